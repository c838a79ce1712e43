/* kv_auto.h - `--kv-auto` in `kvq run`, `kvq ppl` and `kvq passkey`: the
 * library chooses per-layer K/V cache types for the byte budget
 * (kvq_kv_auto, kvq_eval.h, says how); this reads the calibration text,
 * prints the choice and puts it into the command's options. */
#ifndef KVQ_KV_AUTO_H
#define KVQ_KV_AUTO_H

#include <stddef.h>

#include "kv_opts.h"
#include "kvq_model.h"
#include "kvq_tokenizer.h"

/* The whole --kv-auto step of a command, after the model is loaded: reads
 * the calibration text (o->auto_calib or <model_dir>/reference/valid.txt),
 * scores, chooses for o->budget at ctx tokens (o->auto_ctx when set), writes
 * o->layer_types / n_layer_types and o->auto_choice, prints one line per
 * layer to stderr unless quiet. @return 0, or 2 after printing the error. */
int kv_auto_apply(const char *cmd, struct kv_opts *o, const kvq_model *m, const kvq_tokenizer *tok,
                  const char *model_dir, size_t ctx, int quiet);

/* Adds "kv_auto": {ctx, budget, metric, total_err, layers: [{k, v, bits,
 * err}]} to a cJSON object (passed as void * so callers need not include
 * cJSON here) when o->kv_auto is set. */
void kv_auto_json(void *cjson_root, const struct kv_opts *o, const kvq_model *m);

#endif
