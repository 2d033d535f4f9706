// The hadamard op: one thread block per chunk of HAD_CHUNK values (or one
// Hadamard block when that is larger), transformed in shared memory.
#include "cuda/cuda_common.cuh"
#include "cuda/hadamard.cuh"
#include "cuda/hadamard.h"

#define HAD_THREADS 256
#define HAD_CHUNK 1024 // values a thread block loads (a power of two)

__global__ static void __launch_bounds__(HAD_THREADS)
    hadamard_kernel(float *__restrict__ x /* [n_total] */, int64_t n_total, int chunk, int block,
                    float scale) {
    extern __shared__ float s[]; // [chunk]
    const int64_t base = (int64_t)blockIdx.x * chunk;
    const int n = (int)(n_total - base < chunk ? n_total - base : chunk); // a multiple of block
    for (int i = threadIdx.x; i < n; i += HAD_THREADS)
        s[i] = x[base + i];
    hadamard_shared(s, n, block, scale, threadIdx.x, HAD_THREADS);
    for (int i = threadIdx.x; i < n; i += HAD_THREADS)
        x[base + i] = s[i];
}

extern "C" int cuda_hadamard_apply(float *x, int64_t n_rows, int n, int block, cudaStream_t stream,
                                   struct verr *err) {
    if (n_rows < 0 || block < 2 || block > 1024 || (block & (block - 1)) || n <= 0 || n % block)
        return verr_set(err, VERR_RANGE,
                        "hadamard: %lld rows of %d with block %d (a power of two in [2, 1024] "
                        "dividing the row)",
                        (long long)n_rows, n, block);
    if (n_rows == 0)
        return VERR_OK;
    if (!x)
        return verr_set(err, VERR_RANGE, "hadamard: NULL pointer");
    const int chunk = block > HAD_CHUNK ? block : HAD_CHUNK;
    const int64_t n_total = n_rows * n;
    const int64_t blocks = (n_total + chunk - 1) / chunk;
    if (blocks > INT32_MAX)
        return verr_set(err, VERR_RANGE, "hadamard: %lld values", (long long)n_total);
    // the scale as the CPU computes it (host sqrtf), so both give the same bits
    const float scale = 1.0f / sqrtf((float)block);
    hadamard_kernel<<<(unsigned int)blocks, HAD_THREADS, (size_t)chunk * sizeof(float), stream>>>(
        x, n_total, chunk, block, scale);
    VELA_CHECK_LAUNCH(err, "hadamard_kernel");
    return VERR_OK;
}
