/* cuda_encode.cu - appending tokens: rows encoded on the GPU, bit-identical to
 * the CPU encoder.
 *
 * One warp encodes one row (one token of one head, K or V) in shared memory,
 * performing exactly the float operations of the contract in
 * codec_internal.h and rotation_internal.h, in the same order. nvcc would
 * contract a*b+c into an FMA and is free to pick the rounding of a plain
 * division or square root under some flags, so every operation here is an
 * explicit correctly rounded intrinsic (__fmul_rn, __fadd_rn, __fsub_rn,
 * __fmaf_rn where the contract says fmaf, __frcp_rn for 1.0f / n,
 * __fsqrt_rn): the result does not depend on compiler flags.
 */
#include "cuda_internal.cuh"
#include "cuda_rot.cuh"
#include "kvq_cuda_hooks.cuh"

namespace {

using namespace kvq_cu;

constexpr int kWarps = 4;

/* kvq_norm_ref: eight fmaf chains over j = k mod 8, then the fixed tree. */
__device__ float warp_norm(const float *x, int d, int lane)
{
    float s = 0.0f;
    if (lane < 8)
        for (int j = lane; j < d; j += 8)
            s = __fmaf_rn(x[j], x[j], s);
    float p[8];
#pragma unroll
    for (int k = 0; k < 8; k++)
        p[k] = __shfl_sync(0xffffffffu, s, k);
    float t = __fadd_rn(__fadd_rn(__fadd_rn(p[0], p[4]), __fadd_rn(p[2], p[6])),
                        __fadd_rn(__fadd_rn(p[1], p[5]), __fadd_rn(p[3], p[7])));
    return __fsqrt_rn(t);
}

__device__ bool f16_overflows(float v)
{
    return (kvq_f32_to_f16(v) & 0x7c00u) == 0x7c00u;
}

/* ---- llama.cpp's block layouts (baseline.c, baseline_q5.c) ----------------
 * A warp holds one 32-value block, lane i value i. The CPU's sequential
 * choices become reductions that keep its tie rule: the first index wins
 * among equal keys (which also settles the sign of a zero). */

/* The lane holding the first `better` key (better(a, b): a strictly wins). */
template <class Better>
__device__ int warp_first(float key, int lane, Better better)
{
    int idx = lane;
    for (int o = 16; o; o >>= 1) {
        const float k2 = __shfl_xor_sync(0xffffffffu, key, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
        if (better(k2, key) || (!better(key, k2) && i2 < idx)) {
            key = k2;
            idx = i2;
        }
    }
    return idx;
}

/* kvq_block_inv_scale */
__device__ float inv_scale(float d)
{
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    return isinf(id) ? 0.0f : id;
}

/* The block's scale d and minimum m (0 for q8_0/q4_0/q5_0) as the CPU's
 * q8_0_scale, q4_0_scale, min_max_par and q5_0_par compute them; v is this
 * lane's value. */
__device__ void block_params(int base, float v, int lane, float *d, float *m)
{
    *m = 0.0f;
    if (base == KVQ_TYPE_Q4_1 || base == KVQ_TYPE_Q5_1) {
        const float mn = __shfl_sync(0xffffffffu, v, warp_first(v, lane, [](float a, float b) { return a < b; }));
        const float mx = __shfl_sync(0xffffffffu, v, warp_first(v, lane, [](float a, float b) { return a > b; }));
        *d = __fdiv_rn(__fsub_rn(mx, mn), base == KVQ_TYPE_Q4_1 ? 15.0f : 31.0f);
        *m = mn;
        return;
    }
    const float a = fabsf(v);
    const int at = warp_first(a, lane, [](float x, float y) { return x > y; });
    const float amax = __shfl_sync(0xffffffffu, a, at), sv = __shfl_sync(0xffffffffu, v, at);
    const float mx = amax > 0.0f ? sv : 0.0f; /* the CPU's max stays +0 when every |x| is 0 */
    if (base == KVQ_TYPE_Q8_0)
        *d = __fdiv_rn(amax, 127.0f);
    else
        *d = __fdiv_rn(mx, base == KVQ_TYPE_Q4_0 ? -8.0f : -16.0f);
}

/* Whether row y (d values, any memory) of block layout `base` stores a
 * scale or minimum that overflows f16 (the CPU's KVQ_ERR_RANGE). */
__device__ bool blocks_overflow(int base, const float *y, int d, int lane)
{
    bool over = false;
    for (int b = 0; b < d / KVQ_QK; b++) {
        float s, m;
        block_params(base, y[b * KVQ_QK + lane], lane, &s, &m);
        over |= f16_overflows(s) || f16_overflows(m);
    }
    return over;
}

__device__ void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v & 255u);
    p[1] = (uint8_t)(v >> 8);
}

