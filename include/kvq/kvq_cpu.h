/* kvq_cpu.h - run-time CPU feature checks for the SIMD paths.
 *
 * SIMD kernels live in *_avx2.c files compiled with -mavx2 -mfma -mf16c; the
 * dispatcher calls them only when the running CPU has all three, so one
 * binary runs everywhere. KVQ_FORCE_SCALAR=1 in the environment forces the
 * scalar reference paths (used by tests to compare both on one machine).
 */
#ifndef KVQ_CPU_H
#define KVQ_CPU_H

#include "kvq_export.h"

/** @return 1 when AVX2, FMA and F16C are usable and not disabled by KVQ_FORCE_SCALAR. */
KVQ_API int kvq_cpu_has_avx2(void);

#endif
