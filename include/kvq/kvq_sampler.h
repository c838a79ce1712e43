/* kvq_sampler.h - choosing the next token from logits, exactly.
 *
 * Greedy (temperature 0) is argmax, ties to the smaller id. Otherwise the
 * distribution is, with no approximation beyond double rounding:
 *   1. z_i = logit_i / temperature;
 *   2. top-k: keep the tokens whose logit is >= the k-th largest logit
 *      (tokens tied with the k-th are all kept, as HF's TopKLogitsWarper does);
 *   3. p_i = softmax(z) over the kept tokens;
 *   4. top-p: order the kept tokens by logit, descending (ties: smaller id
 *      first), and keep token r while the mass of the tokens before it is
 *      < top_p (the smallest prefix whose mass reaches top_p; the first token
 *      is always kept), as HF's TopPLogitsWarper does;
 *   5. renormalise over what is left and draw with kvq_rng (xoshiro256**,
 *      one 53-bit uniform per draw), so a seed fixes the whole sequence.
 * Logits may be -INFINITY (a masked token: probability 0); NaN or +INFINITY
 * is an error (KVQ_ERR_NONFINITE) because it means the model broke.
 *
 * The sampler owns all scratch memory for its vocabulary size, allocated at
 * create: sampling never allocates. One sampler per sequence (it holds that
 * sequence's RNG); different samplers may run on different threads.
 *
 * Vocabulary slices: a sharded LM head reduces each slice with kvq_argmax()
 * and combines the results with kvq_best_merge() for greedy decoding, and for
 * sampling writes each slice's logits at its offset into one array of
 * vocab_size floats that it hands to kvq_sampler_sample().
 */
#ifndef KVQ_SAMPLER_H
#define KVQ_SAMPLER_H

#include "kvq_export.h"

#include <stdint.h>

#include "kvq_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Plain data. */
typedef struct kvq_sampler_params {
    float temperature; /* 0: greedy; > 0: sample from softmax(logits / temperature) */
    int32_t top_k;     /* 0 (or >= vocab): no top-k cut */
    float top_p;       /* in (0, 1]; 1: no nucleus cut */
    uint64_t seed;     /* RNG seed of the sequence */
} kvq_sampler_params;

/** @return greedy defaults: temperature 0, top_k 0, top_p 1, seed 0. */
KVQ_API kvq_sampler_params kvq_sampler_params_default(void);

/** @return KVQ_OK, or KVQ_ERR_INVALID_ARG for temperature < 0 / NaN / Inf,
 *  top_k < 0, top_p outside (0, 1] or NaN (and p NULL). */
KVQ_API kvq_status kvq_sampler_params_check(const kvq_sampler_params *p);

typedef struct kvq_sampler kvq_sampler;

/** Plans a sampler for vocab_size logits (buffers allocated here, once).
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (vocab_size < 1, bad params, NULL);
 *  KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_sampler_create(int32_t vocab_size, const kvq_sampler_params *p, kvq_sampler **out);

/** Accepts NULL. */
KVQ_API void kvq_sampler_free(kvq_sampler *s);

/** New parameters; the RNG restarts from p->seed.
 *  @return KVQ_OK or KVQ_ERR_INVALID_ARG (sampler unchanged). */
KVQ_API kvq_status kvq_sampler_set_params(kvq_sampler *s, const kvq_sampler_params *p);

/** @return the current parameters (zeros for NULL). */
KVQ_API kvq_sampler_params kvq_sampler_get_params(const kvq_sampler *s);

/** Restarts the RNG from the parameters' seed (a new sequence). */
KVQ_API void kvq_sampler_reset(kvq_sampler *s);

/** Advances the RNG past n draws (n >= 0; nothing when greedy: greedy
 *  draws nothing): after tokens drawn elsewhere at its next uniforms
 *  (kvq_batch_item.sampler of a verify item), past the ones kept. */
KVQ_API void kvq_sampler_skip(kvq_sampler *s, int n);

/** Draws one token from logits[0..vocab_size). Never allocates.
 *  @return KVQ_OK and *token; KVQ_ERR_NONFINITE for a NaN or +Inf logit;
 *  KVQ_ERR_INVALID_ARG for NULL or when every logit is -Inf. On error
 *  *token is -1 and the RNG has not advanced. */
KVQ_API kvq_status kvq_sampler_sample(kvq_sampler *s, const float *logits, int32_t *token);

/** The exact distribution kvq_sampler_sample draws from: probs[0..vocab_size)
 *  (0 outside the kept set, summing to 1; one-hot at the argmax when
 *  temperature is 0). Does not touch the RNG. Errors as kvq_sampler_sample. */
KVQ_API kvq_status kvq_sampler_probs(kvq_sampler *s, const float *logits, double *probs);

/* ---- greedy over vocabulary slices ---------------------------------------- */

/* The best token seen so far and its logit. */
typedef struct kvq_best {
    int32_t token; /* -1: none yet */
    float score;
} kvq_best;

/** @return an empty kvq_best (token -1), the identity of kvq_best_merge. */
KVQ_API kvq_best kvq_best_none(void);

/** Reduces one slice: best->token = first_token + argmax of logits[0..n)
 *  (ties: the smaller id), best->score its logit (-INFINITY when the whole
 *  slice is masked: merging then prefers any other slice).
 *  @return KVQ_OK; KVQ_ERR_NONFINITE for a NaN or +Inf logit;
 *  KVQ_ERR_INVALID_ARG for NULL or n < 1 (best untouched on error). */
KVQ_API kvq_status kvq_argmax(const float *logits, int32_t n, int32_t first_token, kvq_best *best);

/** acc = the better of acc and b (higher score; ties: smaller token), so
 *  merging slice results in any order gives the argmax of the whole. */
KVQ_API void kvq_best_merge(kvq_best *acc, kvq_best b);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_SAMPLER_H */
