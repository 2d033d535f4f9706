// Flash attention over the KV cache with online softmax: the n_tok x n_kv
// score matrix never exists in global memory.
//
// Work decomposition. For KV head g the query rows are r = t * n_group + j
// (token t, query head h = g * n_group + j), so the heads sharing a KV head
// (GQA) read each K/V tile once and K/V are never copied per query head.
// A block takes ATTN_ROWS consecutive rows of one KV head and walks the KV
// cells in tiles of ATTN_BK = 32: the tile's K and V go to shared memory as
// f32 (converted from the cache type), then each warp serves its rows:
//   scores: lane l computes row . K[cell c0 + l] (K rows padded to D + 1
//           floats so that the 32 lanes hit 32 different banks);
//   softmax: the running max m and sum l of the row are updated with the
//           tile's max (a warp reduction), old accumulators rescaled by
//           exp(m_old - m_new);
//   P.V: lane l owns output dims l, l + 32, ... (head_dim_v <= 256: up to 8
//        accumulators), p_j broadcast with a shuffle.
// Mask: row t sees cell c iff 0 <= cell_pos[c] <= q_pos[t] and bit q_seq[t]
// of cell_seq[c] is set, and with a sliding window (window > 0) also
// q_pos[t] - cell_pos[c] < window. A tile that no row of the block can see (every
// cell empty or later than the block's largest q_pos) is skipped before K/V
// are loaded: in causal prefill that is about half the tiles.
// Decode (1..CUDA_ATTN_DEC_MAX_TOK tokens, F16/F16 or F32/F32 caches at
// head dims 64/128/256, caches of any other type at 64/128, no RoPE inside)
// runs attn_dec_kernel instead, unless the call asks for
// CUDA_ATTN_DECODE_SPLITK: cuda/attention_decode.cu. What follows is
// attn_kernel's path: every other call, self-extend included.
// Cache types (cuda/kv_quant.cuh): F16 and F32 have their own instances; a
// call with bf16 or a quantized K or V runs the "any cache" instance
// (kvq_any: the types read at run time), which decodes each tile's runs of 8
// values to float as it loads them (head dims multiples of 8). The decoded
// values are the CPU's bit for bit, and everything after the load is the
// same code, so such a call computes what an F32 cache of the decoded rows
// would; RoPE inside (the unrotated cache, exact self-extend) rotates the
// decoded K tile.
// Split-K (decode, long context): when (row blocks x KV heads) cannot fill
// the GPU, blockIdx.z splits the cells into n_split ranges; each writes its
// unnormalized accumulators with (m, l) to scratch and attn_combine_kernel
// merges them. A row with no visible cell gets zeros (l == 0).
// Sinks (cuda_attention_apply's sinks): calls with them run the kernels'
// SINK instances, which join a row's sink to its softmax once, where they
// normalize the row (unsplit: at the end of the kernel; split: in the
// combine), cuda/attention_sink.cuh; every other instance has no sink code.
// No instance takes sinks with RoPE inside (rope_on): refused.
// The plan (chunk) is a function of round_up(n_kv, CUDA_ATTN_PLAN_CELLS), not
// of n_kv: two calls whose n_kv round to the same value and whose extra cells
// are empty walk the same tiles in the same order (extra splits find nothing
// visible, m = -inf, and the combine skips them; a single split's acc / l
// equals the combine of it with empty ones), so their outputs are
// bit-identical. A decode step recorded in a CUDA graph with n_kv rounded up
// (host/forward/forward.c) relies on this.
// Prefill (n_tok >= ATTN_TC_MIN_TOK, F16 K/V or any cache with a type
// other than f16 / f32, head dims multiples of 16) runs attn_tc_kernel on
// tensor cores instead: see its comment below. It
// walks all tiles in one block per row tile (no split), so the rounding
// argument above holds for it too (extra empty cells are skipped tiles or
// zero weights).
// With rope_on (K cached unrotated; exact self-extend, host/ops/selfextend.h)
// both kernels rotate q and each K tile in shared memory as they load them:
// cuda/attention_se.cuh. With G and W per token (q_se) a block rotates its K
// tile once per distinct G > 1 of its rows (same bits per row as a call with
// that row's G and W for all; the plan does not depend on them).
#include <atomic>
#include <limits.h>
#include <mma.h>

#include "cuda/attention.h"
#include "cuda/attention_decode.h"
#include "cuda/attention_sink.cuh"
#include "cuda/kv_quant.cuh"
#include "cuda/q8_1.cuh"

#define ATTN_WARPS 4
#define ATTN_ROWS_PER_WARP 4
#define ATTN_ROWS (ATTN_WARPS * ATTN_ROWS_PER_WARP)
#define ATTN_BK 32
#define ATTN_DV_LANE (CUDA_ATTN_MAX_HEAD_DIM / VELA_WARP)
#define ATTN_THREADS (ATTN_WARPS * VELA_WARP)
// Split-K: only from this many cells (rounded up as the plan sees them) on,
// at most this many splits; the blocks aimed at and the cells per split are
// cuda_attn's split_blocks_per_sm and split_min_cells.
#define ATTN_SPLIT_FROM_CELLS (2 * CUDA_ATTN_PLAN_CELLS)
#define ATTN_MAX_SPLIT 64
#define ATTN_COMBINE_THREADS 128
// Bytes kept free under the 48 KiB default for attn_kernel's static shared memory.
#define ATTN_STATIC_SMEM_SLACK 1024

static __device__ __forceinline__ float attn_load(const float *p) {
    return *p;
}
static __device__ __forceinline__ float attn_load(const __half *p) {
    return __half2float(*p);
}
static __device__ __forceinline__ float attn_load(kvq_ptr p) {
    return kvq_get1(p);
}

// The K or V cache of a call as the kernels address it: a T pointer, or for
// the any-cache instances (T = kvq_any) a kvq_ptr of the call's type.
template <typename T> struct attn_cache {
    static __device__ __forceinline__ const T *of(const void *p, enum ggml_type) {
        return (const T *)p;
    }
};
template <> struct attn_cache<kvq_any> {
    static __device__ __forceinline__ kvq_ptr of(const void *p, enum ggml_type t) {
        return kvq_ptr{(const uint8_t *)p, (int)t, 0};
    }
};

#include "cuda/attention_se.cuh" // SE: RoPE inside attn_kernel (the unrotated cache)

#include "cuda/attention_widen.cuh"

// The KV tile of cells [c0, c0 + ATTN_BK) of KV head g (cells at or past
// c_end as zeros) into shared memory as float: dst[j * ld + d]. VEC: rows are
// 16-byte aligned (D a multiple of 16 / sizeof(T), cache 16-byte aligned),
// so each thread moves 16 bytes per load and keeps four loads in flight;
// otherwise one element at a time. A cache of any type (kvq_ptr, D a
// multiple of 8): runs of 8 decoded.
template <bool VEC, typename P>
static __device__ __forceinline__ void attn_load_tile(float *dst, int ld, P cache, int c0,
                                                      int c_end, int g, int n_head_kv, int D) {
    if constexpr (std::is_same<P, kvq_ptr>::value) {
#pragma unroll 2
        for (int e = threadIdx.x; e < ATTN_BK * (D / 8); e += ATTN_THREADS) {
            const int j = e / (D / 8), d = (e % (D / 8)) * 8;
            const int c = c0 + j;
            float f[8];
            if (c < c_end) {
                kvq_dequant8(cache.type, cache.base, ((size_t)c * n_head_kv + g) * D + d, f);
            } else {
#pragma unroll
                for (int v = 0; v < 8; v++)
                    f[v] = 0.0f;
            }
#pragma unroll
            for (int v = 0; v < 8; v++)
                dst[j * ld + d + v] = f[v];
        }
    } else if constexpr (VEC) {
        using T = typename std::remove_cv<typename std::remove_pointer<P>::type>::type;
        constexpr int V = 16 / sizeof(T);
        const int per_row = D / V;
#pragma unroll 4
        for (int e = threadIdx.x; e < ATTN_BK * per_row; e += ATTN_THREADS) {
            const int j = e / per_row, d = (e % per_row) * V;
            const int c = c0 + j;
            float f[V];
            if (c < c_end) {
                const uint4 u = *(const uint4 *)(cache + ((size_t)c * n_head_kv + g) * D + d);
                attn_widen(u, cache, f);
            } else {
#pragma unroll
                for (int v = 0; v < V; v++)
                    f[v] = 0.0f;
            }
#pragma unroll
            for (int v = 0; v < V; v++)
                dst[j * ld + d + v] = f[v];
        }
    } else {
        for (int e = threadIdx.x; e < ATTN_BK * D; e += ATTN_THREADS) {
            const int j = e / D, d = e % D;
            const int c = c0 + j;
            dst[j * ld + d] =
                c < c_end ? attn_load(cache + ((size_t)c * n_head_kv + g) * D + d) : 0.0f;
        }
    }
}

