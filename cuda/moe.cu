// Mixture of experts around the expert matrices (cuda/moe.h): the router
// (softmax + top-k + renorm, or top-k + softmax, one warp per token), the
// grouping of (token, slot) pairs by expert for prompt batches (a counting
// sort on the device, so the ids never travel to the host and a CUDA graph
// replays it with new ids), the activation with per-expert biases, and the
// weighted sum over the slots. The experts' mat-vecs and
// GEMMs are the dense kernels in expert mode (matvec.cu, matvec_q8.cu,
// matmul_tc.cu): the same decode and dot products as the dense ops.
#include <limits.h>
#include <math.h>

#include "cuda/cuda_common.cuh"
#include "cuda/moe.h"

#define MOE_ROUTE_WARPS 4 // tokens per block of the router (fewer for > 3072 experts)
#define MOE_GROUP_THREADS 256
#define MOE_COMBINE_THREADS 256 // and of the activation
// llama.cpp's floor of the renormalised weights' sum (build_moe_ffn): 2^-14.
#define MOE_RENORM_MIN 6.103515625e-5f

static __device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(VELA_FULL_MASK, v, o);
    return v;
}

// ---------------------------------------------------------------------------
// router

// A selected expert's place in p: a NaN (never larger than anything, never
// equal to -inf) with a payload the kernel's own NaNs do not carry.
#define MOE_TAKEN_BITS 0xfff0beefu

// One warp per token. Lane l owns experts l, l + 32, ... of the token's row
// of scores (shared memory) and is the only thread that reads or writes them,
// so the selection needs no barrier: each of the k rounds takes every lane's
// best untaken expert (ascending e: a strict >, or the first -inf, so the
// lower index among equal scores), then the warp's (larger score, else lower
// index), and the owner marks it taken. NaN scores are taken only when
// nothing else is left. The scores are p = softmax(logits) (gating 0, 1),
// or the logits themselves (2: SOFTMAX_WEIGHT, then a softmax over the k).
__global__ static void moe_route_kernel(int32_t *__restrict__ ids /* [n_tok][k] */,
                                        float *__restrict__ weights /* [n_tok][k] */,
                                        const float *__restrict__ logits /* [n_tok][n_expert] */,
                                        int n_tok, int n_expert, int k, int gating) {
    extern __shared__ float moe_p[]; // [warps][n_expert]
    const int warps = blockDim.x / VELA_WARP;
    const int warp = threadIdx.x / VELA_WARP, lane = threadIdx.x % VELA_WARP;
    const int t = blockIdx.x * warps + warp;
    if (t >= n_tok)
        return; // uniform per warp; the kernel has no block barrier
    float *p = moe_p + (size_t)warp * n_expert;
    const float *l = logits + (size_t)t * n_expert;

    if (gating == CUDA_MOE_SOFTMAX_WEIGHT) {
        for (int e = lane; e < n_expert; e += VELA_WARP)
            p[e] = l[e];
    } else {
        float mx = -INFINITY;
        for (int e = lane; e < n_expert; e += VELA_WARP)
            mx = fmaxf(mx, l[e]);
        mx = warp_max(mx);
        double sum = 0.0;
        for (int e = lane; e < n_expert; e += VELA_WARP) {
            const float v = expf(__fsub_rn(l[e], mx));
            p[e] = v;
            sum += (double)v;
        }
        sum = warp_sum_f64(sum);
        const float inv = (float)(1.0 / sum);
        for (int e = lane; e < n_expert; e += VELA_WARP)
            p[e] = __fmul_rn(p[e], inv);
    }

    int32_t *id = ids + (size_t)t * k;
    float *w = weights + (size_t)t * k;
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bi = INT_MAX;
        for (int e = lane; e < n_expert; e += VELA_WARP)
            if (p[e] > bv || (bi == INT_MAX && p[e] == -INFINITY)) {
                bv = p[e];
                bi = e;
            }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(VELA_FULL_MASK, bv, o);
            const int oi = __shfl_xor_sync(VELA_FULL_MASK, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (bi == INT_MAX) {
            // Only NaN left untaken: the lowest untaken expert, as the
            // CPU's scan takes it.
            int f = INT_MAX;
            for (int e = lane; e < n_expert && f == INT_MAX; e += VELA_WARP)
                if (__float_as_uint(p[e]) != MOE_TAKEN_BITS)
                    f = e;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                f = min(f, __shfl_xor_sync(VELA_FULL_MASK, f, o));
            bi = f < n_expert ? f : 0;
            bv = __shfl_sync(VELA_FULL_MASK, lane == bi % VELA_WARP ? p[bi] : 0.0f, bi % VELA_WARP);
        }
        if (lane == bi % VELA_WARP)
            p[bi] = __uint_as_float(MOE_TAKEN_BITS);
        if (lane == 0) {
            id[j] = bi;
            w[j] = bv;
        }
    }
    if (lane != 0)
        return;
    if (gating == CUDA_MOE_SOFTMAX_RENORM) {
        float s = 0.0f;
        for (int j = 0; j < k; j++)
            s = __fadd_rn(s, w[j]);
        s = s > MOE_RENORM_MIN ? s : MOE_RENORM_MIN;
        for (int j = 0; j < k; j++)
            w[j] = __fdiv_rn(w[j], s);
    } else if (gating == CUDA_MOE_SOFTMAX_WEIGHT) {
        float mx = -INFINITY;
        for (int j = 0; j < k; j++)
            mx = w[j] > mx ? w[j] : mx;
        double sum = 0.0;
        for (int j = 0; j < k; j++) {
            w[j] = expf(__fsub_rn(w[j], mx));
            sum += (double)w[j];
        }
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j < k; j++)
            w[j] = __fmul_rn(w[j], inv);
    }
}

