// Test helper (header-only, included by test_sample_op.c, gpu/test_cuda_ops.c,
// gpu/test_cuda_sample.c): a seeded splitmix64 stream and the draws built on
// it. Each test binary has its own stream; a test seeds it and so gets the
// same inputs on every run.
#ifndef VELA_TESTS_RNG_SPLITMIX_H
#define VELA_TESTS_RNG_SPLITMIX_H

#include <math.h>
#include <stdint.h>

static uint64_t rng_state;

static inline void rng_seed(uint64_t s) {
    rng_state = s * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
}

static inline uint64_t rng_u64(void) { // splitmix64
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline double urand(void) { // [0, 1)
    return (double)(rng_u64() >> 11) / 9007199254740992.0;
}

static inline int irand(int lo, int hi) { // [lo, hi]
    return lo + (int)(rng_u64() % (uint64_t)(hi - lo + 1));
}

static inline float nrand(void) { // standard normal (Box-Muller)
    double u = urand(), v = urand();
    return (float)(sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v));
}

#endif