// q row . K row over D floats, two interleaved fma chains (every score of
// attn_kernel is computed by this one function: the same bits in any pass).
static __device__ __forceinline__ float attn_dot(const float *qr, const float *kr, int D) {
    float s0 = 0.0f, s1 = 0.0f;
    int d = 0;
    for (; d + 1 < D; d += 2) {
        s0 = fmaf(qr[d], kr[d], s0);
        s1 = fmaf(qr[d + 1], kr[d + 1], s1);
    }
    if (d < D)
        s0 = fmaf(qr[d], kr[d], s0);
    return s0 + s1;
}

// SE with several distinct G > 1 in the block (G per token): passes 1 ..
// n_se - 1 of a tile whose K / far K (of list[0]) scores are done. Pass p
// rotates the tile's far K for list[p] from the cache into sKf, when a row
// of that G has a far key in the tile (bit k of `later`: row slot k's key of
// this lane is visible, far, and of a later pass), and gives those rows
// their far scores s[k]. Block-uniform; 0 iterations in the uniform case.
// Costs per further G and tile: 2 barriers, the K tile read again (L2),
// ATTN_BK * n_rot/2 cos/sin pairs; the dot products are those the rows
// skipped in pass 0, so none are added.
template <typename P>
static __device__ void
attn_se_later_passes(const struct cuda_attn &a, float (&s)[ATTN_ROWS_PER_WARP], unsigned later,
                     const int (&qpass)[ATTN_ROWS_PER_WARP], int n_se, const int *list,
                     const float *sQf, float *sKf, P kcache, int c0, int c_end, const int *sPos) {
    const int D = a.head_dim, warp = threadIdx.x / VELA_WARP, lane = threadIdx.x % VELA_WARP;
    for (int p = 1; p < n_se; p++) {
        bool need = false;
#pragma unroll
        for (int k = 0; k < ATTN_ROWS_PER_WARP; k++)
            need = need || (((later >> k) & 1u) && qpass[k] == p);
        if (!__syncthreads_or(need)) // also: the last pass's sKf is consumed
            continue;                // block-uniform
        attn_se_far_k(a.rope, a.n_head_kv, D, sKf, D + 1, kcache, c0, c_end, (int)blockIdx.y, sPos,
                      list[p]);
        __syncthreads();
#pragma unroll
        for (int k = 0; k < ATTN_ROWS_PER_WARP; k++)
            if (((later >> k) & 1u) && qpass[k] == p)
                s[k] = attn_dot(sQf + (warp + k * ATTN_WARPS) * D, sKf + lane * (D + 1), D);
    }
}

