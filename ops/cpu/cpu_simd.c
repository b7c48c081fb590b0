/* Which vector instructions the CPU's kernels use (cpu_internal.h): asked of
 * the CPU once, capped by NB_CPU_SIMD ("baseline", "avx2" or "avx512") when
 * that is set, and set by tests through nb__cpu_simd_use. */
#include "cpu_internal.h"

#include <stdlib.h>
#include <string.h>

static int g_level = -1; /* -1: not asked yet */

static int level_named(const char *name)
{
    if (!name)
        return -1;
    return strcmp(name, "avx512") == 0 ? 2 : strcmp(name, "avx2") == 0 ? 1 : strcmp(name, "baseline") == 0 ? 0 : -1;
}

static int cpu_level(void)
{
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        return 0;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw"))
        return 2;
    return 1;
#else
    return 0;
#endif
}

int nb__cpu_simd_level(void)
{
    int k = __atomic_load_n(&g_level, __ATOMIC_RELAXED);
    if (k < 0) {
        k = cpu_level();
        int cap = level_named(getenv("NB_CPU_SIMD"));
        if (cap >= 0 && cap < k)
            k = cap;
        __atomic_store_n(&g_level, k, __ATOMIC_RELAXED);
    }
    return k;
}

bool nb__cpu_simd_use(const char *name)
{
    int want = level_named(name);
    if (want < 0 || want > cpu_level())
        return false;
    __atomic_store_n(&g_level, want, __ATOMIC_RELAXED);
    return true;
}
