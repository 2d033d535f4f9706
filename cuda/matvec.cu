// Mat-vec for decode (n_tok <= CUDA_MATVEC_MAX_TOK): one warp per output row.
// The weights are read exactly once and decoded in registers; activations
// stay f32; the bias is added by the lane that writes the result.
//
// Quantized rows: lane l decodes sub-blocks (32 elements) l, l+32, ...; the 32
// lanes of a warp read 32 consecutive sub-blocks, i.e. one contiguous span of
// the row per step (coalesced). Plain rows (F32/F16/BF16): lane l reads
// elements l, l+32, ... (for 2-byte types groups of 4 or pairs of them), also
// coalesced, and any n_in is allowed.
//
// One launch serves up to CUDA_MV_MAX_SEGS matrices that share x (Q/K/V,
// gate/up): the rows of all segments are numbered one after another and each
// warp finds its segment; the epilogue stores, adds into the output (residual
// folded in) or, for gate/up, computes both dots of a row and writes
// silu(gate) * up.
#include "cuda/dequant.cuh"
#include "cuda/launch.cuh"
#include "cuda/matvec.h"

#include <atomic>

#include <cuda_pipeline_primitives.h>

#define MATVEC_WARPS 4 // rows per block

// Kernel arguments (by value): the segments and where their rows end in the
// launch's numbering.
struct mv_args {
    float *out[CUDA_MV_MAX_SEGS];        // [n_tok][n_out[s]]
    const uint8_t *w[CUDA_MV_MAX_SEGS];  // [n_out[s]][row_bytes]
    const float *bias[CUDA_MV_MAX_SEGS]; // [n_out[s]] or NULL
    int64_t n_out[CUDA_MV_MAX_SEGS];
    int64_t row_end[CUDA_MV_MAX_SEGS]; // cumulative n_out
    int64_t n_rows;                    // rows of the launch (row_end of the last segment)
    int n_seg;
    // Expert mode (cuda_matvec_experts; NULL ids: off): blockIdx.y is the
    // pair pair0 + blockIdx.y, n_tok is 1.
    const int32_t *ids;  // [n_pairs]
    size_t expert_bytes; // one expert's matrix: n_out[0] * row_bytes
    int n_expert, x_div, pair0, n_pairs;
};

// Row loaders: how a lane's partial dot of one row with every token's x is
// formed (acc[t] += ...). MODE_QVEC / MODE_Q: quantized, x read as float4 or
// scalars; MODE_VEC4: 2-byte plain type, 4 elements (8 bytes) per load, x
// as float4; MODE_PAIR: 2-byte plain type read two at a time; MODE_PLAIN: one
// element at a time.
enum { MODE_QVEC, MODE_Q, MODE_VEC4, MODE_PAIR, MODE_PLAIN };

// One 2-byte plain value (f16 or bf16) from its bits.
template <int T> static __device__ __forceinline__ float mv_half(uint32_t h) {
    if constexpr (T == GGML_TYPE_F16)
        return f16_bits_to_f32((uint16_t)h);
    else
        return bf16_bits_to_f32((uint16_t)h);
}

// acc + the dot of 4 f16 / bf16 values packed in a uint2 with 4 floats, in
// element order.
template <int T>
static __device__ __forceinline__ float mv_dot4(const uint2 &u, const float4 &p, float acc) {
    acc = fmaf(mv_half<T>(u.x & 0xffffu), p.x, acc);
    acc = fmaf(mv_half<T>(u.x >> 16), p.y, acc);
    acc = fmaf(mv_half<T>(u.y & 0xffffu), p.z, acc);
    return fmaf(mv_half<T>(u.y >> 16), p.w, acc);
}

