/* decoder_internal.h - the model and sequence-state structures shared by
 * model/, backend/ and generate/. */
#ifndef KVQ_DECODER_INTERNAL_H
#define KVQ_DECODER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kvq_cache.h"
#include "kvq_model.h"
#include "kvq_ngram.h"
#include "kvq_safetensors.h"
#include "kvq_sampler.h"

/* Weights of one layer, f32, HF Linear layout [out][in]. Projections that
 * read the same input are fused so one sgemm does them: wqkv = [q; k; v]
 * rows, wgu = [gate; up] rows. Optional tensors are NULL when absent.
 * On the host model the four projection matrices (wqkv, wo, wgu, wdown) are
 * set only when the model was loaded with weights_f32 (one f32 block each);
 * otherwise they are NULL and struct kvq_model.mats holds them in the
 * file's dtype (kvq_wmat, kvq_model_weight_f32). */
struct kvq_layer_weights {
    const float *attn_norm; /* [hidden] */
    const float *wqkv;      /* [q_dim + 2 kv_dim][hidden] */
    const float *bqkv;      /* [q_dim + 2 kv_dim] or NULL */
    const float *q_norm;    /* [head_dim] or NULL ([q_dim] with arch.qk_norm_full) */
    const float *k_norm;    /* [head_dim] or NULL ([kv_dim] with arch.qk_norm_full) */
    const float *wo;        /* [hidden][q_dim] */
    const float *bo;        /* [hidden] or NULL */
    const float *ffn_norm;  /* [hidden] (Gemma: pre_feedforward_layernorm) */
    const float *post_attn_norm; /* [hidden] sandwich norms (Gemma), else NULL */
    const float *post_ffn_norm;  /* [hidden] */
    const float *wgu;       /* [2 ffn][hidden] */
    const float *bgu;       /* [2 ffn] or NULL */
    const float *wdown;     /* [hidden][ffn] */
    const float *bdown;     /* [hidden] or NULL */
};

/* The projections of a layer, as the backends' linear op names them
 * (backend.h: KVQ_W_QKV, KVQ_W_O, KVQ_W_GATE_UP, KVQ_W_DOWN, in that order). */
enum { KVQ_WEIGHT_QKV, KVQ_WEIGHT_O, KVQ_WEIGHT_GATE_UP, KVQ_WEIGHT_DOWN };

/* Matrix, bias and shape of projection `which` of a layer whose weights w
 * point to host or device memory alike (each backend keeps its own copy of
 * this struct). */
static inline void kvq_weight_pick(const struct kvq_layer_weights *w, int which, int hidden, int ffn, int q_dim,
                                   int qkv_dim, const float **mat, const float **bias, int *in, int *out)
{
    *in = hidden;
    *out = hidden;
    switch (which) {
    case KVQ_WEIGHT_QKV: *mat = w->wqkv, *bias = w->bqkv, *out = qkv_dim; break;
    case KVQ_WEIGHT_O: *mat = w->wo, *bias = w->bo, *in = q_dim; break;
    case KVQ_WEIGHT_GATE_UP: *mat = w->wgu, *bias = w->bgu, *out = 2 * ffn; break;
    default: *mat = w->wdown, *bias = w->bdown, *in = ffn; break;
    }
}

/* One row block of a weight matrix as it lies in memory: mapped from its
 * safetensors file in the file's dtype, or f32 in the model's arena. */
struct kvq_wblock {
    const void *data;          /* [rows][cols] elements of dtype, any alignment */
    enum kvq_st_dtype dtype;   /* KVQ_ST_F32, KVQ_ST_F16 or KVQ_ST_BF16 */
    int rows;
};

/* A projection's matrix [rows][cols] as its row blocks stacked in order
 * (q, k and v from three tensors; one block for a fused tensor). */
#define KVQ_MAX_WBLOCKS 3
struct kvq_wmat {
    struct kvq_wblock b[KVQ_MAX_WBLOCKS];
    int n_blocks;
    int rows, cols;
};

/* weights.c: the whole matrix widened to f32, [rows][cols] at dst (for a
 * backend that wants f32, e.g. an upload). */
