// Test helper (header-only, included by gpu/test_cuda_matvec_q8.c and
// gpu/test_cuda_matmul_tc.c): for tests that call the cuda/*.cu entry points
// directly rather than through the backend op table. raw_cuda_probe() says
// whether device 0 is usable (and makes it current); REQUIRE_GPU() skips a
// test without one, never passes it; CU() asserts a CUDA runtime call;
// dev_upload / dev_download move bytes (synchronously).
#ifndef VELA_TESTS_GPU_RAW_CUDA_H
#define VELA_TESTS_GPU_RAW_CUDA_H

#include <criterion/criterion.h>

#include <cuda_runtime_api.h>

static int have_gpu;

static int raw_cuda_probe(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0 && cudaSetDevice(0) == cudaSuccess;
}

#define REQUIRE_GPU()                                                                              \
    do {                                                                                           \
        if (!have_gpu)                                                                             \
            cr_skip_test("no CUDA device present");                                                \
    } while (0)

#define CU(call)                                                                                   \
    do {                                                                                           \
        const cudaError_t e_ = (call);                                                             \
        cr_assert_eq(e_, cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                    \
    } while (0)

static void *dev_upload(const void *h, size_t bytes) {
    void *d = NULL;
    CU(cudaMalloc(&d, bytes ? bytes : 16));
    if (h && bytes)
        CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void dev_download(void *h, const void *d, size_t bytes) {
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

#endif
