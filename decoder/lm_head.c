/* lm_head.c - final norm and the LM head, one vocabulary slice at a time.
 *
 * Slices bound the scratch memory (rows x slice) and are the unit a sharded
 * model stores. When only the greedy token is wanted, each slice is reduced
 * to (best score, id) per row as soon as it is computed, so the full
 * [rows][vocab] logits never exist.
 */
#include <cblas.h>
#include <math.h>

#include "kvq_sampler.h"

#include "decoder_internal.h"
#include "matvec_internal.h"

kvq_status kvq_lm_head(kvq_seq *s, size_t T, size_t r0, float *logits, int32_t *argmax)
{
    const kvq_model *m = s->m;
    const struct kvq_model_config *c = &m->cfg;
    int h = c->hidden;
    int R = (int)(T - r0);
    if (R <= 0 || (!logits && !argmax))
        return KVQ_OK;
    double t0 = kvq_now();
    for (int r = 0; r < R; r++) {
        const float *x = s->x + (r0 + (size_t)r) * (size_t)h;
        float *y = s->lm_x + (size_t)r * h;
        double ss = 0.0;
        for (int i = 0; i < h; i++)
            ss += (double)x[i] * x[i];
        float inv = (float)(1.0 / sqrt(ss / h + c->rms_eps));
        for (int i = 0; i < h; i++)
            y[i] = m->final_norm[i] * (x[i] * inv);
        s->lm_best[r] = kvq_best_none();
    }
    kvq_status st = KVQ_OK;
    for (int k = 0; k < m->n_lm; k++) {
        const struct kvq_lm_slice *sl = &m->lm[k];
        /* With full logits wanted, write each slice straight into its columns. */
        float *out = logits ? logits + sl->start : s->lm_out;
        int ldc = logits ? c->vocab : sl->count;
        if (R <= KVQ_MATVEC_MAX_M) /* batch-invariant: verify rows equal decode rows */
            kvq_matvec(s->lm_x, h, sl->w, out, ldc, R, sl->count, h, 0);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, sl->count, h, 1.0f, s->lm_x, h, sl->w, h, 0.0f,
                        out, ldc);
        for (int r = 0; argmax && r < R && st == KVQ_OK; r++) {
            kvq_best b;
            st = kvq_argmax(out + (size_t)r * ldc, sl->count, sl->start, &b);
            kvq_best_merge(&s->lm_best[r], b); /* ties: lowest id, whatever the slice order */
        }
    }
    for (int r = 0; argmax && r < R; r++)
        argmax[r] = s->lm_best[r].token;
    s->tm.lm_head += kvq_now() - t0;
    return st;
}
