/* kvq_cuda_hooks.cuh - device functions for attention kernels that read kvq's
 * packed cache pages directly (include from a .cu file; sm_80 or newer).
 *
 * The idea (docs/attention-cuda.md): a warp scores packed keys and accumulates packed
 * values with tensor-core MMAs (m16n8k16, f16 inputs, f32 accumulators),
 * decoding codes straight into MMA fragments with byte permutes instead of
 * going through f32 or shared-memory lookup tables.
 *
 * Warp shape. Lane l = 4g + t (g = l / 4 in 0..7, t = l % 4). For scores a
 * warp computes S^T[16 rows][8 tokens] = Q[16 rows][128 slots] K^T: row r < 8
 * is the f16 "hi" part of query r, row r + 8 its "lo" part (q = hi + lo to
 * ~2^-22, so f16 inputs cost no accuracy on the query side). The B fragment
 * of token g comes from lane (g, t), which decodes the 32 head dimensions
 * 32t .. 32t + 31 of that token. Which dimension sits in which MMA "slot"
 * is whatever makes the decode cheapest; the query fragments are laid out
 * in the same slot order (kvq_cu::slot tables below), and a dot product does
 * not care about the order of its terms.
 *
 * Rows. The CUDA cache keeps its pages in the device page layout of
 * kvq_layout.h (each head's tokens in groups of 32, K rows then V rows):
 * kvq_dev_row() finds a token's norm, codes and signs there.
 *
 * Codes (tq3, 3 bits, the device order of kvq_layout.h): the 96 bits of a
 * lane's 32 codes are nearly nibble selectors already (a mask, and 6
 * instructions for the 8 codes spread over the nibbles' spare bits), and
 * PRMT looks the f16 centroid bytes up in a 16-byte table held in 4
 * registers (tq3_decode32): ~1.4 instructions per code, no memory traffic.
 *
 * QJL signs: sum_j (S q')_j s~_j = 2 P - T with P = sum over sign bit 1 of
 * (S q')_j and T = sum_j (S q')_j. P is an MMA whose B operand is the sign
 * word masked in place: the bit at position k (11..14) of an f16 is the exact
 * power of two 2^-13, 2^-11, 2^-7 or 2, so the query side is pre-divided by
 * that value (qjl_bits32, 20 instructions for 32 signs).
 *
 * Values: O^T += V^T P^T. One lookup gives two f16 pairs (4 dims of token
 * g); with the same lookup for token g + 8, four movmatrix make the A
 * fragment of one m-block of V^T (accum_values_tq3); the softmax weights
 * (times the row norm) are the B operand, again split into hi + lo f16.
 * f16 rows go through ldmatrix.trans.
 */
#ifndef KVQ_CUDA_HOOKS_CUH
#define KVQ_CUDA_HOOKS_CUH

#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "kvq_half.h"
#include "kvq_layout.h"

