/* forward.c - rows of one or several sequences through every layer, in
 * backend ops.
 *
 * Per layer (the architecture's kinds come from struct kvq_model_arch):
 *   x += Wo . attn(RoPE(norm_q(Wq . norm(x))), RoPE(norm_k(Wk . norm(x))), Wv . norm(x))
 *   x += Wdown . (act(Wgate . norm(x)) * (Wup . norm(x)))
 * or in a sparse layer, over the k experts the router picks for the row:
 *   x += sum_e w_e . Wdown_e . (act(Wgate_e . norm(x)) * (Wup_e . norm(x)))
 * The backend (backend.h) computes, the KV store (kv_store.h) keeps the keys
 * and values and attends; this file only orders the steps, times them and
 * rolls the store back when a step fails.
 *
 * A forward carries segments: T rows of one store sequence at positions
 * pos0.. each (a sequence state's chunk is one segment; a batch step is a
 * decode row for each of many sequences plus prefill chunks). Every op but
 * attention is row-wise, so all rows go through one call; attention goes to
 * the store per run of segments with equal T. On the CPU the projections are
 * split so that every row meets the kernel it would meet if its sequence ran
 * alone (see linear_rows): batching never changes a sequence's bits.
 */
#include "backend.h"
#include "decoder_internal.h"
#include "kv_store.h"
#include "matvec_internal.h"

/* Device backends time their queued work per part with events. */
static void mark(const struct kvq_fwd *f, enum kvq_part part)
{
    if (f->be->ops->mark)
        f->be->ops->mark(f->be, part, 0);
}

/* The CPU backend picks its kernel by row count: the batch-invariant few-row
 * kernel up to KVQ_MATVEC_MAX_M rows, sgemm above. A segment longer than
 * that goes alone (sgemm of exactly the rows it would have alone); shorter
 * segments share calls of at most KVQ_MATVEC_MAX_M rows, where each row's
 * result does not depend on its neighbours. A device backend takes all rows
 * in one call. */
/* The row group that starts at segment i: its rows, and in *next the first
 * segment after it. */
static size_t row_group(const struct kvq_fwd_seg *segs, int n_segs, int i, int *next)
{
    size_t n = segs[i].T;
    int j = i + 1;
    if (n <= KVQ_MATVEC_MAX_M)
        while (j < n_segs && segs[j].T <= KVQ_MATVEC_MAX_M && n + segs[j].T <= KVQ_MATVEC_MAX_M)
            n += segs[j++].T;
    *next = j;
    return n;
}

static void linear_rows(const struct kvq_fwd *f, const struct kvq_fwd_seg *segs, int n_segs, size_t rows,
                        enum kvq_weight w, int layer, const float *x, float *y, int acc)
{
    kvq_backend *be = f->be;
    double t0 = kvq_now();
    mark(f, KVQ_PART_MATMUL);
    if (be->device || n_segs == 1) {
        be->ops->linear(be, w, layer, x, y, rows, acc);
    } else {
        const struct kvq_model *m = f->m;
        const float *W, *B;
        int in, out;
        kvq_weight_pick(&m->layers[layer], (int)w, m->cfg.hidden, m->cfg.ffn, m->q_dim, m->qkv_dim, &W, &B, &in,
                        &out);
        size_t r0 = 0;
        for (int i = 0; i < n_segs;) {
            int j;
            const size_t n = row_group(segs, n_segs, i, &j);
            be->ops->linear(be, w, layer, x + r0 * (size_t)in, y + r0 * (size_t)out, n, acc);
            r0 += n;
            i = j;
        }
    }
    mark(f, KVQ_PART_OTHER);
    f->tm->matmul += kvq_now() - t0;
}

/* A sparse layer's MLP: y += the experts' weighted sum over the rows x
 * (FFN-normed), router and experts in the row groups linear_rows uses, so
 * that on the CPU a row meets the kernels it would meet alone whatever rows
 * it is batched with (each group's rows are routed and grouped by expert
 * among themselves). */
