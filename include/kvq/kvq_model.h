/* kvq_model.h - a Llama-family decoder that keeps its KV cache in kvq caches.
 *
 * Three objects:
 *  - struct kvq_model_config: what config.json says, with every architecture
 *    difference (q/k/v bias, q/k norm, tied embeddings, GQA) as plain fields,
 *    decided in one place (model_config.c) from model_type and config keys.
 *  - kvq_model: the loaded weights. Loaded once from a Hugging Face directory
 *    (config.json + one safetensors file or several with
 *    model.safetensors.index.json) or from a `kvq shard` directory
 *    (runtime_meta.json, validated first); then immutable, so any number of
 *    sequence states, on any threads, may share it.
 *  - kvq_seq: one sequence's state: a kvq_cache per layer (any K/V types,
 *    default tq3j/tq3), the position, the token history and its n-gram table
 *    (speculative drafts), the sampler RNG, all activation buffers and the
 *    attention workspace; slot 0 of a kvq_batch of one (kvq_batch.h), the
 *    one engine. Created once, reset between sequences; forward and
 *    generate never allocate.
 *
 * Forward computation (per layer, T tokens at once with OpenBLAS sgemm):
 *   x += Wo . attn(RoPE(Wq . rms(x)), RoPE(Wk . rms(x)), Wv . rms(x))
 *   x += Wdown . (silu(Wgate . rms(x)) * (Wup . rms(x)))
 * RoPE follows HF's rotate_half convention (pairs i and i + head_dim/2).
 * The post-RoPE keys and values of each chunk are appended to the layer's
 * kvq cache, and attention runs only through kvq's public API
 * (kvq_attn_causal for T > 1, kvq_attn_decode for T = 1): query head h uses
 * KV head h / (n_heads / n_kv_heads).
 *
 * Token ids are int32_t in [0, vocab). Logits are [rows][vocab] floats.
 */
#ifndef KVQ_MODEL_H
#define KVQ_MODEL_H

#include "kvq_export.h"

#include <stddef.h>
#include <stdint.h>

#include "kvq_codec.h"
#include "kvq_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a norm is computed from x and its weight w. */
enum kvq_norm_kind {
    KVQ_NORM_RMS = 0,            /* w * x / rms(x) (Llama, Qwen, Mistral) */
    KVQ_NORM_RMS_UNIT_OFFSET = 1 /* (1 + w) * x / rms(x) (Gemma) */
};

/* The gate activation of the gated MLP: h = act(gate) * up. */
enum kvq_act_kind {
    KVQ_ACT_SILU = 0,     /* x * sigmoid(x) (SwiGLU) */
    KVQ_ACT_GELU_TANH = 1 /* the tanh approximation of GELU (GeGLU, Gemma) */
};

/* Which coordinates of a head RoPE rotates together. */
enum kvq_rope_kind {
    KVQ_ROPE_HALF = 0,       /* pairs (i, i + rotary_dim / 2): HF rotate_half */
    KVQ_ROPE_INTERLEAVED = 1 /* pairs (2i, 2i + 1): GPT-J, original Llama weights */
};

/* How RoPE frequencies are scaled for long contexts (config.json's
 * rope_parameters / rope_scaling "rope_type"), with the formulas of
 * transformers' rope init functions (decoder/model/rope.c). */
enum kvq_rope_scaling_kind {
    KVQ_ROPE_SCALE_NONE = 0, /* "default" */
    KVQ_ROPE_SCALE_LINEAR,   /* inv_freq / factor */
    KVQ_ROPE_SCALE_DYNAMIC,  /* NTK: base grows with the sequence length past max_position_embeddings */
    KVQ_ROPE_SCALE_YARN,     /* ramp between interpolation and extrapolation, scaled cos/sin */
    KVQ_ROPE_SCALE_LLAMA3,   /* Llama 3.1: low frequencies / factor, smooth band between */
    KVQ_ROPE_SCALE_LONGROPE  /* Phi-3: per-frequency short/long factors, scaled cos/sin */
};

#define KVQ_ROPE_MAX_FACTORS 512 /* longrope factors: rotary_dim / 2 of them */

struct kvq_rope_scaling {
    enum kvq_rope_scaling_kind kind;
    double factor;           /* linear, dynamic, yarn, llama3, longrope (0 = derived) */
    int original_max;        /* original_max_position_embeddings (0 = absent) */
    double low_freq_factor, high_freq_factor; /* llama3 */
    double beta_fast, beta_slow;              /* yarn (0 = 32 / 1) */
    double mscale, mscale_all_dim;            /* yarn (0 = absent) */
    double attention_factor; /* yarn, longrope: cos/sin multiplier (0 = derived) */
    int truncate;            /* yarn: floor/ceil the correction range (default 1) */
    int n_factors;           /* longrope: entries of short_factor and long_factor */
    float short_factor[KVQ_ROPE_MAX_FACTORS], long_factor[KVQ_ROPE_MAX_FACTORS];
};