template <int T, int NT, int MODE>
static __device__ __forceinline__ void
mv_row_partial(float acc[NT], const uint8_t *__restrict__ row, const float *__restrict__ x,
               int64_t n_in, int n_tok, int lane) {
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    if constexpr (MODE == MODE_QVEC || MODE == MODE_Q) {
        const int64_t n_sub = n_in / 32;
        for (int64_t sb = lane; sb < n_sub; sb += VELA_WARP) {
            float v[32];
            dequant_sub32<T>(row, sb, v);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < n_tok) {
                    const float *xs = x + (size_t)t * n_in + sb * 32;
                    float a0 = 0.0f, a1 = 0.0f;
                    if constexpr (MODE == MODE_QVEC) {
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
    } else if constexpr (MODE == MODE_VEC4) {
        // Lane l takes elements 4l..4l+3, 4l+128..: 8-byte weight loads and
        // 16-byte x loads, each a contiguous span across the warp (256 and
        // 512 bytes: every sector touched is used). Two spans per iteration
        // keep as many weight bytes in flight as one 16-byte load would.
        // Another partition of the row than MODE_PAIR's, so the two modes
        // round differently (both f32).
        const uint2 *row4 = (const uint2 *)row;
        const int64_t n4 = n_in / 4;
        for (int64_t i4 = lane; i4 < n4; i4 += 2 * VELA_WARP) {
            const bool two = i4 + VELA_WARP < n4;
            const uint2 u0 = row4[i4];
            const uint2 u1 = two ? row4[i4 + VELA_WARP] : make_uint2(0u, 0u);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < n_tok) {
                    const float4 *xv = (const float4 *)(x + (size_t)t * n_in) + i4;
                    const float4 p0 = xv[0];
                    acc[t] = mv_dot4<T>(u0, p0, acc[t]);
                    if (two) {
                        const float4 p1 = xv[VELA_WARP];
                        acc[t] = mv_dot4<T>(u1, p1, acc[t]);
                    }
                }
            }
        }
    } else if constexpr (MODE == MODE_PAIR) {
        const uint32_t *row2 = (const uint32_t *)row;
        for (int64_t i2 = lane; i2 < n_in / 2; i2 += VELA_WARP) {
            const uint32_t pr = row2[i2];
            const float w0 = mv_half<T>(pr & 0xffffu), w1 = mv_half<T>(pr >> 16);
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
}

// a.f[s] for a segment index s in [0, 3), without indexing the kernel
// parameter dynamically (that would copy the argument struct to local memory).
#define MV_PICK(a, f, s) ((s) == 0 ? (a).f[0] : (s) == 1 ? (a).f[1] : (a).f[2])
static_assert(CUDA_MV_MAX_SEGS == 3, "MV_PICK selects among 3 segments");

template <int T, int NT, int MODE, int EPI>
__global__ static void __launch_bounds__(MATVEC_WARPS *VELA_WARP)
    matvec_kernel(const mv_args a, size_t row_bytes,
                  const float *__restrict__ x /* [n_tok][n_in] */, int64_t n_in, int n_tok) {
    cuda_pdl_wait();
    const int64_t g = (int64_t)blockIdx.x * MATVEC_WARPS + threadIdx.x / VELA_WARP;
    const int lane = threadIdx.x % VELA_WARP;
    // SWIGLU: a warp takes row g of both matrices; otherwise rows of all
    // segments are numbered one after another.
    if (g >= (CUDA_MV_GATED(EPI) ? a.n_out[0] : a.n_rows))
        return; // uniform per warp
    int s = 0;
    if (!CUDA_MV_GATED(EPI))
        s = g < a.row_end[0] ? 0 : g < a.row_end[1] ? 1 : 2;
    const int64_t o = s == 0 ? g : g - MV_PICK(a, row_end, s - 1), n_out = MV_PICK(a, n_out, s);
    // Expert mode: expert ids[p] (clamped: never out of bounds), x row
    // p / x_div, output row p.
    size_t w_off = 0, out_off = 0;
    if (a.ids) {
        const int p = a.pair0 + (int)blockIdx.y;
        w_off = (size_t)min(max(a.ids[p], 0), a.n_expert - 1) * a.expert_bytes;
        x += (size_t)(p / a.x_div) * n_in;
        out_off = (size_t)p * n_out;
    }
    float acc[NT];
    mv_row_partial<T, NT, MODE>(acc, MV_PICK(a, w, s) + w_off + (size_t)o * row_bytes, x, n_in,
                                n_tok, lane);
    if constexpr (CUDA_MV_GATED(EPI)) {
        float up[NT];
        mv_row_partial<T, NT, MODE>(up, a.w[1] + w_off + (size_t)o * row_bytes, x, n_in, n_tok,
                                    lane);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < n_tok) {
                const float gs = warp_sum(acc[t]), us = warp_sum(up[t]);
                if (lane == 0)
                    a.out[0][out_off + (size_t)t * n_out + o] =
                        EPI == CUDA_MV_GEGLU ? vela_gelu_mul(gs, us) : vela_silu_mul(gs, us);
            }
        }
        return;
    }
    const float *bias = MV_PICK(a, bias, s);
    float *out = MV_PICK(a, out, s);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t < n_tok) {
            const float sum = warp_sum(acc[t]);
            if (lane == 0) {
                const float r = bias ? sum + bias[o] : sum;
                float *dst = out + out_off + (size_t)t * n_out + o;
                if (EPI == CUDA_MV_ADD)
                    *dst += r;
                else
                    *dst = r;
            }
        }
    }
}