/* Where a 4- or 5-bit block layout keeps its minimum, fifth bits and
 * nibbles (byte offsets; 0: no such field), from kvq_layout.h's structs. */
struct block_fields {
    int m, qh, qs;
};

__device__ block_fields fields_of(int base)
{
    switch (base) {
    case KVQ_TYPE_Q4_0: return {0, 0, (int)offsetof(kvq_block_q4_0, qs)};
    case KVQ_TYPE_Q4_1: return {(int)offsetof(kvq_block_q4_1, m), 0, (int)offsetof(kvq_block_q4_1, qs)};
    case KVQ_TYPE_Q5_0: return {0, (int)offsetof(kvq_block_q5_0, qh), (int)offsetof(kvq_block_q5_0, qs)};
    default: return {(int)offsetof(kvq_block_q5_1, m), (int)offsetof(kvq_block_q5_1, qh), (int)offsetof(kvq_block_q5_1, qs)};
    }
}

/* Row y of block layout `base` into codes, the CPU's bytes (the checks ran
 * before: every scale fits f16). */
__device__ void encode_blocks(int base, const float *y, int d, uint8_t *codes, int lane)
{
    const uint32_t bb = kvq_layout_block_bytes(base);
    for (int b = 0; b < d / KVQ_QK; b++) {
        uint8_t *blk = codes + (size_t)b * bb;
        const float v = y[b * KVQ_QK + lane];
        float s, m;
        block_params(base, v, lane, &s, &m);
        const float id = inv_scale(s);
        int q; /* this lane's level, as the CPU converts it */
        switch (base) {
        case KVQ_TYPE_Q8_0: q = (int8_t)(int)roundf(__fmul_rn(v, id)); break;
        case KVQ_TYPE_Q4_0: q = min((int)(int8_t)__float2int_rz(__fadd_rn(__fmul_rn(v, id), 8.5f)), 15); break;
        case KVQ_TYPE_Q4_1: q = min((int)(int8_t)__float2int_rz(__fadd_rn(__fmul_rn(__fsub_rn(v, m), id), 0.5f)), 15); break;
        case KVQ_TYPE_Q5_0: q = min((int)(int8_t)__float2int_rz(__fadd_rn(__fmul_rn(v, id), 16.5f)), 31); break;
        default: q = (uint8_t)__float2int_rz(__fadd_rn(__fmul_rn(__fsub_rn(v, m), id), 0.5f)); break; /* q5_1 */
        }
        if (lane == 0)
            put_u16(blk, kvq_f32_to_f16(s)); /* every layout starts with its f16 scale */
        if (base == KVQ_TYPE_Q8_0) {
            blk[offsetof(kvq_block_q8_0, qs) + lane] = (uint8_t)(int8_t)q;
            continue;
        }
        const block_fields f = fields_of(base);
        const int hi = __shfl_down_sync(0xffffffffu, q, 16); /* lane i < 16 packs values i and i + 16 */
        const unsigned qh = __ballot_sync(0xffffffffu, (q & 16) != 0);
        if (lane < 16)
            blk[f.qs + lane] = (uint8_t)((q & 15) | ((hi & 15) << 4));
        if (lane == 0) {
            if (f.m)
                put_u16(blk + f.m, kvq_f32_to_f16(m));
            for (int k = 0; f.qh && k < 4; k++)
                blk[f.qh + k] = (uint8_t)(qh >> (8 * k));
        }
    }
}

struct row_ref {
    const float *x;
    const kvq_dev_codec *cd;
    kvq_row row; /* where it goes (tok_page given) */
};

