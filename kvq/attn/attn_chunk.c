/* attn_chunk.c - causal attention for a chunk of query positions (prefill),
 * tiled: each block of keys/values is decoded once per pass (up to four
 * query tiles) and then scored against every row of the pass, tile by tile,
 * instead of once per query row as a decode per position does
 * (kvq_attn_causal_ref, kept as the reference).
 *
 * A row is one (position p, query head) of the tile. Its view is exactly the
 * one kvq_attn_decode(c, kv_head, p + 1, ...) reads (kvq_cache_f16_view of
 * p + 1 tokens): packed keys [se, pe), f16 rows [0, se) and [max(tl, se), p + 1).
 * Blocks are laid on absolute positions (at most KVQ_ATTN_BLOCK tokens, never
 * across a page or a multiple of KVQ_ATTN_BLOCK), so the keys a row meets in
 * each block, and so its result, do not depend on which tile or chunk the row
 * is computed in: a caller may split a chunk into tiles across threads and
 * get the same bits.
 *
 * Blocks are decoded into the input domain (codec decode, plus the page's key
 * mean with key centring; f16 rows converted), so the kernels are plain f32
 * products: scores = q . k over the block, an online softmax per row (exp in
 * float, maxima and weight sums in double), and the weighted values summed
 * in float per block and folded into double accumulators, as the decode
 * kernels do (the error does not grow with the context).
 */
#include <math.h>
#include <string.h>

#include "attn_internal.h"
#include "kvq_half.h"
#include "kvq_cpu.h"

/* The scalar block step (also the fallback where the AVX2 one does not apply). */
static void chunk_block_scalar(const struct kvq_attn_chunk_rows *R, const float *kt, const float *v, int d,
                               float scale, float *tmp)
{
    float *s = tmp, *o = tmp + KVQ_ATTN_BLOCK;
    for (int r = 0; r < R->n; r++) {
        const float *q = R->q[r];
        const uint32_t lo = R->lo[r], hi = R->hi[r];
        float mx = -INFINITY;
        for (uint32_t j = lo; j < hi; j++) {
            float dot = 0;
            for (int i = 0; i < d; i++)
                dot = fmaf(q[i], kt[(size_t)i * KVQ_ATTN_BLOCK + j], dot);
            s[j] = dot * scale;
            mx = s[j] > mx ? s[j] : mx;
        }
        double *m = R->m[r], *acc = R->acc[r];
        const double mn = *m > mx ? *m : mx;
        const double alpha = *m == -INFINITY ? 0.0 : exp(*m - mn);
        const float mf = (float)mn;
        float sum = 0;
        memset(o, 0, (size_t)d * sizeof *o);
        for (uint32_t j = lo; j < hi; j++) {
            const float w = expf(s[j] - mf);
            sum += w;
            for (int i = 0; i < d; i++)
                o[i] = fmaf(w, v[(size_t)j * d + i], o[i]);
        }
        *m = mn;
        *R->l[r] = *R->l[r] * alpha + sum;
        for (int i = 0; i < d; i++)
            acc[i] = acc[i] * alpha + o[i];
    }
}

const struct kvq_attn_chunk_kernels kvq_attn_chunk_kernels_scalar = {chunk_block_scalar};

/* Decodes packed tokens [t0, t0 + n) (one page) of kv_head into k, v
 * ([n][d] each) and k's transpose kt ([d][KVQ_ATTN_BLOCK]). */
