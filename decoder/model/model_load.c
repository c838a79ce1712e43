/* model_load.c - kvq_model_load: a plain Hugging Face directory or a `kvq
 * shard` directory, through the same structures.
 *
 * Both layouts end up as a list of mapped safetensors files plus, for each
 * weight, the file that must hold it: a plain directory may keep any tensor
 * in any file (the index says where), a sharded one must keep each tensor in
 * the shard the manifest assigns it to. Every tensor's dtype and shape are
 * checked against the config. Weight matrices stay where the mapping puts
 * them, in the file's dtype (struct kvq_wmat: [q; k; v] and [gate; up] as
 * stacked blocks, so projections reading the same input are still one
 * product); norms and biases are converted to f32 in one arena, and with
 * weights_f32 the matrices too, fused into single f32 blocks.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoder_internal.h"
#include "kvq_manifest.h"

#define ANY_FILE (-1)

struct loader {
    kvq_model *m;
    const char *dir;
    struct kvq_manifest man;     /* sharded only */
    int *layer_file;             /* [n_layers]: file holding layer l, or ANY_FILE */
    int embed_file, norm_file;   /* likewise */
    float *cur;                  /* arena fill pointer */
    int f32;                     /* kvq_model_load_opts.weights_f32 */
    kvq_error *err;
};

void kvq_model_load_opts_default(struct kvq_model_load_opts *o)
{
    o->lm_head_slice_rows = 8192;
    o->verify_checksums = 1;
    o->weights_f32 = 0;
}

/* Sharded directory: manifest first, validated against config and files
 * before anything is mapped. */
static kvq_status open_sharded(struct loader *L, const char *manifest_path, const struct kvq_model_load_opts *o)
{
    size_t len;
    errno = 0;
    char *text = kvq_read_text(manifest_path, 1u << 26, &len);
    if (!text)
        return kvq_error_set(L->err, KVQ_ERR_IO, "%s: cannot read: %s", manifest_path,
                             errno ? strerror(errno) : "larger than 64 MiB");
    kvq_status st = kvq_manifest_parse(text, len, &L->man, L->err);
    free(text);
    if (st == KVQ_OK)
        st = kvq_manifest_validate(&L->man, &L->m->cfg, L->err);
    if (st == KVQ_OK)
        st = kvq_manifest_check_files(&L->man, L->dir, o->verify_checksums, L->err);
    for (size_t i = 0; st == KVQ_OK && i < L->man.n_shards; i++) {
        const struct kvq_shard *sh = &L->man.shards[i];
        st = kvq_files_open(&L->m->fs, L->dir, sh->file, L->err);
        if (sh->kind == KVQ_SHARD_EMBED)
            L->embed_file = (int)i;
        for (int l = sh->begin; sh->kind == KVQ_SHARD_LAYERS && l < sh->end; l++)
            L->layer_file[l] = (int)i;
        if (sh->kind == KVQ_SHARD_LAYERS && sh->end == L->m->cfg.n_layers)
            L->norm_file = (int)i;
    }
    return st;
}

/* Finds a tensor in file fi (or any file) and checks it is a float tensor of
 * the expected shape. */