namespace kvq_cu {

/* ---- slot orders (host and device) ----------------------------------- */

/* tq3_decode32 returns 16 f16 pairs; pair p holds codes 2p (low half) and
 * 2p + 1 of the 32 it was given. */

/* qjl_bits32: pair r holds signs (r, r + 16); the bit sits at position
 * 11 + (r & 3) of each half, worth kQjlBitValue[r & 3] as an f16. */
static constexpr float kQjlBitValue[4] = {1.0f / 8192.0f, 1.0f / 2048.0f, 1.0f / 128.0f, 2.0f};

/* MMA slot s (0..127) of a K fragment: k-block kb = s / 16, w = s % 16 ->
 * lane t = (w % 8) / 2, pair p = 2 kb + w / 8, half e = w % 2. */
__host__ __device__ static inline void slot_split(int s, int *t, int *p, int *e)
{
    int w = s & 15;
    *t = (w & 7) >> 1;
    *p = 2 * (s >> 4) + (w >> 3);
    *e = w & 1;
}

/* Head dimension held by K-score slot s: tq3 codes (tq3_decode32 order) or
 * raw f16 rows (lane t reads 16-byte chunks 2t, 2t+1, 2t+8, 2t+9). */
__host__ __device__ static inline int kslot_dim(bool f16, int s)
{
    int t, p, e;
    slot_split(s, &t, &p, &e);
    if (f16) {
        const int i = p / 4, ch = 2 * t + (i & 1) + 8 * (i >> 1);
        return 8 * ch + 2 * (p % 4) + e;
    }
    return 32 * t + 2 * p + e;
}

/* Head dimension of QJL-sign slot s, and 1 / the f16 value its bit carries. */
__host__ __device__ static inline int sslot_dim(int s, float *inv_bitval)
{
    int t, p, e;
    slot_split(s, &t, &p, &e);
    const int k = p & 3; /* bit 11 + k: 2^-13, 2^-11, 2^-7, 2 */
    *inv_bitval = k == 0 ? 8192.0f : k == 1 ? 2048.0f : k == 2 ? 128.0f : 0.5f;
    return 32 * t + p + 16 * e;
}

/* Head dimension of value slot s (row s % 16 of m-block s / 16 of O^T):
 * itself for f16 rows; for tq3 codes the order accum_values_tq3 gives,
 * rows r < 8 holding pair 2 mb and rows r >= 8 pair 2 mb + 1 of lane
 * t = (r % 8) / 2's slice. */
__host__ __device__ static inline int vslot_dim(bool f16, int s)
{
    if (f16)
        return s;
    const int mb = s >> 4, r = s & 15;
    return 32 * ((r & 7) >> 1) + 4 * mb + 2 * (r >> 3) + (r & 1);
}

/* ---- small wrappers -------------------------------------------------- */

/* PRMT with a selector whose nibbles all have bit 3 clear (the only kind
 * used here); written as PTX because __byte_perm masks the selector with
 * 0x7777 first, one extra instruction per lookup. Only sel[15:0] count. */
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel)
{
#if defined(__CUDA_ARCH__)
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
#else
    return __byte_perm(a, b, sel);
#endif
}

/* D = A B + D, m16n8k16, f16 x f16 -> f32. Fragment layouts as in the PTX
 * ISA: a = {A[g][2t..], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..]},
 * b = {B[2t..][g], B[2t+8..][g]}, c = {C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]}. */
__device__ __forceinline__ void mma16816(float c[4], uint4 a, uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    /* not volatile: a pure function of its operands, so ptxas may interleave
     * independent MMA chains with the decode work around them */
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
#else
    (void)c, (void)a, (void)b0, (void)b1;
    __trap();
#endif
}

/* Four 8x8 f16 matrices from shared memory (ldmatrix): lane l supplies the
 * address of row l % 8 of matrix l / 8; register i holds matrix i's row
 * l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 (an MMA fragment). */
__device__ __forceinline__ void ldsm_x4(uint32_t smem_addr, uint32_t r[4])
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr)
                 : "memory");
#else
    (void)smem_addr;
    r[0] = r[1] = r[2] = r[3] = 0;
    __trap();
#endif
}

/* The same, transposed (ldmatrix.trans). */
__device__ __forceinline__ void ldsm_x4_trans(uint32_t smem_addr, uint32_t r[4])
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr)
                 : "memory");
#else
    (void)smem_addr;
    r[0] = r[1] = r[2] = r[3] = 0;
    __trap();
#endif
}

/* Transposes an 8x8 f16 matrix held as one register per lane (lane (g, t)
 * holds row g, columns 2t and 2t + 1, low half first): afterwards lane (g, t)
 * holds row g, columns 2t, 2t + 1 of the transpose (movmatrix, sm_75+). */
__device__ __forceinline__ uint32_t movm_trans(uint32_t x)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t r;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(x));
    return r;
#else
    (void)x;
    __trap();
    return 0;
#endif
}

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* f16x2 of (x, y) rounded to nearest, and the f16x2 of what rounding lost. */
__device__ __forceinline__ void split_f16x2(float x, float y, uint32_t *hi, uint32_t *lo)
{
    __half2 h = __floats2half2_rn(x, y);
    float2 hf = __half22float2(h);
    __half2 l = __floats2half2_rn(x - hf.x, y - hf.y);
    *hi = *reinterpret_cast<uint32_t *>(&h);
    *lo = *reinterpret_cast<uint32_t *>(&l);
}

/* ---- tq3 codes -> f16 pairs ------------------------------------------ */

/* The 8 centroids times alpha as f16 bytes: lo bytes of c[0..3], c[4..7],
 * hi bytes likewise. alpha (see codebook_alpha) makes all eight nearly
 * exact in f16; the kernels divide it back out once, in float. */
struct tq3_lut {
    uint32_t lo0, lo1, hi0, hi1;
};

