/* kv_opts.h - the KV-cache options `kvq run`, `kvq ppl` and `kvq passkey`
 * share: --cache-type-k, --cache-type-v, --kv-budget, --seed. */
#ifndef KVQ_KV_OPTS_H
#define KVQ_KV_OPTS_H

#include <stdint.h>
#include <stdio.h>

#include "kvq_eval.h"
#include "kvq_model.h"
#include "kvq_tokenizer.h"

struct kv_opts {
    enum kvq_type tk, tv; /* default tq3j / tq3 */
    size_t budget;        /* --kv-budget bytes, 0 = none */
    uint64_t seed;
    int n_layer_types;    /* --layer-types: 0, or one K/V pair per model layer */
    enum kvq_type layer_types[2 * KVQ_KV_AUTO_MAX_LAYERS];
    int v_norm_correct;   /* --v-norm-correct */
    int recent_f16;       /* the last, partly filled page also in f16: KVQ_WINDOW_AUTO (default)
                             as the library decides (kvq_seq_window_for: on when some layer's K
                             or V type is compressed); 1 --kv-recent-f16, 0 --no-kv-recent-f16 */
    int sink_tokens;      /* --kv-sink N: the first N tokens also in f16 (0 = off) */
    int key_outlier_f16;  /* 1 (default): keys of k_proj-bias outlier layers in f16
                             (kvq_seq_config.key_outlier_f16); 0 --no-key-outlier-f16 */
    int cuda_graphs;      /* 1 (default): decode steps as CUDA graphs; 0 --no-cuda-graphs */
    int fast_prefill;     /* 1, --exact-prefill 0 (kvq_seq_config.fast_prefill) */
    int center_k;         /* kvq_seq_config.center_k: KVQ_CENTER_AUTO (default) with the
                             window; 1 --kv-center-k (refused without it), 0 --no-kv-center-k */
    enum kvq_device device; /* --device cpu|cuda (default cpu) */
    /* --kv-auto (kv_auto.h): per-layer types chosen for budget at a context */
    int kv_auto;
    size_t auto_ctx;                     /* --kv-auto-ctx N, 0 = the command's context */
    enum kvq_kv_auto_metric auto_metric; /* --kv-auto-metric (default nll) */
    const char *auto_calib;              /* --kv-auto-calib F, NULL = <model>/reference/valid.txt */
    struct kvq_kv_auto_choice auto_choice; /* filled by kv_auto_apply */
};

void kv_opts_default(struct kv_opts *o);

/* Tries option a with value v. @return 1 when consumed, 0 when a is not a
 * KV option, 2 after printing an error (bad value). */
int kv_opts_parse(const char *cmd, const char *a, const char *v, struct kv_opts *o);

/* Flags without a value (--v-norm-correct, --kv-recent-f16,
 * --no-kv-recent-f16, --kv-auto). @return 1 when consumed. A new flag
 * without a value also goes into cli.c's value_less list, so that the
 * argument after it is read as an option (cli_normalize_args). */
int kv_opts_flag(const char *a, struct kv_opts *o);

/* What `kvq ppl` and `kvq passkey` share: --model, --json, --quiet and the
 * KV options. */
struct kv_cmd {
    const char *model;
    int json, quiet;
    struct kv_opts kv;
};

/* The argument loop of such a command (c is reset first): --help / -h
 * (usage(stdout)), the KV flags and options, --json, --quiet, --model DIR;
 * any other option with a value goes to own(user, option, value), which
 * returns 0 when it took it, 1 for a bad value, -1 for an unknown option.
 * @return 0; -1 help printed; 2 error printed. */
int kv_cmd_parse(const char *cmd, int argc, char **argv, struct kv_cmd *c, void (*usage)(FILE *),
                 int (*own)(void *user, const char *a, const char *v), void *user);

/* After the model is loaded: --layer-types must name every layer. Says on
 * stderr which layers keep their keys in f16 as k_proj-bias outliers.
 * @return 0 or 2 (printed). */
int kv_opts_check(const char *cmd, const struct kv_opts *o, const kvq_model *m);

/* "tq3j/tq3", "q8_0/tq3,tq3j/tq3,..." for per-layer types, then "+vnc" for
 * value norm correction, "+ctr" for centred keys (kvq_seq_centred), "+win"
 * for the recent f16 window (when kvq_seq_window_for turns it on) and
 * "+sinkN" for N sink tokens. */
void kv_opts_name(const struct kv_opts *o, char *buf, size_t cap);

/* Bits per cached value over all layers (K and V), from the plan: the pages
 * alone (bytes per token). */
double kv_bits_per_value(const struct kvq_seq_plan *pl, const struct kvq_model_config *c);

/* Bits per cached value of a full context of ctx tokens, the f16 override
 * buffers (recent window, sink tokens) included:
 * 8 (ctx bytes_per_token + fixed_bytes) / (ctx values per token). */
double kv_bits_at(const struct kvq_seq_plan *pl, const struct kvq_model_config *c, size_t ctx);

/* A type name or an error naming every type. @return 0 or 2 (printed). */
int kv_parse_type(const char *cmd, const char *s, enum kvq_type *t);

/* The --help lines for these options. */
void kv_opts_usage(FILE *f);

/* Fills a sequence config from o (types, seed, budget, window, sinks); the
 * window may be KVQ_WINDOW_AUTO: kvq_seq_window_for(sc, n_layers) resolves it
 * (the window takes tq3j/tq3 from +3.8% to +0.7% perplexity on the bundled
 * model, docs/long-context.md). */
void kv_opts_seq_config(const struct kv_opts *o, struct kvq_seq_config *sc);

/* Loads dir's model and tokenizer.json (BOS/EOS from the config), then, when
 * check is not NULL, kv_opts_check(cmd, check, model), runs fn(user, model,
 * tokenizer) and frees both. @return fn's exit status, or 2/1 after printing
 * a loading error. */
int kv_with_model(const char *cmd, const char *dir, const struct kv_opts *check,
                  int (*fn)(void *user, kvq_model *m, kvq_tokenizer *tok), void *user);

/* The cache fields of a command's JSON object (a cJSON *, passed as void *):
 * "cache" (kv_opts_name), "cache_type_k", "cache_type_v". */
void kv_opts_json(void *cjson_root, const struct kv_opts *o);

/* Prints root (a cJSON *, passed as void *) as one line on stdout and
 * deletes it. @return 0, or 1 after printing the error (out of memory). */
int kv_print_json(const char *cmd, void *cjson_root);


/* Peak resident set size of this process so far, bytes (getrusage). */
size_t kv_peak_rss(void);

#endif
