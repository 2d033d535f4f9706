// Test helper (header-only, included by gpu/test_cuda_ops.c and
// gpu/test_cuda_moe.c): host arrays of inputs and references, random
// normal floats from tests/rng_splitmix.h and weights dequantized by the
// host reference decoder (gguf/quant.c).
#ifndef VELA_TESTS_GPU_HOST_ARRAYS_H
#define VELA_TESTS_GPU_HOST_ARRAYS_H

#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>

#include "gguf/quant.h"
#include "gguf/types.h"
#include "tests/rng_splitmix.h"

// n floats of N(0, sigma^2), with 16 spare bytes past the end for kernels
// that read a vector's tail.
static inline float *nrand_array(size_t n, float sigma) {
    float *x = malloc(n * sizeof *x + 16);
    cr_assert_not_null(x);
    for (size_t i = 0; i < n; i++)
        x[i] = sigma * nrand();
    return x;
}

// [n_out][n_in] floats of the weight w of `type`.
static inline float *dequant_all(enum ggml_type type, const void *w, int64_t n_in, int64_t n_out) {
    float *d = malloc((size_t)n_in * (size_t)n_out * sizeof *d);
    cr_assert_not_null(d);
    const size_t rb = ggml_row_bytes(type, n_in);
    struct verr err = {0};
    for (int64_t o = 0; o < n_out; o++)
        cr_assert_eq(quant_dequantize_row(type, (const uint8_t *)w + (size_t)o * rb,
                                          d + (size_t)o * n_in, n_in, &err),
                     0, "%s", err.msg);
    return d;
}

#endif