extern "C" int cuda_moe_route(int32_t *ids, float *weights, const float *logits, int n_tok,
                              int n_expert, int k, int gating, cudaStream_t stream,
                              struct verr *err) {
    if (n_tok < 0 || n_expert < 1 || n_expert > CUDA_MOE_MAX_EXPERT || k < 1 || k > n_expert)
        return verr_set(err, VERR_RANGE,
                        "moe route: %d tokens, %d experts, k %d (need 1 <= k <= n_expert <= %d)",
                        n_tok, n_expert, k, CUDA_MOE_MAX_EXPERT);
    if (gating < CUDA_MOE_SOFTMAX || gating > CUDA_MOE_SOFTMAX_WEIGHT)
        return verr_set(err, VERR_RANGE,
                        "moe route: gating %d (softmax 0, softmax_renorm 1 or softmax_weight 2)",
                        gating);
    if (n_tok == 0)
        return VERR_OK;
    if (!ids || !weights || !logits)
        return verr_set(err, VERR_RANGE, "moe route: NULL pointer");
    const int warps = n_expert > 3072 ? 2 : MOE_ROUTE_WARPS; // 48 KiB of p at most
    const size_t smem = (size_t)warps * n_expert * sizeof(float);
    moe_route_kernel<<<ceil_div_u(n_tok, warps), warps * VELA_WARP, smem, stream>>>(
        ids, weights, logits, n_tok, n_expert, k, gating);
    VELA_CHECK_LAUNCH(err, "moe_route_kernel");
    return VERR_OK;
}

// ---------------------------------------------------------------------------
// grouping by expert