#define KVQ_MODEL_MAX_LAYERS 4096

/* Mixture of experts: how a sparse layer's router turns its logits over the
 * experts into the k experts a token takes and their weights. */
enum kvq_router_kind {
    KVQ_ROUTER_SOFTMAX_TOPK = 0, /* softmax over all experts, then the k largest, renormalised to sum 1
                                    when kvq_model_arch.norm_topk (Mixtral always, Qwen3-MoE and OLMoE
                                    by norm_topk_prob): transformers' order of operations */
    KVQ_ROUTER_TOPK_SOFTMAX = 1  /* the k largest logits, softmax over those alone (gpt-oss; equal to
                                    SOFTMAX_TOPK with norm_topk up to rounding) */
};

/* How a checkpoint names its experts' tensors (layer prefix model.layers.L.). */
enum kvq_expert_names {
    KVQ_EXPERTS_MLP = 0,    /* mlp.gate.weight; mlp.experts.N.{gate,up,down}_proj.weight (Qwen3-MoE, OLMoE) */
    KVQ_EXPERTS_MIXTRAL = 1 /* block_sparse_moe.gate.weight; block_sparse_moe.experts.N.{w1,w3,w2}.weight */
};
/* Either kind may instead be stored fused, as transformers 5 keeps experts in
 * memory and can save them: mlp.gate.weight [E][hidden], mlp.experts.gate_up_proj
 * [E][2 moe_ffn][hidden] (gate rows, then up rows), mlp.experts.down_proj
 * [E][hidden][moe_ffn]. The loader takes whichever the file has. */

#define KVQ_MAX_EXPERTS 1024 /* experts per sparse layer */
#define KVQ_MAX_TOP_K 64     /* experts per token */

/* The architecture of a checkpoint as the forward pass needs it: every
 * difference between model families is a field here, decided once from
 * model_type and the config keys when config.json is parsed
 * (model_config.c); the backends read only these fields. */
struct kvq_model_arch {
    int qkv_bias;        /* q_proj/k_proj/v_proj carry .bias (Qwen2; Llama attention_bias) */
    int o_bias;          /* o_proj carries .bias (Llama attention_bias) */
    int mlp_bias;        /* gate/up/down carry .bias (Llama mlp_bias) */
    int qk_norm;         /* per-head RMSNorm of q and k before RoPE (Qwen3) */
    int fused_proj;      /* the checkpoint stores qkv_proj and gate_up_proj fused (Phi-3) */
    int tied_embeddings; /* LM head = embedding table (tie_word_embeddings) */
    enum kvq_norm_kind norm;
    enum kvq_act_kind act;
    enum kvq_rope_kind rope;
    int rotary_dim;      /* leading coordinates of a head that RoPE rotates (partial
                            rotary: head_dim * partial_rotary_factor); = head_dim for full rotary */
    struct kvq_rope_scaling rope_scaling;
    float embed_scale;   /* embeddings are multiplied by it (1; sqrt(hidden) for Gemma) */
    float final_softcap; /* logits = c * tanh(logits / c) when > 0 */
    float attn_softcap;  /* attention scores capped likewise when > 0 (not supported yet:
                            config parsing refuses it) */
    float attn_scale;    /* attention score scale; 0 = 1 / sqrt(head_dim) (Gemma:
                            query_pre_attn_scalar^-1/2) */
    int sandwich_norm;   /* Gemma 2/3: the attention and MLP outputs are normed
                            (post_attention_layernorm, post_feedforward_layernorm)
                            before the residual add, the MLP input by
                            pre_feedforward_layernorm */
    double rope_local_theta; /* > 0: windowed layers use plain RoPE of this base
                                (Gemma 3's rope_local_base_freq), the others rope_theta
                                with rope_scaling */
    int sliding_window;  /* tokens a query sees in a windowed layer (itself included), 0 = all */
    uint8_t window_layers[KVQ_MODEL_MAX_LAYERS / 8]; /* bit l: layer l is windowed */
    int qk_norm_full;    /* RMSNorm of the whole q and k projections (all heads at once) before RoPE,
                            weights [q_dim] and [kv_dim] (OLMoE); qk_norm is then 0 */
    /* mixture of experts (n_experts = 0: a dense model) */
    int n_experts;       /* experts per sparse layer (num_experts, num_local_experts) */
    int top_k;           /* experts per token (num_experts_per_tok) */
    int moe_ffn;         /* an expert's intermediate size (moe_intermediate_size; Mixtral and
                            OLMoE: intermediate_size). Dense layers use kvq_model_config.ffn */
    enum kvq_router_kind router;
    int norm_topk;       /* SOFTMAX_TOPK: the k weights renormalised to sum 1 */
    enum kvq_expert_names expert_names;
    int shared_ffn;      /* > 0: every sparse layer also runs a shared expert of this intermediate
                            size on every token, scaled by sigmoid(shared_expert_gate . x) and added
                            to the routed experts' sum (Qwen2-MoE: shared_expert_intermediate_size) */
    uint8_t moe_layers[KVQ_MODEL_MAX_LAYERS / 8]; /* bit l: layer l is sparse (Qwen3-MoE: not in
                            mlp_only_layers and (l + 1) % decoder_sparse_step == 0) */
    uint8_t key_outlier_layers[KVQ_MODEL_MAX_LAYERS / 8]; /* bit l: layer l's k_proj bias has at
                            least KVQ_KEY_OUTLIER_RATIO x the median norm over layers (set by
                            kvq_model_load from the weights; config.json says nothing of it).
                            Such a bias is a large component every key of the layer shares,
                            and a few bits per coordinate spent on it leave little for what
                            tells the keys apart (Qwen2/2.5: norms ~600-900 at the first and
                            last layers against a median ~22; kvq_seq_config.key_outlier_f16) */
};