// Occupancy (sm_90, ptxas -v; bench/README.md's emulated report): 111
// registers per thread, 25% theoretical occupancy, under the 50% the decode
// path aims for. Why it stays: each lane keeps 32 float accumulators of its
// output rows, and K/V tiles are widened to float in shared memory; a decode
// block spends its time streaming K/V, with each thread's 16-byte loads of a
// tile independent of each other, so fewer resident warps still keep many
// loads in flight (the split-K grid adds blocks as the KV range grows). The
// bytes moved are within 1.03x of K/V read once at 4k and 32k keys. Ways to
// raise it if a GPU run shows latency-bound decode attention: one row per
// warp, a register cap, half-precision tiles.
// SE (RoPE inside): 4 blocks per SM asked for, i.e. at most 128 registers:
// without it ptxas gave the F16/F16 VEC instance 96 registers and 88 bytes
// of spills once G per token was added (122..128 registers, no spills with
// it; CUDA 13.0, sm_90). The other instances are as without SE.
// SINK: the call's sinks ([n_head]; unread without SINK) joined per row.
template <typename KT, typename VT, bool VEC, bool SE, bool SINK>
__global__ static void __launch_bounds__(ATTN_THREADS, SE ? 4 : 0)
    attn_kernel(const struct cuda_attn a, int chunk, int n_split,
                float *__restrict__ part_acc /* [n_tok*n_head][n_split][head_dim_v] */,
                float *__restrict__ part_ml /* [n_tok*n_head][n_split][2] */,
                const float *__restrict__ sinks) {
    extern __shared__ float smem[];
    const int D = a.head_dim, DV = a.head_dim_v;
    float *sQ = smem;                       // [ATTN_ROWS][D], pre-scaled
    float *sK = sQ + ATTN_ROWS * D;         // [ATTN_BK][D + 1]
    float *sV = sK + ATTN_BK * (D + 1);     // [ATTN_BK][DV]
    int *sPos = (int *)(sV + ATTN_BK * DV); // [ATTN_BK]
    float *sQf = (float *)(sPos + ATTN_BK); // SE: [ATTN_ROWS][D] the far queries, pre-scaled
    float *sKf = sQf + ATTN_ROWS * D;       // SE: [ATTN_BK][D + 1] the far keys
    __shared__ int s_max_qpos, s_min_qpos;
    __shared__ int s_se_g[ATTN_ROWS], s_se_n; // SE: the rows' distinct G > 1 (attn_se_list_build)

    const auto kcache = attn_cache<KT>::of(a.k, a.type_k);
    const auto vcache = attn_cache<VT>::of(a.v, a.type_v);
    const int tid = threadIdx.x, warp = tid / VELA_WARP, lane = tid % VELA_WARP;
    const int g = blockIdx.y;
    const int n_group = a.n_head / a.n_head_kv;
    const int64_t n_rows = (int64_t)a.n_tok * n_group;
    const int64_t row0 = (int64_t)blockIdx.x * ATTN_ROWS;
    const int split = blockIdx.z;
    const int c_begin = split * chunk;
    const int c_end = min(a.n_kv, c_begin + chunk);

    if (tid == 0) {
        s_max_qpos = INT_MIN;
        s_min_qpos = INT_MAX;
    }
    for (int e = tid; e < ATTN_ROWS * D; e += ATTN_THREADS) {
        const int r = e / D, d = e % D;
        const int64_t gr = row0 + r;
        float val = 0.0f;
        if (gr < n_rows) {
            const int64_t t = gr / n_group, h = (int64_t)g * n_group + gr % n_group;
            val = a.q[((size_t)t * a.n_head + h) * D + d] * (SE ? 1.0f : a.scale);
        }
        sQ[e] = val;
    }
    if (SE && warp == 0)
        attn_se_list_build(a, row0, ATTN_ROWS, n_group, n_rows, s_se_g, &s_se_n);
    __syncthreads();
    if (tid < ATTN_ROWS && row0 + tid < n_rows) {
        atomicMax(&s_max_qpos, a.q_pos[(row0 + tid) / n_group]);
        atomicMin(&s_min_qpos, a.q_pos[(row0 + tid) / n_group]);
    }
    if (SE) // read after the barrier that opens the first tile
        attn_se_rotate_q(a, sQ, sQf, row0, n_group, n_rows);

    // Per-row state; row slot k of this warp is local row warp + k * ATTN_WARPS.
    float m[ATTN_ROWS_PER_WARP], l[ATTN_ROWS_PER_WARP];
    float acc[ATTN_ROWS_PER_WARP][ATTN_DV_LANE];
    int qpos[ATTN_ROWS_PER_WARP], qseq[ATTN_ROWS_PER_WARP];
    // SE: the row's keys at cell positions <= qfar are far (its G > 1 and
    // !se_is_near with its W); qpass: the pass of its G (-1: G 1).
    int qfar[ATTN_ROWS_PER_WARP], qpass[ATTN_ROWS_PER_WARP];
    const int n_se = SE ? s_se_n : 0;
#pragma unroll
    for (int k = 0; k < ATTN_ROWS_PER_WARP; k++) {
        const int64_t gr = row0 + warp + k * ATTN_WARPS;
        const bool valid = gr < n_rows;
        qpos[k] = valid ? a.q_pos[gr / n_group] : -1; // -1: the row sees nothing
        qseq[k] = valid ? a.q_seq[gr / n_group] : -1;
        if (qseq[k] < 0 || (qseq[k] >> 6) >= a.seq_words)
            qpos[k] = -1; // a sequence id outside the bitset sees nothing
        int G = 1, W = 1;
        if (SE && valid)
            attn_se_gw(a, gr / n_group, &G, &W);
        qfar[k] = G > 1 ? qpos[k] - W : -1;
        qpass[k] = SE ? attn_se_pass(s_se_g, n_se, G) : -1;
        m[k] = -INFINITY;
        l[k] = 0.0f;
#pragma unroll
        for (int i = 0; i < ATTN_DV_LANE; i++)
            acc[k][i] = 0.0f;
    }

    for (int c0 = c_begin; c0 < c_end; c0 += ATTN_BK) {
        __syncthreads(); // the previous tile is consumed; s_max_qpos is final
        int p = -1;
        if (tid < ATTN_BK && c0 + tid < c_end)
            p = a.cell_pos[c0 + tid];
        if (tid < ATTN_BK)
            sPos[tid] = p;
        // A window hides cells every row of the block has left behind.
        if (!__syncthreads_or(p >= 0 && p <= s_max_qpos &&
                              (a.window <= 0 || s_min_qpos - p < a.window)))
            continue; // block-uniform
        attn_load_tile<VEC>(sK, D + 1, kcache, c0, c_end, g, a.n_head_kv, D);
        attn_load_tile<VEC>(sV, DV, vcache, c0, c_end, g, a.n_head_kv, DV);
        __syncthreads();
        if (SE) { // the near K and the far K of the block's first G
            attn_se_rotate_k(a, sK, n_se > 0 ? sKf : nullptr, D + 1, sPos,
                             n_se > 0 ? s_se_g[0] : 1);
            __syncthreads();
        }

        const int c = c0 + lane;
        const int cpos = sPos[lane];
        float s[ATTN_ROWS_PER_WARP];
        unsigned vis_bits = 0, later = 0; // bit k: row slot k sees the key / scores it later
#pragma unroll
        for (int k = 0; k < ATTN_ROWS_PER_WARP; k++) {
            s[k] = -INFINITY;
            if (qpos[k] < 0)
                continue; // warp-uniform: the row belongs to the whole warp
            bool vis = cpos >= 0 && cpos <= qpos[k] && (a.window <= 0 || qpos[k] - cpos < a.window);
            if (vis) {
                const uint64_t word = a.cell_seq[(size_t)c * a.seq_words + (qseq[k] >> 6)];
                vis = (word >> (qseq[k] & 63)) & 1u;
            }
            if (!vis)
                continue;
            vis_bits |= 1u << k;
            // SE: a far key scores the far query against the far key (of the
            // row's G: the one in sKf now, or a later pass's)
            const bool far = SE && cpos <= qfar[k];
            if (far && qpass[k] > 0)
                later |= 1u << k;
            else
                s[k] = attn_dot((far ? sQf : sQ) + (warp + k * ATTN_WARPS) * D,
                                (far ? sKf : sK) + lane * (D + 1), D);
        }
        if (SE)
            attn_se_later_passes(a, s, later, qpass, n_se, s_se_g, sQf, sKf, kcache, c0, c_end,
                                 sPos);

#pragma unroll
        for (int k = 0; k < ATTN_ROWS_PER_WARP; k++) {
            if (qpos[k] < 0)
                continue; // warp-uniform
            const float tile_max = warp_max(s[k]);
            if (tile_max == -INFINITY)
                continue; // warp-uniform: nothing visible in this tile
            const float m_new = fmaxf(m[k], tile_max);
            const float alpha = expf(m[k] - m_new); // 0 while m[k] is -inf
            const float pj = (vis_bits >> k) & 1u ? expf(s[k] - m_new) : 0.0f;
            l[k] = l[k] * alpha + warp_sum(pj);
#pragma unroll
            for (int i = 0; i < ATTN_DV_LANE; i++)
                acc[k][i] *= alpha;
            for (int jj = 0; jj < ATTN_BK; jj++) {
                const float pv = __shfl_sync(VELA_FULL_MASK, pj, jj);
                if (pv == 0.0f)
                    continue; // warp-uniform (broadcast value)
                const float *vr = sV + jj * DV;
#pragma unroll
                for (int i = 0; i < ATTN_DV_LANE; i++) {
                    const int d = lane + VELA_WARP * i;
                    if (d < DV)
                        acc[k][i] = fmaf(pv, vr[d], acc[k][i]);
                }
            }
            m[k] = m_new;
        }
    }

#pragma unroll
    for (int k = 0; k < ATTN_ROWS_PER_WARP; k++) {
        const int64_t gr = row0 + warp + k * ATTN_WARPS;
        if (gr >= n_rows)
            continue;
        const int64_t t = gr / n_group, h = (int64_t)g * n_group + gr % n_group;
        const size_t th = (size_t)t * a.n_head + h;
        if (n_split == 1) {
            float inv = l[k] > 0.0f ? 1.0f / l[k] : 0.0f;
            if constexpr (SINK) {
                if (l[k] > 0.0f)
                    inv = attn_sink_inv<false>(m[k], l[k], sinks[h]);
            }
#pragma unroll
            for (int i = 0; i < ATTN_DV_LANE; i++) {
                const int d = lane + VELA_WARP * i;
                if (d < DV)
                    a.out[th * DV + d] = acc[k][i] * inv;
                // a.xq: DV % 32 == 0, so the warp's 32 lanes hold one whole
                // q8_1 block (elements 32 i .. 32 i + 31 of the head)
                if (a.xq && VELA_WARP * i < DV)
                    q8_1_store_warp((uint8_t *)a.xq + (th * DV / 32 + i) * Q8_1_BLOCK_BYTES,
                                    acc[k][i] * inv, lane);
            }
        } else {
            const size_t ps = th * n_split + split;
#pragma unroll
            for (int i = 0; i < ATTN_DV_LANE; i++) {
                const int d = lane + VELA_WARP * i;
                if (d < DV)
                    part_acc[ps * DV + d] = acc[k][i];
            }
            if (lane == 0) {
                part_ml[ps * 2] = m[k];
                part_ml[ps * 2 + 1] = l[k];
            }
        }
    }
}

// One block per (token, head): merges the n_split partial results; SINK:
// then joins the head's sink (sinks: [n_head]; unread without SINK).
// xq (or NULL, DV % 32 == 0): the output also as q8_1 blocks, as attn_kernel.
template <bool SINK>
__global__ static void __launch_bounds__(ATTN_COMBINE_THREADS)
    attn_combine_kernel(float *__restrict__ out /* [n_tok*n_head][DV] */,
                        const float *__restrict__ part_acc, const float *__restrict__ part_ml,
                        int n_split, int DV, uint8_t *__restrict__ xq,
                        const float *__restrict__ sinks, int n_head) {
    const size_t th = blockIdx.x;
    const float *ml = part_ml + th * n_split * 2;
    float mx = -INFINITY;
    for (int s = 0; s < n_split; s++)
        mx = fmaxf(mx, ml[2 * s]);
    float sum = 0.0f;
    if (mx != -INFINITY)
        for (int s = 0; s < n_split; s++)
            if (ml[2 * s] != -INFINITY)
                sum += ml[2 * s + 1] * expf(ml[2 * s] - mx);
    float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    if constexpr (SINK) {
        if (sum > 0.0f)
            inv = attn_sink_inv<false>(mx, sum, sinks[th % n_head]);
    }
    for (int d = threadIdx.x; d < DV; d += ATTN_COMBINE_THREADS) {
        float o = 0.0f;
        if (sum > 0.0f)
            for (int s = 0; s < n_split; s++)
                if (ml[2 * s] != -INFINITY)
                    o += part_acc[(th * n_split + s) * DV + d] * expf(ml[2 * s] - mx);
        out[th * DV + d] = o * inv;
        if (xq) // whole warps: DV % 32 == 0 and ATTN_COMBINE_THREADS % 32 == 0
            q8_1_store_warp(xq + (th * DV + d) / 32 * Q8_1_BLOCK_BYTES, o * inv,
                            threadIdx.x % VELA_WARP);
    }
}

