// Elementwise and gather ops: embed (dequantize selected rows), swiglu, geglu, scale, add,
// add_sigmoid_scaled, get_rows. All are memory-bound grid-stride loops over the output.
#include "cuda/dequant.cuh"
#include "cuda/elementwise.h"

#define EW_THREADS 256

// Enough blocks to fill any GPU, few enough for gridDim.x.
static unsigned int ew_grid(int64_t n) {
    int64_t blocks = (n + EW_THREADS - 1) / EW_THREADS;
    if (blocks > 65535)
        blocks = 65535;
    return (unsigned int)(blocks < 1 ? 1 : blocks);
}

// One thread per 32-element sub-block of an output row.
template <int T>
__global__ static void embed_q_kernel(float *__restrict__ out /* [n_tok][n_in] */,
                                      const uint8_t *__restrict__ table, size_t row_bytes,
                                      int64_t n_in, int64_t n_rows,
                                      const int32_t *__restrict__ tokens, int n_tok) {
    const int64_t n_sub = n_in / 32, total = (int64_t)n_tok * n_sub;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / n_sub, sb = idx % n_sub;
        const int32_t tok = tokens[t];
        float *o = out + (size_t)t * n_in + sb * 32;
        if (tok < 0 || tok >= n_rows) {
#pragma unroll
            for (int l = 0; l < 32; l++)
                o[l] = 0.0f;
            continue;
        }
        float v[32];
        dequant_sub32<T>(table + (size_t)tok * row_bytes, sb, v);
#pragma unroll
        for (int l = 0; l < 32; l++)
            o[l] = v[l];
    }
}

template <int T>
__global__ static void embed_plain_kernel(float *__restrict__ out /* [n_tok][n_in] */,
                                          const uint8_t *__restrict__ table, size_t row_bytes,
                                          int64_t n_in, int64_t n_rows,
                                          const int32_t *__restrict__ tokens, int n_tok) {
    const int64_t total = (int64_t)n_tok * n_in;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / n_in, i = idx % n_in;
        const int32_t tok = tokens[t];
        out[idx] =
            tok < 0 || tok >= n_rows ? 0.0f : load_plain<T>(table + (size_t)tok * row_bytes, i);
    }
}

__global__ static void swiglu_kernel(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        out[i] = vela_silu_mul(gate[i], up[i]);
    }
}

__global__ static void geglu_kernel(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        out[i] = vela_gelu_mul(gate[i], up[i]);
    }
}

__global__ static void scale_kernel(float *x, float s, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

__global__ static void add_kernel(float *x, const float *y, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

// y[t][i] += s[t][i] * sig(g[t]), sig(g) = silu(g) / g (1/2 at g = 0): the
// add_sigmoid_scaled op, each step rounded as the CPU's C (no FMA).
__global__ static void add_sigmoid_scaled_kernel(float *__restrict__ y /* [n_tok][n] */,
                                                 const float *__restrict__ s /* [n_tok][n] */,
                                                 const float *__restrict__ g /* [n_tok] */,
                                                 int n_tok, int n) {
    const int64_t total = (int64_t)n_tok * n;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const float gt = g[idx / n];
        const float sig = gt == 0.0f ? 0.5f : gt / (1.0f + expf(-gt)) / gt;
        y[idx] = __fadd_rn(y[idx], __fmul_rn(s[idx], sig));
    }
}

__global__ static void get_rows_kernel(float *__restrict__ out /* [n_out_rows][n] */,
                                       const float *__restrict__ x /* [*][n] */,
                                       const int32_t *__restrict__ rows, int n_out_rows, int n) {
    const int64_t total = (int64_t)n_out_rows * n;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = idx / n, i = idx % n;
        out[idx] = x[(size_t)rows[r] * n + i];
    }
}