void kvq_wmat_to_f32(const struct kvq_wmat *w, float *dst);
/* Rows [r0, r0 + n) of w widened to f32 at dst ([n][cols]). */
void kvq_wmat_rows_f32(const struct kvq_wmat *w, int r0, int n, float *dst);
/* Bytes w occupies in memory. */
size_t kvq_wmat_bytes(const struct kvq_wmat *w);

#define KVQ_PATH_MAX 4096

/* The mapped safetensors files of a model (weight_files.c). */
struct kvq_file_set {
    kvq_st_file **files;
    char **paths;  /* [n] each file's path (the expert cache reads from them) */
    int n;
    size_t bytes; /* all files together */
};
/* Maps dir/name and adds it to fs. */
kvq_status kvq_files_open(struct kvq_file_set *fs, const char *dir, const char *name, kvq_error *err);
/* Maps the weight files of a plain HF directory (index or single file). */
kvq_status kvq_files_open_hf(struct kvq_file_set *fs, const char *dir, kvq_error *err);
void kvq_files_close(struct kvq_file_set *fs);
/* The tensor called name in file `only` (or in any file when only < 0);
 * *where (optional) gets the file index. */
const struct kvq_st_tensor *kvq_files_find(const struct kvq_file_set *fs, int only, const char *name, int *where);
int kvq_path_join(char *out, size_t cap, const char *dir, const char *name);
int kvq_file_exists(const char *path);
/* Reads a whole file of at most max bytes, NUL-terminated; NULL on failure. */
char *kvq_read_text(const char *path, size_t max, size_t *len);

/* One vocabulary slice of the LM head: rows [start, start + count). */
struct kvq_lm_slice {
    int32_t start, count;
    const float *w;     /* [count][hidden] f32, or NULL when kept in the file's dtype */
    struct kvq_wmat wm; /* the same rows in any dtype (always set) */
};

/* A sparse layer's router and experts (kvq_model_layer_is_moe), each a
 * matrix as it lies in memory: per-expert tensors or slices of the fused
 * 3-D ones (moe_load.c). */
struct kvq_moe_layer {
    struct kvq_wmat router; /* [n_experts][hidden] */
    struct kvq_wmat *gu;    /* [n_experts]: [2 moe_ffn][hidden], gate rows then up rows */
    struct kvq_wmat *down;  /* [n_experts]: [hidden][moe_ffn] */
    /* arch.shared_ffn > 0 (Qwen2-MoE): the shared expert and its gate, mapped
     * like the layer's own projections (never through the expert cache) */
    struct kvq_wmat shared_gu;   /* [2 shared_ffn][hidden], gate rows then up rows */
    struct kvq_wmat shared_down; /* [hidden][shared_ffn] */
    struct kvq_wmat shared_gate; /* [1][hidden] */
};

/* moe_load.c: layer l's router and experts from the mapped files (file fi,
 * or any when fi < 0), in either layout (kvq_model.h, enum
 * kvq_expert_names); with *f32 not NULL they are widened to f32 there (the
 * arena, 16-float aligned steps) and *f32 advances. dir names the model in
 * errors. */
kvq_status kvq_moe_load_layer(struct kvq_model *m, int fi, int l, float **f32, const char *dir, kvq_error *err);
/* Floats the arena needs for the experts of all sparse layers when they
 * are widened to f32 (0 for a dense model). */
size_t kvq_moe_arena_floats(const struct kvq_model_config *c);
/* Allocates m->moe and its matrices. @return KVQ_OK or KVQ_ERR_NOMEM. */
kvq_status kvq_moe_alloc(struct kvq_model *m);
/* Bytes of all routers and experts in memory. */
size_t kvq_moe_bytes(const struct kvq_model *m);

/* moe_cpu.c: the router of one row: logits[n_experts] -> the k experts ids[k]
 * and their weights w[k], by descending weight (ties: lower id first), as
 * kind and norm_topk say (enum kvq_router_kind). Scratch-free. */
void kvq_moe_topk(const float *logits, int n_experts, int k, enum kvq_router_kind kind, int norm_topk, int32_t *ids,
                  float *w);
/* The (row, slot) entries of ids[T][k] grouped by expert: start[e] ..
 * start[e + 1] index order[], which holds row * k + slot, rows ascending
 * within an expert. start has n_experts + 1 entries. */