// One block. Counts per expert (shared atomics: integer, so the counts do
// not depend on the order), one thread's scan into offsets and the tile
// table, then warp 0 scatters the pairs 32 at a time in ascending order:
// the lanes routed to one expert (__match_any_sync) take consecutive places
// from its cursor in lane order, so each group is sorted by pair index and
// the result does not depend on scheduling.
__global__ static void __launch_bounds__(MOE_GROUP_THREADS)
    moe_group_kernel(int32_t *__restrict__ order /* [n_pairs] */,
                     int32_t *__restrict__ offsets /* [n_expert + 1] */,
                     int32_t *__restrict__ tiles /* [n_tiles][2] */,
                     const int32_t *__restrict__ ids /* [n_pairs] */, int n_pairs, int n_expert,
                     int tpb, int n_tiles) {
    extern __shared__ int moe_g[]; // count [n_expert], cursor [n_expert]
    __shared__ int used_tiles;
    int *count = moe_g, *cursor = moe_g + n_expert;
    const int tid = threadIdx.x, lane = tid % VELA_WARP;
    for (int e = tid; e < n_expert; e += MOE_GROUP_THREADS)
        count[e] = 0;
    __syncthreads();
    for (int p = tid; p < n_pairs; p += MOE_GROUP_THREADS)
        atomicAdd(&count[min(max(ids[p], 0), n_expert - 1)], 1);
    __syncthreads();
    if (tid == 0) {
        int off = 0, tile = 0;
        for (int e = 0; e < n_expert; e++) {
            const int c = count[e];
            offsets[e] = off;
            cursor[e] = off;
            for (int f = 0; f < c && tile < n_tiles; f += tpb, tile++) {
                tiles[2 * tile] = e;
                tiles[2 * tile + 1] = off + f;
            }
            off += c;
        }
        offsets[n_expert] = off;
        used_tiles = tile;
    }
    __syncthreads();
    for (int i = used_tiles + tid; i < n_tiles; i += MOE_GROUP_THREADS) {
        tiles[2 * i] = -1;
        tiles[2 * i + 1] = 0;
    }
    if (tid >= VELA_WARP)
        return;
    const unsigned int below = (1u << lane) - 1u;
    for (int base = 0; base < n_pairs; base += VELA_WARP) {
        const int p = base + lane;
        const int e = p < n_pairs ? min(max(ids[p], 0), n_expert - 1) : -1;
        const unsigned int same = __match_any_sync(VELA_FULL_MASK, e);
        const int at = e >= 0 ? cursor[e] : 0;
        __syncwarp(); // every lane has read its cursor before the leaders move them
        if (e >= 0) {
            order[at + __popc(same & below)] = p;
            if ((same & below) == 0)
                cursor[e] = at + __popc(same);
        }
        __syncwarp(); // the moved cursors are seen by the next round
    }
}

extern "C" int cuda_moe_max_tiles(int n_pairs, int n_expert, int tpb) {
    if (n_pairs <= 0 || n_expert <= 0 || tpb <= 0)
        return 0;
    const int partial = n_expert < n_pairs ? n_expert : n_pairs;
    return n_pairs / tpb + partial;
}

extern "C" int cuda_moe_group(int32_t *order, int32_t *offsets, int32_t *tiles, const int32_t *ids,
                              int n_pairs, int n_expert, int tpb, int n_tiles, cudaStream_t stream,
                              struct verr *err) {
    if (n_pairs < 0 || n_expert < 1 || n_expert > CUDA_MOE_MAX_EXPERT || tpb < 1 ||
        n_tiles < cuda_moe_max_tiles(n_pairs, n_expert, tpb))
        return verr_set(err, VERR_RANGE,
                        "moe group: %d pairs, %d experts, tiles of %d, a table of %d tiles (need "
                        "n_expert <= %d and at least %d tiles)",
                        n_pairs, n_expert, tpb, n_tiles, CUDA_MOE_MAX_EXPERT,
                        cuda_moe_max_tiles(n_pairs, n_expert, tpb));
    if (!order || !offsets || (n_tiles > 0 && !tiles) || (n_pairs > 0 && !ids))
        return verr_set(err, VERR_RANGE, "moe group: NULL pointer");
    const size_t smem = (size_t)2 * n_expert * sizeof(int);
    moe_group_kernel<<<1, MOE_GROUP_THREADS, smem, stream>>>(order, offsets, tiles, ids, n_pairs,
                                                             n_expert, tpb, n_tiles);
    VELA_CHECK_LAUNCH(err, "moe_group_kernel");
    return VERR_OK;
}

// ---------------------------------------------------------------------------
// the experts' activation with biases

// gpt-oss's swiglu_oai (ggml_compute_forward_swiglu_oai_f32): std::min and
// std::clamp's comparisons (a NaN g or u passes through), every step rounded
// as written.
static __device__ __forceinline__ float moe_swiglu_oai(float g, float u, float alpha, float limit) {
    const float x = limit < g ? limit : g;
    const float y = u < -limit ? -limit : limit < u ? limit : u;
    const float glu = __fdiv_rn(x, __fadd_rn(1.0f, expf(__fmul_rn(alpha, -x))));
    return __fmul_rn(glu, __fadd_rn(y, 1.0f));
}

// The expert of pair p (clamped, as the expert mat-vecs clamp it).
static __device__ __forceinline__ int moe_expert_of(const int32_t *ids, int64_t p, int n_expert) {
    return min(max(ids[p], 0), n_expert - 1);
}

