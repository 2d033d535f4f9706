// norm.cu: RMS norm (cuda/cuda_boundary.h: the contract of every entry point).
#ifndef VELA_CUDA_NORM_H
#define VELA_CUDA_NORM_H

#include "cuda/cuda_boundary.h"

VELA_CUDA_BEGIN

// out[r] = x[r] / sqrtf(mean(x[r]^2) + eps) * w; out may alias x. With xq
// (n a multiple of 32), also xq[r] = quant_q8_1_row(out[r]) bit for bit: the
// rms_norm_q8 op (host/ops/backend.h), whose copy the next mat-vec reads.
int cuda_rms_norm_apply(float *out /* [n_rows][n] */, const float *x /* [n_rows][n] */,
                        const float *w /* [n] */, int n_rows, int n, float eps,
                        void *xq /* [n_rows][n / 32] q8_1 blocks or NULL */, bool pdl,
                        cudaStream_t stream, struct verr *err);

VELA_CUDA_END

#endif
