// Mat-vec for decode (n_tok <= CUDA_MATVEC_MAX_TOK): one warp per output row.
// The weights are read exactly once and decoded in registers; activations
// stay f32; the bias is added by the lane that writes the result.
//
// Quantized rows: lane l decodes sub-blocks (32 elements) l, l+32, ...; the 32
// lanes of a warp read 32 consecutive sub-blocks, i.e. one contiguous span of
// the row per step (coalesced). Plain rows (F32/F16/BF16): lane l reads
// elements l, l+32, ... (or pairs of them for 2-byte types), also coalesced,
// and any n_in is allowed.
#include "cuda/dequant.cuh"

#define MATVEC_WARPS 4 // rows per block

template <int T, int NT, bool VEC>
__global__ static void __launch_bounds__(MATVEC_WARPS *VELA_WARP)
    matvec_q_kernel(float *__restrict__ out /* [n_tok][n_out] */,
                    const uint8_t *__restrict__ w /* [n_out][row_bytes] */, size_t row_bytes,
                    const float *__restrict__ x /* [n_tok][n_in] */,
                    const float *__restrict__ bias /* [n_out] or NULL */, int64_t n_in,
                    int64_t n_out, int n_tok) {
    const int64_t o = (int64_t)blockIdx.x * MATVEC_WARPS + threadIdx.x / VELA_WARP;
    const int lane = threadIdx.x % VELA_WARP;
    if (o >= n_out)
        return; // uniform per warp
    const uint8_t *row = w + (size_t)o * row_bytes;
    const int64_t n_sub = n_in / 32;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    for (int64_t sb = lane; sb < n_sub; sb += VELA_WARP) {
        float v[32];
        dequant_sub32<T>(row, sb, v);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < n_tok) {
                const float *xs = x + (size_t)t * n_in + sb * 32;
                float a0 = 0.0f, a1 = 0.0f;
                if (VEC) {
#pragma unroll
                    for (int l = 0; l < 32; l += 8) {
                        const float4 p = *(const float4 *)(xs + l);
                        const float4 q = *(const float4 *)(xs + l + 4);
                        a0 = fmaf(v[l + 0], p.x, a0);
                        a1 = fmaf(v[l + 1], p.y, a1);
                        a0 = fmaf(v[l + 2], p.z, a0);
                        a1 = fmaf(v[l + 3], p.w, a1);
                        a0 = fmaf(v[l + 4], q.x, a0);
                        a1 = fmaf(v[l + 5], q.y, a1);
                        a0 = fmaf(v[l + 6], q.z, a0);
                        a1 = fmaf(v[l + 7], q.w, a1);
                    }
                } else {
#pragma unroll
                    for (int l = 0; l < 32; l += 2) {
                        a0 = fmaf(v[l], xs[l], a0);
                        a1 = fmaf(v[l + 1], xs[l + 1], a1);
                    }
                }
                acc[t] += a0 + a1;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t < n_tok) {
            const float s = warp_sum(acc[t]);
            if (lane == 0)
                out[(size_t)t * n_out + o] = bias ? s + bias[o] : s;
        }
    }
}

// PAIR: 2-byte type with an even n_in, so each row is 4-byte aligned and a
// lane reads two elements with one 4-byte load (x rows are then 8-byte aligned).
template <int T, int NT, bool PAIR>
__global__ static void __launch_bounds__(MATVEC_WARPS *VELA_WARP)
    matvec_plain_kernel(float *__restrict__ out /* [n_tok][n_out] */,
                        const uint8_t *__restrict__ w /* [n_out][row_bytes] */, size_t row_bytes,
                        const float *__restrict__ x /* [n_tok][n_in] */,
                        const float *__restrict__ bias /* [n_out] or NULL */, int64_t n_in,
                        int64_t n_out, int n_tok) {
    const int64_t o = (int64_t)blockIdx.x * MATVEC_WARPS + threadIdx.x / VELA_WARP;
    const int lane = threadIdx.x % VELA_WARP;
    if (o >= n_out)
        return;
    const uint8_t *row = w + (size_t)o * row_bytes;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    if (PAIR) {
        const uint32_t *row2 = (const uint32_t *)row;
        for (int64_t i2 = lane; i2 < n_in / 2; i2 += VELA_WARP) {
            const uint32_t pr = row2[i2];
            float w0, w1;
            if (T == GGML_TYPE_F16) {
                w0 = f16_bits_to_f32((uint16_t)(pr & 0xffffu));
                w1 = f16_bits_to_f32((uint16_t)(pr >> 16));
            } else {
                w0 = bf16_bits_to_f32((uint16_t)(pr & 0xffffu));
                w1 = bf16_bits_to_f32((uint16_t)(pr >> 16));
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < n_tok) {
                    const float2 xv = *(const float2 *)(x + (size_t)t * n_in + 2 * i2);
                    acc[t] = fmaf(w0, xv.x, acc[t]);
                    acc[t] = fmaf(w1, xv.y, acc[t]);
                }
            }
        }
    } else {
        for (int64_t i = lane; i < n_in; i += VELA_WARP) {
            const float wv = load_plain<T>(row, i);
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (t < n_tok)
                    acc[t] = fmaf(wv, x[(size_t)t * n_in + i], acc[t]);
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t < n_tok) {
            const float s = warp_sum(acc[t]);
            if (lane == 0)
                out[(size_t)t * n_out + o] = bias ? s + bias[o] : s;
        }
    }
}

