// The hadamard op: one thread block per chunk of HAD_CHUNK values (or one
// Hadamard block when that is larger), transformed in shared memory; with
// xq, a warp per 32 values then writes them as a q8_1 block (chunks and rows
// are whole blocks of 32, so the blocks of all rows are one flat array).
#include "cuda/cuda_common.cuh"
#include "cuda/hadamard.cuh"
#include "cuda/hadamard.h"
#include "cuda/q8_1.cuh"

#define HAD_THREADS 256
#define HAD_CHUNK 1024 // values a thread block loads (a power of two)

__global__ static void __launch_bounds__(HAD_THREADS)
    hadamard_kernel(float *__restrict__ x /* [n_total] */, int64_t n_total, int chunk, int block,
                    float scale, uint8_t *__restrict__ xq /* [n_total / 32] q8_1 or NULL */) {
    extern __shared__ float s[]; // [chunk]
    const int64_t base = (int64_t)blockIdx.x * chunk;
    const int n = (int)(n_total - base < chunk ? n_total - base : chunk); // a multiple of block
    for (int i = threadIdx.x; i < n; i += HAD_THREADS)
        s[i] = x[base + i];
    hadamard_shared(s, n, block, scale, threadIdx.x, HAD_THREADS);
    for (int i = threadIdx.x; i < n; i += HAD_THREADS)
        x[base + i] = s[i];
    if (!xq)
        return;
    const int lane = threadIdx.x % VELA_WARP;
    for (int g = threadIdx.x / VELA_WARP; g < n / 32; g += HAD_THREADS / VELA_WARP)
        q8_1_store_warp(xq + (size_t)((base + g * 32) / 32) * Q8_1_BLOCK_BYTES, s[g * 32 + lane],
                        lane);
}

extern "C" int cuda_hadamard_apply(float *x, int64_t n_rows, int n, int block, void *xq,
                                   cudaStream_t stream, struct verr *err) {
    if (n_rows < 0 || block < 2 || block > 1024 || (block & (block - 1)) || n <= 0 || n % block)
        return verr_set(err, VERR_RANGE,
                        "hadamard: %lld rows of %d with block %d (a power of two in [2, 1024] "
                        "dividing the row)",
                        (long long)n_rows, n, block);
    if (n_rows == 0)
        return VERR_OK;
    if (!x)
        return verr_set(err, VERR_RANGE, "hadamard: NULL pointer");
    if (xq && (n % 32 != 0 || ((uintptr_t)xq & 3u) != 0))
        return verr_set(err, VERR_RANGE,
                        "hadamard: a q8_1 copy needs n (%d) a multiple of 32 and xq 4-byte "
                        "aligned",
                        n);
    const int chunk = block > HAD_CHUNK ? block : HAD_CHUNK;
    const int64_t n_total = n_rows * n;
    const int64_t blocks = (n_total + chunk - 1) / chunk;
    if (blocks > INT32_MAX)
        return verr_set(err, VERR_RANGE, "hadamard: %lld values", (long long)n_total);
    // the scale as the CPU computes it (host sqrtf), so both give the same bits
    const float scale = 1.0f / sqrtf((float)block);
    hadamard_kernel<<<(unsigned int)blocks, HAD_THREADS, (size_t)chunk * sizeof(float), stream>>>(
        x, n_total, chunk, block, scale, (uint8_t *)xq);
    VELA_CHECK_LAUNCH(err, "hadamard_kernel");
    return VERR_OK;
}