/* Locates row r = (token * H + head) * 2 + kv. */
__device__ row_ref locate(int64_t r, const float *k, const float *v, const kvq_dev_codec &ck, const kvq_dev_codec &cv,
                          const kvq_dev_pages &pg, const int32_t *tok_page, const int32_t *tok_slot)
{
    row_ref rr;
    int kv = (int)(r & 1);
    int64_t th = r >> 1; /* token * H + head */
    int h = (int)(th % pg.n_kv_heads);
    int64_t tok = th / pg.n_kv_heads;
    const kvq_dev_codec &cd = kv ? cv : ck;
    rr.cd = &cd;
    rr.x = (kv ? v : k) + th * cd.dim;
    rr.row = kvq_row{NULL, NULL, NULL, NULL};
    if (tok_page) {
        uint8_t *page = pg.pool + (uint64_t)tok_page[tok] * pg.page_bytes;
        rr.row = kvq_dev_row(&pg.dl, page, kv, (uint32_t)h, (uint32_t)tok_slot[tok]);
    }
    return rr;
}

/* Flags 1 (non-finite) and 2 (range) exactly as the CPU's checks. */
__global__ void check_kernel(int64_t n_rows, const float *k, const float *v, kvq_dev_codec ck, kvq_dev_codec cv,
                             kvq_dev_pages pg, int *flag)
{
    extern __shared__ float smem_f[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int dmax = ck.dim;
    float *buf = smem_f + warp * 2 * dmax; /* the row, and a rotation's scratch */
    for (int64_t r = (int64_t)blockIdx.x * kWarps + warp; r < n_rows; r += (int64_t)gridDim.x * kWarps) {
        row_ref rr = locate(r, k, v, ck, cv, pg, NULL, NULL);
        const int d = rr.cd->dim;
        bool bad = false, range = false;
        for (int j = lane; j < d; j += 32) {
            float xj = rr.x[j];
            buf[j] = xj;
            bad |= !isfinite(xj);
            if (rr.cd->type == KVQ_TYPE_F16)
                range |= f16_overflows(xj);
        }
        __syncwarp();
        bad = __any_sync(0xffffffffu, bad);
        range = __any_sync(0xffffffffu, range);
        if (!bad && rr.cd->rotated)
            range = f16_overflows(warp_norm(buf, d, lane));
        if (!bad && kvq_layout_block_bytes(rr.cd->base)) {
            const float *y = buf;
            if (rr.cd->in_rot) { /* the CPU checks R x too (kvq_rotbase_check): finite x can overflow */
                y = warp_rotate(rr.cd->R, buf, buf + dmax, lane);
                bool inf = false;
                for (int j = lane; j < d; j += 32)
                    inf |= !isfinite(y[j]);
                bad = __any_sync(0xffffffffu, inf);
            }
            range = !bad && __any_sync(0xffffffffu, blocks_overflow(rr.cd->base, y, d, lane));
        }
        if (lane == 0 && (bad || range))
            atomicOr(flag, bad ? 1 : 2);
        __syncwarp();
    }
}

__device__ void store_u16(uint8_t *p, uint16_t v)
{
    *reinterpret_cast<uint16_t *>(p) = v; /* norm sections are 2-byte aligned */
}

/* Where f16 copies of the override rows (sinks, recent window) go: token
 * i's rows of every head to row row[i] of sequence seq[i] (-1: none). */
struct ov_dst {
    const int32_t *seq, *row; /* NULL: the cache keeps no override rows */
    int rows_per_seq;
    uint16_t *k, *v;
};

/* One row x (global or shared memory) of codec cd into row, by one warp:
 * f32 and f16 copied, tq types encoded (codes, norms, QJL signs). buf0 and
 * buf1 hold d floats each, idx and sgn d bytes each (the warp's own). */
__device__ __forceinline__ void encode_row(const kvq_dev_codec &cd, const float *x, kvq_row row, float *buf0, float *buf1,
                           uint8_t *idx, uint8_t *sgn, int lane)
{
    const int d = cd.dim;
    uint8_t *codes = row.codes;
    if (cd.type == KVQ_TYPE_F32) {
        for (int j = lane; j < d; j += 32)
            reinterpret_cast<float *>(codes)[j] = x[j];
        return;
    }
    if (cd.type == KVQ_TYPE_F16) {
        for (int j = lane; j < d; j += 32)
            reinterpret_cast<uint16_t *>(codes)[j] = kvq_f32_to_f16(x[j]);
        return;
    }
    if (!cd.rotated) { /* llama.cpp's blocks, of x or of R x */
        const float *y = x;
        if (cd.in_rot) {
            for (int j = lane; j < d; j += 32)
                buf0[j] = x[j];
            __syncwarp();
            y = warp_rotate(cd.R, buf0, buf1, lane);
        }
        encode_blocks(cd.base, y, d, codes, lane);
        __syncwarp();
        return;
    }
    /* tq types: the codes into idx, the QJL signs into sgn, then packed */
    const bool fast = d == 128 && rot128_ok(cd.R) && (!cd.qjl || rot128_ok(cd.S));
    float sg_r[kRot128Pre][4], sg_s[kRot128Pre][4], v[4];
    if (fast) { /* the tables' loads issued with the row's: one memory latency, not one per round */
        rot128_load_signs(cd.R, sg_r, lane);
        if (cd.qjl)
            rot128_load_signs(cd.S, sg_s, lane);
#pragma unroll
        for (int k = 0; k < 4; k++)
            buf0[lane + 32 * k] = v[k] = x[lane + 32 * k];
    } else {
        for (int j = lane; j < d; j += 32)
            buf0[j] = x[j];
    }
    __syncwarp();
    const float n = warp_norm(buf0, d, lane);
    uint8_t *norm_p = reinterpret_cast<uint8_t *>(row.norm);
    uint8_t *rnorm_p = cd.qjl ? reinterpret_cast<uint8_t *>(row.rnorm) : NULL;
    uint8_t *signs = cd.qjl ? row.signs : NULL;
    const int code_bytes = d * cd.bits / 8;
    if (n == 0.0f) { /* the all-zero row */
        if (lane == 0) {
            store_u16(norm_p, 0);
            if (rnorm_p)
                store_u16(rnorm_p, 0);
        }
        for (int b = lane; b < code_bytes; b += 32)
            codes[b] = 0;
        if (signs)
            for (int b = lane; b < d / 8; b += 32)
                signs[b] = 0;
        __syncwarp();
        return;
    }
    const float inv = __frcp_rn(n);
    float gamma = 0.0f;
    int c[4]; /* the fast path's codes, lane + 32 k */
    if (fast) {
        /* the same operations as below in registers (rot128_apply is
         * warp_rotate's butterflies in its order): the same bytes */
#pragma unroll
        for (int k = 0; k < 4; k++)
            v[k] = __fmul_rn(v[k], inv);
        rot128_apply(cd.R, sg_r, v, lane);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            c[k] = kvq_cu_bucket(cd, v[k]);
            idx[lane + 32 * k] = (uint8_t)c[k];
        }
        if (cd.qjl) {
#pragma unroll
            for (int k = 0; k < 4; k++)
                buf1[lane + 32 * k] = v[k] = __fsub_rn(v[k], kvq_cu_centroid(cd, (unsigned)c[k]));
            __syncwarp();
            gamma = warp_norm(buf1, d, lane);
            rot128_apply(cd.S, sg_s, v, lane);
#pragma unroll
            for (int k = 0; k < 4; k++)
                sgn[lane + 32 * k] = !(v[k] < 0.0f);
        }
        __syncwarp();
        if (kvq_dev_order(cd.type)) {
            /* the row's words straight from the lanes' codes: lane i holds
             * code i of each group of 32, so word k of a group is an OR over
             * lanes (kvq_layout.h's device order), where the byte loop below
             * ran ~1,000 dependent instructions on the step's critical path */
            unsigned mine = 0; /* lane L < 12 writes word L */
#pragma unroll
            for (int q = 0; q < 4; q++)
#pragma unroll
                for (int k = 0; k < 3; k++) {
                    const unsigned cu = (unsigned)c[q];
                    const unsigned part = lane < 24 ? ((lane >> 3) == k ? (cu & 7u) << (4 * (lane & 7)) : 0u)
                                                    : ((cu >> k) & 1u) << (4 * (lane - 24) + 3);
                    const unsigned w = __reduce_or_sync(0xffffffffu, part);
                    mine = lane == 3 * q + k ? w : mine;
                }
            unsigned smine = 0; /* QJL signs: lane L < 4 writes group L's 32 */
            if (cd.qjl)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const unsigned w = __ballot_sync(0xffffffffu, !(v[q] < 0.0f));
                    smine = lane == q ? w : smine;
                }
            if (lane < 12)
                for (int i = 0; i < 4; i++)
                    codes[4 * lane + i] = (uint8_t)(mine >> (8 * i));
            if (cd.qjl && lane < 4)
                for (int i = 0; i < 4; i++)
                    signs[4 * lane + i] = (uint8_t)(smine >> (8 * i));
            if (lane == 0) {
                store_u16(norm_p, kvq_f32_to_f16(n));
                if (rnorm_p)
                    store_u16(rnorm_p, kvq_f32_to_f16(gamma));
            }
            __syncwarp();
            return;
        }
    } else {
        for (int j = lane; j < d; j += 32)
            buf0[j] = __fmul_rn(buf0[j], inv);
        __syncwarp();
        float *y = warp_rotate(cd.R, buf0, buf1, lane);
        for (int j = lane; j < d; j += 32) {
            idx[j] = (uint8_t)kvq_cu_bucket(cd, y[j]);
        }
        __syncwarp();
        if (cd.qjl) {
            for (int j = lane; j < d; j += 32)
                y[j] = __fsub_rn(y[j], kvq_cu_centroid(cd, idx[j]));
            __syncwarp();
            gamma = warp_norm(y, d, lane);
            float *z = warp_rotate(cd.S, y, y == buf0 ? buf1 : buf0, lane);
            for (int j = lane; j < d; j += 32)
                sgn[j] = !(z[j] < 0.0f);
            __syncwarp();
        }
    }
    const bool dev_order = kvq_dev_order(cd.type); /* 3-bit codes: kvq_layout.h's device order */
    for (int b = lane; b < code_bytes; b += 32) {
        unsigned byte = 0;
        for (int i = 0; i < 8; i++) {
            const int pos = 8 * b + i;
            int bit = pos % cd.bits;
            const int j = dev_order ? kvq_dev_bitsrc(d, (uint32_t)pos, &bit) : pos / cd.bits;
            byte |= ((unsigned)(idx[j] >> bit) & 1u) << i;
        }
        codes[b] = (uint8_t)byte;
    }
    if (cd.qjl)
        for (int b = lane; b < d / 8; b += 32) {
            unsigned byte = 0;
            for (int i = 0; i < 8; i++)
                byte |= (unsigned)sgn[8 * b + i] << i;
            signs[b] = (uint8_t)byte;
        }
    if (lane == 0) {
        store_u16(norm_p, kvq_f32_to_f16(n));
        if (rnorm_p)
            store_u16(rnorm_p, kvq_f32_to_f16(gamma));
    }
    __syncwarp();
}