template <int T, int NT>
static int matvec_launch_q(float *out, const void *w, size_t row_bytes, int64_t n_in, int64_t n_out,
                           const float *x, const float *bias, int n_tok, cudaStream_t stream,
                           struct verr *err) {
    const dim3 grid(ceil_div_u(n_out, MATVEC_WARPS)), block(MATVEC_WARPS * VELA_WARP);
    // float4 reads of x need 16-byte aligned rows: n_in is a multiple of 32,
    // so only the base pointer matters.
    if (((uintptr_t)x & 15u) == 0) {
        matvec_q_kernel<T, NT, true><<<grid, block, 0, stream>>>(out, (const uint8_t *)w, row_bytes,
                                                                 x, bias, n_in, n_out, n_tok);
        VELA_CHECK_LAUNCH(err, "matvec_q_kernel<vec>");
    } else {
        matvec_q_kernel<T, NT, false><<<grid, block, 0, stream>>>(
            out, (const uint8_t *)w, row_bytes, x, bias, n_in, n_out, n_tok);
        VELA_CHECK_LAUNCH(err, "matvec_q_kernel<scalar>");
    }
    return VERR_OK;
}

template <int T, int NT>
static int matvec_launch_plain(float *out, const void *w, size_t row_bytes, int64_t n_in,
                               int64_t n_out, const float *x, const float *bias, int n_tok,
                               cudaStream_t stream, struct verr *err) {
    const dim3 grid(ceil_div_u(n_out, MATVEC_WARPS)), block(MATVEC_WARPS * VELA_WARP);
    const bool pair =
        T != GGML_TYPE_F32 && n_in % 2 == 0 && ((uintptr_t)w & 3u) == 0 && ((uintptr_t)x & 7u) == 0;
    if (pair) {
        matvec_plain_kernel<T, NT, true><<<grid, block, 0, stream>>>(
            out, (const uint8_t *)w, row_bytes, x, bias, n_in, n_out, n_tok);
        VELA_CHECK_LAUNCH(err, "matvec_plain_kernel<pair>");
    } else {
        matvec_plain_kernel<T, NT, false><<<grid, block, 0, stream>>>(
            out, (const uint8_t *)w, row_bytes, x, bias, n_in, n_out, n_tok);
        VELA_CHECK_LAUNCH(err, "matvec_plain_kernel");
    }
    return VERR_OK;
}

extern "C" int cuda_matvec_apply(float *out, const void *w, enum ggml_type type, int64_t n_in,
                                 int64_t n_out, const float *x, const float *bias, int n_tok,
                                 cudaStream_t stream, struct verr *err) {
    if (n_tok < 1 || n_tok > CUDA_MATVEC_MAX_TOK)
        return verr_set(err, VERR_RANGE, "matvec: n_tok %d outside [1, %d]", n_tok,
                        CUDA_MATVEC_MAX_TOK);
    if (n_out <= 0)
        return VERR_OK;
    const size_t row_bytes = ggml_row_bytes(type, n_in);
    if (row_bytes == 0)
        return verr_set(err, VERR_RANGE, "matvec: %s row of %lld elements is not whole blocks",
                        ggml_type_name(type), (long long)n_in);
    if (((uintptr_t)w & 15u) != 0)
        return verr_set(err, VERR_RANGE, "matvec: weight data %p is not 16-byte aligned", w);
    const bool one = n_tok == 1;
    auto run_q = [&](auto tc) -> int {
        constexpr int T = decltype(tc)::value;
        return one ? matvec_launch_q<T, 1>(out, w, row_bytes, n_in, n_out, x, bias, n_tok, stream,
                                           err)
                   : matvec_launch_q<T, CUDA_MATVEC_MAX_TOK>(out, w, row_bytes, n_in, n_out, x,
                                                             bias, n_tok, stream, err);
    };
    auto run_plain = [&](auto tc) -> int {
        constexpr int T = decltype(tc)::value;
        return one ? matvec_launch_plain<T, 1>(out, w, row_bytes, n_in, n_out, x, bias, n_tok,
                                               stream, err)
                   : matvec_launch_plain<T, CUDA_MATVEC_MAX_TOK>(out, w, row_bytes, n_in, n_out, x,
                                                                 bias, n_tok, stream, err);
    };
    if (vela_is_plain(type))
        return VELA_DISPATCH_PLAIN(type, run_plain, VERR_UNSUPPORTED);
    const int rc = VELA_DISPATCH_QTYPE(type, run_q, 1);
    if (rc == 1)
        return verr_set(err, VERR_UNSUPPORTED, "matvec: weight type %s is not supported",
                        ggml_type_name(type));
    return rc;
}