static void decode_packed(const kvq_cache *c, int kv_head, size_t t0, uint32_t n, float *k, float *v, float *mean)
{
    const struct kvq_page_layout *pl = kvq_cache_layout(c);
    const kvq_codec *ck = kvq_cache_codec_k(c), *cv = kvq_cache_codec_v(c);
    const size_t P = pl->page_tokens, d = pl->dim, page = t0 / P;
    const uint8_t *base = kvq_cache_page(c, page);
    const uint8_t *kch = base + pl->k_off + (uint64_t)kv_head * pl->k.bytes;
    const uint8_t *vch = base + pl->v_off + (uint64_t)kv_head * pl->v.bytes;
    const uint8_t *mb = pl->mean_bytes ? kvq_cache_key_mean(c, page, kv_head) : NULL;
    if (mb)
        kvq_key_mean_decode(mb, (int)d, mean);
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t slot = (uint32_t)((t0 + i) % P);
        struct kvq_row rk = kvq_attn_row(&pl->k, kch, slot), rv = kvq_attn_row(&pl->v, vch, slot);
        ck->traits->decode(ck, &rk, k + i * d);
        cv->traits->decode(cv, &rv, v + i * d);
        for (size_t j = 0; mb && j < d; j++)
            k[i * d + j] += mean[j];
    }
}

/* f16 rows [t0, t0 + n) of kv_head: the cache's copies, or (rec) the ones
 * its caller kept. */
static kvq_status load_f16(const kvq_cache *c, const struct kvq_attn_recent *rec, int kv_head, size_t t0,
                           uint32_t n, size_t d, float *k, float *v)
{
    const size_t H = (size_t)kvq_cache_config_of(c)->n_kv_heads;
    for (uint32_t i = 0; i < n; i++) {
        const uint16_t *hk, *hv;
        if (rec) {
            const size_t at = ((t0 + i - rec->pos) * H + (size_t)kv_head) * d;
            hk = rec->k + at;
            hv = rec->v + at;
        } else {
            hk = kvq_cache_f16_row(c, 0, kv_head, t0 + i);
            hv = kvq_cache_f16_row(c, 1, kv_head, t0 + i);
            if (!hk || !hv)
                return KVQ_ERR_INTERNAL; /* the view names only rows the cache holds */
        }
        kvq_f16_to_f32_n(hk, k + i * d, d);
        kvq_f16_to_f32_n(hv, v + i * d, d);
    }
    return KVQ_OK;
}

/* Where one source's rows come from. */
enum source { SRC_PACKED, SRC_F16, SRC_RECENT };

/* The rows' intervals in one source: position r of the pass sees keys [lo[r], hi[r]). */
struct spans {
    size_t lo[KVQ_ATTN_PASS_POS], hi[KVQ_ATTN_PASS_POS];
};

/* Runs every block of [min lo, max hi) of one source (the pages, the
 * cache's f16 rows or the caller's) over the pass's rows (np positions x n_q heads): each
 * block is decoded once, then stepped tile by tile (tp positions each). */
static kvq_status run_source(const struct kvq_attn_chunk_kernels *kr, const kvq_cache *c,
                             const struct kvq_attn_recent *rec, int kv_head, enum source src,
                             const struct spans *sp, size_t np, size_t tp, const float *q, int n_q, float scale,
                             kvq_attn_workspace *ws)
{
    const size_t d = (size_t)ws->dim, P = kvq_cache_layout(c)->page_tokens, B = KVQ_ATTN_BLOCK;
    size_t a = SIZE_MAX, b = 0;
    for (size_t r = 0; r < np; r++)
        if (sp->lo[r] < sp->hi[r]) {
            a = sp->lo[r] < a ? sp->lo[r] : a;
            b = sp->hi[r] > b ? sp->hi[r] : b;
        }
    float *k = ws->ck, *v = ws->cv, *kt = ws->ckt;
    for (size_t t0 = a; t0 < b;) {
        size_t end = (t0 / B + 1) * B, pend = (t0 / P + 1) * P;
        end = end < pend ? end : pend;
        end = end < b ? end : b;
        const uint32_t n = (uint32_t)(end - t0), off = (uint32_t)(t0 % B);
        /* rows at [off, off + n) of the block, so a row's keys keep their lanes */
        if (src == SRC_PACKED) {
            decode_packed(c, kv_head, t0, n, k + off * d, v + off * d, ws->row);
        } else {
            kvq_status st = load_f16(c, src == SRC_RECENT ? rec : NULL, kv_head, t0, n, d, k + off * d, v + off * d);
            if (st != KVQ_OK)
                return st;
        }
        for (size_t i = 0; i < d; i++)
            for (uint32_t j = off; j < off + n; j++)
                kt[i * B + j] = k[j * d + i];
        struct kvq_attn_chunk_rows *R = ws->cr;
        for (size_t r0 = 0; r0 < np; r0 += tp) {
            const size_t r1 = np - r0 < tp ? np : r0 + tp;
            R->n = 0;
            for (size_t r = r0; r < r1; r++) {
                size_t lo = sp->lo[r] > t0 ? sp->lo[r] : t0, hi = sp->hi[r] < end ? sp->hi[r] : end;
                if (lo >= hi)
                    continue;
                for (int h = 0; h < n_q; h++) {
                    const size_t row = r * (size_t)n_q + (size_t)h;
                    const int i = R->n++;
                    R->q[i] = q + row * d;
                    R->lo[i] = (uint32_t)(lo - t0 + off);
                    R->hi[i] = (uint32_t)(hi - t0 + off);
                    R->m[i] = &ws->cm[row];
                    R->l[i] = &ws->cl[row];
                    R->acc[i] = ws->cacc + row * d;
                }
            }
            if (R->n)
                kr->block(R, kt, v, (int)d, scale, ws->crow);
        }
        t0 = end;
    }
    return KVQ_OK;
}