__global__ void encode_kernel(int64_t n_rows, const float *k, const float *v, kvq_dev_codec ck, kvq_dev_codec cv,
                              kvq_dev_pages pg, const int32_t *tok_page, const int32_t *tok_slot, ov_dst ov,
                              int skip_k, const int *flag)
{
    extern __shared__ float smem_f[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int dmax = ck.dim;
    float *buf0 = smem_f + warp * 2 * dmax;
    float *buf1 = buf0 + dmax;
    uint8_t *idx = reinterpret_cast<uint8_t *>(smem_f + kWarps * 2 * dmax) + warp * 2 * dmax;
    uint8_t *sgn = idx + dmax;
    /* d = 128: the row's copy (encode_smem); other dims read it where it is */
    float *xs = reinterpret_cast<float *>(reinterpret_cast<uint8_t *>(smem_f) + kWarps * dmax * 10) + warp * dmax;

    for (int64_t r = (int64_t)blockIdx.x * kWarps + warp; r < n_rows; r += (int64_t)gridDim.x * kWarps) {
        const int kv = (int)(r & 1);
        const int64_t th = r >> 1, tok = th / pg.n_kv_heads; /* th = token * H + head */
        const int h = (int)(th % pg.n_kv_heads);
        const int d = kv ? cv.dim : ck.dim;
        const float *x = (kv ? v : k) + th * d;
        /* every load of the row issued before the first is used: at batch 1
         * this kernel is a chain of memory latencies on the step's critical
         * path (the check's flag, the token's page and slot, its ring row,
         * the row itself), and they do not depend on each other */
        const int refused = flag ? *flag : 0;
        const int32_t page_i = tok_page[tok], slot = tok_slot[tok];
        const int32_t orow = ov.row ? ov.row[tok] : -1, oseq = ov.row ? ov.seq[tok] : 0;
        const bool d128 = d == 128 && dmax == 128;
        float xr[4];
        if (d128) {
#pragma unroll
            for (int q = 0; q < 4; q++)
                xr[q] = x[lane + 32 * q];
        }
        if (refused) /* the input check refused a row: write nothing */
            return;
        if (d128) {
#pragma unroll
            for (int q = 0; q < 4; q++)
                xs[lane + 32 * q] = xr[q];
            __syncwarp();
        }
        const float *src = d128 ? xs : x;
        if (orow >= 0) { /* in the same launch: one kernel less per layer and step */
            const size_t hd = (size_t)pg.n_kv_heads * d;
            uint16_t *dst = (kv ? ov.v : ov.k) + ((size_t)oseq * ov.rows_per_seq + orow) * hd + (size_t)h * d;
            for (int j = lane; j < d; j += 32)
                dst[j] = __half_as_ushort(__float2half_rn(src[j]));
        }
        if (skip_k && !kv)
            continue; /* key centering: the key waits for its page (pack_kernel) */
        uint8_t *page = pg.pool + (uint64_t)page_i * pg.page_bytes;
        /* each branch names its codec and half of the page: picked at run
         * time, the parameters were copied to local memory and read back */
        if (kv)
            encode_row(cv, src, kvq_dev_row(&pg.dl, page, 1, (uint32_t)h, (uint32_t)slot), buf0, buf1, idx, sgn, lane);
        else
            encode_row(ck, src, kvq_dev_row(&pg.dl, page, 0, (uint32_t)h, (uint32_t)slot), buf0, buf1, idx, sgn, lane);
    }
}

/* Key centering (kvq_layout.h, "key means"; the CPU's pack_keys in
 * kvq/cache/cache.c, operation for operation): block (head, job) encodes the
 * keys [from, to) of one page against its mean, computing and storing the
 * mean first when the job is fresh. A key is read as its f16 rounding: from
 * the appended rows k (tokens from in_first on, row in_row first) or else
 * from the sequence's ring row, which the append's encode kernel (launched
 * after this one) has not overwritten yet. */
__device__ float centred_source(const kvq_cu_pack_job &J, int t, int h, int j, const float *k, int H, int d,
                                const uint16_t *ov_k, int ov_rows, int sink_rows, int ring)
{
    if (t >= J.in_first)
        return __half2float(__float2half_rn(k[((int64_t)(J.in_row + t - J.in_first) * H + h) * d + j]));
    /* a sink token's only f16 copy is its sink row (override_row in cuda_cache.cu) */
    const int64_t row = t < sink_rows ? t : sink_rows + t % ring;
    const uint16_t *r = ov_k + (((int64_t)J.seq * ov_rows + row) * H + h) * d;
    return __half2float(__ushort_as_half(r[j]));
}

__global__ void pack_kernel(const kvq_cu_pack_job *jobs, const float *k, kvq_dev_codec ck, kvq_dev_pages pg,
                            uint64_t mean_off, uint32_t mean_bytes, const uint16_t *ov_k, int ov_rows, int sink_rows,
                            int ring, const int *flag)
{
    if (flag && *flag)
        return;
    const kvq_cu_pack_job J = jobs[blockIdx.y];
    if (J.to <= J.from)
        return;
    extern __shared__ float smem_f[];
    const int h = blockIdx.x, d = ck.dim, H = (int)pg.n_kv_heads, P = (int)pg.page_tokens;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *mean = smem_f, *x = mean + d + warp * 3 * d, *buf0 = x + d, *buf1 = buf0 + d;
    uint8_t *idx = reinterpret_cast<uint8_t *>(smem_f + d + kWarps * 3 * d) + warp * 2 * d, *sgn = idx + d;
    uint8_t *page = pg.pool + (uint64_t)J.page * pg.page_bytes;
    uint8_t *blk = page + mean_off + (uint64_t)h * mean_bytes;
    __shared__ float scale_s;
    if (J.fresh) {
        for (int j = threadIdx.x; j < d; j += blockDim.x) {
            float s = 0.0f;
            for (int t = J.p0; t < J.p0 + P; t++)
                s = __fadd_rn(s, centred_source(J, t, h, j, k, H, d, ov_k, ov_rows, sink_rows, ring));
            mean[j] = __fdiv_rn(s, (float)P);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float mx = 0.0f;
            for (int j = 0; j < d; j++)
                mx = fabsf(mean[j]) > mx ? fabsf(mean[j]) : mx;
            const uint16_t sh = kvq_f32_to_f16(__fdiv_rn(mx, 7.0f));
            blk[0] = (uint8_t)(sh & 255);
            blk[1] = (uint8_t)(sh >> 8);
            scale_s = kvq_f16_to_f32(sh);
        }
        __syncthreads();
        const float sc = scale_s;
        for (int b = threadIdx.x; 2 * b < d; b += blockDim.x) {
            unsigned byte = 0;
            for (int i = 0; i < 2 && 2 * b + i < d; i++)
                byte |= (unsigned)kvq_key_mean_quant(mean[2 * b + i], sc) << (4 * i);
            blk[2 + b] = (uint8_t)byte;
        }
        __syncthreads();
    }
    for (int j = threadIdx.x; j < d; j += blockDim.x) /* m~, as kvq_key_mean_decode */
        mean[j] = kvq_key_mean_scale(blk) * (float)(kvq_key_mean_code(blk, j) - 8);
    __syncthreads();
    for (int t = J.from + warp; t < J.to; t += kWarps) {
        for (int j = lane; j < d; j += 32)
            x[j] = __fsub_rn(centred_source(J, t, h, j, k, H, d, ov_k, ov_rows, sink_rows, ring), mean[j]);
        __syncwarp();
        encode_row(ck, x, kvq_dev_row(&pg.dl, page, 0, (uint32_t)h, (uint32_t)(t - J.p0)), buf0, buf1, idx, sgn,
                   lane);
        __syncwarp();
    }
}

/* encode_kernel's shared memory: per warp two float rows and two byte
 * rows, and at d = 128 the row's copy (at d = 1024 that would pass 48 KB). */
size_t encode_smem(int d)
{
    return (size_t)kWarps * d * (2 * sizeof(float) + 2) + (d == 128 ? (size_t)kWarps * d * sizeof(float) : 0);
}

int grid_for(int64_t n_rows)
{
    int64_t blocks = (n_rows + kWarps - 1) / kWarps;
    return (int)(blocks < 65535 ? blocks : 65535);
}

} /* namespace */

