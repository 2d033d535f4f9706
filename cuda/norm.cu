// RMS norm: out[r] = x[r] / sqrtf(mean(x[r]^2) + eps) * w, one block per row,
// the sum of squares accumulated in f32. out may alias x (no __restrict__):
// each element is read and written by the same thread, after the reduction.
#include "cuda/cuda_common.cuh"

#define NORM_THREADS 256

__global__ static void __launch_bounds__(NORM_THREADS)
    rms_norm_kernel(float *out /* [n_rows][n] */, const float *x /* [n_rows][n] */,
                    const float *__restrict__ w /* [n] */, int n, float eps) {
    __shared__ float partial[NORM_THREADS / VELA_WARP];
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
    for (int i = threadIdx.x; i < n; i += NORM_THREADS)
        outr[i] = xr[i] * scale * w[i];
}

extern "C" int cuda_rms_norm_apply(float *out, const float *x, const float *w, int n_rows, int n,
                                   float eps, cudaStream_t stream, struct verr *err) {
    if (n_rows <= 0 || n <= 0)
        return VERR_OK;
    rms_norm_kernel<<<(unsigned int)n_rows, NORM_THREADS, 0, stream>>>(out, x, w, n, eps);
    VELA_CHECK_LAUNCH(err, "rms_norm_kernel");
    return VERR_OK;
}