__host__ __device__ static inline tq3_lut tq3_lut_make(const float c[8], float alpha)
{
    tq3_lut t = {0, 0, 0, 0};
    for (int i = 0; i < 8; i++) {
        uint32_t h = kvq_f32_to_f16(c[i] * alpha);
        int sh = 8 * (i & 3);
        if (i < 4) {
            t.lo0 |= (h & 0xffu) << sh;
            t.hi0 |= (h >> 8) << sh;
        } else {
            t.lo1 |= (h & 0xffu) << sh;
            t.hi1 |= (h >> 8) << sh;
        }
    }
    return t;
}

/* The factor alpha in [1, 2) for which the levels alpha * c[i] lose the
 * least to f16 rounding (largest relative error). Rounding the raw d = 128
 * 3-bit centroids costs up to 2.3e-4 relative, a systematic per-level error
 * that showed up as ~1e-3 in attention outputs with peaky softmax; the best
 * alpha brings it to ~2e-5. Host only (a few ms, once per cache). */
static inline float codebook_alpha(const float *c, int levels)
{
    float best_a = 1.0f;
    double best = 1e30;
    for (int k = 0; k < (1 << 18); k++) {
        const float a = 1.0f + (float)k / (float)(1 << 18);
        double worst = 0.0;
        for (int i = 0; i < levels && worst < best; i++) {
            const float v = c[i] * a;
            if (v == 0.0f)
                continue;
            const double e = fabs((double)kvq_f16_to_f32(kvq_f32_to_f16(v)) - (double)v) / fabs((double)v);
            worst = e > worst ? e : worst;
        }
        if (worst < best) {
            best = worst;
            best_a = a;
        }
    }
    return best_a;
}

/* Two pairs from the low 16 bits of sel (4 nibbles = 4 codes). */
__device__ __forceinline__ void tq3_lookup4(uint32_t sel, const tq3_lut &T, uint32_t *p0, uint32_t *p1)
{
    uint32_t lo = prmt(T.lo0, T.lo1, sel);
    uint32_t hi = prmt(T.hi0, T.hi1, sel);
    *p0 = prmt(lo, hi, 0x5140);
    *p1 = prmt(lo, hi, 0x7362);
}

/* The selectors of 32 codes in device order (w0..w2: one 12-byte group,
 * kvq_layout.h): sel[k] nibble i = code 8k + i. Lookup i (0..7) of codes
 * 4i..4i+3 takes sel[i / 2] >> (16 * (i & 1)), so that a caller can
 * interleave the lookups with the MMAs that consume them. */
__device__ __forceinline__ void tq3_select32(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t sel[4])
{
    sel[0] = w0 & 0x77777777u;
    sel[1] = w1 & 0x77777777u;
    sel[2] = w2 & 0x77777777u;
    uint32_t s3 = (w0 >> 3) & 0x11111111u;
    s3 |= (w1 >> 2) & 0x22222222u;
    s3 |= (w2 >> 1) & 0x44444444u;
    sel[3] = s3;
}

/* 32 codes in device order -> 16 f16x2 centroid pairs, pair p = codes 2p,
 * 2p + 1. */
__device__ __forceinline__ void tq3_decode32(uint32_t w0, uint32_t w1, uint32_t w2, const tq3_lut &T,
                                             uint32_t out[16])
{
    uint32_t sel[4];
    tq3_select32(w0, w1, w2, sel);
#pragma unroll
    for (int i = 0; i < 8; i++)
        tq3_lookup4(sel[i / 2] >> (16 * (i & 1)), T, &out[2 * i], &out[2 * i + 1]);
}

/* ---- integer tensor cores for the key side (the fused kernel, tq keys) --
 *
 * The f16 decode above needs one PRMT per code: a lookup gives 4 bytes,
 * and an f16 is 2. With keys in 16-bit fixed point, C = round(S c) =
 * 256 hk + lk (s8 each), one PRMT into a hi-byte table and one into a
 * lo-byte table give 4 codes' hk and lk, which are exactly an s8 MMA
 * operand: half a PRMT per code. mma.m16n8k32 (s8, s32 accumulate) then
 * takes hk and lk of 4 codes in its k-slots 4t.. and 16 + 4t.. (a0/a1 and
 * a2/a3 of tokens g and g + 8). The query side is 24-bit fixed point,
 * Q = 65536 hq + 256 mq + lq, placed in two n-tiles per query so that
 * column A = (hq | 0), B = (mq | hq), C = (lq | mq) (k-slots hk | lk) give
 * sum Q C = 256 (65536 A + 256 B + C) up to the lq lk term (2^-24).
 * QJL signs need no table at all: sw & (0x01010101 << p) puts sign bits
 * 8i + p in byte i, worth 2^p as a u8; the query side, again 24-bit in two
 * n-tiles (hi, mid | lo), is divided by that (>= 17 bits remain).
 * The accumulators start at the bit pattern of 1.5 * 2^23, so a result
 * below 2^22 in magnitude reads as that float plus the integer, with no
 * conversion instruction. tests/cuda/emulate_v4.py models all of this. */

