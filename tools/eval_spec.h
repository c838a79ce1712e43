/* eval_spec.h - parsing `kvq eval --types`: which cache configurations
 * (struct kvq_eval_config, kvq_eval.h) to measure.
 *
 *   --types k=tq3j:v=tq3,k=q8_0:v=q4_0,tq4,k=tq3j:v=tq3:qjl=gauss:seed=7
 *
 * An item is either one type name (K and V both) or colon-separated key=value
 * pairs with keys k, v (both required), rot, qjl, seed; omitted variant keys
 * take the command's defaults (--rot, --qjl, --seed).
 */
#ifndef KVQ_EVAL_SPEC_H
#define KVQ_EVAL_SPEC_H

#include <stddef.h>

#include "kvq_eval.h"

/* Parses a --types list into out[0..*n) (at most cap entries), each
 * labelled relative to def (kvq_eval_config_label).
 * @return KVQ_OK, or KVQ_ERR_INVALID_ARG with one line in err. */
kvq_status eval_spec_parse(const char *spec, const struct kvq_eval_config *def, struct kvq_eval_config *out,
                           size_t cap, size_t *n, kvq_error *err);

#endif