kvq_status kvq_cu_check_rows(const kvq_cuda_cache *c, size_t n_tokens, const float *k, const float *v, int *flag_d)
{
    const int64_t n_rows = (int64_t)n_tokens * c->cfg.cache.n_kv_heads * 2;
    if (n_rows == 0)
        return KVQ_OK;
    const size_t smem = (size_t)kWarps * 2 * c->dk.dim * sizeof(float);
    return kvq_cu_launch(c->step, false, check_kernel, dim3((unsigned)grid_for(n_rows)), dim3(kWarps * 32), smem,
                         c->stream, n_rows, k, v, c->dk, c->dv, kvq_cu_pages_of(c), flag_d);
}

kvq_status kvq_cu_encode_rows(const kvq_cuda_cache *c, size_t n_tokens, const float *k, const float *v,
                              const int32_t *tok_page_d, const int32_t *tok_slot_d, const int32_t *tok_seq_d,
                              const int32_t *tok_row_d, const int *flag_d)
{
    const int64_t n_rows = (int64_t)n_tokens * c->cfg.cache.n_kv_heads * 2;
    if (n_rows == 0)
        return KVQ_OK;
    const size_t smem = encode_smem(c->dk.dim);
    const ov_dst ov = {c->ov_rows ? tok_seq_d : NULL, c->ov_rows ? tok_row_d : NULL, c->ov_rows, c->ov_k_d, c->ov_v_d};
    return kvq_cu_launch(c->step, false, encode_kernel, dim3((unsigned)grid_for(n_rows)), dim3(kWarps * 32), smem,
                         c->stream, n_rows, k, v, c->dk, c->dv, kvq_cu_pages_of(c), tok_page_d, tok_slot_d, ov,
                         c->center, flag_d);
}

kvq_status kvq_cu_pack_keys(const kvq_cuda_cache *c, int n_jobs, const kvq_cu_pack_job *jobs_d, const float *k,
                            const int *flag_d)
{
    if (n_jobs == 0)
        return KVQ_OK;
    const int d = c->dk.dim;
    const size_t smem = ((size_t)d + kWarps * 3 * (size_t)d) * sizeof(float) + kWarps * 2 * (size_t)d;
    const int H = c->cfg.cache.n_kv_heads;
    return kvq_cu_launch(c->step, false, pack_kernel, dim3((unsigned)H, (unsigned)n_jobs), dim3(kWarps * 32), smem,
                         c->stream, jobs_d, k, c->dk, kvq_cu_pages_of(c), (uint64_t)c->layout.mean_off,
                         c->layout.mean_bytes, (const uint16_t *)c->ov_k_d, c->ov_rows, c->sink_rows,
                         c->ring ? c->ring : 1, flag_d);
}