/* How far above the median a layer's k_proj bias norm must be to count as an outlier. */
#define KVQ_KEY_OUTLIER_RATIO 8.0f

#define KVQ_MODEL_MAX_EOS 4

struct kvq_model_config {
    char model_type[32]; /* "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3_text", "qwen3_moe", "qwen2_moe",
                            "mixtral", "olmoe" */
    int hidden;          /* hidden_size */
    int n_layers;        /* num_hidden_layers */
    int n_heads;         /* num_attention_heads */
    int n_kv_heads;      /* num_key_value_heads (GQA; = n_heads when absent) */
    int head_dim;        /* head_dim, or hidden / n_heads */
    int ffn;             /* intermediate_size */
    int vocab;           /* vocab_size */
    int max_ctx;         /* max_position_embeddings (times the factor for dynamic RoPE) */
    float rms_eps;       /* rms_norm_eps */
    double rope_theta;   /* rope_theta or rope_parameters.rope_theta */
    int32_t bos_id;      /* -1 when absent */
    int32_t eos_ids[KVQ_MODEL_MAX_EOS]; /* eos_token_id (int or list); unused slots -1 */
    int n_eos;
    struct kvq_model_arch arch;
};

/** Parses config.json text (json[0..len)). Refuses, with one line in err:
 *  unknown model_type, hidden_act other than silu, rope scaling other than
 *  the default, missing or non-positive dimensions, n_heads not a multiple of
 *  n_kv_heads, odd head_dim.
 *  @return KVQ_OK; KVQ_ERR_FORMAT; KVQ_ERR_UNSUPPORTED. */
KVQ_API kvq_status kvq_model_config_parse(const char *json, size_t len, struct kvq_model_config *cfg, kvq_error *err);

/** Reads and parses a config.json file. @return as above, or KVQ_ERR_IO. */
KVQ_API kvq_status kvq_model_config_load(const char *path, struct kvq_model_config *cfg, kvq_error *err);

/** 1 when id is one of the config's end-of-sequence ids (eos_token_id):
 *  the rule kvq_seq_generate stops at, for callers that run their own
 *  loop (kvq run's exit status, kvq serve's finish reason). */
KVQ_API int kvq_model_is_eos(const struct kvq_model_config *cfg, int32_t id);

/* Parameters per layer as the config implies them (attention with GQA +
 * SwiGLU MLP + norms + biases), and for the embedding and LM head. A
 * mixture of experts may have layers of two sizes: this is a sparse layer's
 * (router and all experts), kvq_model_config_layer_params_at each one's. */
KVQ_API size_t kvq_model_config_layer_params(const struct kvq_model_config *cfg);

/** Parameters of layer l alone (its experts included). */
KVQ_API size_t kvq_model_config_layer_params_at(const struct kvq_model_config *cfg, int l);

/** 1 when layer l of cfg is a mixture-of-experts layer. */
static inline int kvq_model_layer_is_moe(const struct kvq_model_config *cfg, int l)
{
    return cfg->arch.n_experts > 0 && (cfg->arch.moe_layers[l / 8] >> (l % 8) & 1);
}

/* ---- loaded model ---------------------------------------------------- */

typedef struct kvq_model kvq_model;

struct kvq_model_load_opts {
    int lm_head_slice_rows;  /* plain HF dirs: vocabulary rows per LM-head slice (0 = 8192) */
    int verify_checksums;    /* sharded dirs: check every shard's FNV-1a (default 1) */
    int weights_f32;         /* 1: widen every weight matrix to f32 in memory at load (twice
                                the memory of a bf16 checkpoint; prefill skips the per-chunk
                                widening). 0 (default): matrices stay memory-mapped in the
                                file's dtype, resident memory about the file size */
};
KVQ_API void kvq_model_load_opts_default(struct kvq_model_load_opts *o);

