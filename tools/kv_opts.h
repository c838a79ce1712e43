/* kv_opts.h - the KV-cache options `kvq run`, `kvq ppl` and `kvq passkey`
 * share: --cache-type-k, --cache-type-v, --kv-budget, --seed. */
#ifndef KVQ_KV_OPTS_H
#define KVQ_KV_OPTS_H

#include <stdint.h>
#include <stdio.h>

#include "kvq_model.h"
#include "kvq_tokenizer.h"

#define KV_OPTS_MAX_LAYERS 256

struct kv_opts {
    enum kvq_type tk, tv; /* default tq3j / tq3 */
    size_t budget;        /* --kv-budget bytes, 0 = none */
    uint64_t seed;
    int n_layer_types;    /* --layer-types: 0, or one K/V pair per model layer */
    enum kvq_type layer_types[2 * KV_OPTS_MAX_LAYERS];
    int v_norm_correct;   /* --v-norm-correct */
    int recent_f16;       /* the last, partly filled page also in f16: -1 (default) on when some
                             layer's K or V type is compressed (not f32/f16), see kv_opts_window;
                             1 --kv-recent-f16, 0 --no-kv-recent-f16 */
    int sink_tokens;      /* --kv-sink N: the first N tokens also in f16 (0 = off) */
    /* --kv-auto (kv_auto.h): per-layer types chosen for budget at a context */
    int kv_auto;
    size_t auto_ctx;        /* --kv-auto-ctx N, 0 = the command's context */
    int auto_metric;        /* --kv-auto-metric: enum kv_auto_metric (kv_auto.h) */
    const char *auto_calib; /* --kv-auto-calib F, NULL = <model>/reference/valid.txt */
    size_t auto_ctx_used;   /* filled by kv_auto_apply */
    double auto_err[KV_OPTS_MAX_LAYERS]; /* chosen pair's out_err per layer */
};

void kv_opts_default(struct kv_opts *o);

/* Tries option a with value v. @return 1 when consumed, 0 when a is not a
 * KV option, 2 after printing an error (bad value). */
int kv_opts_parse(const char *cmd, const char *a, const char *v, struct kv_opts *o);

/* Flags without a value (--v-norm-correct, --kv-recent-f16,
 * --no-kv-recent-f16, --kv-auto). @return 1 when consumed. */
int kv_opts_flag(const char *a, struct kv_opts *o);

/* Whether the recent-token f16 window is on for these options: as asked,
 * or by default when some layer's K or V type is compressed. On the bundled
 * model the window takes tq3j/tq3 from +3.8% to +0.7% perplexity and from
 * 240 to 250 of 250 passkeys (docs/long-context.md); f32/f16 caches gain
 * nothing from it. */
int kv_opts_window(const struct kv_opts *o);

/* The same for one K/V pair under the --kv-recent-f16 setting w (-1, 0, 1). */
int kv_window_for_pair(int w, enum kvq_type tk, enum kvq_type tv);

/* After the model is loaded: --layer-types must name every layer.
 * @return 0 or 2 (printed). */
int kv_opts_check(const char *cmd, const struct kv_opts *o, const kvq_model *m);

/* "tq3j/tq3", "q8_0/tq3,tq3j/tq3,..." for per-layer types, then "+vnc" for
 * value norm correction, "+win" for the recent f16 window and "+sinkN" for N
 * sink tokens. */
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

/* Fills a sequence config from o (types, seed, budget). */
void kv_opts_seq_config(const struct kv_opts *o, struct kvq_seq_config *sc);

/* Loads dir's model and tokenizer.json (BOS/EOS from the config).
 * @return 0, or 2/1 after printing the error. */
int kv_load_model(const char *cmd, const char *dir, kvq_model **m, kvq_tokenizer **tok);


/* Peak resident set size of this process so far, bytes (getrusage). */
size_t kv_peak_rss(void);

#endif
