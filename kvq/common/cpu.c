/* cpu.c - feature detection for the SIMD dispatch (see kvq_cpu.h).
 * Uses cpuid directly: clang does not know every feature name that
 * __builtin_cpu_supports() takes in gcc ("f16c"), and the fuzz build is clang. */
#include "kvq_cpu.h"

#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static int x86_has_avx2_fma_f16c(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!(fma && osxsave && avx && f16c))
        return 0;
    /* The OS must save the YMM state (XCR0 bits 1 and 2). */
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    (void)xhi;
    if ((xlo & 6u) != 6u)
        return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    return (b >> 5) & 1; /* AVX2 */
}
#endif

int kvq_cpu_has_avx2(void)
{
    static _Atomic int cached = -1; /* every thread computes the same value */
    int v = cached;
    if (v < 0) {
        int ok = 0;
#if defined(__x86_64__) || defined(__i386__)
        ok = x86_has_avx2_fma_f16c();
#endif
        const char *force = getenv("KVQ_FORCE_SCALAR");
        if (force && *force && *force != '0')
            ok = 0;
        cached = v = ok;
    }
    return v;
}