extern "C" int cuda_embed_rows(float *out, const void *table, enum ggml_type type, int64_t n_in,
                               int64_t n_rows, const int32_t *tokens, int n_tok,
                               cudaStream_t stream, struct verr *err) {
    if (n_tok <= 0 || n_in <= 0)
        return VERR_OK;
    const size_t row_bytes = ggml_row_bytes(type, n_in);
    if (row_bytes == 0)
        return verr_set(err, VERR_RANGE, "embed: %s row of %lld elements is not whole blocks",
                        ggml_type_name(type), (long long)n_in);
    const uint8_t *tb = (const uint8_t *)table;
    auto run_plain = [&](auto tc) -> int {
        constexpr int T = decltype(tc)::value;
        embed_plain_kernel<T><<<ew_grid((int64_t)n_tok * n_in), EW_THREADS, 0, stream>>>(
            out, tb, row_bytes, n_in, n_rows, tokens, n_tok);
        VELA_CHECK_LAUNCH(err, "embed_plain_kernel");
        return VERR_OK;
    };
    auto run_q = [&](auto tc) -> int {
        constexpr int T = decltype(tc)::value;
        embed_q_kernel<T><<<ew_grid((int64_t)n_tok * (n_in / 32)), EW_THREADS, 0, stream>>>(
            out, tb, row_bytes, n_in, n_rows, tokens, n_tok);
        VELA_CHECK_LAUNCH(err, "embed_q_kernel");
        return VERR_OK;
    };
    if (vela_is_plain(type))
        return VELA_DISPATCH_PLAIN(type, run_plain, VERR_UNSUPPORTED);
    if (((uintptr_t)table & 15u) != 0)
        return verr_set(err, VERR_RANGE, "embed: table data %p is not 16-byte aligned", table);
    const int rc = VELA_DISPATCH_QTYPE(type, run_q, 1);
    if (rc == 1)
        return verr_set(err, VERR_UNSUPPORTED, "embed: table type %s is not supported",
                        ggml_type_name(type));
    return rc;
}

extern "C" int cuda_swiglu_apply(float *out, const float *gate, const float *up, int64_t n,
                                 cudaStream_t stream, struct verr *err) {
    if (n <= 0)
        return VERR_OK;
    swiglu_kernel<<<ew_grid(n), EW_THREADS, 0, stream>>>(out, gate, up, n);
    VELA_CHECK_LAUNCH(err, "swiglu_kernel");
    return VERR_OK;
}

extern "C" int cuda_geglu_apply(float *out, const float *gate, const float *up, int64_t n,
                                cudaStream_t stream, struct verr *err) {
    if (n <= 0)
        return VERR_OK;
    geglu_kernel<<<ew_grid(n), EW_THREADS, 0, stream>>>(out, gate, up, n);
    VELA_CHECK_LAUNCH(err, "geglu_kernel");
    return VERR_OK;
}

extern "C" int cuda_scale_apply(float *x, float s, int64_t n, cudaStream_t stream,
                                struct verr *err) {
    if (n <= 0)
        return VERR_OK;
    scale_kernel<<<ew_grid(n), EW_THREADS, 0, stream>>>(x, s, n);
    VELA_CHECK_LAUNCH(err, "scale_kernel");
    return VERR_OK;
}

extern "C" int cuda_add_apply(float *x, const float *y, int64_t n, cudaStream_t stream,
                              struct verr *err) {
    if (n <= 0)
        return VERR_OK;
    add_kernel<<<ew_grid(n), EW_THREADS, 0, stream>>>(x, y, n);
    VELA_CHECK_LAUNCH(err, "add_kernel");
    return VERR_OK;
}

extern "C" int cuda_add_sigmoid_scaled(float *y, const float *s, const float *g, int n_tok, int n,
                                       cudaStream_t stream, struct verr *err) {
    if (n_tok <= 0 || n <= 0)
        return VERR_OK;
    add_sigmoid_scaled_kernel<<<ew_grid((int64_t)n_tok * n), EW_THREADS, 0, stream>>>(y, s, g,
                                                                                      n_tok, n);
    VELA_CHECK_LAUNCH(err, "add_sigmoid_scaled_kernel");
    return VERR_OK;
}

extern "C" int cuda_get_rows(float *out, const float *x, const int32_t *rows, int n_out_rows, int n,
                             cudaStream_t stream, struct verr *err) {
    if (n_out_rows <= 0 || n <= 0)
        return VERR_OK;
    get_rows_kernel<<<ew_grid((int64_t)n_out_rows * n), EW_THREADS, 0, stream>>>(out, x, rows,
                                                                                 n_out_rows, n);
    VELA_CHECK_LAUNCH(err, "get_rows_kernel");
    return VERR_OK;
}
