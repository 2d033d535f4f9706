// The GEMM path of matmul (batches larger than CUDA_MATVEC_MAX_TOK tokens):
// cuBLAS with f32 accumulation.
//   F32 weights:  f32 GEMM on the stored weights (CUBLAS_COMPUTE_32F, no TF32).
//   F16 weights:  stored weights as they are; activations rounded to f16.
//   BF16 weights: stored weights as they are; activations rounded to bf16.
//   quantized:    up to cuda_matmul_tc_max_tok() tokens (cuda_matmul_tc_takes)
//                 the fused tensor-core kernel of matmul_tc.cu on the f16
//                 activations, no weight scratch; above it slices of at most
//                 MATMUL_SLICE_ELEMS weights are decoded to f16 in scratch
//                 (dequant.cuh, the same values as the host decoder, then
//                 rounded to f16), one GEMM per slice, writing the slice's
//                 columns of out (ldc = n_out); activations f16. Both read
//                 the same f16 activations (matmul_convert_kernel) and
//                 accumulate in f32: they agree to f32 rounding.
// Scratch layout: [activations, 256-aligned][weight slice (cuBLAS path)].
#include "cuda/dequant.cuh"
#include "cuda/matmul.h"
#include "cuda/matmul_tc.h"
#include "cuda/matvec.h"

// Elements of one decoded weight slice (f16): 128 MiB of scratch at most.
#define MATMUL_SLICE_ELEMS ((int64_t)64 << 20)
#define MATMUL_THREADS 256

#define VELA_CUBLAS_CALL(err, stmt)                                                                \
    do {                                                                                           \
        cublasStatus_t s_ = (stmt);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            return verr_set((err), VERR_BACKEND, "%s: %s (%s:%d)", #stmt,                          \
                            cublasGetStatusString(s_), __FILE__, __LINE__);                        \
    } while (0)

static size_t align256(size_t n) {
    return (n + 255) & ~(size_t)255;
}

static int64_t matmul_slice_rows(int64_t n_in, int64_t n_out) {
    int64_t rows = MATMUL_SLICE_ELEMS / n_in;
    if (rows >= 256)
        rows -= rows % 256; // whole tiles for cuBLAS
    if (rows < 1)
        rows = 1;
    return rows < n_out ? rows : n_out;
}

template <typename TO>
__global__ static void matmul_convert_kernel(TO *__restrict__ dst, const float *__restrict__ src,
                                             int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        if constexpr (std::is_same<TO, __half>::value)
            dst[i] = __float2half_rn(src[i]);
        else
            dst[i] = __float2bfloat16_rn(src[i]);
    }
}

// Decodes rows [0, n_rows) of w (already offset to the slice) to f16; one
// thread per 32-element sub-block, written as four 16-byte stores.
template <int T>
__global__ static void matmul_dequant_f16_kernel(__half *__restrict__ dst /* [n_rows][n_in] */,
                                                 const uint8_t *__restrict__ w, size_t row_bytes,
                                                 int64_t n_rows, int64_t n_in) {
    const int64_t n_sub = n_in / 32;
    const int64_t total = n_rows * n_sub;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = idx / n_sub, sb = idx % n_sub;
        float v[32];
        dequant_sub32<T>(w + (size_t)r * row_bytes, sb, v);
        uint4 *d = (uint4 *)(dst + (size_t)r * n_in + sb * 32);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            __half2 h[4];
#pragma unroll
            for (int e = 0; e < 4; e++)
                h[e] = __floats2half2_rn(v[8 * k + 2 * e], v[8 * k + 2 * e + 1]);
            uint4 u;
            u.x = *(uint32_t *)&h[0];
            u.y = *(uint32_t *)&h[1];
            u.z = *(uint32_t *)&h[2];
            u.w = *(uint32_t *)&h[3];
            d[k] = u;
        }
    }
}

__global__ static void matmul_add_bias_kernel(float *__restrict__ out /* [n_tok][n_out] */,
                                              const float *__restrict__ bias /* [n_out] */,
                                              int64_t n_out, int64_t total) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] += bias[i % n_out];
}

// Grid for a grid-stride loop over n items: enough blocks to fill any GPU,
// few enough to stay in range.
static unsigned int matmul_grid(int64_t n) {
    int64_t blocks = (n + MATMUL_THREADS - 1) / MATMUL_THREADS;
    if (blocks > 65535)
        blocks = 65535;
    return (unsigned int)(blocks < 1 ? 1 : blocks);
}

extern "C" int cuda_convert_f16(uint16_t *dst, const float *src, int64_t n, cudaStream_t stream,
                                struct verr *err) {
    if (n <= 0)
        return VERR_OK;
    matmul_convert_kernel<__half>
        <<<matmul_grid(n), MATMUL_THREADS, 0, stream>>>((__half *)dst, src, n);
    VELA_CHECK_LAUNCH(err, "matmul_convert_kernel<f16>");
    return VERR_OK;
}

extern "C" size_t cuda_matmul_scratch_bytes(enum ggml_type type, int64_t n_in, int64_t n_out,
                                            int n_tok) {
    if (type == GGML_TYPE_F32)
        return 0;
    const size_t act = align256((size_t)n_tok * (size_t)n_in * 2);
    if (vela_is_plain(type) || cuda_matmul_tc_takes(type, n_tok))
        return act;
    return act + align256((size_t)matmul_slice_rows(n_in, n_out) * (size_t)n_in * 2);
}