// --- Prefill on tensor cores (WMMA m16n16k16, f16 in, f32 accumulate) ------------
// For n_tok >= ATTN_TC_MIN_TOK with F16 K and V (or caches of types other
// than f16 / f32: their tiles are decoded and rounded to f16 in shared
// memory, attn_tc_load_tile) and head dims that are multiples of 16. A block
// of ATTN_TC_WARPS warps takes ATTN_TC_ROWS = 64 consecutive rows of one KV
// head (rows r = t * n_group + j as above, so a GQA group shares each K/V
// tile); warp w owns local rows 16w..16w+15.
// Per KV tile of BK cells (shared memory, f16 as in the cache):
//   S  = Q_w K^T  (Q: row-major A, K tile: column-major B), f32 -> sS;
//   softmax: lanes 2i, 2i+1 own row i of the warp's 16 (BK/2 columns each):
//            mask exactly as attn_kernel, running max m / sum l in f32,
//            P = exp(S - m) rounded to f16 -> sP, l sums the rounded P (the
//            weights P.V really uses), the row's O is rescaled in place;
//   O += P V      (P: row-major A, V tile: row-major B) with O kept in f32
//            in shared memory (sO), loaded into / stored from accumulator
//            fragments: the online-softmax rescale is per row, which the
//            unspecified fragment layout cannot express.
// The n_tok x n_kv scores exist only as one BK-column tile in shared memory.
// Tiles no row of the block can see are skipped before K/V are loaded, empty
// cells and cells past n_kv are zero in the K/V tiles (P is 0 there, and
// 0 * garbage could be NaN). Rows that see nothing get zeros (l == 0).
// Precision: q * scale and P are rounded to f16 (relative 2^-11 each), K/V
// are f16 already; dot products and sums are f32. Against an f32 reference
// that is about 1e-3 of max|V| (tests/gpu/test_cuda_ops.c states the bound).
// Unsplit (n_split 1): prefill has enough row blocks to fill the GPU.
// BK = 64 when both head dims <= 96, else 32, keeping shared memory
// (f16 Q/K/V tiles, f32 S and O, padded rows) within 99 KiB for head dims
// <= 128 (sm_86/89 opt-in limit); head dim 256 needs 145 KiB (sm_80/90) and
// falls back to attn_kernel on GPUs with less.
#define ATTN_TC_WARPS 4
#define ATTN_TC_ROWS (ATTN_TC_WARPS * 16)
#define ATTN_TC_THREADS (ATTN_TC_WARPS * VELA_WARP)
#define ATTN_TC_MIN_TOK 16
// Row padding (elements) against bank conflicts; keeps ldm a multiple of 8
// halves / 4 floats and every 16-row fragment pointer 32-byte aligned.
#define ATTN_TC_PAD_H 8
#define ATTN_TC_PAD_F 4

struct attn_tc_layout {
    int ldq, ldk, ldv, lds, ldp, ldo;          // leading dims (elements)
    size_t q, k, v, s, p, o, pos, maxq, bytes; // byte offsets
    size_t qf, kf, sf; // SE: far queries [64][ldq], keys [BK][ldk] (f16), scores [64][lds]
    size_t se;         // SE: int [1 + 64]: n distinct G > 1, then the G (attn_se_list_build)
};

static __host__ __device__ __forceinline__ size_t attn_tc_align(size_t x) {
    return (x + 127) & ~(size_t)127;
}

static __host__ __device__ __forceinline__ struct attn_tc_layout
attn_tc_make_layout(int D, int DV, int BK, bool se) {
    struct attn_tc_layout L;
    L.ldq = D + ATTN_TC_PAD_H;
    L.ldk = D + ATTN_TC_PAD_H;
    L.ldv = DV + ATTN_TC_PAD_H;
    L.lds = BK + ATTN_TC_PAD_F;
    L.ldp = BK + ATTN_TC_PAD_H;
    L.ldo = DV + ATTN_TC_PAD_F;
    size_t off = 0;
    // clang-format off
    L.q = off;    off = attn_tc_align(off + sizeof(__half) * ATTN_TC_ROWS * L.ldq); // [64][ldq]
    L.k = off;    off = attn_tc_align(off + sizeof(__half) * BK * L.ldk);          // [BK][ldk]
    L.v = off;    off = attn_tc_align(off + sizeof(__half) * BK * L.ldv);          // [BK][ldv]
    L.s = off;    off = attn_tc_align(off + sizeof(float) * ATTN_TC_ROWS * L.lds); // [64][lds]
    L.p = off;    off = attn_tc_align(off + sizeof(__half) * ATTN_TC_ROWS * L.ldp); // [64][ldp]
    L.o = off;    off = attn_tc_align(off + sizeof(float) * ATTN_TC_ROWS * L.ldo); // [64][ldo]
    L.pos = off;  off += sizeof(int) * BK;                                         // [BK]
    L.maxq = off; off += sizeof(int);
    // clang-format on
    L.qf = L.kf = L.sf = L.se = 0;
    if (se) {
        L.qf = off = attn_tc_align(off);
        L.kf = off = attn_tc_align(off + sizeof(__half) * ATTN_TC_ROWS * L.ldq);
        L.sf = off = attn_tc_align(off + sizeof(__half) * BK * L.ldk);
        L.se = off = off + sizeof(float) * ATTN_TC_ROWS * L.lds;
        off += sizeof(int) * (1 + ATTN_TC_ROWS);
    }
    L.bytes = off;
    return L;
}

// attn_tc_kernel's K or V tile: the bk cells from c0 of KV head g (of
// n_head_kv, D dims) into dst [bk][ld] as f16, empty cells (sPos < 0) as
// zeros. An f16 cache is copied 16 bytes at a time; a cache of another
// type (kv_quant.cuh) is decoded 8 values at a time and rounded to f16 (the
// tile's precision; the branch is uniform). D is a multiple of 16 and the
// launcher checked an f16 cache's alignment.
static __device__ __forceinline__ void attn_tc_load_tile(__half *dst, int ld, const void *cache,
                                                         enum ggml_type t, int c0, int g,
                                                         int n_head_kv, int D, const int *sPos,
                                                         int bk) {
    for (int e = threadIdx.x; e < bk * (D / 8); e += ATTN_TC_THREADS) {
        const int j = e / (D / 8), d = (e % (D / 8)) * 8;
        const size_t off = ((size_t)(c0 + j) * n_head_kv + g) * D + d;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (t == GGML_TYPE_F16) {
            if (sPos[j] >= 0)
                val = *(const uint4 *)((const __half *)cache + off);
        } else if (sPos[j] >= 0) {
            float f[8];
            kvq_dequant8(t, (const uint8_t *)cache, off, f);
            uint32_t w[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const __half2 h = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
                w[i] = *(const uint32_t *)&h;
            }
            val = make_uint4(w[0], w[1], w[2], w[3]);
        }
        *(uint4 *)(dst + j * ld + d) = val;
    }
}

// attn_tc_kernel: S = Q_w K^T for warp w's 16 rows of qs [64][ldq] and the
// BK keys of ks [BK][ldk] (f16), into ss [64][lds] (f32).
template <int BK>
static __device__ __forceinline__ void attn_tc_scores(const __half *qs, const __half *ks, float *ss,
                                                      const struct attn_tc_layout &L, int D,
                                                      int warp) {
    using namespace nvcuda;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> s_acc[BK / 16];
#pragma unroll
    for (int j = 0; j < BK / 16; j++)
        wmma::fill_fragment(s_acc[j], 0.0f);
    for (int kk = 0; kk < D; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fq;
        wmma::load_matrix_sync(fq, qs + warp * 16 * L.ldq + kk, L.ldq);
#pragma unroll
        for (int j = 0; j < BK / 16; j++) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fk;
            wmma::load_matrix_sync(fk, ks + j * 16 * L.ldk + kk, L.ldk);
            wmma::mma_sync(s_acc[j], fq, fk, s_acc[j]);
        }
    }
