// Greedy sampling on the device: argmax per row, the lowest index on ties
// (the order the CPU reference's left-to-right scan gives). NaN never
// compares greater, so it never wins; a row of NaN gives 0.
#include <limits.h>

#include "cuda/cuda_common.cuh"

#define ARGMAX_THREADS 256

// (v, i) beats (bv, bi) when larger, or equal with a lower index.
static __device__ __forceinline__ void argmax_merge(float v, int i, float *bv, int *bi) {
    if (v > *bv || (v == *bv && i < *bi)) {
        *bv = v;
        *bi = i;
    }
}

__global__ static void __launch_bounds__(ARGMAX_THREADS)
    argmax_kernel(int32_t *__restrict__ out /* [n_rows] */,
                  const float *__restrict__ logits /* [n_rows][n_vocab] */, int n_vocab) {
    __shared__ float s_val[ARGMAX_THREADS / VELA_WARP];
    __shared__ int s_idx[ARGMAX_THREADS / VELA_WARP];
    const float *row = logits + (size_t)blockIdx.x * n_vocab;
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int i = threadIdx.x; i < n_vocab; i += ARGMAX_THREADS)
        argmax_merge(row[i], i, &bv, &bi);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(VELA_FULL_MASK, bv, o);
        const int i = __shfl_xor_sync(VELA_FULL_MASK, bi, o);
        argmax_merge(v, i, &bv, &bi);
    }
    if (threadIdx.x % VELA_WARP == 0) {
        s_val[threadIdx.x / VELA_WARP] = bv;
        s_idx[threadIdx.x / VELA_WARP] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ARGMAX_THREADS / VELA_WARP; w++)
            argmax_merge(s_val[w], s_idx[w], &bv, &bi);
        out[blockIdx.x] = bi == INT_MAX ? 0 : bi;
    }
}

extern "C" int cuda_argmax_rows(int32_t *out, const float *logits, int n_rows, int n_vocab,
                                cudaStream_t stream, struct verr *err) {
    if (n_rows <= 0)
        return VERR_OK;
    if (n_vocab <= 0)
        return verr_set(err, VERR_RANGE, "argmax: n_vocab %d", n_vocab);
    argmax_kernel<<<(unsigned int)n_rows, ARGMAX_THREADS, 0, stream>>>(out, logits, n_vocab);
    VELA_CHECK_LAUNCH(err, "argmax_kernel");
    return VERR_OK;
}