/** Loads a model directory: a `kvq shard` output (runtime_meta.json present:
 *  the manifest is validated before any weight is read) or a plain HF
 *  directory. Weight matrices (f32, f16 or bf16) stay memory-mapped in the
 *  file's dtype and are widened to f32 as the kernels read them (all of
 *  them converted once to f32 with opts->weights_f32); norms and biases are
 *  converted to f32; embedding rows are converted on lookup.
 *  opts may be NULL for defaults.
 *  @return KVQ_OK and *out; KVQ_ERR_IO (missing file); KVQ_ERR_FORMAT
 *  (corrupt file or manifest, missing tensor, wrong shape or dtype);
 *  KVQ_ERR_UNSUPPORTED; KVQ_ERR_NOMEM. err gets one line. */
KVQ_API kvq_status kvq_model_load(const char *dir, const struct kvq_model_load_opts *opts, kvq_model **out,
                          kvq_error *err);

/** Frees m; accepts NULL. Every kvq_seq using m must be freed first. */
KVQ_API void kvq_model_free(kvq_model *m);

KVQ_API const struct kvq_model_config *kvq_model_config_of(const kvq_model *m);

struct kvq_model_info {
    int sharded;              /* 1: loaded from runtime_meta.json */
    int n_files;              /* safetensors files mapped */
    int n_lm_slices;          /* LM-head vocabulary slices */
    size_t file_bytes;        /* bytes of all weight files */
    size_t weight_bytes;      /* bytes of the weights the forward pass reads, mapped or converted
                                 (embedding table excluded; routers and experts included) */
    size_t expert_bytes;      /* of weight_bytes, the mixture-of-experts routers and experts, shared ones included (0: dense) */
    double load_seconds;      /* wall time of kvq_model_load */
};
KVQ_API void kvq_model_get_info(const kvq_model *m, struct kvq_model_info *info);

/** Threads of the CPU decoder, process-wide, in one pool: the products of
 *  chunks (prefill, perplexity; sgemm in slices of weight rows, OpenBLAS
 *  itself kept single-threaded so that its spinning threads do not take the
 *  cores from the attention that follows), the few-row kernel of decode
 *  steps and the LM head (row ranges), and attention ((KV head x query tile)
 *  tasks of a chunk, KV heads of a decode step). n <= 0: the cores this
 *  process may run on, which is also the default. Results do not depend on
 *  it. Call it while no forward runs. @return the threads now in use. */
KVQ_API int kvq_set_threads(int n);

/** Threads the CPU decoder uses now. */
KVQ_API int kvq_threads(void);

/* ---- sequence state --------------------------------------------------- */

typedef struct kvq_seq kvq_seq;

/* Where a sequence runs. */
enum kvq_device {
    KVQ_DEVICE_CPU = 0, /* host memory, OpenBLAS and the fused CPU attention */
    KVQ_DEVICE_CUDA = 1 /* the current GPU: weights, activations and KV pages in device memory */
};