#pragma unroll
    for (int j = 0; j < BK / 16; j++)
        wmma::store_matrix_sync(ss + warp * 16 * L.lds + j * 16, s_acc[j], L.lds,
                                wmma::mem_row_major);
}

// attn_tc_kernel, SE with several distinct G > 1 in the block (G per
// token): passes 1 .. n_se - 1 of a tile whose near scores (sS) and far
// scores of list[0] (sSf) are done. This lane owns columns j0 .. j0 + BK/2
// of row lr (its pass rpass, far keys at cell positions <= qfar). Pass p
// first moves the far scores of the previous pass's rows into sS (far
// columns), then, when a row of list[p] has a far key in the tile, rotates
// the far K of list[p] from the cache into sKf and computes Qf K^T into sSf
// (warps without such rows skip the product). The last pass's rows take
// their far scores from sSf in the softmax, as in the uniform case (no
// further pass). Block-uniform. Costs per further G and tile: 2 barriers,
// the K tile read again (L2), BK * n_rot/2 cos/sin pairs, one more Q K^T
// product for each warp with rows of that G.
template <int BK>
static __device__ void
attn_tc_se_later_passes(const struct cuda_attn &a, const struct attn_tc_layout &L, int n_se,
                        const int *list, int rpass, int qfar, int lr, int j0, int c0,
                        const int *sPos, const __half *sQf, __half *sKf, float *sS, float *sSf) {
    const int warp = threadIdx.x / VELA_WARP;
    float *sRow = sS + lr * L.lds;
    const float *sRowF = sSf + lr * L.lds;
    for (int p = 1; p < n_se; p++) {
        bool need = false;
        for (int j = j0; j < j0 + BK / 2; j++) {
            const bool far = sPos[j] >= 0 && sPos[j] <= qfar;
            if (far && rpass == p - 1)
                sRow[j] = sRowF[j];
            need = need || (far && rpass == p);
        }
        if (!__syncthreads_or(need)) // also: sKf and sSf of the last pass are consumed
            continue;                // block-uniform
        attn_se_tc_far_k(a.rope, a.n_head_kv, a.head_dim, sKf, L.ldk,
                         kvq_ptr{(const uint8_t *)a.k, (int)a.type_k, 0}, c0, (int)blockIdx.y, sPos,
                         BK, ATTN_TC_THREADS, list[p]);
        __syncthreads();
        if (__any_sync(VELA_FULL_MASK, rpass == p))
            attn_tc_scores<BK>(sQf, sKf, sSf, L, a.head_dim, warp);
        __syncwarp();
    }
}

// __launch_bounds__: for the exact self-extend variant with BK 32 (head dims
// over 96), 4 blocks a multiprocessor (at most 128 registers): left to
// itself, ptxas kept it at 96 and spilled 52 bytes a thread (sm_90, after
// attn_se_walk); with the bound it takes 116 and spills none. BK 64 takes
// 128 without spilling as it is, and spills 12 bytes under the bound.
// sinks: none, or the call's sinks ([n_head], const float *) joined per row.
// A pack so that the instances without sinks take `a` alone: a second
// parameter moves the RoPE-inside instances' machine code (nvcc, sm_90).
template <int BK, bool SE, typename... Sinks>
__global__ static void __launch_bounds__(ATTN_TC_THREADS, (SE && BK == 32) ? 4 : 0)
    attn_tc_kernel(const struct cuda_attn a, Sinks... sinks) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 700
    using namespace nvcuda;
    extern __shared__ __align__(128) unsigned char attn_tc_smem[];
    const int D = a.head_dim, DV = a.head_dim_v;
    const struct attn_tc_layout L = attn_tc_make_layout(D, DV, BK, SE);
    __half *sQ = (__half *)(attn_tc_smem + L.q); // [64][ldq], q * scale
    __half *sK = (__half *)(attn_tc_smem + L.k); // [BK][ldk]
    __half *sV = (__half *)(attn_tc_smem + L.v); // [BK][ldv]
    float *sS = (float *)(attn_tc_smem + L.s);   // [64][lds]
    __half *sP = (__half *)(attn_tc_smem + L.p); // [64][ldp]
    float *sO = (float *)(attn_tc_smem + L.o);   // [64][ldo], unnormalized
    int *sPos = (int *)(attn_tc_smem + L.pos);   // [BK]
    int *sMaxQ = (int *)(attn_tc_smem + L.maxq);
    __half *sQf = (__half *)(attn_tc_smem + L.qf); // SE
    __half *sKf = (__half *)(attn_tc_smem + L.kf); // SE
    float *sSf = (float *)(attn_tc_smem + L.sf);   // SE
    int *sSe = (int *)(attn_tc_smem + L.se);       // SE: [0] n, [1..] the rows' distinct G > 1

    const int tid = threadIdx.x, warp = tid / VELA_WARP, lane = tid % VELA_WARP;
    const int g = blockIdx.y;
    const int n_group = a.n_head / a.n_head_kv;
    const int64_t n_rows = (int64_t)a.n_tok * n_group;
    const int64_t row0 = (int64_t)blockIdx.x * ATTN_TC_ROWS;

    if (tid == 0)
        *sMaxQ = INT_MIN;
    if (SE)
        attn_se_tc_q(a, sQ, sQf, L.ldq, g, row0, n_group, n_rows, ATTN_TC_ROWS, ATTN_TC_THREADS);
    if (SE && warp == 0)
        attn_se_list_build(a, row0, ATTN_TC_ROWS, n_group, n_rows, sSe + 1, sSe);
    for (int e = tid; !SE && e < ATTN_TC_ROWS * D; e += ATTN_TC_THREADS) {
        const int r = e / D, d = e % D;
        const int64_t gr = row0 + r;
        float val = 0.0f;
        if (gr < n_rows) {
            const int64_t t = gr / n_group, h = (int64_t)g * n_group + gr % n_group;
            val = a.q[((size_t)t * a.n_head + h) * D + d] * a.scale;
        }
        sQ[r * L.ldq + d] = __float2half_rn(val);
    }
    // This lane's row (local lr) and half of the columns.
    const int rr = lane >> 1, hf = lane & 1;
    const int lr = warp * 16 + rr;
    const int64_t gr = row0 + lr;
    int qpos = -1, qseq = -1; // qpos -1: the row sees nothing
    if (gr < n_rows) {
        qpos = a.q_pos[gr / n_group];
        qseq = a.q_seq[gr / n_group];
        if (qseq < 0 || (qseq >> 6) >= a.seq_words)
            qpos = -1;
    }
    float m = -INFINITY, l = 0.0f;
    float *oRow = sO + lr * L.ldo; // [DV]
    for (int d = hf; d < DV; d += 2)
        oRow[d] = 0.0f;
    __syncthreads(); // sMaxQ initialised, sSe written
    if (hf == 0 && gr < n_rows)
        atomicMax(sMaxQ, a.q_pos[gr / n_group]);
    // SE: the row's pass (-1: G 1) and far keys (cell positions <= qfar,
    // !se_is_near with its W); the rows of the last pass pick far scores in
    // the softmax.
    int n_se = 0, rpass = -1, qfar = -1;
    if (SE) {
        int G = 1, W = 1;
        if (gr < n_rows)
            attn_se_gw(a, gr / n_group, &G, &W);
        n_se = sSe[0];
        rpass = attn_se_pass(sSe + 1, n_se, G);
        qfar = G > 1 ? qpos - W : -1;
    }
    const bool pick_far = SE && rpass >= 0 && rpass == n_se - 1;

    for (int c0 = 0; c0 < a.n_kv; c0 += BK) {
        __syncthreads(); // the previous tile is consumed; sMaxQ is final
        int p = -1;
        if (tid < BK && c0 + tid < a.n_kv)
            p = a.cell_pos[c0 + tid];
        if (tid < BK)
            sPos[tid] = p;
        if (!__syncthreads_or(p >= 0 && p <= *sMaxQ))
            continue; // block-uniform
        attn_tc_load_tile(sK, L.ldk, a.k, a.type_k, c0, g, a.n_head_kv, D, sPos, BK);
        attn_tc_load_tile(sV, L.ldv, a.v, a.type_v, c0, g, a.n_head_kv, DV, sPos, BK);
        __syncthreads();
        if (SE) { // the near K and the far K of the block's first G
            attn_se_tc_k(a, sK, n_se > 0 ? sKf : nullptr, L.ldk, sPos, BK, ATTN_TC_THREADS,
                         n_se > 0 ? sSe[1] : 1);
            __syncthreads();
        }

        // S = Q_w K^T for the warp's 16 rows, BK columns (SE: also the far
        // scores Qf_w Kf^T into sSf when the warp has rows of the first G).
        attn_tc_scores<BK>(sQ, sK, sS, L, D, warp);
        if (SE && n_se > 0 && __any_sync(VELA_FULL_MASK, rpass == 0))
            attn_tc_scores<BK>(sQf, sKf, sSf, L, D, warp);
        __syncwarp();
        if (SE && n_se > 1)
            attn_tc_se_later_passes<BK>(a, L, n_se, sSe + 1, rpass, qfar, lr, hf * (BK / 2), c0,
                                        sPos, sQf, sKf, sS, sSf);

        // Online softmax of row lr over columns hf*BK/2 .. +BK/2.
        {
            float *sRow = sS + lr * L.lds; // SE: far scores of the last pass replace near below
            const float *sRowF = sSf + lr * L.lds;
            __half *pRow = sP + lr * L.ldp;
            const int j0 = hf * (BK / 2);
            float mx = -INFINITY;
            uint32_t vis_bits = 0; // bit j - j0: column j visible to the row (BK / 2 <= 32)
            for (int j = j0; j < j0 + BK / 2; j++) {
                const int cpos = sPos[j];
                bool vis = qpos >= 0 && cpos >= 0 && cpos <= qpos &&
                           (a.window <= 0 || qpos - cpos < a.window);
                if (vis) {
                    const uint64_t word = a.cell_seq[(size_t)(c0 + j) * a.seq_words + (qseq >> 6)];
                    vis = (word >> (qseq & 63)) & 1u;
                }
                if (vis && pick_far && cpos <= qfar) // far (selfextend.h)
                    sRow[j] = sRowF[j];
                if (vis) {
                    mx = fmaxf(mx, sRow[j]);
                    vis_bits |= 1u << (j - j0);
                }
            }
            mx = fmaxf(mx, __shfl_xor_sync(VELA_FULL_MASK, mx, 1));
            const float m_new = fmaxf(m, mx);
            float alpha = 1.0f, sum = 0.0f;
            if (m_new != -INFINITY) {    // else: nothing visible yet, P is all 0
                alpha = expf(m - m_new); // 0 while m is -inf
                for (int j = j0; j < j0 + BK / 2; j++) {
                    const bool vis = (vis_bits >> (j - j0)) & 1u;
                    const float sj = sRow[j];
                    const __half ph = __float2half_rn(vis ? expf(sj - m_new) : 0.0f);
                    pRow[j] = ph;
                    sum += __half2float(ph);
                }
            } else {
                for (int j = j0; j < j0 + BK / 2; j++)
                    pRow[j] = __float2half_rn(0.0f);
            }
            sum += __shfl_xor_sync(VELA_FULL_MASK, sum, 1);
            l = l * alpha + sum;
            m = m_new;
            if (alpha != 1.0f)
                for (int d = hf; d < DV; d += 2)
                    oRow[d] *= alpha;
        }
        __syncwarp();

        // O_w += P_w V.
        {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fp[BK / 16];
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++)
                wmma::load_matrix_sync(fp[kk], sP + warp * 16 * L.ldp + kk * 16, L.ldp);
            for (int n0 = 0; n0 < DV; n0 += 16) {
                wmma::fragment<wmma::accumulator, 16, 16, 16, float> o_acc;
                float *oTile = sO + warp * 16 * L.ldo + n0;
                wmma::load_matrix_sync(o_acc, oTile, L.ldo, wmma::mem_row_major);
#pragma unroll
                for (int kk = 0; kk < BK / 16; kk++) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fv;
                    wmma::load_matrix_sync(fv, sV + kk * 16 * L.ldv + n0, L.ldv);
                    wmma::mma_sync(o_acc, fp[kk], fv, o_acc);
                }
                wmma::store_matrix_sync(oTile, o_acc, L.ldo, wmma::mem_row_major);
            }
        }
    }
    __syncwarp(); // the warp's last store to sO before its lanes read their rows
    if (gr < n_rows) {
        const int64_t t = gr / n_group, h = (int64_t)g * n_group + gr % n_group;
        const size_t th = (size_t)t * a.n_head + h;
        float inv = l > 0.0f ? 1.0f / l : 0.0f;
        if constexpr (sizeof...(Sinks) > 0) {
            const float *const sink[] = {sinks...};
            if (l > 0.0f)
                inv = attn_sink_inv<false>(m, l, sink[0][h]);
        }
        for (int d = hf; d < DV; d += 2)
            a.out[th * DV + d] = oRow[d] * inv;
    }