void kvq_moe_group(const int32_t *ids, size_t T, int k, int n_experts, int32_t *start, int32_t *order);

struct kvq_model {
    struct kvq_model_config cfg;
    int q_dim, kv_dim, qkv_dim; /* n_heads * head_dim, n_kv_heads * head_dim, q + 2 kv */
    struct kvq_file_set fs;     /* every mapped weight file */
    int sharded;
    const struct kvq_st_tensor *embed; /* [vocab][hidden], mapped, any float dtype */
    const float *final_norm;
    struct kvq_layer_weights *layers;
    struct kvq_wmat (*mats)[4]; /* [n_layers][KVQ_WEIGHT_*]: the projections in memory (a sparse
                                   layer's gate/up and down are empty: its experts are in moe) */
    struct kvq_moe_layer *moe;  /* [n_layers] (entries of dense layers empty); NULL for a dense model */
    struct kvq_wmat *expert_mats; /* storage of every moe[l].gu and .down */
    struct kvq_lm_slice *lm;
    int n_lm;
    int max_lm_rows;            /* largest slice count */
    float *arena;               /* converted weights: norms and biases, and with weights_f32 all matrices */
    size_t arena_floats;
    double load_seconds;
};

/* rope.c: RoPE as transformers computes it (no table over the context). */
/* 1 when the frequencies depend on the sequence length (dynamic, longrope). */
int kvq_rope_len_dependent(const struct kvq_model_config *c);
/* inv[rotary_dim / 2] and the cos/sin factor for a forward reaching seq_len
 * tokens (positions < seq_len). */
void kvq_rope_freqs(const struct kvq_model_config *c, size_t seq_len, float *inv, float *scale);
/* The plain RoPE of windowed layers when the model has a local base
 * (arch.rope_local_theta: Gemma 3): inv[rotary_dim / 2], scale 1. */
void kvq_rope_freqs_local(const struct kvq_model_config *c, float *inv, float *scale);
/* 1 when layer l uses the local RoPE. */
static inline int kvq_rope_layer_local(const struct kvq_model_config *c, int l)
{
    return c->arch.rope_local_theta > 0 && (c->arch.window_layers[l / 8] >> (l % 8) & 1);
}
/* cos/sin [n][half] of positions pos0 .. pos0 + n - 1. */
void kvq_rope_rows(const float *inv, float scale, int half, size_t pos0, size_t n, float *cs, float *sn);
/* malloc'd cos/sin tables [n_pos][rotary_dim / 2] with the frequencies of a
 * sequence of n_pos tokens (for a backend that wants a table), or with
 * local, those of the windowed layers' local base (kvq_rope_freqs_local);
 * free both. */
kvq_status kvq_rope_table(const struct kvq_model_config *c, size_t n_pos, int local, float **cs, float **sn);

/* batch.c: appends n tokens of seeded random keys and values to every layer
 * of slot without running the model: a context of n tokens for measuring
 * what a step costs there (bench/bench_decoder_cuda.c) without its prefill.
 * @return KVQ_OK; KVQ_ERR_INVALID_ARG; KVQ_ERR_CONTEXT_FULL; KVQ_ERR_BUDGET;
 * KVQ_ERR_NOMEM; a store error (the slot is then as before). */
typedef struct kvq_batch kvq_batch;
kvq_status kvq_batch_fill(kvq_batch *b, int slot, size_t n, uint64_t seed);

/* engine.c: the KV store (max_seqs sequences, calls of up to max_rows rows;
 * layer l's budget max_bytes[l], max_bytes NULL: none) and the backend of
 * an engine, attached; the device's refusals (kvq_kv_store_cuda_supports,
 * kvq_backend_cuda_supports) asked first. sc resolved (kvq_engine_config);
 * specs from kvq_layers_plan (read at create only). */
struct kvq_backend;
struct kvq_kv_store;
kvq_status kvq_engine_open(const kvq_model *m, const struct kvq_seq_config *sc, size_t max_ctx, int max_seqs,
                           size_t max_rows, const struct kvq_layer_spec *specs, const size_t *max_bytes,
                           struct kvq_kv_store **kv, struct kvq_backend **be, kvq_error *err);

