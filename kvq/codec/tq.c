/* tq.c - run-time choice between the AVX2 and the scalar tq row kernels.
 * Both give identical bits (see codec_internal.h), so the choice only
 * changes speed; KVQ_FORCE_SCALAR=1 selects the references. */
#include "codec_internal.h"
#include "kvq_cpu.h"

kvq_status kvq_tq_encode(const kvq_codec *c, const float *x, const struct kvq_row *dst)
{
    return kvq_cpu_has_avx2() ? kvq_tq_encode_avx2(c, x, dst) : kvq_tq_encode_ref(c, x, dst);
}

void kvq_tq_decode(const kvq_codec *c, const struct kvq_row *src, float *x)
{
    if (kvq_cpu_has_avx2())
        kvq_tq_decode_avx2(c, src, x);
    else
        kvq_tq_decode_ref(c, src, x);
}

float kvq_tq_score(const kvq_codec *c, const float *qprep, const struct kvq_row *src)
{
    return kvq_cpu_has_avx2() ? kvq_tq_score_avx2(c, qprep, src) : kvq_tq_score_ref(c, qprep, src);
}