__global__ static void moe_glu_kernel(float *h, const float *gate, const float *__restrict__ up,
                                      const float *__restrict__ gate_b,
                                      const float *__restrict__ up_b,
                                      const int32_t *__restrict__ ids, int n_pairs, int n_expert,
                                      int64_t n_ff, int act, float alpha, float limit) {
    const int64_t total = (int64_t)n_pairs * n_ff;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t f = i % n_ff;
        const size_t eb = (size_t)moe_expert_of(ids, i / n_ff, n_expert) * n_ff + f;
        const float g = gate_b ? __fadd_rn(gate[i], gate_b[eb]) : gate[i];
        const float u = up_b ? __fadd_rn(up[i], up_b[eb]) : up[i];
        h[i] =
            act == CUDA_MOE_SWIGLU_OAI ? moe_swiglu_oai(g, u, alpha, limit) : vela_silu_mul(g, u);
    }
}

static unsigned int moe_grid(int64_t total) {
    const int64_t blocks = (total + MOE_COMBINE_THREADS - 1) / MOE_COMBINE_THREADS;
    return (unsigned int)(blocks > 65535 ? 65535 : blocks); // grid-stride beyond
}

extern "C" int cuda_moe_glu(float *h, const float *gate, const float *up, const float *gate_b,
                            const float *up_b, const int32_t *ids, int n_pairs, int n_expert,
                            int64_t n_ff, int act, float alpha, float limit, cudaStream_t stream,
                            struct verr *err) {
    if (n_pairs < 0 || n_expert < 1 || n_ff < 0 ||
        (act != CUDA_MOE_SWIGLU && act != CUDA_MOE_SWIGLU_OAI))
        return verr_set(err, VERR_RANGE,
                        "moe glu: %d pairs, %d experts, rows of %lld, act %d (swiglu 0 or "
                        "swiglu_oai 1)",
                        n_pairs, n_expert, (long long)n_ff, act);
    const int64_t total = (int64_t)n_pairs * n_ff;
    if (total == 0)
        return VERR_OK;
    if (!h || !gate || !up || !ids)
        return verr_set(err, VERR_RANGE, "moe glu: NULL pointer");
    moe_glu_kernel<<<moe_grid(total), MOE_COMBINE_THREADS, 0, stream>>>(
        h, gate, up, gate_b, up_b, ids, n_pairs, n_expert, n_ff, act, alpha, limit);
    VELA_CHECK_LAUNCH(err, "moe_glu_kernel");
    return VERR_OK;
}

// ---------------------------------------------------------------------------
// weighted sum over the slots

__global__ static void moe_combine_kernel(float *__restrict__ out /* [n_tok][n] */,
                                          const float *__restrict__ y /* [n_tok][k][n] */,
                                          const float *__restrict__ weights /* [n_tok][k] */,
                                          const float *__restrict__ bias /* [n_expert][n] */,
                                          const int32_t *__restrict__ ids /* [n_tok][k] */,
                                          int n_tok, int k, int64_t n, int n_expert) {
    const int64_t total = (int64_t)n_tok * n;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / n, o = i % n;
        const float *yt = y + (size_t)t * k * n + o;
        const float *wt = weights + (size_t)t * k;
        float acc = 0.0f;
        for (int j = 0; j < k; j++) {
            float v = yt[(size_t)j * n];
            if (bias)
                v = __fadd_rn(v, bias[(size_t)moe_expert_of(ids, t * k + j, n_expert) * n + o]);
            v = __fmul_rn(v, wt[j]);
            acc = j == 0 ? v : __fadd_rn(acc, v);
        }
        out[i] = acc;
    }
}

extern "C" int cuda_moe_combine(float *out, const float *y, const float *weights, const float *bias,
                                const int32_t *ids, int n_tok, int k, int64_t n, int n_expert,
                                cudaStream_t stream, struct verr *err) {
    if (n_tok < 0 || k < 1 || n < 0 || (bias && (!ids || n_expert < 1)))
        return verr_set(err, VERR_RANGE,
                        "moe combine: %d tokens, k %d, rows of %lld, bias %p with ids %p of %d "
                        "experts",
                        n_tok, k, (long long)n, (const void *)bias, (const void *)ids, n_expert);
    const int64_t total = (int64_t)n_tok * n;
    if (total == 0)
        return VERR_OK;
    moe_combine_kernel<<<moe_grid(total), MOE_COMBINE_THREADS, 0, stream>>>(
        out, y, weights, bias, ids, n_tok, k, n, n_expert);
    VELA_CHECK_LAUNCH(err, "moe_combine_kernel");
    return VERR_OK;
}
