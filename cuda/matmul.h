// matmul.cu: the GEMM path of matmul, batches larger than the mat-vec's
// (cuda/cuda_boundary.h: the contract of every entry point).
#ifndef VELA_CUDA_MATMUL_H
#define VELA_CUDA_MATMUL_H

#include <cublas_v2.h>

#include "cuda/cuda_boundary.h"

VELA_CUDA_BEGIN

// Scratch bytes cuda_matmul_apply needs for these sizes.
size_t cuda_matmul_scratch_bytes(enum ggml_type type, int64_t n_in, int64_t n_out, int n_tok);
// The GEMM path of matmul (any n_tok); cublas must be bound to `stream`.
// Quantized weights of a batch cuda_matmul_tc_takes go through the fused
// tensor-core kernel (cuda/matmul_tc.h), the others through cuBLAS.
// accumulate: out += W x (GEMM beta = 1; bias must then be NULL).
int cuda_matmul_apply(cublasHandle_t cublas, float *out /* [n_tok][n_out] */, const void *w,
                      enum ggml_type type, int64_t n_in, int64_t n_out,
                      const float *x /* [n_tok][n_in] */, const float *bias /* [n_out] or NULL */,
                      int n_tok, int accumulate, void *scratch, size_t scratch_bytes,
                      cudaStream_t stream, struct verr *err);

// dst[i] = src[i] rounded to f16 (__float2half_rn): the activations of the
// GEMM path, as cuda_matmul_apply converts them.
int cuda_convert_f16(uint16_t *dst /* [n] f16 bits */, const float *src /* [n] */, int64_t n,
                     cudaStream_t stream, struct verr *err);

VELA_CUDA_END

#endif
