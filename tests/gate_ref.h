// Test helper (header-only, included by test_ops_moe.c and
// gpu/test_cuda_moe.c): the float64 reference of the add_sigmoid_scaled op
// (host/ops/backend.h) and the gate values both tests feed it.
#ifndef VELA_TESTS_GATE_REF_H
#define VELA_TESTS_GATE_REF_H

#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <math.h>
#include <stddef.h>

// g = 0 and -0 (llama.cpp's silu(g) / g is 0/0 there; the op gives 1/2),
// tiny g, both signs, |g| where expf(-g) overflows or underflows.
static const float gate_ref_g[] = {0.0f,  -0.0f,  1e-30f, -1e-30f, 0.25f, -0.25f,
                                   1.0f,  -1.0f,  3.5f,   -3.5f,   15.0f, -15.0f,
                                   87.0f, -87.0f, 100.0f, -100.0f, 1e30f, -1e30f};
#define GATE_REF_N_FIXED ((int)(sizeof gate_ref_g / sizeof gate_ref_g[0]))

// y, the op's result from y0, s and g, against y0 + s / (1 + exp(-g)) in
// double. The op's float steps: expf (within 1 ulp on the CPU, 2 on CUDA),
// four roundings in sig, one in the product, one in the add; 16 ulp of
// |y0| + |s sig| bounds them with margin. Rows whose g is 0 must equal
// y0 + s * 0.5f exactly. Logs the worst error as a fraction of the bound
// (label: the backend); returns the number of values outside it.
static inline int gate_ref_check(const char *label, const float *y, const float *y0, const float *s,
                                 const float *g, int n_tok, int n) {
    double worst = 0.0;
    int fails = 0;
    for (int t = 0; t < n_tok; t++) {
        const double sig = 1.0 / (1.0 + exp(-(double)g[t]));
        for (int i = 0; i < n; i++) {
            const size_t k = (size_t)t * n + i;
            const double want = y0[k] + s[k] * sig, e = fabs(y[k] - want);
            const double tol = (fabs(y0[k]) + fabs(s[k]) * sig) / 1048576.0;
            const bool ok = g[t] == 0.0f ? y[k] == y0[k] + s[k] * 0.5f : e <= tol;
            worst = fmax(worst, e / tol);
            if (!ok && fails++ < 5)
                cr_log_error("%s: g %g: y[%d][%d] %.9g, float64 %.9g", label, g[t], t, i, y[k],
                             want);
        }
    }
    cr_log_info("%s add_sigmoid_scaled %d x %d: worst error %.3g of the 16-ulp bound", label, n_tok,
                n, worst);
    return fails;
}

#endif
