/* eval_spec.h - which cache configurations `kvq eval` measures.
 *
 * A configuration is a K type, a V type and the codec variant (rotation kind,
 * QJL projection kind, seed). The command line names them as a comma list:
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
#include <stdint.h>

#include "kvq_codec.h"
#include "kvq_rotation.h"
#include "kvq_status.h"

#define EVAL_LABEL_MAX 48
#define EVAL_MAX_CONFIGS 256

struct eval_config {
    enum kvq_type type_k, type_v;
    enum kvq_rot_kind rot;
    enum kvq_qjl_kind qjl;
    uint64_t seed;
    /* "tq3j/tq3", plus "+dct", "+gauss", "+s7" where the variant differs
     * from the run's defaults, so plot labels stay short but unambiguous. */
    char label[EVAL_LABEL_MAX];
};

/* Sets the variant fields of d (types f32/f32) to HADAMARD, ORTHO, seed 0. */
void eval_config_defaults(struct eval_config *d);

/* Fills c->label from its fields, relative to the defaults `def`. */
void eval_config_label(struct eval_config *c, const struct eval_config *def);

/* Parses a --types list into out[0..*n) (at most cap entries).
 * @return KVQ_OK, or KVQ_ERR_INVALID_ARG with one line in err. */
kvq_status eval_spec_parse(const char *spec, const struct eval_config *def, struct eval_config *out, size_t cap,
                           size_t *n, kvq_error *err);

/* The --sweep grid: the f32 floor, the f16/q8_0/q4_0 baselines, tqB/tqB and
 * tqBj/tqB for B = 1..4, mixed pairs, and K-only (V = f16) / V-only
 * (K = f16) rows that separate the two sides' errors.
 * @return the number of entries written (at most cap). */
size_t eval_sweep_default(const struct eval_config *def, struct eval_config *out, size_t cap);

/* Puts an f32/f32 configuration (the floor: only float rounding) first when
 * the list has none. @return the new count (unchanged when full). */
size_t eval_ensure_floor(const struct eval_config *def, struct eval_config *cfgs, size_t n, size_t cap);

#endif
