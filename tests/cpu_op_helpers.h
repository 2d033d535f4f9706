// Test helper (header-only, included by test_ops_cpu.c and test_rope.c): a
// seeded xorshift stream for random inputs and a CPU reference backend of a
// given thread count.
#ifndef VELA_TESTS_CPU_OP_HELPERS_H
#define VELA_TESTS_CPU_OP_HELPERS_H

#include <criterion/criterion.h>

#include <stdint.h>

#include "host/ops/backend.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static inline void rng_seed(uint64_t s) {
    rng = s * 0x9e3779b97f4a7c15ull + 1;
}

// Uniform in [-1, 1).
static inline float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static inline int irand(int lo, int hi) { // [lo, hi]
    float u = (frand() + 1.0f) * 0.5f;
    int v = lo + (int)(u * (float)(hi - lo + 1));
    return v > hi ? hi : v;
}

static inline struct backend *mk_backend(int n_threads) {
    struct backend *be = NULL;
    struct verr err = {0};
    int rc = backend_cpu_create(&be, n_threads, &err);
    cr_assert_eq(rc, 0, "backend_cpu_create: %s", err.msg);
    cr_assert_not_null(be);
    return be;
}

#endif