/* Largest fixed-point magnitude: keeps hk/hq within s8 after the split. */
constexpr int kFixMax = 32000;
constexpr uint32_t kImmaBias = 0x4B400000u; /* bits of 1.5 * 2^23 */
constexpr float kImmaBiasF = 12582912.0f;

struct tq3_ilut {
    uint32_t hi0, hi1, lo0, lo1; /* hk of C_0..3, C_4..7; lk likewise */
};

/* The scale S in [kFixMax / 2, kFixMax] / max|c| for which round(S c_i)
 * is relatively nearest S c_i (d = 128, 3 bits: 2.5e-6, against 2.6e-5
 * for the f16 tables). Host only, once per cache. */
static inline float codebook_int_scale(const float *c, int levels)
{
    float cm = 0.0f;
    for (int i = 0; i < levels; i++)
        cm = fabsf(c[i]) > cm ? fabsf(c[i]) : cm;
    if (cm == 0.0f)
        return 1.0f;
    float best_s = (float)kFixMax / cm;
    double best = 1e30;
    for (int k = 0; k <= (1 << 17); k++) {
        const float s = (float)kFixMax / cm * (0.5f + 0.5f * (float)k / (float)(1 << 17));
        double worst = 0.0;
        for (int i = 0; i < levels && worst < best; i++) {
            const double v = (double)c[i] * (double)s;
            if (v == 0.0)
                continue;
            const double e = fabs(nearbyint(v) - v) / fabs(v);
            worst = e > worst ? e : worst;
        }
        if (worst < best) {
            best = worst;
            best_s = s;
        }
    }
    return best_s;
}

/* v = 256 hi + lo with hi, lo in s8, for |v| <= kFixMax. */
__host__ __device__ static inline void fix_split16(int v, int *hi, int *lo)
{
    *hi = (v + 128) >> 8;
    *lo = v - 256 * *hi;
}

/* v = 65536 hi + 256 mid + lo, all s8, for |v| <= 256 kFixMax. */
__host__ __device__ static inline void fix_split24(int v, int *hi, int *mid, int *lo)
{
    *hi = (v + 32896) >> 16; /* remainder in [-32896, 32639]: mid and lo fit s8 */
    fix_split16(v - 65536 * *hi, mid, lo);
}

static inline tq3_ilut tq3_ilut_make(const float c[8], float S)
{
    tq3_ilut t = {0, 0, 0, 0};
    for (int i = 0; i < 8; i++) {
        int hi, lo;
        fix_split16((int)nearbyintf(c[i] * S), &hi, &lo);
        const int sh = 8 * (i & 3);
        if (i < 4) {
            t.hi0 |= ((uint32_t)hi & 0xffu) << sh;
            t.lo0 |= ((uint32_t)lo & 0xffu) << sh;
        } else {
            t.hi1 |= ((uint32_t)hi & 0xffu) << sh;
            t.lo1 |= ((uint32_t)lo & 0xffu) << sh;
        }
    }
    return t;
}

/* Head dimension of code k-block kb (0..7), lane t, byte i: tq3_select32's
 * selector kb / 2, half kb % 2, nibble i. */
__host__ __device__ static inline int islot_dim(int kb, int t, int i)
{
    return 32 * t + 4 * kb + i;
}

/* D += A B, m16n8k32, s8 x s8 (U8 = false) or u8 x s8 -> s32. Fragments:
 * a = {A[g][4t..], A[g+8][4t..], A[g][16+4t..], A[g+8][16+4t..]},
 * b = {B[4t..][g], B[16+4t..][g]}, 4 bytes per register, c as mma16816. */
template <bool U8 = false>
__device__ __forceinline__ void mma16832_s8(int32_t c[4], uint4 a, uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (U8)
        asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
            : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
            : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
#else
    (void)c, (void)a, (void)b0, (void)b1;
    __trap();
#endif
}

