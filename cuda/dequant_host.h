// dequant_host.cu: the device decoders (dequant.cuh) run on the host, for
// tests (cuda/cuda_boundary.h: the contract of every entry point).
#ifndef VELA_CUDA_DEQUANT_HOST_H
#define VELA_CUDA_DEQUANT_HOST_H

#include "cuda/cuda_boundary.h"

VELA_CUDA_BEGIN

// Decodes one row of n elements: out must be bit-identical to gguf/quant.c's
// quant_dequantize_row. row and out: host memory, row aligned as a row of a
// 16-byte aligned matrix.
int cuda_dequant_row_host(enum ggml_type type, const void *row, int64_t n, float *out,
                          struct verr *err);

VELA_CUDA_END

#endif
