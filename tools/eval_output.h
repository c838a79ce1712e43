/* eval_output.h - `kvq eval` results: the stdout table, CSV, JSON and plot.
 *
 * Files hold only the measured numbers (no timings, no dates), so the same
 * command twice writes byte-identical files.
 */
#ifndef KVQ_EVAL_OUTPUT_H
#define KVQ_EVAL_OUTPUT_H

#include <stdio.h>

#include "kvq_eval.h"
#include "kvq_status.h"

struct eval_result {
    struct kvq_eval_config cfg;
    struct kvq_eval_cost cost;
    struct kvq_eval_sums total;   /* all layers merged, in layer order */
    struct kvq_eval_sums *layers; /* [run->n_layers], in run->layers order */
    int front_out, front_kl;  /* on the Pareto front of (bits, out_err) / (bits, KL) */
};

/* One input (dump or synthetic data) with the results of every configuration. */
struct eval_run {
    const struct kvq_eval_data *data;
    size_t queries_used;
    double eff_keys, top_p, v_gain; /* kvq_eval_ctx_attention_stats of the exact attention */
    const int *layers;        /* the layers measured (--layers), ascending */
    int n_layers;
    struct eval_result *res;
    size_t n_res;
};

/* Marks the Pareto fronts: a configuration is on a front when no other one
 * has both fewer-or-equal bits and lower-or-equal error, one of them
 * strictly. Left out: the f32/f32 floor (the reference, not a choice) and
 * lossless configurations (eval_is_lossless), which trade nothing. */
void eval_mark_pareto(struct eval_run *run);

/* 1 when r's out_err (which 0) or KL (which 1) is within 10x of the f32
 * floor's: f16 on an f16 dump, or the KL of a row whose keys are exact. */
int eval_is_lossless(const struct eval_run *run, const struct eval_result *r, int which);

/* Readable table; per_layer adds one line per layer under each configuration. */
void eval_print_table(FILE *f, const struct eval_run *run, int per_layer);

/* Writes the CSV to path, whole or not at all (kvq_file.h).
 * @return 0, or -1 with the reason in err. */
int eval_write_csv(const char *path, const struct eval_run *runs, size_t n_runs, kvq_error *err);

/* The JSON document of every run (cJSON_free it): one line, or indented
 * when pretty. NULL when out of memory. */
char *eval_json_text(const struct eval_run *runs, size_t n_runs, int pretty);

/* Whether --plot can work, before any work: gnuplot installed, the path
 * plain, its directory writable. @return 0, or -1 with the reason in why. */
int eval_plot_check(const char *png_path, char *why, size_t why_len);

/* Plots attention-output error and KL against bits per value with gnuplot,
 * one point per configuration, Pareto fronts drawn, the f32 floor as a line.
 * @return 0; otherwise -1 with a one-line reason in why (gnuplot missing,
 * gnuplot failed, temp file not writable, bad path). */
int eval_plot(const char *png_path, const struct eval_run *run, char *why, size_t why_len);

/* The plot path for input i of n: png_path itself when n == 1, otherwise
 * the input's name inserted before the extension ("out.png" -> "out-kv_text.png"). */
void eval_plot_path(const char *png_path, const struct eval_run *run, size_t n_runs, char *out, size_t out_len);

#endif