/* Time accumulators of one sequence (seconds). */
struct kvq_seq_timers {
    double matmul, attn, lm_head;
};

/* batch.c: the one engine under kvq_seq. A sequence state is slot 0 of a
 * batch of one whose layers hold their budget shares themselves
 * (kvq_layer_budget_share), created by kvq_batch_create_one (sc resolved);
 * the slot is taken. chunk() runs T rows of slot at its length through
 * every layer (no LM head: the final hidden states stay in the backend's
 * acts.x) and appends them; on error nothing changed. rollback() drops
 * tokens [n, len) and keeps the caches' pages (a speculative rollback takes
 * them again at once: no allocation in the decode loop). The rest lends
 * the batch's parts. */
kvq_status kvq_batch_create_one(const kvq_model *m, const struct kvq_seq_config *sc, size_t max_ctx,
                                size_t max_rows, kvq_batch **out, kvq_error *err);
kvq_status kvq_batch_chunk(kvq_batch *b, int slot, const int32_t *ids, size_t T);
void kvq_batch_rollback(kvq_batch *b, int slot, size_t n);
void kvq_batch_set_hook(kvq_batch *b, kvq_qkv_hook fn, void *user);
struct kvq_backend *kvq_batch_backend(const kvq_batch *b);
struct kvq_kv_store *kvq_batch_store(const kvq_batch *b);
struct kvq_seq_timers *kvq_batch_timers(kvq_batch *b);

struct kvq_seq {
    const struct kvq_model *m;
    struct kvq_seq_config cfg;   /* recent_f16 resolved (0 or 1) */
    size_t max_ctx;
    int max_chunk;
    kvq_batch *b;                /* the engine: this sequence is its slot 0 */
    struct kvq_backend *be;      /* the batch's ops and activation buffers (backend.h) */
    struct kvq_kv_store *kv;     /* the batch's store: every layer's keys and values (kv_store.h) */
    struct kvq_seq_timers *tm;   /* the batch's */
    size_t pos;                  /* tokens in the caches */
    int32_t *tokens;             /* [max_ctx + 1] history: cached tokens, then a pending one */
    kvq_sampler *sampler;        /* owns the sequence's RNG */
    kvq_ngram *ngram;            /* the drafts' n-gram table over tokens (kvq_ngram.h) */
    int32_t *draft;              /* [KVQ_MAX_DRAFT + 1] pending token + draft */
    int32_t *verify;             /* [KVQ_MAX_DRAFT + 1] the model's tokens for them */
    int decoding;                /* forward time counts as decode (else prefill) */
    struct kvq_seq_stats st;
};

/* T rows of store sequence seq, at positions pos0 .. pos0 + T - 1. */
struct kvq_fwd_seg {
    int seq;
    size_t pos0, T;
};

/* What a forward over rows of one or several sequences works with. */
struct kvq_fwd {
    const struct kvq_model *m;
    struct kvq_backend *be;
    struct kvq_kv_store *kv;
    struct kvq_seq_timers *tm;
    kvq_qkv_hook hook;           /* NULL: none */
    void *hook_user;
    int32_t *pos;                /* [be->max_rows] host scratch */
    int *seq_ids;                /* [segments] scratch; NULL: one segment only */
};

/* 1 when sc's center_k is valid for a sequence whose resolved window
 * (recent_f16) is `window`: 0, or 1 with the window on (a centred page's keys
 * wait in the window for the page to fill); KVQ_SEQ_CENTER_WHY says why not. */
int kvq_seq_center_ok(const struct kvq_seq_config *sc, int window);

/* Bytes of one sequence's f16 override buffers (sinks, recent window) of a
 * layer cache of cc on device: the host cache's (kvq_cache_bytes_for(cc, 0))
 * or, on KVQ_DEVICE_CUDA, the device cache's (kvq_cuda_cache_f16_bytes: the
 * same rows, not capped at max_tokens). Budgets and plans count these. */
size_t kvq_layer_f16_bytes(const struct kvq_cache_config *cc, enum kvq_device device);
#define KVQ_SEQ_CENTER_WHY "key centering (center_k) needs the recent-token window (recent_f16), which is off"