static kvq_status find(struct loader *L, int fi, const char *name, int n_dims, int64_t d0, int64_t d1,
                       const struct kvq_st_tensor **out)
{
    int where = -1;
    const struct kvq_st_tensor *t = kvq_files_find(&L->m->fs, fi, name, &where);
    if (!t) {
        if (fi != ANY_FILE)
            return kvq_error_set(L->err, KVQ_ERR_FORMAT, "%s/%s: missing tensor '%s'", L->dir,
                                 L->man.shards[fi].file, name);
        return kvq_error_set(L->err, KVQ_ERR_FORMAT, "%s: missing tensor '%s'", L->dir, name);
    }
    if (t->dtype != KVQ_ST_F32 && t->dtype != KVQ_ST_F16 && t->dtype != KVQ_ST_BF16)
        return kvq_error_set(L->err, KVQ_ERR_FORMAT, "%s: tensor '%s' has dtype %s (weights must be F32, F16 or BF16)",
                             L->dir, name, kvq_st_dtype_name(t->dtype));
    if (L->m->sharded && t->dtype != L->man.dtype)
        return kvq_error_set(L->err, KVQ_ERR_FORMAT, "%s/%s: tensor '%s' has dtype %s, the manifest declares %s",
                             L->dir, L->man.shards[where].file, name, kvq_st_dtype_name(t->dtype),
                             kvq_st_dtype_name(L->man.dtype));
    int64_t shape[2] = {d0, d1};
    kvq_error e2;
    if (kvq_st_expect(t, KVQ_ST_DTYPE_COUNT, n_dims, shape, &e2) != KVQ_OK)
        return kvq_error_set(L->err, KVQ_ERR_FORMAT, "%s: %s (from config.json)", L->dir, e2.msg);
    *out = t;
    return KVQ_OK;
}

/* Converts a whole tensor to f32 at dst. */
static kvq_status load_into(struct loader *L, int fi, const char *name, int n_dims, int64_t d0, int64_t d1,
                            float *dst)
{
    const struct kvq_st_tensor *t;
    kvq_status st = find(L, fi, name, n_dims, d0, d1, &t);
    if (st == KVQ_OK)
        st = kvq_st_to_f32(t, dst, t->n_elements);
    return st;
}

/* Takes n floats from the arena, 64-byte aligned. */
static float *take(struct loader *L, size_t n)
{
    float *p = L->cur;
    L->cur += (n + 15) & ~(size_t)15;
    return p;
}

static size_t round16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

static size_t arena_size(const kvq_model *m, int f32)
{
    const struct kvq_model_config *c = &m->cfg;
    size_t h = (size_t)c->hidden, f = (size_t)c->ffn;
    size_t per = round16(h) * (c->arch.sandwich_norm ? 4 : 2);
    if (f32)
        per += round16((size_t)m->qkv_dim * h) + round16(h * m->q_dim) + round16(2 * f * h) + round16(h * f);
    if (c->arch.qkv_bias)
        per += round16((size_t)m->qkv_dim);
    if (c->arch.qk_norm)
        per += 2 * round16((size_t)c->head_dim);
    if (c->arch.qk_norm_full)
        per += round16((size_t)m->q_dim) + round16((size_t)m->kv_dim);
    if (c->arch.o_bias)
        per += round16(h);
    if (c->arch.mlp_bias)
        per += round16(2 * f) + round16(h);
    return per * (size_t)c->n_layers + round16(h) +
           (f32 ? round16((size_t)c->vocab * h) + 16 * (size_t)m->n_lm + kvq_moe_arena_floats(c) : 0);
}

/* A projection from n stacked tensors dir/model.layers.l.SUFFIX[i] of rows[i]
 * rows each: mapped blocks in the file's dtype, or (weights_f32) one f32
 * block in the arena, also returned in *f32. */
static kvq_status load_mat(struct loader *L, int fi, int l, const char *const *suffix, const int64_t *rows, int n,
                           int64_t cols, struct kvq_wmat *wm, const float **f32)
{
    char name[160];
    int64_t total = 0;
    for (int i = 0; i < n; i++)
        total += rows[i];
    memset(wm, 0, sizeof *wm);
    wm->rows = (int)total;
    wm->cols = (int)cols;
    float *p = L->f32 ? take(L, (size_t)(total * cols)) : NULL;
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix[i]);
        const struct kvq_st_tensor *t;
        kvq_status st = find(L, fi, name, 2, rows[i], cols, &t);
        if (st == KVQ_OK && p)
            st = kvq_st_to_f32(t, p + off * cols, t->n_elements);
        if (st != KVQ_OK)
            return st;
        if (!p)
            wm->b[wm->n_blocks++] = (struct kvq_wblock){t->data, t->dtype, (int)rows[i]};
        off += rows[i];
    }
    if (p)
        wm->b[wm->n_blocks++] = (struct kvq_wblock){p, KVQ_ST_F32, (int)total};
    *f32 = p;
    return KVQ_OK;
}