template <int T, int NT, int MODE>
static int matvec_launch(const mv_args &a, enum cuda_mv_epilogue epi, size_t row_bytes,
                         const float *x, int64_t n_in, int n_tok, bool pdl, cudaStream_t stream,
                         struct verr *err) {
    const int64_t rows = CUDA_MV_GATED(epi) ? a.n_out[0] : a.n_rows;
    const dim3 block(MATVEC_WARPS * VELA_WARP);
    // Expert mode: the grid's y walks the pairs, at most 65535 per launch.
    const int n_y_all = a.ids ? a.n_pairs : 1;
    for (int p0 = 0; p0 < n_y_all; p0 += 65535) {
        const dim3 grid(ceil_div_u(rows, MATVEC_WARPS),
                        (unsigned int)(n_y_all - p0 < 65535 ? n_y_all - p0 : 65535));
        mv_args ap = a;
        ap.pair0 = p0;
        switch (epi) {
        case CUDA_MV_STORE:
            cuda_launch(pdl, matvec_kernel<T, NT, MODE, CUDA_MV_STORE>, grid, block, 0, stream, ap,
                        row_bytes, x, n_in, n_tok);
            break;
        case CUDA_MV_ADD:
            cuda_launch(pdl, matvec_kernel<T, NT, MODE, CUDA_MV_ADD>, grid, block, 0, stream, ap,
                        row_bytes, x, n_in, n_tok);
            break;
        case CUDA_MV_GEGLU:
            cuda_launch(pdl, matvec_kernel<T, NT, MODE, CUDA_MV_GEGLU>, grid, block, 0, stream, ap,
                        row_bytes, x, n_in, n_tok);
            break;
        default:
            cuda_launch(pdl, matvec_kernel<T, NT, MODE, CUDA_MV_SWIGLU>, grid, block, 0, stream, ap,
                        row_bytes, x, n_in, n_tok);
            break;
        }
        VELA_CHECK_LAUNCH(err, "matvec_kernel");
    }
    return VERR_OK;
}

template <int T, int MODE>
static int matvec_launch_nt(const mv_args &a, enum cuda_mv_epilogue epi, size_t row_bytes,
                            const float *x, int64_t n_in, int n_tok, bool pdl, cudaStream_t stream,
                            struct verr *err) {
    if (n_tok == 1)
        return matvec_launch<T, 1, MODE>(a, epi, row_bytes, x, n_in, n_tok, pdl, stream, err);
    return matvec_launch<T, CUDA_MATVEC_MAX_TOK, MODE>(a, epi, row_bytes, x, n_in, n_tok, pdl,
                                                       stream, err);
}

// ---------------------------------------------------------------------------
// streaming mat-vec of 2-byte plain weights (CUDA_MV_STREAM)
//
// A persistent grid of a few blocks per multiprocessor. Warp g of the grid's
// G owns the rows g, g + G, ... whole (gated: row g of both matrices). A row
// is cut into items of U 16-byte units per lane (lane l the units l, l + 32,
// ... of the item: every load a contiguous 512 bytes across the warp); the
// warp walks its items in order, rows one after another, with two register
// buffers: the item after the current one is requested before the current
// one is used, so a warp keeps one item of weights in flight from its first
// row to its last. Every token's activations are copied into shared memory
// once per block, at the start: the block's one barrier. Unit c of a row
// (elements 8c .. 8c + 7) meets x as two float4, staged as two planes
// (elements 8c .. 8c + 3 at [0][c], 8c + 4 .. 8c + 7 at [1][c]) so that the
// lanes' 16-byte shared loads are consecutive. A row's sums are the warp's
// own (each lane's terms in row order, then the butterfly); lane t stores
// token t with the epilogue.