static kvq_status moe_rows(const struct kvq_fwd *f, const struct kvq_fwd_seg *segs, int n_segs, size_t rows,
                           int layer, const float *x, float *y)
{
    kvq_status st = KVQ_OK;
    kvq_backend *be = f->be;
    const size_t h = (size_t)f->m->cfg.hidden;
    double t0 = kvq_now();
    mark(f, KVQ_PART_MATMUL);
    for (int i = 0; i < n_segs;) {
        int j = n_segs; /* a device backend, or one segment: all rows in one call */
        const size_t n = be->device || n_segs == 1 ? rows : row_group(segs, n_segs, i, &j);
        be->ops->moe_route(be, layer, x, n);
        if ((st = be->ops->moe_experts(be, layer, x, y, n)) != KVQ_OK)
            break;
        x += n * h;
        y += n * h;
        i = j;
    }
    mark(f, KVQ_PART_OTHER);
    f->tm->matmul += kvq_now() - t0;
    return st;
}

/* Appends and attends layer l for every segment, one store call per run of
 * segments with the same T (their rows are the store's [n_seqs][T] layout). */
static kvq_status attend_rows(const struct kvq_fwd *f, const struct kvq_fwd_seg *segs, int n_segs, int l)
{
    kvq_kv_store *kv = f->kv;
    const struct kvq_acts *a = &f->be->acts;
    const size_t qd = (size_t)f->m->q_dim, kvd = (size_t)f->m->kv_dim;
    size_t r0 = 0;
    for (int i = 0; i < n_segs;) {
        int j = i + 1;
        while (j < n_segs && segs[j].T == segs[i].T && f->seq_ids)
            j++;
        const int *ids = &segs[i].seq;
        if (j - i > 1) {
            for (int k = i; k < j; k++)
                f->seq_ids[k - i] = segs[k].seq;
            ids = f->seq_ids;
        }
        kvq_status st = kv->ops->append_attend(kv, l, j - i, ids, segs[i].T, a->k + r0 * kvd, a->v + r0 * kvd,
                                               a->q + r0 * qd, a->attn + r0 * qd);
        if (st != KVQ_OK)
            return st;
        r0 += (size_t)(j - i) * segs[i].T;
        i = j;
    }
    return KVQ_OK;
}

/* Every layer for the T rows of the segments (positions in f->pos); on an
 * error the store holds what it held before. */
