// RMS norm: out[r] = x[r] / sqrtf(mean(x[r]^2) + eps) * w, one block per row,
// the sum of squares accumulated in f32. out may alias x (no __restrict__):
// each element is read and written by the same thread, after the reduction.
// With xq, the block also writes each output row as q8_1 blocks (the input
// format of the act_q8 mat-vec, cuda/q8_1.cuh), so the next mat-vec needs no
// quantize launch: a warp's 32 consecutive outputs are one q8_1 block.
#include "cuda/launch.cuh"
#include "cuda/norm.h"
#include "cuda/q8_1.cuh"

#define NORM_THREADS 256

template <bool Q8>
__global__ static void __launch_bounds__(NORM_THREADS)
    rms_norm_kernel(float *out /* [n_rows][n] */, const float *x /* [n_rows][n] */,
                    const float *__restrict__ w /* [n] */, int n, float eps,
                    uint8_t *__restrict__ xq /* [n_rows][n / 32] q8_1 blocks, Q8 only */) {
    __shared__ float partial[NORM_THREADS / VELA_WARP];
    cuda_pdl_wait();
    const float *xr = x + (size_t)blockIdx.x * n;
    float *outr = out + (size_t)blockIdx.x * n;
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS)
        s = fmaf(xr[i], xr[i], s);
    s = warp_sum(s);
    if (threadIdx.x % VELA_WARP == 0)
        partial[threadIdx.x / VELA_WARP] = s;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int k = 0; k < NORM_THREADS / VELA_WARP; k++)
        total += partial[k];
    const float scale = 1.0f / sqrtf(total / (float)n + eps);
    // Q8 needs n % 32 == 0: then a warp's 32 indices are all in range or all
    // out, and the warp-collective quantizer is called by whole warps.
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) {
        const float y = xr[i] * scale * w[i];
        outr[i] = y;
        if (Q8)
            q8_1_store_warp(xq + ((size_t)blockIdx.x * (n / 32) + i / 32) * Q8_1_BLOCK_BYTES, y,
                            threadIdx.x % VELA_WARP);
    }
}

extern "C" int cuda_rms_norm_apply(float *out, const float *x, const float *w, int n_rows, int n,
                                   float eps, void *xq, bool pdl, cudaStream_t stream,
                                   struct verr *err) {
    if (n_rows <= 0 || n <= 0)
        return VERR_OK;
    if (xq) {
        if (n % 32 != 0 || ((uintptr_t)xq & 3u) != 0)
            return verr_set(err, VERR_RANGE,
                            "rms_norm: a q8_1 copy needs n (%d) a multiple of 32 and xq 4-byte "
                            "aligned",
                            n);
        cuda_launch(pdl, rms_norm_kernel<true>, (unsigned int)n_rows, NORM_THREADS, 0, stream, out,
                    x, w, n, eps, (uint8_t *)xq);
        VELA_CHECK_LAUNCH(err, "rms_norm_kernel<q8>");
        return VERR_OK;
    }
    cuda_launch(pdl, rms_norm_kernel<false>, (unsigned int)n_rows, NORM_THREADS, 0, stream, out, x,
                w, n, eps, (uint8_t *)nullptr);
    VELA_CHECK_LAUNCH(err, "rms_norm_kernel");
    return VERR_OK;
}