/* The integer an accumulator started at kImmaBias holds, as a float. */
__device__ __forceinline__ float imma_val(int32_t acc)
{
    return __int_as_float(acc) - kImmaBiasF;
}

/* ---- QJL sign words -> masked f16 pairs ------------------------------ */

/* sw: 32 sign bits (dims 32t + i at bit i). out[r] holds bit r in its low
 * half and bit r + 16 in its high half, each at position 11 + (r & 3). */
__device__ __forceinline__ void qjl_bits32(uint32_t sw, uint32_t out[16])
{
    const uint32_t a0 = sw << 11, a1 = sw << 7, a2 = sw << 3, a3 = sw >> 1;
#pragma unroll
    for (int b = 0; b < 4; b++) {
        const uint32_t m = 0x00010001u << (11 + b);
        out[b] = a0 & m;
        out[4 + b] = a1 & m;
        out[8 + b] = a2 & m;
        out[12 + b] = a3 & m;
    }
}

/* ---- scoring one 8-token tile ---------------------------------------- */

/* Accumulates S^T for 8 tokens: kb_regs are the lane's 16 B-fragment pairs
 * (tq3_decode32, qjl_bits32 or raw f16 pairs); qfrag[kb * 32 + lane] the
 * matching A fragments (hi/lo query rows). */
__device__ __forceinline__ void score_tile8(float acc[4], const uint32_t kb_regs[16], const uint4 *qfrag, int lane)
{
#pragma unroll
    for (int kb = 0; kb < 8; kb++)
        mma16816(acc, qfrag[kb * 32 + lane], kb_regs[2 * kb], kb_regs[2 * kb + 1]);
}

/* ---- values ----------------------------------------------------------- */

/* O^T += V^T P^T for 16 tq3 tokens straight from registers: lane (g, t)
 * decodes its 32 codes of tokens g and g + 8 (w0, w1: their device-order
 * words), and movmatrix turns the pairs of one lookup into the A fragment
 * of one m-block (rows: value slots in vslot_dim order, columns: tokens),
 * so there is no shared-memory tile and no ldmatrix. */
template <int NT>
__device__ __forceinline__ void accum_values_tq3(float acc[][8][4], const uint32_t *w0, const uint32_t *w1,
                                                 const tq3_lut &T, const uint32_t pb0[NT], const uint32_t pb1[NT])
{
    uint32_t s0[4], s1[4];
    tq3_select32(w0[0], w0[1], w0[2], s0);
    tq3_select32(w1[0], w1[1], w1[2], s1);
#pragma unroll
    for (int mb = 0; mb < 8; mb++) {
        uint32_t p0, p1, q0, q1;
        tq3_lookup4(s0[mb >> 1] >> (16 * (mb & 1)), T, &p0, &p1);
        tq3_lookup4(s1[mb >> 1] >> (16 * (mb & 1)), T, &q0, &q1);
        const uint4 av = make_uint4(movm_trans(p0), movm_trans(p1), movm_trans(q0), movm_trans(q1));
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            mma16816(acc[nt][mb], av, pb0[nt], pb1[nt]);
    }
}

/* The same from plain f16 rows (stride bytes apart, natural slot order). */
template <int NT>
__device__ __forceinline__ void accum_values16_rows(float acc[][8][4], const uint8_t *rows, uint32_t stride, int lane,
                                                    const uint32_t pb0[NT], const uint32_t pb1[NT])
{
    const int row = (lane & 7) + ((lane >> 4) & 1) * 8;
    const int hi = (lane >> 3) & 1;
    const uint32_t base = smem_u32(rows) + (uint32_t)row * stride;
#pragma unroll
    for (int mb = 0; mb < 8; mb++) {
        uint32_t a[4];
        ldsm_x4_trans(base + (uint32_t)(2 * mb + hi) * 16u, a);
        uint4 av = make_uint4(a[0], a[1], a[2], a[3]);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            mma16816(acc[nt][mb], av, pb0[nt], pb1[nt]);
    }
}

/* ---- scalar helpers (any type, any dim): used by the reference kernel - */

/* Code j of a row of `bits`-bit codes (bits <= 8) in stream order (code
 * j's bit b at stream bit bits * j + b, LSB first; kvq_layout.h): one or two
 * bytes. The second byte is read only when the code reaches into it, so a
 * row's last code never reads past the row. */