static kvq_status load_layer(struct loader *L, int l)
{
    const struct kvq_model_config *c = &L->m->cfg;
    struct kvq_layer_weights *w = &L->m->layers[l];
    int fi = L->layer_file[l];
    int64_t h = c->hidden, q = L->m->q_dim, kv = L->m->kv_dim, f = c->ffn, hd = c->head_dim;
    char name[160];
    kvq_status st = KVQ_OK;
#define LOAD(suffix, nd, a, b, dst)                                                              \
    do {                                                                                         \
        snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);                            \
        if ((st = load_into(L, fi, name, nd, a, b, dst)) != KVQ_OK)                              \
            return st;                                                                           \
    } while (0)
    float *p;
    struct kvq_wmat *mats = L->m->mats[l];
    static const char *const qkv3[] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"};
    static const char *const qkv1[] = {"self_attn.qkv_proj.weight"};
    static const char *const gu2[] = {"mlp.gate_proj.weight", "mlp.up_proj.weight"};
    static const char *const gu1[] = {"mlp.gate_up_proj.weight"};
    static const char *const o1[] = {"self_attn.o_proj.weight"};
    static const char *const down1[] = {"mlp.down_proj.weight"};
    const int fused = c->arch.fused_proj;
    const int64_t qkv_rows[3] = {q, kv, kv}, qkv_fused[1] = {q + 2 * kv}, gu_rows[2] = {f, f}, gu_fused[1] = {2 * f};
    const int64_t hrows[1] = {h};
    w->attn_norm = p = take(L, (size_t)h);
    LOAD("input_layernorm.weight", 1, h, 0, p);
    if ((st = load_mat(L, fi, l, fused ? qkv1 : qkv3, fused ? qkv_fused : qkv_rows, fused ? 1 : 3, h,
                       &mats[KVQ_WEIGHT_QKV], &w->wqkv)) != KVQ_OK)
        return st;
    if (c->arch.qkv_bias) {
        w->bqkv = p = take(L, (size_t)L->m->qkv_dim);
        LOAD("self_attn.q_proj.bias", 1, q, 0, p);
        LOAD("self_attn.k_proj.bias", 1, kv, 0, p + q);
        LOAD("self_attn.v_proj.bias", 1, kv, 0, p + q + kv);
    }
    if (c->arch.qk_norm || c->arch.qk_norm_full) { /* per head, or over the whole projection (OLMoE) */
        const int64_t qn = c->arch.qk_norm_full ? q : hd, kn = c->arch.qk_norm_full ? kv : hd;
        w->q_norm = p = take(L, (size_t)qn);
        LOAD("self_attn.q_norm.weight", 1, qn, 0, p);
        w->k_norm = p = take(L, (size_t)kn);
        LOAD("self_attn.k_norm.weight", 1, kn, 0, p);
    }
    if ((st = load_mat(L, fi, l, o1, hrows, 1, q, &mats[KVQ_WEIGHT_O], &w->wo)) != KVQ_OK)
        return st;
    if (c->arch.o_bias) {
        w->bo = p = take(L, (size_t)h);
        LOAD("self_attn.o_proj.bias", 1, h, 0, p);
    }
    if (c->arch.sandwich_norm) { /* Gemma: input, post-attention, pre- and post-feedforward */
        w->post_attn_norm = p = take(L, (size_t)h);
        LOAD("post_attention_layernorm.weight", 1, h, 0, p);
        w->ffn_norm = p = take(L, (size_t)h);
        LOAD("pre_feedforward_layernorm.weight", 1, h, 0, p);
        w->post_ffn_norm = p = take(L, (size_t)h);
        LOAD("post_feedforward_layernorm.weight", 1, h, 0, p);
    } else {
        w->ffn_norm = p = take(L, (size_t)h);
        LOAD("post_attention_layernorm.weight", 1, h, 0, p);
    }
    if (kvq_model_layer_is_moe(c, l)) /* router and experts instead of the dense MLP */
        return kvq_moe_load_layer(L->m, fi, l, L->f32 ? &L->cur : NULL, L->dir, L->err);
    if ((st = load_mat(L, fi, l, fused ? gu1 : gu2, fused ? gu_fused : gu_rows, fused ? 1 : 2, h,
                       &mats[KVQ_WEIGHT_GATE_UP], &w->wgu)) != KVQ_OK)
        return st;
    if (c->arch.mlp_bias) {
        w->bgu = p = take(L, (size_t)(2 * f));
        LOAD("mlp.gate_proj.bias", 1, f, 0, p);
        LOAD("mlp.up_proj.bias", 1, f, 0, p + f);
    }
    if ((st = load_mat(L, fi, l, down1, hrows, 1, f, &mats[KVQ_WEIGHT_DOWN], &w->wdown)) != KVQ_OK)
        return st;
    if (c->arch.mlp_bias) {
        w->bdown = p = take(L, (size_t)h);
        LOAD("mlp.down_proj.bias", 1, h, 0, p);
    }
