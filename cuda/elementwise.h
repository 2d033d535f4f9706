// elementwise.cu: embedding rows, activations, scale, add, row gathers
// (cuda/cuda_boundary.h: the contract of every entry point).
#ifndef VELA_CUDA_ELEMENTWISE_H
#define VELA_CUDA_ELEMENTWISE_H

#include "cuda/cuda_boundary.h"

VELA_CUDA_BEGIN

// out[t][:] = dequantized row tokens[t] of the table (a token outside
// [0, n_rows) gives a row of zeros: tokens are checked on the host first).
int cuda_embed_rows(float *out /* [n_tok][n_in] */, const void *table, enum ggml_type type,
                    int64_t n_in, int64_t n_rows, const int32_t *tokens /* [n_tok] */, int n_tok,
                    cudaStream_t stream, struct verr *err);
// out[i] = silu(gate[i]) * up[i]; out may alias gate or up.
int cuda_swiglu_apply(float *out, const float *gate, const float *up, int64_t n,
                      cudaStream_t stream, struct verr *err);
// out[i] = gelu(gate[i]) * up[i] (the geglu op: ggml's f16-table GELU);
// out may alias gate or up.
int cuda_geglu_apply(float *out, const float *gate, const float *up, int64_t n, cudaStream_t stream,
                     struct verr *err);
// x[i] *= s
int cuda_scale_apply(float *x, float s, int64_t n, cudaStream_t stream, struct verr *err);
// x[i] += y[i]
int cuda_add_apply(float *x, const float *y, int64_t n, cudaStream_t stream, struct verr *err);
// y[t][i] += s[t][i] * sig(g[t]) (the add_sigmoid_scaled op); s must not
// alias y.
int cuda_add_sigmoid_scaled(float *y /* [n_tok][n] */, const float *s /* [n_tok][n] */,
                            const float *g /* [n_tok] */, int n_tok, int n, cudaStream_t stream,
                            struct verr *err);
// out[r] = x[rows[r]]
int cuda_get_rows(float *out /* [n_out_rows][n] */, const float *x /* [*][n] */,
                  const int32_t *rows /* [n_out_rows] */, int n_out_rows, int n,
                  cudaStream_t stream, struct verr *err);

VELA_CUDA_END

#endif