extern "C" int cuda_matmul_apply(cublasHandle_t cublas, float *out, const void *w,
                                 enum ggml_type type, int64_t n_in, int64_t n_out, const float *x,
                                 const float *bias, int n_tok, int accumulate, void *scratch,
                                 size_t scratch_bytes, cudaStream_t stream, struct verr *err) {
    if (n_tok <= 0 || n_out <= 0)
        return VERR_OK;
    if (accumulate && bias)
        return verr_set(err, VERR_RANGE, "matmul: accumulate with a bias is not supported");
    const size_t row_bytes = ggml_row_bytes(type, n_in);
    if (row_bytes == 0)
        return verr_set(err, VERR_RANGE, "matmul: %s row of %lld elements is not whole blocks",
                        ggml_type_name(type), (long long)n_in);
    if (n_in > INT32_MAX || n_out > INT32_MAX)
        return verr_set(err, VERR_RANGE, "matmul: %lld x %lld is too large for cuBLAS",
                        (long long)n_out, (long long)n_in);
    if (scratch_bytes < cuda_matmul_scratch_bytes(type, n_in, n_out, n_tok))
        return verr_set(err, VERR_RANGE, "matmul: scratch of %zu bytes is too small (%zu)",
                        scratch_bytes, cuda_matmul_scratch_bytes(type, n_in, n_out, n_tok));
    if (!vela_is_plain(type) && ((uintptr_t)w & 15u) != 0)
        return verr_set(err, VERR_RANGE, "matmul: weight data %p is not 16-byte aligned", w);
    VELA_CUBLAS_CALL(err, cublasSetStream(cublas, stream));
    // beta = 1: out += W x in the GEMM's epilogue (the residual folded in).
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const int k = (int)n_in, n = n_tok;

    if (type == GGML_TYPE_F32) {
        VELA_CUBLAS_CALL(err,
                         cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, n, k, &alpha, w,
                                      CUDA_R_32F, k, x, CUDA_R_32F, k, &beta, out, CUDA_R_32F,
                                      (int)n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
        const int64_t n_act = (int64_t)n_tok * n_in;
        void *act = scratch;
        const bool bf16 = type == GGML_TYPE_BF16;
        if (bf16) {
            matmul_convert_kernel<__nv_bfloat16>
                <<<matmul_grid(n_act), MATMUL_THREADS, 0, stream>>>((__nv_bfloat16 *)act, x, n_act);
            VELA_CHECK_LAUNCH(err, "matmul_convert_kernel<bf16>");
        } else {
            matmul_convert_kernel<__half>
                <<<matmul_grid(n_act), MATMUL_THREADS, 0, stream>>>((__half *)act, x, n_act);
            VELA_CHECK_LAUNCH(err, "matmul_convert_kernel<f16>");
        }
        const cudaDataType_t ab = bf16 ? CUDA_R_16BF : CUDA_R_16F;
        if (!vela_is_plain(type) && cuda_matmul_tc_takes(type, n_tok)) {
            // bias and accumulate in the kernel's epilogue
            return cuda_matmul_q_tc(out, w, type, n_in, n_out, (const uint16_t *)act, bias, n_tok,
                                    accumulate, stream, err);
        }
        if (vela_is_plain(type)) {
            VELA_CUBLAS_CALL(err,
                             cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, n, k,
                                          &alpha, w, ab, k, act, ab, k, &beta, out, CUDA_R_32F,
                                          (int)n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        } else {
            __half *wslice = (__half *)((char *)scratch + align256((size_t)n_act * 2));
            const int64_t slice = matmul_slice_rows(n_in, n_out);
            for (int64_t r0 = 0; r0 < n_out; r0 += slice) {
                const int64_t rows = n_out - r0 < slice ? n_out - r0 : slice;
                const uint8_t *wr = (const uint8_t *)w + (size_t)r0 * row_bytes;
                auto decode = [&](auto tc) -> int {
                    constexpr int T = decltype(tc)::value;
                    matmul_dequant_f16_kernel<T>
                        <<<matmul_grid(rows * (n_in / 32)), MATMUL_THREADS, 0, stream>>>(
                            wslice, wr, row_bytes, rows, n_in);
                    VELA_CHECK_LAUNCH(err, "matmul_dequant_f16_kernel");
                    return VERR_OK;
                };
                const int rc = VELA_DISPATCH_QTYPE_MX(type, decode, 1);
                if (rc == 1)
                    return verr_set(err, VERR_UNSUPPORTED,
                                    "matmul: weight type %s is not supported",
                                    ggml_type_name(type));
                if (rc)
                    return rc;
                VELA_CUBLAS_CALL(err,
                                 cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, n, k,
                                              &alpha, wslice, CUDA_R_16F, k, act, CUDA_R_16F, k,
                                              &beta, out + r0, CUDA_R_32F, (int)n_out,
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            }
        }
    }
    if (bias) {
        const int64_t total = (int64_t)n_tok * n_out;
        matmul_add_bias_kernel<<<matmul_grid(total), MATMUL_THREADS, 0, stream>>>(out, bias, n_out,
                                                                                  total);
        VELA_CHECK_LAUNCH(err, "matmul_add_bias_kernel");
    }
    return VERR_OK;
}