struct kvq_seq_config {
    enum kvq_device device; /* default KVQ_DEVICE_CPU */
    enum kvq_type type_k;   /* default KVQ_DEFAULT_TYPE_K (tq3j) */
    enum kvq_type type_v;   /* default KVQ_DEFAULT_TYPE_V (tq3) */
    uint64_t seed;          /* kvq codec seeds (per layer, derived) and sampler RNG */
    size_t max_ctx;         /* tokens; 0 = the model's max_ctx */
    int max_chunk;          /* tokens per forward chunk (prefill); 0 = kvq_default_max_chunk(device) */
    int ngram;              /* n-gram length for speculative drafts; 0 = 3 */
    size_t kv_budget;       /* bytes of cache pages over all layers; 0 = no limit.
                             * Split exactly: layer l's cache gets
                             * floor(kv_budget * b_l / sum b) bytes (kvq_cache
                             * max_bytes), b_l = its bytes per token (an equal split
                             * for uniform types), so the pages of all layers never
                             * exceed kv_budget and every layer holds about the same
                             * number of tokens. Pages are allocated on demand; a
                             * forward that would need one more page fails with
                             * KVQ_ERR_BUDGET. */
    const enum kvq_type *layer_types; /* NULL: type_k/type_v everywhere; else
                             * [n_layers][2] (K, V) per layer, read only by
                             * kvq_seq_create / kvq_seq_plan_of (not kept) */
    int v_norm_correct;     /* 1: before a value row is appended to a rotated (tq)
                             * V cache, scale it so that its decoded row has the
                             * input's norm (||x~|| = ||x||). The codes depend only
                             * on the direction, so this stores the corrected norm
                             * without any codec change; costs one extra encode +
                             * decode per value row at append. */
    int recent_f16;         /* 1: every layer's cache also keeps the tokens of its last,
                             * partly filled page in f16 and attention reads them from
                             * there (kvq_cache_config.recent_f16). Forward then appends
                             * and attends one position at a time within a chunk, so a
                             * prefill sees exactly what token-by-token generation sees.
                             * KVQ_WINDOW_AUTO (-1, the default, as in the kvq command):
                             * on when some layer's K or V type is compressed (not f32
                             * or f16), off otherwise (kvq_seq_window_for). */
    int key_outlier_f16;    /* 1 (default): the keys of the layers marked in
                             * kvq_model_arch.key_outlier_layers are cached in f16 whatever
                             * their K type says (when that type is compressed), so a shared
                             * large bias costs those layers' key bytes, not the attention's
                             * accuracy; 0: every layer takes its K type */
    int sink_tokens;        /* 0..KVQ_CACHE_MAX_SINK_TOKENS: the first sink_tokens tokens
                             * are also kept in f16 and always read from there
                             * (kvq_cache_config.sink_tokens). The f16 buffers of both
                             * are allocated at create and count against kv_budget
                             * (first, in equal shares per layer; the rest is split as
                             * above). */
    int cuda_graphs;        /* 1 (default): on KVQ_DEVICE_CUDA a decode step's layers run
                             * as one CUDA graph, recorded once per batch size and
                             * replayed (kvq_cuda.h, "step graphs"); 0: every kernel
                             * launched one by one */
    int center_k;           /* key centering (kvq_cache_config.center_k) in every layer
                             * whose K type is compressed: KVQ_CENTER_AUTO (-1, the
                             * default, as in the kvq command) where the window
                             * (recent_f16) is on; 1 likewise, but a config without the
                             * window is refused; 0: off. Costs a 4-bit mean per page and
                             * KV head (0.03 bits per value at d = 128, 64-token pages)
                             * and lowers the keys' error 1.2-1.7x (docs/frontier.md) */
    size_t expert_cache;    /* mixture-of-experts models on the CPU: 0 (default) reads the
                             * experts where the checkpoint is mapped, so every expert used stays
                             * resident; > 0 keeps at most this many bytes of experts (whole experts,
                             * at least one) and preads the others from the checkpoint's files when
                             * the router picks them, least recently used out first: resident
                             * memory bounded, results bit-identical (kvq_seq_stats.experts) */
    int expert_prefetch;    /* with expert_cache: 1 reads ahead, on a thread of its own, the
                             * experts the next sparse layer's router picks on this layer's input,
                             * into slots neither layer holds; 0 (default): reads only what a layer
                             * fetches. Same results either way; off by default until it is measured
                             * to help on a real model (on the random test checkpoints it does not:
                             * bench_experts) */
    int expert_direct;      /* with expert_cache: 1 reads the experts with O_DIRECT, past the
                             * page cache (whose copies would otherwise take as much memory
                             * again as the experts read, until the kernel drops them), in
                             * 4 KiB-aligned pieces; refused at create where the filesystem
                             * does not support it. 0 (default): plain pread. Same results */
    int fast_prefill;       /* 1 (default): on KVQ_DEVICE_CUDA a product of more than 64 rows
                             * (a prefill chunk) with 16-bit weights rounds its inputs to the
                             * weights' type, one GEMM with f32 sums, as transformers', vLLM's
                             * and llama.cpp's bf16 forwards do (logits ~2e-3 x max|logit|
                             * from float32); 0 (kvq --exact-prefill): f32 inputs, each as
                             * two 16-bit halves, two GEMMs, matching a float32 forward (~2x
                             * the products' time); decode steps (up to 64 rows) keep f32
                             * inputs either way */
};
/* kvq_seq_config.max_chunk's default on the CPU: tokens per prefill forward
 * (also the chunk of `kvq serve` and the base of kvq_batch's max_rows). */
#define KVQ_DEFAULT_MAX_CHUNK 256
/* The same on KVQ_DEVICE_CUDA: the products and the prefill attention reach
 * their rate only on thousands of rows (one H200, Llama-3.1-8B shape, default
 * cache: a 32K prompt in 4.0 s in chunks of 256, 1.6 s in chunks of 8192; a
 * 128K prompt in 15.6 s in chunks of 2048, 13.1 s in 8192), at the price of
 * activations for that many rows (kvq_seq_plan.work_bytes). */
#define KVQ_DEFAULT_MAX_CHUNK_CUDA 8192
/** @return kvq_seq_config.max_chunk's default on dev (what 0 there means, and
 *  the kvq command's --chunk default): KVQ_DEFAULT_MAX_CHUNK_CUDA on
 *  KVQ_DEVICE_CUDA, KVQ_DEFAULT_MAX_CHUNK otherwise. */
KVQ_API int kvq_default_max_chunk(enum kvq_device dev);
/* kvq_seq_config.recent_f16: decided from the cache types. */
#define KVQ_WINDOW_AUTO (-1)
/* kvq_seq_config.center_k: wherever the window is on. */
#define KVQ_CENTER_AUTO (-1)

/** Fills cfg with the defaults the kvq command uses: tq3j keys, tq3 values,
 *  seed 0, the model's context, recent_f16 = KVQ_WINDOW_AUTO (so the window
 *  is on for compressed types), center_k = KVQ_CENTER_AUTO (so are centred
 *  keys), no sinks, no budget, CUDA graphs on. */
KVQ_API void kvq_seq_config_default(struct kvq_seq_config *cfg);