/* One pass: positions [p0, p0 + np), np <= KVQ_ATTN_PASS_TILES tiles of tp. */
static kvq_status chunk_pass(const struct kvq_attn_chunk_kernels *kr, const kvq_cache *c,
                             const struct kvq_attn_recent *rec, int kv_head, size_t p0, size_t np, size_t tp,
                             const float *q, int n_q, float scale, float *out, kvq_attn_workspace *ws)
{
    const size_t d = (size_t)ws->dim, rows = np * (size_t)n_q, P = kvq_cache_layout(c)->page_tokens;
    struct spans pk, sink, tail;
    for (size_t r = 0; r < np; r++) {
        size_t se, tl;
        const size_t n = p0 + r + 1;
        kvq_status st = kvq_cache_f16_view(c, n, &se, &tl);
        if (st != KVQ_OK)
            return st;
        if (rec) /* the view as the ring held it when n was the length (see kvq_attn_recent) */
            tl = n % P == 0 ? n : n - n % P > rec->pos ? n - n % P : rec->pos;
        const size_t pe = tl > se ? tl : se;
        pk.lo[r] = se;
        pk.hi[r] = pe;
        sink.lo[r] = 0;
        sink.hi[r] = se;
        tail.lo[r] = pe; /* = max(tl, se) */
        tail.hi[r] = n;
    }
    for (size_t r = 0; r < rows; r++) {
        ws->cm[r] = -INFINITY;
        ws->cl[r] = 0.0;
    }
    memset(ws->cacc, 0, rows * d * sizeof *ws->cacc);
    kvq_status st = run_source(kr, c, rec, kv_head, SRC_PACKED, &pk, np, tp, q, n_q, scale, ws);
    if (st == KVQ_OK)
        st = run_source(kr, c, rec, kv_head, SRC_F16, &sink, np, tp, q, n_q, scale, ws);
    if (st == KVQ_OK)
        st = run_source(kr, c, rec, kv_head, rec ? SRC_RECENT : SRC_F16, &tail, np, tp, q, n_q, scale, ws);
    if (st != KVQ_OK)
        return st;
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < d; j++) {
            const double o = ws->cacc[r * d + j] / ws->cl[r];
            out[r * d + j] = (float)o;
            /* Only a float overflow of the scores (queries near FLT_MAX) gets here. */
            if (!isfinite(o) || !isfinite((float)o))
                return KVQ_ERR_RANGE;
        }
    return KVQ_OK;
}

size_t kvq_attn_causal_span(int n_q)
{
    return n_q < 1 ? 0 : KVQ_ATTN_PASS_TILES * kvq_attn_chunk_positions(n_q);
}