#else
    __trap(); // the launcher picks this kernel only on sm_70 and later
#endif
}

struct attn_plan {
    unsigned int row_blocks;
    int n_split, chunk;
    size_t smem;
};

// Deterministic in its arguments: cuda_attention_scratch_bytes and
// cuda_attention_apply must agree on n_split.
static struct attn_plan attn_make_plan(const struct cuda_attn *a, int sm_count) {
    struct attn_plan p;
    const int64_t n_rows = (int64_t)a->n_tok * (a->n_head / a->n_head_kv);
    p.row_blocks = ceil_div_u(n_rows, ATTN_ROWS);
    const int64_t blocks = (int64_t)p.row_blocks * a->n_head_kv;
    // A decode block streams its cells one tile at a time, each tile's loads
    // waited for before its scores: the GPU's memory is kept busy by blocks
    // side by side. Up to 4 fit per SM (registers); more splits also mean
    // more partial results through L2 (n_group rows per split). The H200 run
    // measured 8-10% of bandwidth at 4k-64k keys with 2 per SM: other plans
    // are timed against it (vela-bench-kernels --attn-split, setting
    // split_blocks_per_sm / split_min_cells) before a default moves.
    const int per_sm =
        a->split_blocks_per_sm > 0 ? a->split_blocks_per_sm : CUDA_ATTN_SPLIT_BLOCKS_PER_SM;
    const int min_cells = a->split_min_cells > 0 ? a->split_min_cells : CUDA_ATTN_SPLIT_MIN_CELLS;
    const int64_t target = (int64_t)per_sm * (sm_count > 0 ? sm_count : 1);
    // The plan's view of the window: n_kv rounded up (see the top comment).
    const int64_t n_kv_plan =
        ((int64_t)a->n_kv + CUDA_ATTN_PLAN_CELLS - 1) / CUDA_ATTN_PLAN_CELLS * CUDA_ATTN_PLAN_CELLS;
    int64_t ns = 1;
    if (blocks < target && n_kv_plan >= ATTN_SPLIT_FROM_CELLS) {
        ns = (target + blocks - 1) / blocks;
        const int64_t by_kv = n_kv_plan / min_cells;
        if (ns > by_kv)
            ns = by_kv;
        if (ns > ATTN_MAX_SPLIT)
            ns = ATTN_MAX_SPLIT;
    }
    if (ns > 1) {
        int64_t chunk = (n_kv_plan + ns - 1) / ns;
        chunk = (chunk + ATTN_BK - 1) / ATTN_BK * ATTN_BK;
        p.chunk = (int)chunk;
        p.n_split = (int)((a->n_kv + chunk - 1) / chunk);
    } else {
        p.chunk = a->n_kv > 0 ? a->n_kv : 1;
        p.n_split = 1;
    }
    p.smem =
        sizeof(float) * ((size_t)ATTN_ROWS * a->head_dim + (size_t)ATTN_BK * (a->head_dim + 1) +
                         (size_t)ATTN_BK * a->head_dim_v) +
        sizeof(int) * ATTN_BK;
    if (a->rope_on) // sQf, sKf
        p.smem +=
            sizeof(float) * ((size_t)ATTN_ROWS * a->head_dim + (size_t)ATTN_BK * (a->head_dim + 1));
    return p;
}