static kvq_status run_layers(const struct kvq_fwd *f, const int32_t *ids, const struct kvq_fwd_seg *segs, int n_segs,
                             size_t T)
{
    kvq_backend *be = f->be;
    const struct kvq_backend_ops *op = be->ops;
    const struct kvq_acts *a = &be->acts;
    const int n_layers = f->m->cfg.n_layers;
    op->set_pos(be, f->pos, T);
    op->embed(be, ids, T, a->x);
    for (int l = 0; l < n_layers; l++) {
        op->norm(be, KVQ_NORM_ATTN, l, a->x, a->xn, T);
        linear_rows(f, segs, n_segs, T, KVQ_W_QKV, l, a->xn, a->qkv, 0);
        op->qkv_rope(be, l, a->qkv, T, be->pos, a->q, a->k, a->v);
        if (f->hook && !be->device) /* the hook reads host memory */
            for (int i = 0, r = 0; i < n_segs; r += (int)segs[i++].T)
                f->hook(f->hook_user, l, segs[i].pos0, segs[i].T, a->q + (size_t)r * f->m->q_dim,
                        a->k + (size_t)r * f->m->kv_dim, a->v + (size_t)r * f->m->kv_dim);

        double t0 = kvq_now();
        mark(f, KVQ_PART_ATTN);
        kvq_status st = attend_rows(f, segs, n_segs, l);
        mark(f, KVQ_PART_OTHER);
        if (st != KVQ_OK) { /* layers [0, l] back at each segment's pos0 */
            for (int i = 0; i < n_segs; i++)
                f->kv->ops->truncate(f->kv, segs[i].seq, l + 1, segs[i].pos0);
            return st;
        }
        f->tm->attn += kvq_now() - t0;

        /* sandwich norms (Gemma): an output is normed in xn, then added */
        const int sw = f->m->cfg.arch.sandwich_norm;
        linear_rows(f, segs, n_segs, T, KVQ_W_O, l, a->attn, sw ? a->xn : a->x, !sw);
        if (sw)
            op->norm(be, KVQ_NORM_POST_ATTN, l, a->xn, a->x, T);
        op->norm(be, KVQ_NORM_FFN, l, a->x, a->xn, T);
        if (kvq_model_layer_is_moe(&f->m->cfg, l)) { /* no family has sandwich norms and experts */
            if ((st = moe_rows(f, segs, n_segs, T, l, a->xn, a->x)) != KVQ_OK) { /* an expert read failed */
                for (int i = 0; i < n_segs; i++)
                    f->kv->ops->truncate(f->kv, segs[i].seq, l + 1, segs[i].pos0);
                return st;
            }
            continue;
        }
        linear_rows(f, segs, n_segs, T, KVQ_W_GATE_UP, l, a->xn, a->gu, 0);
        op->glu(be, a->gu, a->h, T);
        linear_rows(f, segs, n_segs, T, KVQ_W_DOWN, l, a->h, sw ? a->xn : a->x, !sw);
        if (sw)
            op->norm(be, KVQ_NORM_POST_FFN, l, a->xn, a->x, T);
    }
    return KVQ_OK;
}

/* A decode step (one row per segment) on a device backend may run as one
 * CUDA graph: the pages its appends land in are taken first, so no page
 * table changes inside it (kv_store.h reserve). */
static int step_graph_begin(const struct kvq_fwd *f, const struct kvq_fwd_seg *segs, int n_segs, size_t T,
                            kvq_status *st)
{
    kvq_backend *be = f->be;
    *st = KVQ_OK;
    if (!be->ops->step_begin || (size_t)n_segs != T)
        return 0;
    for (int i = 0; i < n_segs; i++)
        if ((*st = f->kv->ops->reserve(f->kv, segs[i].seq, 1)) != KVQ_OK)
            return 0;
    return be->ops->step_begin(be, T);
}

kvq_status kvq_forward_rows(const struct kvq_fwd *f, const int32_t *ids, const struct kvq_fwd_seg *segs, int n_segs)
{
    kvq_backend *be = f->be;
    const struct kvq_backend_ops *op = be->ops;
    size_t T = 0;
    for (int i = 0; i < n_segs; i++)
        for (size_t t = 0; t < segs[i].T; t++)
            f->pos[T++] = (int32_t)(segs[i].pos0 + t);
    if (T == 0 || T > be->max_rows)
        return KVQ_ERR_INVALID_ARG;
    if (op->mark)
        op->mark(be, KVQ_PART_OTHER, T);
    kvq_status st;
    const int graph = step_graph_begin(f, segs, n_segs, T, &st);
    if (st != KVQ_OK)
        return st;
    st = run_layers(f, ids, segs, n_segs, T);
    if (!graph)
        return st;
    if (st == KVQ_OK && op->step_end(be) == KVQ_OK)
        return KVQ_OK;
    /* nothing of the step ran: its calls did not match the recorded graph
     * (a kernel choice that changed with the lengths), the capture failed,
     * or an op failed (run_layers has undone its layers). Undo the host
     * state and run the step as queued, which also reports a real error. */
    if (st == KVQ_OK)
        for (int i = 0; i < n_segs; i++)
            f->kv->ops->truncate(f->kv, segs[i].seq, f->m->cfg.n_layers, segs[i].pos0);
    else
        op->step_cancel(be);
    return run_layers(f, ids, segs, n_segs, T);
}