// Warps per block: one token's activations are small enough for several
// blocks per SM; 8 tokens of a 4096-wide row take 128 KiB, one block per SM,
// which then needs more warps of its own.
template <int NT> struct mvf_shape { static constexpr int warps = NT == 1 ? 8 : 16; };
// 16-byte units per lane of an item of R rows (R = 2: gate and up): 2 KiB of
// weights per warp in flight for one token, 4 KiB for a batch.
template <int NT, int R> struct mvf_units { static constexpr int u = (NT == 1 ? 4 : 8) / R; };

template <int T, int NT, bool GATED>
__global__ static void __launch_bounds__(mvf_shape<NT>::warps *VELA_WARP)
    matvec_stream_kernel(const mv_args a, size_t row_bytes,
                         const float *__restrict__ x /* [n_tok][n_in] */, int64_t n_in, int n_tok,
                         int epi) {
    constexpr int W = mvf_shape<NT>::warps, R = GATED ? 2 : 1, U = mvf_units<NT, R>::u;
    extern __shared__ __align__(16) float4 mvf_xs[]; // [n_tok][2][n_in / 8]
    const int warp = threadIdx.x / VELA_WARP, lane = threadIdx.x % VELA_WARP;
    const int64_t n8 = n_in / 8; // 16-byte units of a row
    const int n_items = (int)((n8 + U * VELA_WARP - 1) / (U * VELA_WARP));
    const int64_t n_rows = GATED ? a.n_out[0] : a.n_rows;
    const int64_t stride = (int64_t)gridDim.x * W;
    const int64_t g = (int64_t)blockIdx.x * W + warp;

    // Row gr's weights: matrix r of a gated pair, else its segment's.
    size_t w_off = 0;
    auto row_of = [&](int64_t gr, int r) -> const uint4 * {
        if (GATED)
            return (const uint4 *)((r == 0 ? a.w[0] : a.w[1]) + w_off + (size_t)gr * row_bytes);
        const int s = gr < a.row_end[0] ? 0 : gr < a.row_end[1] ? 1 : 2;
        const int64_t o = s == 0 ? gr : gr - MV_PICK(a, row_end, s - 1);
        return (const uint4 *)(MV_PICK(a, w, s) + w_off + (size_t)o * row_bytes);
    };
    // The fetch cursor: item fi of row fr (fr >= n_rows: nothing left).
    int64_t fr = g;
    int fi = 0;
    auto fetch = [&](uint4(&buf)[R][U]) {
        if (fr >= n_rows)
            return;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint4 *row = row_of(fr, r);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t c = ((int64_t)fi * U + u) * VELA_WARP + lane;
                buf[r][u] = c < n8 ? row[c] : make_uint4(0u, 0u, 0u, 0u);
            }
        }
        if (++fi == n_items) {
            fi = 0;
            fr += stride;
        }
    };

    // Weights are no earlier kernel's output: the first item goes out before
    // the wait, except in expert mode (its ids are).
    uint4 b0[R][U], b1[R][U];
    if (!a.ids)
        fetch(b0);
    cuda_pdl_wait();
    size_t out_off = 0;
    if (a.ids) {
        const int p = a.pair0 + (int)blockIdx.y;
        w_off = (size_t)min(max(a.ids[p], 0), a.n_expert - 1) * a.expert_bytes;
        x += (size_t)(p / a.x_div) * n_in;
        out_off = (size_t)p * a.n_out[0];
        fetch(b0);
    }
    for (int t = 0; t < n_tok; t++) {
        const float4 *src = (const float4 *)(x + (size_t)t * n_in);
        float4 *dst = mvf_xs + (size_t)t * 2 * n8;
        for (int64_t k = threadIdx.x; k < 2 * n8; k += W * VELA_WARP)
            __pipeline_memcpy_async(dst + (k & 1) * n8 + (k >> 1), src + k, 16);
    }
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();

    // The compute cursor: item ci of row cr, sums acc[r][t].
    int64_t cr = g;
    int ci = 0;
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[r][t] = 0.0f;
    auto store = [&]() {
        float v[R] = {};
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < n_tok) {
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const float s = warp_sum(acc[r][t]);
                    if (lane == t)
                        v[r] = s;
                }
            }
        }
        if (lane < n_tok) {
            if constexpr (GATED) {
                a.out[0][out_off + (size_t)lane * a.n_out[0] + cr] =
                    epi == CUDA_MV_GEGLU ? vela_gelu_mul(v[0], v[1]) : vela_silu_mul(v[0], v[1]);
            } else {
                const int s = cr < a.row_end[0] ? 0 : cr < a.row_end[1] ? 1 : 2;
                const int64_t o = s == 0 ? cr : cr - MV_PICK(a, row_end, s - 1);
                const int64_t n_out = MV_PICK(a, n_out, s);
                const float *bias = MV_PICK(a, bias, s);
                const float r = bias ? v[0] + bias[o] : v[0];
                float *dst = MV_PICK(a, out, s) + out_off + (size_t)lane * n_out + o;
                *dst = epi == CUDA_MV_ADD ? *dst + r : r;
            }
        }
    };
    // Uses the item in buf (the next one is on its way), then stores the row
    // where it was its last item.
    auto use = [&](const uint4(&buf)[R][U]) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t c = ((int64_t)ci * U + u) * VELA_WARP + lane;
            if (c < n8) {
                // widened once, used by every token
                float wv[R][8];
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const uint32_t q[4] = {buf[r][u].x, buf[r][u].y, buf[r][u].z, buf[r][u].w};
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        wv[r][2 * j] = mv_half<T>(q[j] & 0xffffu);
                        wv[r][2 * j + 1] = mv_half<T>(q[j] >> 16);
                    }
                }
                // token t's terms (its activations at xt): 8 dependent FMAs,
                // in element order
                auto dot = [&](const float4 *xt, int t) {
                    const float4 p0 = xt[0], p1 = xt[n8];
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        float s = acc[r][t];
                        s = fmaf(wv[r][0], p0.x, s);
                        s = fmaf(wv[r][1], p0.y, s);
                        s = fmaf(wv[r][2], p0.z, s);
                        s = fmaf(wv[r][3], p0.w, s);
                        s = fmaf(wv[r][4], p1.x, s);
                        s = fmaf(wv[r][5], p1.y, s);
                        s = fmaf(wv[r][6], p1.z, s);
                        acc[r][t] = fmaf(wv[r][7], p1.w, s);
                    }
                };
                const float4 *xc = mvf_xs + c;
                // Two tokens without a branch between them, so that their
                // chains interleave (eight that way need more registers than
                // a 16-warp block has: ptxas spills).
                if (NT == 2 && n_tok == NT) {
#pragma unroll
                    for (int t = 0; t < NT; t++, xc += 2 * n8)
                        dot(xc, t);
                } else {
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        if (t < n_tok) {
                            dot(xc, t);
                            xc += 2 * n8;
                        }
                    }
                }
            }
        }
        if (++ci == n_items) {
            store();
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int t = 0; t < NT; t++)
                    acc[r][t] = 0.0f;
            ci = 0;
            cr += stride;
        }
    };
    while (cr < n_rows) {
        fetch(b1);
        use(b0);
        if (cr >= n_rows)
            break;
        fetch(b0);
        use(b1);
    }
}

