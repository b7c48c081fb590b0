/* The tests' reproducible random numbers: SplitMix64 over one state per
 * executable, which a test may set back to RNG_SEED to draw the same numbers
 * again. */
#ifndef NB_TEST_SPLITMIX_H
#define NB_TEST_SPLITMIX_H

#include <stdint.h>

#define RNG_SEED 0x9E3779B97F4A7C15ull

static uint64_t rng_state = RNG_SEED;

/* The next 64 random bits. */
static inline uint64_t rng_u64(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1), from the top 53 bits. */
static inline double rng_unit(void) { return (double)(rng_u64() >> 11) * 0x1.0p-53; }

#endif