#undef LOAD
    return KVQ_OK;
}

/* An LM-head slice: count rows of tensor t from element first on, mapped,
 * or converted into the arena (weights_f32). */
static void lm_slice_set(struct loader *L, struct kvq_lm_slice *s, const struct kvq_st_tensor *t, size_t first)
{
    const size_t h = (size_t)L->m->cfg.hidden, n = (size_t)s->count * h;
    s->wm.rows = s->count;
    s->wm.cols = (int)h;
    s->wm.n_blocks = 1;
    if (L->f32) {
        float *p = take(L, n);
        kvq_st_to_f32_range(t, first, n, p);
        s->w = p;
        s->wm.b[0] = (struct kvq_wblock){p, KVQ_ST_F32, s->count};
    } else {
        s->w = NULL;
        s->wm.b[0] = (struct kvq_wblock){(const uint8_t *)t->data + first * kvq_st_dtype_size(t->dtype), t->dtype,
                                         s->count};
    }
}

/* LM head: the manifest's slices, or for a plain directory the lm_head (or
 * tied embedding) tensor cut into slices of slice_rows rows. */
static kvq_status load_lm_head(struct loader *L, int slice_rows)
{
    kvq_model *m = L->m;
    const struct kvq_model_config *c = &m->cfg;
    int64_t h = c->hidden;
    if (m->sharded) {
        int k = 0;
        for (size_t i = 0; i < L->man.n_shards; i++) {
            const struct kvq_shard *sh = &L->man.shards[i];
            if (sh->kind != KVQ_SHARD_LM_HEAD)
                continue;
            struct kvq_lm_slice *s = &m->lm[k++];
            s->start = sh->begin;
            s->count = sh->end - sh->begin;
            const struct kvq_st_tensor *t;
            kvq_status st = find(L, (int)i, "lm_head.weight", 2, s->count, h, &t);
            if (st != KVQ_OK)
                return st;
            lm_slice_set(L, s, t, 0);
        }
        return KVQ_OK;
    }
    const char *name = c->arch.tied_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    const struct kvq_st_tensor *t;
    kvq_status st = find(L, ANY_FILE, name, 2, c->vocab, h, &t);
    for (int k = 0; st == KVQ_OK && k < m->n_lm; k++) {
        m->lm[k].start = k * slice_rows;
        m->lm[k].count = c->vocab - m->lm[k].start < slice_rows ? c->vocab - m->lm[k].start : slice_rows;
        lm_slice_set(L, &m->lm[k], t, (size_t)m->lm[k].start * (size_t)h);
    }
    return st;
}