kvq_status kvq_attn_causal_kernels(const struct kvq_attn_chunk_kernels *kr, const kvq_cache *c, int kv_head,
                                   size_t pos0, size_t T, const float *q, int n_q, float scale, float *out,
                                   kvq_attn_workspace *ws, const struct kvq_attn_recent *rec)
{
    if (!c || T == 0 || pos0 > SIZE_MAX - T)
        return KVQ_ERR_INVALID_ARG;
    kvq_status st = kvq_attn_check_args(c, kv_head, pos0 + T, q, n_q, scale, out, ws);
    if (st != KVQ_OK)
        return st;
    if (rec && (!rec->k || !rec->v || !kvq_cache_config_of(c)->recent_f16 || rec->pos > pos0 ||
                rec->n < pos0 + T - rec->pos))
        return KVQ_ERR_INVALID_ARG;
    const size_t stride = (size_t)n_q * (size_t)ws->dim, tp = kvq_attn_chunk_positions(n_q);
    const size_t pass = KVQ_ATTN_PASS_TILES * tp;
    if ((st = kvq_attn_check_queries(q, T * (size_t)n_q, ws->dim)) != KVQ_OK)
        return st;
    for (size_t t = 0; t < T && st == KVQ_OK; t += pass) {
        const size_t np = T - t < pass ? T - t : pass;
        st = chunk_pass(kr, c, rec, kv_head, pos0 + t, np, tp, q + t * stride, n_q, scale, out + t * stride, ws);
    }
    return st;
}

/* The kernels kvq_attn_decode would pick (attn.c) for the cache's head_dim. */
static const struct kvq_attn_chunk_kernels *chunk_kernels(const kvq_cache *c)
{
    const int d = c ? kvq_cache_config_of(c)->head_dim : 0;
    if (kvq_cpu_has_avx2() && d % 8 == 0)
        return kvq_attn_avx512_usable() && d % 16 == 0 ? &kvq_attn_chunk_kernels_avx512 : &kvq_attn_chunk_kernels_avx2;
    return &kvq_attn_chunk_kernels_scalar;
}

kvq_status kvq_attn_causal(const kvq_cache *c, int kv_head, size_t pos0, size_t T, const float *q, int n_q,
                           float scale, float *out, kvq_attn_workspace *ws)
{
    return kvq_attn_causal_kernels(chunk_kernels(c), c, kv_head, pos0, T, q, n_q, scale, out, ws, NULL);
}

kvq_status kvq_attn_causal_recent(const kvq_cache *c, int kv_head, size_t pos0, size_t T, const float *q, int n_q,
                                  float scale, float *out, kvq_attn_workspace *ws, const struct kvq_attn_recent *rec)
{
    if (!rec)
        return KVQ_ERR_INVALID_ARG;
    return kvq_attn_causal_kernels(chunk_kernels(c), c, kv_head, pos0, T, q, n_q, scale, out, ws, rec);
}

kvq_status kvq_attn_causal_ref(const kvq_cache *c, int kv_head, size_t pos0, size_t T, const float *q, int n_q,
                               float scale, float *out, kvq_attn_workspace *ws)
{
    if (!c || T == 0 || pos0 > SIZE_MAX - T)
        return KVQ_ERR_INVALID_ARG;
    kvq_status st = kvq_attn_check_args(c, kv_head, pos0 + T, q, n_q, scale, out, ws);
    if (st != KVQ_OK)
        return st;
    const size_t stride = (size_t)n_q * (size_t)ws->dim;
    if ((st = kvq_attn_check_queries(q, T * (size_t)n_q, ws->dim)) != KVQ_OK)
        return st;
    /* Each position is one decode over its own prefix: exact causal masking. */
    for (size_t t = 0; t < T; t++) {
        st = kvq_attn_decode(c, kv_head, pos0 + t + 1, q + t * stride, n_q, scale, out + t * stride, ws);
        if (st != KVQ_OK)
            return st;
    }
    return KVQ_OK;
}