static size_t attn_part_acc_bytes(const struct cuda_attn *a, int n_split) {
    const size_t n = (size_t)a->n_tok * a->n_head * n_split * a->head_dim_v * sizeof(float);
    return (n + 255) & ~(size_t)255;
}

extern "C" size_t cuda_attention_scratch_bytes(const struct cuda_attn *a, int sm_count) {
    if (a->n_tok <= 0 || a->n_head_kv <= 0 || a->n_head <= 0)
        return 0;
    if (cuda_attention_decode_eligible(a))
        return cuda_attention_decode_scratch_bytes(a, sm_count);
    const struct attn_plan p = attn_make_plan(a, sm_count);
    if (p.n_split == 1)
        return 0;
    return attn_part_acc_bytes(a, p.n_split) +
           (size_t)a->n_tok * a->n_head * p.n_split * 2 * sizeof(float);
}

extern "C" int cuda_attention_sync_count(const struct cuda_attn *a, int sm_count) {
    if (a->n_tok <= 0 || a->n_head_kv <= 0 || a->n_head <= 0 || !cuda_attention_decode_eligible(a))
        return 0;
    return cuda_attention_decode_sync_count(a, sm_count);
}

template <typename KT, typename VT, bool VEC, bool SE, bool SINK>
static int attn_launch(const struct cuda_attn *a, const float *sinks, const struct attn_plan *p,
                       float *part_acc, float *part_ml, cudaStream_t stream, struct verr *err) {
    // Raised once per device to the most any call can ask for, so a call
    // recorded into a CUDA graph makes no attribute call (devices >= 64 set
    // it every time).
    static std::atomic<unsigned long long> raised{0};
    // The 48 KiB default covers static + dynamic shared memory: leave room
    // for the kernel's static s_max_qpos / s_min_qpos / s_se_g / s_se_n (ptxas
    // allots 128 bytes on sm_90), or dynamic sizes just under 48 KiB (e.g. head dims 128/190:
    // exactly 48 KiB) fail to launch on hardware. The emulator checks the
    // dynamic size alone and cannot catch this.
    if (p->smem > 48 * 1024 - ATTN_STATIC_SMEM_SLACK) {
        int dev = 0;
        VELA_CUDA_CALL(err, cudaGetDevice(&dev));
        const unsigned long long bit = dev < 64 ? 1ull << dev : 0;
        if (!bit || !(raised.load() & bit)) {
            const size_t most =
                sizeof(float) * ((size_t)ATTN_ROWS * CUDA_ATTN_MAX_HEAD_DIM +
                                 (size_t)ATTN_BK * (CUDA_ATTN_MAX_HEAD_DIM + 1) +
                                 (size_t)ATTN_BK * CUDA_ATTN_MAX_HEAD_DIM) +
                sizeof(int) * ATTN_BK +
                (SE ? sizeof(float) * ((size_t)ATTN_ROWS * CUDA_ATTN_MAX_HEAD_DIM +
                                       (size_t)ATTN_BK * (CUDA_ATTN_MAX_HEAD_DIM + 1))
                    : 0);
            if (cudaFuncSetAttribute(attn_kernel<KT, VT, VEC, SE, SINK>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)most) == cudaSuccess) {
                raised.fetch_or(bit);
            } else { // a GPU with less shared memory: ask for this call's need only
                (void)cudaGetLastError();
                VELA_CUDA_CALL(err, cudaFuncSetAttribute(
                                        attn_kernel<KT, VT, VEC, SE, SINK>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)p->smem));
            }
        }
    }
    const dim3 grid(p->row_blocks, (unsigned int)a->n_head_kv, (unsigned int)p->n_split);
    attn_kernel<KT, VT, VEC, SE, SINK><<<grid, ATTN_THREADS, p->smem, stream>>>(
        *a, p->chunk, p->n_split, part_acc, part_ml, sinks);
    VELA_CHECK_LAUNCH(err, "attn_kernel");
    return VERR_OK;
}

// The tensor-core prefill's KV tile (32 or 64), or 0 when attn_kernel runs
// this call: F32 caches, few tokens, head dims not multiples of 16, caches
// not 16-byte aligned (the tile loads copy 8 halves at a time), pre-Volta
// GPUs, or more shared memory than the GPU's opt-in limit.
static int attn_tc_bk(const struct cuda_attn *a, int cc_major, int smem_optin) {
    const int D = a->head_dim, DV = a->head_dim_v;
    const bool f16 = a->type_k == GGML_TYPE_F16 && a->type_v == GGML_TYPE_F16;
    // f16 tiles are copied 16 bytes at a time (other types are decoded)
    const uintptr_t vec = (a->type_k == GGML_TYPE_F16 ? (uintptr_t)a->k : 0) |
                          (a->type_v == GGML_TYPE_F16 ? (uintptr_t)a->v : 0);
    if ((!f16 && !cuda_attn_kvq(a)) || a->n_tok < ATTN_TC_MIN_TOK || cc_major < 7 || D % 16 != 0 ||
        DV % 16 != 0 || (vec & 15))
        return 0;
    if (((int64_t)a->n_tok * (a->n_head / a->n_head_kv) + ATTN_TC_ROWS - 1) / ATTN_TC_ROWS >
        INT_MAX)
        return 0;
    const int bk = (D > DV ? D : DV) <= 96 ? 64 : 32;
    return attn_tc_make_layout(D, DV, bk, a->rope_on).bytes <= (size_t)smem_optin ? bk : 0;
}

// sinks: none or the call's (attn_tc_kernel).
template <int BK, bool SE, typename... Sinks>
static int attn_tc_launch(const struct cuda_attn *a, int dev, int smem_optin, cudaStream_t stream,
                          struct verr *err, Sinks... sinks) {
    const size_t smem = attn_tc_make_layout(a->head_dim, a->head_dim_v, BK, SE).bytes;
    // Raised once per device (as attn_launch does, for CUDA graph capture) to
    // the most any head dims ask for, capped by the device's opt-in limit.
    static std::atomic<unsigned long long> raised{0};
    if (smem > 48 * 1024) {
        const unsigned long long bit = dev < 64 ? 1ull << dev : 0;
        if (!bit || !(raised.load() & bit)) {
            size_t most =
                attn_tc_make_layout(CUDA_ATTN_MAX_HEAD_DIM, CUDA_ATTN_MAX_HEAD_DIM, BK, SE).bytes;
            if (most > (size_t)smem_optin)
                most = (size_t)smem_optin;
            VELA_CUDA_CALL(err, cudaFuncSetAttribute(attn_tc_kernel<BK, SE, Sinks...>,
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     (int)most));
            raised.fetch_or(bit);
        }
    }
    const int64_t n_rows = (int64_t)a->n_tok * (a->n_head / a->n_head_kv);
    const dim3 grid(ceil_div_u(n_rows, ATTN_TC_ROWS), (unsigned int)a->n_head_kv);
    attn_tc_kernel<BK, SE, Sinks...><<<grid, ATTN_TC_THREADS, smem, stream>>>(*a, sinks...);
    VELA_CHECK_LAUNCH(err, "attn_tc_kernel");
    return VERR_OK;
}

