/* cpu.c - feature detection for the SIMD dispatch (see cpu_internal.h). */
#include "cpu_internal.h"

#include <stdatomic.h>
#include <stdlib.h>

int kvq_cpu_has_avx2(void)
{
    static _Atomic int cached = -1; /* every thread computes the same value */
    if (cached < 0) {
        int ok = 0;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_cpu_init();
        ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
#endif
        const char *force = getenv("KVQ_FORCE_SCALAR");
        if (force && *force && *force != '0')
            ok = 0;
        cached = ok;
    }
    return cached;
}