// Shared memory of the streaming kernel: every token's activations.
static size_t mvf_smem(int n_tok, int64_t n_in) {
    return (size_t)n_tok * (size_t)n_in * sizeof(float);
}

// The most shared memory a streaming block may take under plan.
static size_t mvf_smem_limit(const struct cuda_mv_plan *plan) {
    return plan->smem_per_block > 0 ? (size_t)plan->smem_per_block : 96 * 1024;
}

// Whether the streaming kernel serves type at n_tok x n_in under plan (x
// 16-byte aligned: its rows then are too, n_in being a multiple of 8).
static bool mvf_applies(enum ggml_type type, int64_t n_in, int n_tok,
                        const struct cuda_mv_plan *plan) {
    return plan && plan->kernel == CUDA_MV_STREAM &&
           (type == GGML_TYPE_F16 || type == GGML_TYPE_BF16) && n_in > 0 && n_in % 8 == 0 &&
           n_tok >= 1 && n_tok <= CUDA_MATVEC_MAX_TOK &&
           mvf_smem(n_tok, n_in) <= mvf_smem_limit(plan);
}

// Blocks of the streaming kernel (cuda_stream_blocks): rows streamed.
static unsigned int mvf_blocks(const struct cuda_mv_plan *plan, int64_t rows, unsigned int n_y,
                               size_t smem, int warps_per_block) {
    return cuda_stream_blocks(plan->sm_count, plan->smem_per_sm,
                              plan->blocks_per_sm > 0 ? plan->blocks_per_sm
                                                      : CUDA_MV_STREAM_BLOCKS_PER_SM,
                              rows, n_y, smem, warps_per_block, 0);
}