/* layer_spec.c: layer l's cache config (types, override buffers, context)
 * for a sequence config whose recent_f16 is resolved; without seed and
 * budget. */
void kvq_layer_cache_config(const struct kvq_model_config *c, const struct kvq_seq_config *sc, int l,
                            size_t max_ctx, struct kvq_cache_config *cc);

/* 1 when t is a compressed type (not f32 or f16): such a layer gets the
 * recent window by default and centred keys (KVQ_WINDOW_AUTO,
 * KVQ_CENTER_AUTO). */
static inline int kvq_type_compressed(enum kvq_type t)
{
    return t != KVQ_TYPE_F32 && t != KVQ_TYPE_F16;
}

/* layer_spec.c: every layer's cache config (ccs, may be NULL; without seed
 * and budget) and memory spec (kvq_model.h) for a resolved sequence config
 * (kvq_engine_config) and a context of max_ctx tokens. */
kvq_status kvq_layers_plan(const struct kvq_model_config *c, const struct kvq_seq_config *sc, size_t max_ctx,
                           struct kvq_cache_config *ccs, struct kvq_layer_spec *specs, kvq_error *err);

/* Layer l's exact share of a budget of `budget` bytes (0: none, returns 0):
 * its per-sequence state (the f16 buffers) F_l, plus a part of the rest
 * R = budget - sum F proportional to its bytes per token b_l: floor(R * b_l /
 * sum b) computed as q * b_l + r * b_l / sum (R = q * sum + r) so nothing
 * overflows and the shares never add up to more than the budget. A share
 * below one page still must not read as "no limit" (max_bytes 0), so it is
 * at least one byte: such a cache holds no page and every append reports
 * KVQ_ERR_BUDGET. */
size_t kvq_layer_budget_share(const struct kvq_layer_spec *specs, int n_layers, size_t budget, int l);

/* The checks both engines (kvq_seq, kvq_batch) make of a sequence config at
 * create, with one line in err: cfg (NULL: defaults) resolved into *out
 * (recent_f16 0 or 1) and the context into *max_ctx. */
kvq_status kvq_engine_config(const struct kvq_model_config *c, const struct kvq_seq_config *cfg,
                             struct kvq_seq_config *out, size_t *max_ctx, kvq_error *err);

/* forward.c: rows ids[0..sum T) of the segments (in order) through all
 * layers, appending each segment's keys and values to its store sequence;
 * leaves the final hidden states in be->acts.x. On error every segment is
 * rolled back to its pos0. */
kvq_status kvq_forward_rows(const struct kvq_fwd *f, const int32_t *ids, const struct kvq_fwd_seg *segs, int n_segs);


/* seq.c: what kvq_seq_forward_out returns for rows first_out..n-1: host
 * logits and/or argmax as kvq_seq_forward, or (tok set; at most
 * KVQ_MAX_DRAFT + 1 rows) the tokens the sequence's sampler draws at the
 * uniforms u[], with each row's status in row_st[] (backend lm_sample: the
 * RNG does not advance). */
struct kvq_seq_out {
    float *logits;
    int32_t *argmax;
    const double *u;
    int32_t *tok;
    kvq_status *row_st;
};
kvq_status kvq_seq_forward_out(kvq_seq *s, const int32_t *ids, size_t n, size_t first_out,
                               const struct kvq_seq_out *out);

/* sampler.c: kvq_sampler_sample split in two, so that a device can draw
 * where the logits are. pick() draws at the uniform u in [0, 1) (the
 * sampler's scratch and settings; its RNG untouched; greedy ignores u);
 * errors as kvq_sampler_sample. peek() gives the next n uniforms of the
 * RNG without advancing it (zeros when greedy: greedy draws nothing);
 * skip() (kvq_sampler.h) advances it past n of them. sample() = peek 1,
 * pick, skip 1. */
kvq_status kvq_sampler_pick(kvq_sampler *s, const float *logits, double u, int32_t *token);
void kvq_sampler_peek(const kvq_sampler *s, double *u, int n);

double kvq_now(void);

#endif /* KVQ_DECODER_INTERNAL_H */