/** @return the recent_f16 setting cfg resolves to (0 or 1) for a model of
 *  n_layers layers: cfg->recent_f16 itself unless it is KVQ_WINDOW_AUTO. */
KVQ_API int kvq_seq_window_for(const struct kvq_seq_config *cfg, int n_layers);

/** 1 when t is compressed (not f32 or f16): the types KVQ_WINDOW_AUTO turns
 *  the recent window on for and KVQ_CENTER_AUTO centres the keys of. */
KVQ_API int kvq_type_is_compressed(enum kvq_type t);

/** 1 when cfg centres the keys of some layer of a model of n_layers layers
 *  (center_k on and the window on, a compressed K type there): the rule
 *  kvq_layer_spec.center_k follows, without the model (key-outlier layers,
 *  whose keys are f16, aside). */
KVQ_API int kvq_seq_centred(const struct kvq_seq_config *cfg, int n_layers);

/** Creates a sequence state for m: caches (whose pages grow on demand up to
 *  max_ctx), buffers, RoPE tables, workspace, n-gram table.
 *  @return KVQ_OK and *out; KVQ_ERR_INVALID_ARG / KVQ_ERR_UNSUPPORTED (cache
 *  type for this head_dim) / KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_seq_create(const kvq_model *m, const struct kvq_seq_config *cfg, kvq_seq **out, kvq_error *err);

/** Frees s; accepts NULL. */
KVQ_API void kvq_seq_free(kvq_seq *s);

/* What a cache configuration costs for a model, and how far a budget goes. */
struct kvq_seq_plan {
    size_t bytes_per_token;  /* exact encoded K+V bytes of one token, all layers and KV heads
                              * (with center_k a page's key means are spread over its
                              * tokens, rounded up to whole bytes per layer) */
    size_t page_tokens;      /* tokens per cache page */
    size_t page_bytes;       /* bytes of one page of one layer */
    size_t max_tokens;       /* most tokens that fit kv_budget (whole pages in every
                              * layer's share), capped at max_ctx (model max when 0) */
    size_t bytes_at_max;     /* page bytes, all layers, holding max_tokens tokens */
    size_t budget_tokens;    /* tokens the budget alone would hold (not capped by the
                              * context); SIZE_MAX without a budget */
    size_t fixed_bytes;      /* f16 override buffers (recent_f16, sink_tokens), all
                              * layers: allocated at create, included in bytes_at_max */
    size_t max_chunk;        /* tokens per prefill forward: max_chunk or its default
                              * (kvq_default_max_chunk), at most the context */
    size_t work_bytes;       /* on KVQ_DEVICE_CUDA, the device bytes allocated at create
                              * for forwards of max_chunk rows besides the weights and
                              * the cache: the activations, the LM head's rows, the
                              * products' 16-bit inputs and the dense prefill
                              * scratch (cuBLAS's workspace and the RoPE tables aside);
                              * 0 on the CPU or in a build without CUDA */
};

/** Plans a sequence of model m with cfg's types, f16 overrides, kv_budget and
 *  max_ctx without allocating anything; exactly what kvq_seq_create would
 *  enforce. @return KVQ_OK; KVQ_ERR_INVALID_ARG (NULL, unknown type, bad
 *  recent_f16 / sink_tokens, center_k without the window);
 *  KVQ_ERR_UNSUPPORTED (type for this head_dim). */
KVQ_API kvq_status kvq_seq_plan_of(const kvq_model *m, const struct kvq_seq_config *cfg, struct kvq_seq_plan *out);

/* ---- per-layer memory spec -------------------------------------------
 * What one layer's memory is made of for a model and a sequence config,
 * computed in one place (kvq_layer_specs) and read by every plan, budget
 * and pool: kvq_seq_plan_of, the per-layer budget shares of kvq_seq, the
 * page pool of kvq_batch, the device store's pool and `kvq run --plan`. */

/* What a layer keeps per sequence. Only KV caches today; a recurrent
 * layer's state (fixed size, no pages) would be another kind. */
enum kvq_layer_kind {
    KVQ_LAYER_KV_CACHE = 0 /* keys and values in pages of page_tokens tokens */
};

struct kvq_layer_spec {
    enum kvq_layer_kind kind;
    enum kvq_type type_k, type_v; /* as cached: a key-outlier layer's keys are f16 */
    size_t page_tokens;  /* tokens per page */
    size_t page_bytes;   /* bytes of one page of one sequence (with center_k its key means) */
    size_t token_bytes;  /* encoded K+V bytes of one token, all KV heads, without the
                          * page's key means: the weight of the layer's budget share */
    size_t fixed_bytes;  /* bytes the layer holds once whatever the sequences (0 for a KV cache) */
    size_t state_bytes;  /* bytes each sequence holds from create on, whatever its length:
                          * the f16 override buffers (recent window, sinks) on the device
                          * the config names (the device keeps them apart, unbounded by
                          * max_ctx); a recurrent layer's state would be here */
    int recent_f16;      /* the recent-token f16 window is on */
    int center_k;        /* the keys are centred per page */
    int window;          /* sliding-window attention: tokens a query sees; 0 = all */
    int can_rollback;    /* 1: any truncation keeps the layer exact; 0 (a windowed layer's
                          * ring of segments): only the last few hundred tokens (a
                          * speculative rollback) */
    int can_share;       /* 1: a prefix's pages can be shared by sequences (kvq_batch_share) */
};