template <int T, int NT, bool GATED>
static int matvec_stream_launch(const mv_args &a, enum cuda_mv_epilogue epi, size_t row_bytes,
                                const float *x, int64_t n_in, int n_tok,
                                const struct cuda_mv_plan *plan, bool pdl, cudaStream_t stream,
                                struct verr *err) {
    constexpr int W = mvf_shape<NT>::warps;
    const int64_t rows = GATED ? a.n_out[0] : a.n_rows;
    const size_t smem = mvf_smem(n_tok, n_in);
    static std::atomic<int> raised[64];
    const int rc = cuda_raise_smem(matvec_stream_kernel<T, NT, GATED>, raised, smem,
                                   mvf_smem_limit(plan), err);
    if (rc)
        return rc;
    // Expert mode: the grid's y walks the pairs, at most 65535 per launch.
    const int n_y_all = a.ids ? a.n_pairs : 1;
    const unsigned int n_blocks =
        mvf_blocks(plan, rows, (unsigned int)(n_y_all < 65535 ? n_y_all : 65535), smem, W);
    for (int p0 = 0; p0 < n_y_all; p0 += 65535) {
        const dim3 grid(n_blocks, (unsigned int)(n_y_all - p0 < 65535 ? n_y_all - p0 : 65535));
        mv_args ap = a;
        ap.pair0 = p0;
        cuda_launch(pdl, matvec_stream_kernel<T, NT, GATED>, grid, dim3(W * VELA_WARP), smem,
                    stream, ap, row_bytes, x, n_in, n_tok, (int)epi);
        VELA_CHECK_LAUNCH(err, "matvec_stream_kernel");
    }
    return VERR_OK;
}

template <int T>
static int matvec_stream_nt(const mv_args &a, enum cuda_mv_epilogue epi, size_t row_bytes,
                            const float *x, int64_t n_in, int n_tok,
                            const struct cuda_mv_plan *plan, bool pdl, cudaStream_t stream,
                            struct verr *err) {
    const bool gated = CUDA_MV_GATED(epi);
    if (n_tok == 1)
        return gated ? matvec_stream_launch<T, 1, true>(a, epi, row_bytes, x, n_in, n_tok, plan,
                                                        pdl, stream, err)
                     : matvec_stream_launch<T, 1, false>(a, epi, row_bytes, x, n_in, n_tok, plan,
                                                         pdl, stream, err);
    if (n_tok == 2)
        return gated ? matvec_stream_launch<T, 2, true>(a, epi, row_bytes, x, n_in, n_tok, plan,
                                                        pdl, stream, err)
                     : matvec_stream_launch<T, 2, false>(a, epi, row_bytes, x, n_in, n_tok, plan,
                                                         pdl, stream, err);
    return gated ? matvec_stream_launch<T, CUDA_MATVEC_MAX_TOK, true>(a, epi, row_bytes, x, n_in,
                                                                      n_tok, plan, pdl, stream, err)
                 : matvec_stream_launch<T, CUDA_MATVEC_MAX_TOK, false>(
                       a, epi, row_bytes, x, n_in, n_tok, plan, pdl, stream, err);
}

