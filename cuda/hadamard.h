// hadamard.cu: the Walsh-Hadamard rotation of the attention over a quantized
// KV cache (cuda/cuda_boundary.h: the contract of every entry point).
#ifndef VELA_CUDA_HADAMARD_H
#define VELA_CUDA_HADAMARD_H

#include "cuda/cuda_boundary.h"

VELA_CUDA_BEGIN

// backend_ops.hadamard (host/ops/backend.h): every run of `block` values of
// x becomes H x; block is a power of two in [2, BACKEND_HADAMARD_MAX]
// dividing n (checked here too). Bit for bit the CPU op's result. With xq
// (n a multiple of 32, 4-byte aligned), also writes the rotated rows as q8_1
// blocks (cuda/q8_1.cuh: the act_q8 mat-vec's input).
int cuda_hadamard_apply(float *x /* [n_rows][n] */, int64_t n_rows, int n, int block,
                        void *xq /* [n_rows][n / 32] q8_1 blocks or NULL */, cudaStream_t stream,
                        struct verr *err);

VELA_CUDA_END

#endif