/** The memory spec of every layer of m for cfg (KVQ_WINDOW_AUTO resolved as
 *  kvq_seq_window_for does) into out[0..n_layers).
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (NULL, unknown type, bad recent_f16
 *  or sink_tokens, center_k without the window); KVQ_ERR_UNSUPPORTED (a
 *  type for this head_dim). err (may be NULL) gets one line naming the
 *  layer or setting. */
KVQ_API kvq_status kvq_layer_specs(const kvq_model *m, const struct kvq_seq_config *cfg, struct kvq_layer_spec *out,
                                   kvq_error *err);

/** Back to an empty sequence: caches emptied (pages kept), position 0,
 *  n-gram table cleared, sampler RNG reseeded from the config seed,
 *  statistics zeroed. */
KVQ_API void kvq_seq_reset(kvq_seq *s);

/** Tokens in the cache (= the position of the next token). */
KVQ_API size_t kvq_seq_pos(const kvq_seq *s);

/** Largest context of s. */
KVQ_API size_t kvq_seq_max_ctx(const kvq_seq *s);

/** Runs ids[0..n) at positions pos..pos+n-1 (in chunks of max_chunk),
 *  appending them to the caches. For the tokens [first_out, n) it writes
 *  logits ([n - first_out][vocab], if logits != NULL) and/or the greedy
 *  token (argmax, lowest id on ties; [n - first_out], if argmax != NULL);
 *  the LM head is skipped entirely when both are NULL, and greedy-only
 *  calls reduce each vocabulary slice without building full logits.
 *  @return KVQ_OK; KVQ_ERR_RANGE (an id outside [0, vocab): nothing
 *  appended); KVQ_ERR_CONTEXT_FULL (pos + n > max_ctx: nothing appended);
 *  KVQ_ERR_INVALID_ARG; a cache/attention error (the caches are then
 *  truncated back to pos; with recent_f16 the pages for all n tokens are
 *  reserved first, so a refused budget changes nothing, and only a failure
 *  after that, e.g. non-finite activations, can cost the f16 copies of pos's
 *  partly filled page); KVQ_ERR_IO (expert_cache: reading an expert from
 *  the checkpoint failed; as a cache error, the caches are truncated back
 *  to pos, and the slots being read are dropped, so a later call reads
 *  them again); KVQ_ERR_NONFINITE (NaN/Inf logits: the tokens stay
 *  appended, the outputs are undefined). */
KVQ_API kvq_status kvq_seq_forward(kvq_seq *s, const int32_t *ids, size_t n, size_t first_out, float *logits,
                           int32_t *argmax);

/** After a forward or generate call on s that returned KVQ_ERR_IO: the
 *  expert read that failed (the file, the bytes, the offset and the
 *  reason). NULL when the last expert read succeeded; after other failures
 *  it may still describe an earlier one, so ask only after KVQ_ERR_IO.
 *  Owned by s, valid until the next call on s. */
KVQ_API const char *kvq_seq_error_detail(const kvq_seq *s);

/** Drops tokens [n, pos) from every cache and the history (speculative
 *  rollback). With recent_f16, a rollback into a page before the one of the
 *  last token may leave the kept tokens of the then partly filled page read
 *  packed (kvq_cache.h); kvq_seq_generate's speculative steps never do that. @return KVQ_OK or KVQ_ERR_INVALID_ARG (n > pos). */
KVQ_API kvq_status kvq_seq_truncate(kvq_seq *s, size_t n);

/** Called once per layer and chunk with the post-RoPE q [T][n_heads][head_dim],
 *  k and v [T][n_kv_heads][head_dim] of tokens at positions pos0..pos0+T-1
 *  (after the q/k norm when the model has one). For dumps and analysis; NULL
 *  removes the hook. Called for CPU sequences only (a CUDA sequence keeps
 *  them in device memory). */
typedef void (*kvq_qkv_hook)(void *user, int layer, size_t pos0, size_t T, const float *q, const float *k,
                             const float *v);
KVQ_API void kvq_seq_set_qkv_hook(kvq_seq *s, kvq_qkv_hook fn, void *user);

/** The caches (read-only), e.g. for statistics or external attention. */
KVQ_API const struct kvq_cache *kvq_seq_cache(const kvq_seq *s, int layer);

/* ---- generation ------------------------------------------------------- */

/* Most draft tokens one speculative step verifies. */
#define KVQ_MAX_DRAFT 15