// cuda_matvec_plan_segs, and with ex its expert mode (cuda_matvec_plan_experts).
static int mv_segs(const struct cuda_mv_seg *segs, int n_seg, enum ggml_type type, int64_t n_in,
                   const float *x, int n_tok, enum cuda_mv_epilogue epi,
                   const struct cuda_mv_experts *ex, const struct cuda_mv_plan *plan, bool pdl,
                   cudaStream_t stream, struct verr *err) {
    if (ex && (n_tok != 1 || !ex->ids || ex->n_pairs < 0 || ex->n_expert < 1 || ex->x_div < 1 ||
               n_seg != (CUDA_MV_GATED(epi) ? 2 : 1)))
        return verr_set(err, VERR_RANGE,
                        "matvec experts: n_tok %d, %d segments, ids %p, %d pairs, %d experts, "
                        "x_div %d: need one token, one segment (two gated), ids and positive "
                        "counts",
                        n_tok, n_seg, (const void *)ex->ids, ex->n_pairs, ex->n_expert, ex->x_div);
    if (ex && ex->n_pairs == 0)
        return VERR_OK;
    if (n_tok < 1 || n_tok > CUDA_MATVEC_MAX_TOK)
        return verr_set(err, VERR_RANGE, "matvec: n_tok %d outside [1, %d]", n_tok,
                        CUDA_MATVEC_MAX_TOK);
    if (n_seg < 1 || n_seg > CUDA_MV_MAX_SEGS)
        return verr_set(err, VERR_RANGE, "matvec: %d segments (1 to %d)", n_seg, CUDA_MV_MAX_SEGS);
    if (epi != CUDA_MV_STORE && epi != CUDA_MV_ADD && !CUDA_MV_GATED(epi))
        return verr_set(err, VERR_RANGE, "matvec: unknown epilogue %d", (int)epi);
    if (CUDA_MV_GATED(epi) &&
        (n_seg != 2 || segs[0].n_out != segs[1].n_out || segs[0].bias || segs[1].bias))
        return verr_set(err, VERR_RANGE,
                        "matvec swiglu/geglu: needs 2 segments of equal n_out without bias "
                        "(got %d segments)",
                        n_seg);
    const size_t row_bytes = ggml_row_bytes(type, n_in);
    if (row_bytes == 0)
        return verr_set(err, VERR_RANGE, "matvec: %s row of %lld elements is not whole blocks",
                        ggml_type_name(type), (long long)n_in);
    if (plan &&
        (plan->kernel < CUDA_MV_PASS || plan->kernel > CUDA_MV_STREAM || plan->sm_count < 0 ||
         plan->smem_per_sm < 0 || plan->smem_per_block < 0 || plan->blocks_per_sm < 0))
        return verr_set(err, VERR_RANGE,
                        "matvec: plan {kernel %d, sm_count %d, smem_per_sm %d, smem_per_block %d, "
                        "blocks_per_sm %d}: need kernel 0..1 and no negative counts",
                        plan->kernel, plan->sm_count, plan->smem_per_sm, plan->smem_per_block,
                        plan->blocks_per_sm);
    mv_args a;
    memset(&a, 0, sizeof a);
    int64_t end = 0;
    bool aligned = true;
    for (int s = 0; s < n_seg; s++) {
        if (segs[s].n_out < 0 || !segs[s].w || !segs[s].out)
            return verr_set(err, VERR_RANGE, "matvec: segment %d: NULL pointer or n_out %lld", s,
                            (long long)segs[s].n_out);
        if (((uintptr_t)segs[s].w & 15u) != 0)
            return verr_set(err, VERR_RANGE,
                            "matvec: segment %d: weight data %p is not 16-byte aligned", s,
                            segs[s].w);
        aligned = aligned && ((uintptr_t)segs[s].w & 3u) == 0;
        a.out[s] = segs[s].out;
        a.w[s] = (const uint8_t *)segs[s].w;
        a.bias[s] = segs[s].bias;
        a.n_out[s] = segs[s].n_out;
        a.row_end[s] = end += segs[s].n_out;
    }
    a.n_seg = n_seg;
    a.n_rows = end;
    if (end == 0)
        return VERR_OK;
    if (ex) {
        a.ids = ex->ids;
        a.expert_bytes = (size_t)segs[0].n_out * row_bytes;
        a.n_expert = ex->n_expert;
        a.x_div = ex->x_div;
        a.n_pairs = ex->n_pairs;
    }
    // The streaming kernel where plan asks for it and it applies (its weight
    // rows are 16-byte aligned: checked above, n_in % 8 == 0).
    if (mvf_applies(type, n_in, n_tok, plan) && ((uintptr_t)x & 15u) == 0)
        return type == GGML_TYPE_F16
                   ? matvec_stream_nt<GGML_TYPE_F16>(a, epi, row_bytes, x, n_in, n_tok, plan, pdl,
                                                     stream, err)
                   : matvec_stream_nt<GGML_TYPE_BF16>(a, epi, row_bytes, x, n_in, n_tok, plan, pdl,
                                                      stream, err);
    auto run_q = [&](auto tc) -> int {
        constexpr int T = decltype(tc)::value;
        // float4 reads of x need 16-byte aligned rows: n_in is a multiple of
        // 32, so only the base pointer matters.
        if (((uintptr_t)x & 15u) == 0)
            return matvec_launch_nt<T, MODE_QVEC>(a, epi, row_bytes, x, n_in, n_tok, pdl, stream,
                                                  err);
        return matvec_launch_nt<T, MODE_Q>(a, epi, row_bytes, x, n_in, n_tok, pdl, stream, err);
    };
    auto run_plain = [&](auto tc) -> int {
        constexpr int T = decltype(tc)::value;
        // 8-byte weight loads: every row starts 8-byte aligned (n_in % 4 ==
        // 0; the weights are 16-byte aligned) and x's rows 16-byte for its
        // float4 loads. Pairs: rows 4-byte aligned (even n_in), x rows 8-byte.
        if (T != GGML_TYPE_F32 && n_in % 4 == 0 && aligned && ((uintptr_t)x & 15u) == 0)
            return matvec_launch_nt<T, MODE_VEC4>(a, epi, row_bytes, x, n_in, n_tok, pdl, stream,
                                                  err);
        if (T != GGML_TYPE_F32 && n_in % 2 == 0 && aligned && ((uintptr_t)x & 7u) == 0)
            return matvec_launch_nt<T, MODE_PAIR>(a, epi, row_bytes, x, n_in, n_tok, pdl, stream,
                                                  err);
        return matvec_launch_nt<T, MODE_PLAIN>(a, epi, row_bytes, x, n_in, n_tok, pdl, stream, err);
    };
    if (vela_is_plain(type))
        return VELA_DISPATCH_PLAIN(type, run_plain, VERR_UNSUPPORTED);
    // MXFP4 too (dequant_sub32's byte loads need no row alignment)
    const int rc = VELA_DISPATCH_QTYPE_MX(type, run_q, 1);
    if (rc == 1)
        return verr_set(err, VERR_UNSUPPORTED, "matvec: weight type %s is not supported",
                        ggml_type_name(type));
    return rc;
}