static int cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* kvq_model_arch.key_outlier_layers: the layers whose k_proj bias norm is
 * at least KVQ_KEY_OUTLIER_RATIO x the median over layers. */
static kvq_status mark_key_outliers(kvq_model *m)
{
    struct kvq_model_config *c = &m->cfg;
    memset(c->arch.key_outlier_layers, 0, sizeof c->arch.key_outlier_layers);
    if (!c->arch.qkv_bias || c->n_layers < 3)
        return KVQ_OK; /* a median of fewer layers says nothing */
    float *norm = malloc(2 * (size_t)c->n_layers * sizeof *norm);
    if (!norm)
        return KVQ_ERR_NOMEM;
    for (int l = 0; l < c->n_layers; l++) {
        const float *b = m->layers[l].bqkv + m->q_dim;
        double s = 0;
        for (int i = 0; i < m->kv_dim; i++)
            s += (double)b[i] * b[i];
        norm[l] = norm[c->n_layers + l] = (float)sqrt(s);
    }
    qsort(norm + c->n_layers, (size_t)c->n_layers, sizeof *norm, cmp_float);
    const float median = norm[c->n_layers + (c->n_layers - 1) / 2]; /* the lower one: 2 outliers of 4 stay outliers */
    for (int l = 0; l < c->n_layers; l++)
        if (median > 0 && norm[l] >= KVQ_KEY_OUTLIER_RATIO * median)
            c->arch.key_outlier_layers[l / 8] |= (uint8_t)(1u << (l % 8));
    free(norm);
    return KVQ_OK;
}

static kvq_status load(struct loader *L, const struct kvq_model_load_opts *o)
{
    kvq_model *m = L->m;
    const struct kvq_model_config *c = &m->cfg;
    char path[KVQ_PATH_MAX];
    if (kvq_path_join(path, sizeof path, L->dir, KVQ_MANIFEST_FILE) != 0)
        return kvq_error_set(L->err, KVQ_ERR_INVALID_ARG, "%s: path too long", L->dir);
    m->sharded = kvq_file_exists(path);
    kvq_status st;
    char cfg_path[KVQ_PATH_MAX];
    if (kvq_path_join(cfg_path, sizeof cfg_path, L->dir, "config.json") != 0)
        return kvq_error_set(L->err, KVQ_ERR_INVALID_ARG, "%s: path too long", L->dir);
    if ((st = kvq_model_config_load(cfg_path, &m->cfg, L->err)) != KVQ_OK)
        return st;
    m->q_dim = c->n_heads * c->head_dim;
    m->kv_dim = c->n_kv_heads * c->head_dim;
    m->qkv_dim = m->q_dim + 2 * m->kv_dim;
    L->layer_file = malloc((size_t)c->n_layers * sizeof *L->layer_file);
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    m->mats = calloc((size_t)c->n_layers, sizeof *m->mats);
    if (!L->layer_file || !m->layers || !m->mats || kvq_moe_alloc(m) != KVQ_OK)
        return kvq_error_set(L->err, KVQ_ERR_NOMEM, "out of memory");
    for (int l = 0; l < c->n_layers; l++)
        L->layer_file[l] = ANY_FILE;
    L->embed_file = L->norm_file = ANY_FILE;
    st = m->sharded ? open_sharded(L, path, o) : kvq_files_open_hf(&m->fs, L->dir, L->err);
    if (st != KVQ_OK)
        return st;

    int slice_rows = o->lm_head_slice_rows > 0 ? o->lm_head_slice_rows : 8192;
    if (m->sharded) {
        for (size_t i = 0; i < L->man.n_shards; i++)
            m->n_lm += L->man.shards[i].kind == KVQ_SHARD_LM_HEAD;
    } else {
        m->n_lm = (c->vocab + slice_rows - 1) / slice_rows;
    }
    m->lm = calloc((size_t)m->n_lm, sizeof *m->lm);
    L->f32 = o->weights_f32;
    m->arena_floats = arena_size(m, L->f32);
    m->arena = aligned_alloc(64, m->arena_floats * sizeof(float));
    if (!m->lm || !m->arena)
        return kvq_error_set(L->err, KVQ_ERR_NOMEM, "out of memory for %zu MB of weights",
                             m->arena_floats * sizeof(float) >> 20);
    L->cur = m->arena;

    if ((st = find(L, L->embed_file, "model.embed_tokens.weight", 2, c->vocab, c->hidden, &m->embed)) != KVQ_OK)
        return st;
    for (int l = 0; l < c->n_layers; l++)
        if ((st = load_layer(L, l)) != KVQ_OK)
            return st;
    if ((st = mark_key_outliers(m)) != KVQ_OK)
        return kvq_error_set(L->err, st, "out of memory");
    float *fn = take(L, (size_t)c->hidden);
    m->final_norm = fn;
    if ((st = load_into(L, L->norm_file, "model.norm.weight", 1, c->hidden, 0, fn)) != KVQ_OK)
        return st;
    if ((st = load_lm_head(L, slice_rows)) != KVQ_OK)
        return st;
    for (int k = 0; k < m->n_lm; k++)
        if (m->lm[k].count > m->max_lm_rows)
            m->max_lm_rows = m->lm[k].count;
    return KVQ_OK;
}