__device__ __forceinline__ unsigned code_stream(const uint8_t *codes, int bits, int j)
{
    const unsigned pos = (unsigned)(bits * j), sh = pos & 7u;
    unsigned v = (unsigned)codes[pos >> 3] >> sh;
    if (sh + (unsigned)bits > 8u)
        v |= (unsigned)codes[(pos >> 3) + 1] << (8u - sh);
    return v & ((1u << bits) - 1u);
}

/* Code j of a row of d codes of `bits` bits as the CUDA cache stores it
 * (3 bits: device order, kvq_layout.h; else stream order). */
__device__ __forceinline__ unsigned code_get(const uint8_t *codes, int bits, int d, int j)
{
    return bits == 3 ? kvq_dev_code_get(codes, d, j) : code_stream(codes, bits, j);
}

__device__ __forceinline__ float f16_at(const uint8_t *p, int j)
{
    uint16_t h = (uint16_t)(p[2 * j] | (p[2 * j + 1] << 8));
    return kvq_f16_to_f32(h);
}

/* Nibble i (0..31) of a 4-bit block's qs: value i in the low nibble of
 * byte i, value i + 16 in the high one (llama.cpp's q4/q5 packing). */
__device__ __forceinline__ int q4_nibble(const uint8_t *qs, int i)
{
    return i < 16 ? (qs[i] & 15) : (qs[i - 16] >> 4);
}

/* Value i (0..31) of a q5 block: its nibble in qs plus bit i of qh. */
__device__ __forceinline__ int q5_level(const uint8_t *qh, const uint8_t *qs, int i)
{
    return q4_nibble(qs, i) | (((qh[i >> 3] >> (i & 7)) & 1) << 4);
}

/* Element j of a baseline row (f32, f16 and llama.cpp's block layouts, of
 * the row itself or, for the rotated baselines, of R x) as the CPU's decode
 * computes it. */
__device__ __forceinline__ float baseline_elem(int type, const uint8_t *row, int j)
{
    switch (kvq_layout_base_type(type)) {
    case KVQ_TYPE_F32: {
        uint32_t u = (uint32_t)row[4 * j] | ((uint32_t)row[4 * j + 1] << 8) | ((uint32_t)row[4 * j + 2] << 16) |
                     ((uint32_t)row[4 * j + 3] << 24);
        return __uint_as_float(u);
    }
    case KVQ_TYPE_F16:
        return f16_at(row, j);
    case KVQ_TYPE_Q8_0: {
        const uint8_t *blk = row + (j / KVQ_QK) * sizeof(kvq_block_q8_0);
        return (float)(int8_t)blk[offsetof(kvq_block_q8_0, qs) + j % KVQ_QK] * f16_at(blk, 0);
    }
    case KVQ_TYPE_Q4_0: {
        const uint8_t *blk = row + (j / KVQ_QK) * sizeof(kvq_block_q4_0);
        return (float)(q4_nibble(blk + offsetof(kvq_block_q4_0, qs), j % KVQ_QK) - 8) * f16_at(blk, 0);
    }
    case KVQ_TYPE_Q4_1: {
        const uint8_t *blk = row + (j / KVQ_QK) * sizeof(kvq_block_q4_1);
        const int q = q4_nibble(blk + offsetof(kvq_block_q4_1, qs), j % KVQ_QK);
        return __fadd_rn(__fmul_rn((float)q, f16_at(blk, 0)), f16_at(blk, 1));
    }
    case KVQ_TYPE_Q5_0: {
        const uint8_t *blk = row + (j / KVQ_QK) * sizeof(kvq_block_q5_0);
        const int q = q5_level(blk + offsetof(kvq_block_q5_0, qh), blk + offsetof(kvq_block_q5_0, qs), j % KVQ_QK);
        return (float)(q - 16) * f16_at(blk, 0);
    }
    case KVQ_TYPE_Q5_1: {
        const uint8_t *blk = row + (j / KVQ_QK) * sizeof(kvq_block_q5_1);
        const int q = q5_level(blk + offsetof(kvq_block_q5_1, qh), blk + offsetof(kvq_block_q5_1, qs), j % KVQ_QK);
        return __fadd_rn(__fmul_rn((float)q, f16_at(blk, 0)), f16_at(blk, 1));
    }
    default:
        return 0.0f;
    }
}

} /* namespace kvq_cu */

#endif /* KVQ_CUDA_HOOKS_CUH */