extern "C" int cuda_matvec_segs(const struct cuda_mv_seg *segs, int n_seg, enum ggml_type type,
                                int64_t n_in, const float *x, int n_tok, enum cuda_mv_epilogue epi,
                                bool pdl, cudaStream_t stream, struct verr *err) {
    return mv_segs(segs, n_seg, type, n_in, x, n_tok, epi, NULL, NULL, pdl, stream, err);
}

extern "C" int cuda_matvec_experts(const struct cuda_mv_seg *segs, int n_seg, enum ggml_type type,
                                   int64_t n_in, const float *x, const struct cuda_mv_experts *ex,
                                   enum cuda_mv_epilogue epi, cudaStream_t stream,
                                   struct verr *err) {
    return cuda_matvec_plan_experts(segs, n_seg, type, n_in, x, ex, epi, NULL, stream, err);
}

extern "C" int cuda_matvec_plan_segs(const struct cuda_mv_seg *segs, int n_seg, enum ggml_type type,
                                     int64_t n_in, const float *x, int n_tok,
                                     enum cuda_mv_epilogue epi, const struct cuda_mv_plan *plan,
                                     bool pdl, cudaStream_t stream, struct verr *err) {
    return mv_segs(segs, n_seg, type, n_in, x, n_tok, epi, NULL, plan, pdl, stream, err);
}

extern "C" int cuda_matvec_plan_experts(const struct cuda_mv_seg *segs, int n_seg,
                                        enum ggml_type type, int64_t n_in, const float *x,
                                        const struct cuda_mv_experts *ex, enum cuda_mv_epilogue epi,
                                        const struct cuda_mv_plan *plan, cudaStream_t stream,
                                        struct verr *err) {
    if (!ex)
        return verr_set(err, VERR_RANGE, "matvec experts: no expert ids");
    // The expert mode (MoE decode, cuda/moe.cu beside it) launches without pdl.
    return mv_segs(segs, n_seg, type, n_in, x, 1, epi, ex, plan, false, stream, err);
}

extern "C" int cuda_matvec_kernel(enum ggml_type type, int64_t n_in, int n_tok,
                                  const struct cuda_mv_plan *plan) {
    if (plan && (plan->sm_count < 0 || plan->smem_per_sm < 0 || plan->smem_per_block < 0 ||
                 plan->blocks_per_sm < 0))
        return CUDA_MV_PASS;
    return mvf_applies(type, n_in, n_tok, plan) ? CUDA_MV_STREAM : CUDA_MV_PASS;
}