kvq_status kvq_model_load(const char *dir, const struct kvq_model_load_opts *opts, kvq_model **out, kvq_error *err)
{
    if (!dir || !out)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_model_load: NULL argument");
    double t0 = kvq_now();
    struct kvq_model_load_opts o;
    kvq_model_load_opts_default(&o);
    if (opts)
        o = *opts;
    struct loader L;
    memset(&L, 0, sizeof L);
    L.dir = dir;
    L.err = err;
    L.m = calloc(1, sizeof *L.m);
    if (!L.m)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    kvq_status st = load(&L, &o);
    kvq_manifest_clear(&L.man);
    free(L.layer_file);
    if (st != KVQ_OK) {
        kvq_model_free(L.m);
        return st;
    }
    L.m->load_seconds = kvq_now() - t0;
    *out = L.m;
    return KVQ_OK;
}

void kvq_model_free(kvq_model *m)
{
    if (!m)
        return;
    kvq_files_close(&m->fs);
    free(m->layers);
    free(m->mats);
    free(m->moe);
    free(m->expert_mats);
    free(m->lm);
    free(m->arena);
    free(m);
}

const struct kvq_model_config *kvq_model_config_of(const kvq_model *m)
{
    return m ? &m->cfg : NULL;
}

void kvq_model_get_info(const kvq_model *m, struct kvq_model_info *info)
{
    memset(info, 0, sizeof *info);
    if (!m)
        return;
    info->sharded = m->sharded;
    info->n_files = m->fs.n;
    info->n_lm_slices = m->n_lm;
    info->file_bytes = m->fs.bytes;
    info->weight_bytes = 0;
    for (int l = 0; m->mats && l < m->cfg.n_layers; l++)
        for (int i = 0; i < 4; i++)
            info->weight_bytes += kvq_wmat_bytes(&m->mats[l][i]);
    info->expert_bytes = kvq_moe_bytes(m); /* routers and experts, mapped or widened */
    info->weight_bytes += info->expert_bytes;
    for (int k = 0; k < m->n_lm; k++)
        info->weight_bytes += kvq_wmat_bytes(&m->lm[k].wm);
    info->weight_bytes += (m->cfg.n_layers * 2 + 1) * (size_t)m->cfg.hidden * sizeof(float); /* norms */
    info->load_seconds = m->load_seconds;
}
