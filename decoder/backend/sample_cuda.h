/* sample_cuda.h - choosing tokens where the logits are: on the GPU.
 *
 * The LM head's logits stay in device memory; only the chosen ids (and a
 * status per row) come back to the host. Sampling is kvq_sampler_pick's
 * definition (kvq_sampler.h) computed on the device: the same order of the
 * tokens (a stable radix sort on the same keys), the same top-k ties, the
 * same top-p prefix and the same inverse-CDF draw at a uniform the host
 * sampler's RNG supplies, with the weights and their running sums in double.
 * The sums are formed in a different order than the CPU's sequential loop,
 * so an id can differ only where the draw lands within a few ulps of a
 * boundary between two tokens' cumulative masses.
 *
 * Everything is queued on the legacy default stream, after the work that
 * wrote the logits (the backend's own stream is a blocking one, so the
 * legacy stream waits for it); the two calls wait only for the ids they
 * return.
 * Internal to the CUDA backend (backend_cuda.cu) and its tests.
 */
#ifndef KVQ_SAMPLE_CUDA_H
#define KVQ_SAMPLE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "kvq_sampler.h"
#include "kvq_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvq_gpu_sampler kvq_gpu_sampler;

/** Plans argmax over up to max_rows rows of vocab logits and sampling of
 *  any number of rows (a few at a time: the device scratch is bounded).
 *  @return KVQ_OK and *out; KVQ_ERR_INVALID_ARG; KVQ_ERR_NOMEM (device
 *  memory); KVQ_ERR_DEVICE. */
kvq_status kvq_gpu_sampler_create(int32_t vocab, size_t max_rows, kvq_gpu_sampler **out);

/** Accepts NULL. */
void kvq_gpu_sampler_free(kvq_gpu_sampler *g);

/** best[0..R) (host) = argmax of each device row logits[R][vocab], lowest
 *  id on ties, as kvq_argmax.
 *  @return KVQ_OK; KVQ_ERR_NONFINITE when a row holds NaN or +Inf (its
 *  best is -1); KVQ_ERR_INVALID_ARG (R > max_rows); KVQ_ERR_DEVICE. */
kvq_status kvq_gpu_argmax(kvq_gpu_sampler *g, const float *logits, size_t R, int32_t *best);

/** Row r of the device logits[R][vocab] drawn with p[r]'s settings at the
 *  uniform u[r] in [0, 1), as kvq_sampler_pick (seeds are the host's:
 *  p[r].seed is not read). tok[r], row_st[r] on the host: row_st is
 *  kvq_sampler_pick's status for that row (tok -1 unless KVQ_OK).
 *  @return KVQ_OK (see row_st), KVQ_ERR_INVALID_ARG, KVQ_ERR_DEVICE. */
kvq_status kvq_gpu_sample(kvq_gpu_sampler *g, const float *logits, size_t R, const kvq_sampler_params *p,
                          const double *u, int32_t *tok, kvq_status *row_st);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_SAMPLE_CUDA_H */
