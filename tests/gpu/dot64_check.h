// Test helper (header-only, included by gpu/test_cuda_matvec_mxfp4.c and
// gpu/test_cuda_matvec_f16.c): mat-vec outputs against a float64 dot under
// the gamma_n bound. rand_vec draws n standard normal floats (malloc'd, 16
// bytes of slack); dot64 is the exact dot of a decoded row with x and its
// condition sum |w x|; check_out expects |got - want| within 2 n 2^-24 mag
// and returns the error in units of that bound.
#ifndef VELA_TESTS_GPU_DOT64_CHECK_H
#define VELA_TESTS_GPU_DOT64_CHECK_H

#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "tests/rng_splitmix.h"

static float *rand_vec(size_t n) {
    float *v = malloc(n * sizeof *v + 16);
    cr_assert_not_null(v);
    for (size_t i = 0; i < n; i++)
        v[i] = nrand();
    return v;
}

static double dot64(const float *w, const float *x, int64_t n, double *mag) {
    double s = 0.0, m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)w[i] * x[i];
        m += fabs((double)w[i] * x[i]);
    }
    *mag = m;
    return s;
}

static double check_out(double got, double want, double mag, int64_t n, const char *what, int t,
                        int64_t o) {
    const double unit = 2.0 * (double)n * 0x1p-24 * mag + 1e-30;
    const double e = fabs(got - want) / unit;
    cr_expect(e <= 1.0, "%s n_in %lld token %d row %lld: %.9g, float64 %.9g (%.2f units)", what,
              (long long)n, t, (long long)o, got, want, e);
    return e;
}

#endif