// attn_launch for the cache types and tile loads of this call (a call
// with a type other than f16 / f32: the any-cache instance, vec).
template <bool SE, bool SINK>
static int attn_launch_types(const struct cuda_attn *a, const float *sinks,
                             const struct attn_plan *p, bool vec, float *part_acc, float *part_ml,
                             cudaStream_t stream, struct verr *err) {
    if (cuda_attn_kvq(a))
        return attn_launch<kvq_any, kvq_any, true, SE, SINK>(a, sinks, p, part_acc, part_ml, stream,
                                                             err);
    const bool k16 = a->type_k == GGML_TYPE_F16, v16 = a->type_v == GGML_TYPE_F16;
    if (k16 && v16)
        return vec ? attn_launch<__half, __half, true, SE, SINK>(a, sinks, p, part_acc, part_ml,
                                                                 stream, err)
                   : attn_launch<__half, __half, false, SE, SINK>(a, sinks, p, part_acc, part_ml,
                                                                  stream, err);
    if (k16)
        return vec ? attn_launch<__half, float, true, SE, SINK>(a, sinks, p, part_acc, part_ml,
                                                                stream, err)
                   : attn_launch<__half, float, false, SE, SINK>(a, sinks, p, part_acc, part_ml,
                                                                 stream, err);
    if (v16)
        return vec ? attn_launch<float, __half, true, SE, SINK>(a, sinks, p, part_acc, part_ml,
                                                                stream, err)
                   : attn_launch<float, __half, false, SE, SINK>(a, sinks, p, part_acc, part_ml,
                                                                 stream, err);
    return vec ? attn_launch<float, float, true, SE, SINK>(a, sinks, p, part_acc, part_ml, stream,
                                                           err)
               : attn_launch<float, float, false, SE, SINK>(a, sinks, p, part_acc, part_ml, stream,
                                                            err);
}

// attn_tc_launch for the call's mode: RoPE inside, sinks (never both) or neither.
template <int BK>
static int attn_tc_launch_mode(const struct cuda_attn *a, const float *sinks, int dev,
                               int smem_optin, cudaStream_t stream, struct verr *err) {
    if (a->rope_on)
        return attn_tc_launch<BK, true>(a, dev, smem_optin, stream, err);
    return sinks ? attn_tc_launch<BK, false>(a, dev, smem_optin, stream, err, sinks)
                 : attn_tc_launch<BK, false>(a, dev, smem_optin, stream, err);
}

extern "C" int cuda_attention_apply(const struct cuda_attn *a, const float *sinks, int sm_count,
                                    void *scratch, size_t scratch_bytes, cudaStream_t stream,
                                    struct verr *err) {
    if (a->n_tok <= 0 || a->n_head <= 0)
        return VERR_OK;
    if (a->n_head_kv <= 0 || a->n_head % a->n_head_kv != 0)
        return verr_set(err, VERR_RANGE, "attention: n_head %d is not a multiple of n_head_kv %d",
                        a->n_head, a->n_head_kv);
    if (a->head_dim < 1 || a->head_dim > CUDA_ATTN_MAX_HEAD_DIM || a->head_dim_v < 1 ||
        a->head_dim_v > CUDA_ATTN_MAX_HEAD_DIM)
        return verr_set(err, VERR_UNSUPPORTED,
                        "attention: head dims %d/%d (the kernels take 1..%d)", a->head_dim,
                        a->head_dim_v, CUDA_ATTN_MAX_HEAD_DIM);
    if (a->seq_words < 1)
        return verr_set(err, VERR_RANGE, "attention: seq_words %d < 1", a->seq_words);
    const bool k16 = a->type_k == GGML_TYPE_F16, v16 = a->type_v == GGML_TYPE_F16;
    const bool kvq = cuda_attn_kvq(a);
    if (!kvq_is_cache_type(a->type_k) || !kvq_is_cache_type(a->type_v))
        return verr_set(err, VERR_UNSUPPORTED,
                        "attention: cache types %s/%s (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, "
                        "q5_1, iq4_nl)",
                        ggml_type_name(a->type_k), ggml_type_name(a->type_v));
    // The any-cache kernels decode runs of 8 values.
    if (kvq && (a->head_dim % 8 || a->head_dim_v % 8 || a->head_dim % kvq_block(a->type_k) ||
                a->head_dim_v % kvq_block(a->type_v)))
        return verr_set(err, VERR_UNSUPPORTED,
                        "attention: %s/%s caches need head dims multiples of 8 and of the block "
                        "(got %d/%d)",
                        ggml_type_name(a->type_k), ggml_type_name(a->type_v), a->head_dim,
                        a->head_dim_v);
    if (a->xq && (a->head_dim_v % 32 != 0 || a->n_tok >= ATTN_TC_MIN_TOK))
        return verr_set(err, VERR_RANGE,
                        "attention: a q8_1 copy needs head_dim_v %% 32 == 0 (got %d) and fewer "
                        "than %d tokens (got %d)",
                        a->head_dim_v, ATTN_TC_MIN_TOK, a->n_tok);
    // q_se: each token's G and W replace se_g / se_w (read as >= 1 in the kernels)
    const bool se_bad = !a->q_se && (a->se_g < 1 || (a->se_g > 1 && a->se_w < 1));
    if (a->rope_on &&
        (se_bad || a->rope.n_rot < 2 || a->rope.n_rot % 2 || a->rope.n_rot > a->head_dim))
        return verr_set(err, VERR_RANGE, "attention: RoPE inside: n_rot %d, G %d, W %d",
                        a->rope.n_rot, a->se_g, a->se_w);
    if (sinks && a->rope_on)
        return verr_set(err, VERR_UNSUPPORTED,
                        "attention: sinks with RoPE inside (the unrotated cache of self-extend): "
                        "no CUDA kernel joins the two");
    if (cuda_attention_decode_eligible(a))
        return cuda_attention_decode_apply(a, sinks, sm_count, scratch, scratch_bytes, stream, err);
    if (((k16 && v16) || kvq) && a->n_tok >= ATTN_TC_MIN_TOK) {
        int dev = 0, cc_major = 0, smem_optin = 0;
        VELA_CUDA_CALL(err, cudaGetDevice(&dev));
        VELA_CUDA_CALL(err,
                       cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev));
        VELA_CUDA_CALL(
            err, cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        const int bk = attn_tc_bk(a, cc_major, smem_optin);
        if (bk == 64)
            return attn_tc_launch_mode<64>(a, sinks, dev, smem_optin, stream, err);
        if (bk == 32)
            return attn_tc_launch_mode<32>(a, sinks, dev, smem_optin, stream, err);
    }
    const struct attn_plan p = attn_make_plan(a, sm_count);
    if (p.row_blocks > INT_MAX || a->n_head_kv > 65535)
        return verr_set(err, VERR_RANGE, "attention: grid of %u x %d blocks is too large",
                        p.row_blocks, a->n_head_kv);
    float *part_acc = nullptr, *part_ml = nullptr;
    if (p.n_split > 1) {
        const size_t need = cuda_attention_scratch_bytes(a, sm_count);
        if (!scratch || scratch_bytes < need)
            return verr_set(err, VERR_RANGE, "attention: scratch of %zu bytes < %zu needed",
                            scratch_bytes, need);
        part_acc = (float *)scratch;
        part_ml = (float *)((char *)scratch + attn_part_acc_bytes(a, p.n_split));
    }
    // 16-byte tile loads when every K and V row is 16-byte aligned.
    const bool vec = ((uintptr_t)a->k & 15) == 0 && ((uintptr_t)a->v & 15) == 0 &&
                     a->head_dim % (k16 ? 8 : 4) == 0 && a->head_dim_v % (v16 ? 8 : 4) == 0;
    const int rc =
        a->rope_on
            ? attn_launch_types<true, false>(a, nullptr, &p, vec, part_acc, part_ml, stream, err)
        : sinks
            ? attn_launch_types<false, true>(a, sinks, &p, vec, part_acc, part_ml, stream, err)
            : attn_launch_types<false, false>(a, nullptr, &p, vec, part_acc, part_ml, stream, err);
    if (rc || p.n_split == 1)
        return rc;
    const unsigned int rows = (unsigned int)((int64_t)a->n_tok * a->n_head);
    if (sinks)
        attn_combine_kernel<true><<<rows, ATTN_COMBINE_THREADS, 0, stream>>>(
            a->out, part_acc, part_ml, p.n_split, a->head_dim_v, (uint8_t *)a->xq, sinks,
            a->n_head);
    else
        attn_combine_kernel<false><<<rows, ATTN_COMBINE_THREADS, 0, stream>>>(
            a->out, part_acc, part_ml, p.n_split, a->head_dim_v, (uint8_t *)a->xq, nullptr,
            a->n_head);
    VELA_CHECK_LAUNCH(err, "attn_combine_kernel");
    return VERR_OK;
}