struct kvq_gen_params {
    int max_tokens;       /* tokens to generate (>= 0) */
    float temperature;    /* 0 = greedy */
    int top_k;            /* 0 = off */
    float top_p;          /* 1 = off */
    int speculative;      /* n-gram draft tokens per step, 0..KVQ_MAX_DRAFT (0 = plain decoding) */
    int stop_at_eos;      /* stop after an EOS id of the config (default 1) */
};
KVQ_API void kvq_gen_params_default(struct kvq_gen_params *p);

/* Called with each generated token as soon as it is final; return non-zero
 * to stop generation. */
typedef int (*kvq_token_fn)(void *user, int32_t id);

/** Prefills prompt[0..n_prompt) (appended at the current position) and
 *  generates up to p->max_tokens tokens into out[0..max_out) (*n_out written).
 *  Greedy when temperature is 0; otherwise samples from the temperature /
 *  top-k / top-p distribution with the sequence's RNG. With speculative > 0,
 *  drafts from the n-gram table are verified in one forward of T = N + 1 and
 *  the longest prefix the model agrees with is kept (the caches roll back
 *  the rest), which leaves the output identical to plain decoding. With
 *  the recent-token window a verify pass never fills a cache page (N is
 *  cut at the page's end, the page's last two positions take no drafts), so
 *  a rollback stays in the page the window's ring holds and a centred
 *  page's key mean comes from kept tokens only.
 *  Generation also stops at the context end (KVQ_OK, fewer tokens).
 *  When the KV budget runs out during decoding the call returns
 *  KVQ_ERR_BUDGET, and out[0..*n_out) still holds every token produced so
 *  far (each final; the caches hold the prompt and all but the last).
 *  @return KVQ_OK; KVQ_ERR_CONTEXT_FULL (the prompt does not fit);
 *  KVQ_ERR_BUDGET (the prompt does not fit the budget: *n_out = 0, or the
 *  budget ran out while generating: see above);
 *  KVQ_ERR_RANGE (prompt id out of range); other errors from forward. */
KVQ_API kvq_status kvq_seq_generate(kvq_seq *s, const int32_t *prompt, size_t n_prompt, const struct kvq_gen_params *p,
                            int32_t *out, size_t max_out, size_t *n_out, kvq_token_fn fn, void *user);

/* What an expert cache (kvq_seq_config.expert_cache) did since the state
 * was created: in kvq_seq_stats and kvq_batch_stats alike; all zero
 * without a cache. */
struct kvq_expert_stats {
    size_t cache_bytes;        /* the slots' memory */
    size_t hits, misses;       /* experts a forward used that were held / read from the files */
    size_t bytes_read;         /* read for the misses */
    double t_read;             /* seconds reading them (inside t_matmul) */
    size_t prefetched;         /* experts read ahead (kvq_seq_config.expert_prefetch) */
    size_t prefetch_bytes;     /* their bytes */
    double t_prefetch;         /* seconds the read-ahead thread spent reading them */
    size_t prefetch_hits;      /* hits on an expert read ahead (among hits) */
    double t_wait;             /* seconds forwards waited for a read-ahead to land */
};

struct kvq_seq_stats {
    size_t tokens;            /* in the cache */
    size_t prefill_tokens;    /* tokens run through forward in chunks of T > 1 */
    size_t decode_tokens;     /* tokens generated */
    size_t decode_forwards;   /* forward calls during generation */
    size_t drafted, accepted; /* speculative draft tokens proposed / accepted */
    size_t kv_bytes_used;     /* what the cached tokens occupy in all layers */
    size_t kv_bytes_alloc;    /* pages allocated, plus the f16 window/sink buffers */
    size_t kv_bytes_f16;      /* what an f16 cache would need for them */
    double t_prefill;         /* seconds in prompt forwards */
    double t_decode;          /* seconds in generation (forwards + sampling) */
    double t_matmul;          /* of both: projection and MLP sgemm */
    double t_attn;            /* of both: cache append + kvq attention */
    double t_lm_head;         /* of both: final norm + LM head + reduction/sampling */
    double t_host;            /* the rest: embeddings, norms, RoPE, copies, drafts */
    size_t kv_budget;         /* the configured budget (0 = none) */
    size_t kv_bytes_f16_buffers; /* f16 window/sink buffers, all layers (also in kv_bytes_alloc) */
    /* KVQ_DEVICE_CUDA: seconds of GPU time per part, from events around
     * each part's queued work (the host times above are then mostly
     * queuing); 0 on the CPU. gpu_other: embedding, norms, RoPE, GLU. */
    double gpu_matmul, gpu_attn, gpu_lm_head, gpu_other;
    size_t gpu_graph_steps; /* decode steps that ran as one CUDA graph (kvq_seq_config.cuda_graphs),
                             * since the state was created; 0 on the CPU */
    struct kvq_expert_stats experts; /* kvq_seq_config.expert_cache */
};
/** Fills st. With a CUDA sequence this waits for its queued GPU work. */
KVQ_API void kvq_seq_get_stats(const kvq_seq *s, struct kvq_seq_stats *st);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_MODEL_H */
