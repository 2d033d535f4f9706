// Decode attention for latency (issue #28, item 1): a few query tokens
// (n_tok <= CUDA_ATTN_DEC_MAX_TOK) against the whole KV cache, F16 or F32
// (K and V of one type), head dims 64, 128 or 256 (K and V alike), or any
// other cache types (bf16, quantized: cuda/kv_quant.cuh; K and V each its
// own) at head dims 64 and 128, each lane decoding its run of 8 values into
// registers as it loads it (the kvq_any instances), q and f16 / f32
// caches 16-byte aligned, RoPE outside (rope_on calls stay on attn_kernel in
// attention.cu, which picks this kernel: attn_dec_eligible).
//
// Work decomposition. A block takes one token t, R query heads of one GQA
// group g (R = 1, 4 or 8; larger groups take several row chunks, each
// reading K/V again from L2) and one range of `chunk` cells (blockIdx.z:
// the split). K/V are read once for the R rows. The split is chosen so that
// the grid has about split_blocks_per_sm blocks per multiprocessor even at
// 256 cells (8 cells a block there on Llama-3-8B): a decode step's latency
// is the chain of one block, so blocks are many and short.
// Inside a block, 4 warps; a warp's 32 lanes form 32 / LPC lane groups of
// LPC lanes, a lane group takes one cell at a time and each lane holds EPL
// consecutive elements of its K and V rows (one or two 16-byte loads, 8
// bytes for F32 V rows... never: K and V have one type). Per step a lane
// group takes NC cells, all their K and V loads issued before the first is
// used (NC x 2 x 16 bytes in flight a lane); the cells' positions and
// sequence words for the next step are loaded in the same round trip, so
// the visibility of a cell is known before its K/V loads are issued and
// invisible cells (empty, another sequence, outside the window, after the
// query) are never read.
//   scores: lane-partial dot products of q (registers, pre-scaled by
//           scale * log2(e)) with the K elements, summed over the lane
//           group by xor shuffles; softmax in base 2 (exp2f);
//   online softmax per lane group and row (running m, l, acc over its EPL
//           dims), rescaled once per step with the step's max;
//   merge:  lane groups by xor shuffles (every lane ends with the same
//           bits: the merge is commutative), warps in shared memory in warp
//           order.
// Split combine, fused: each block of a split call writes its (acc, m, l)
// to scratch, then counts itself on a per-(token, row chunk, KV head)
// counter (cuda_attn.sync); the block that arrives last merges all splits
// in split order (attn_dec_combine_row, the same function the standalone
// attn_dec_combine_kernel runs when no counters are given, so both give the
// same bits) and sets the counter back to 0 for the next launch.
// Determinism (BACKEND_KV_BUCKET): the plan depends on n_kv only through
// round_up(n_kv, CUDA_ATTN_PLAN_CELLS); cells at or past n_kv are skipped
// like empty ones (not loaded, weight 0; a step without a visible cell
// leaves a row's state bit for bit as it was), splits wholly past n_kv are
// not launched and an empty split is skipped by the combine, and a single
// split's acc / l equals its combine with empty ones. So calls whose n_kv
// round to the same value and whose extra cells are empty give the same bits.
// Mask: as attn_kernel (attention.cu's top comment). A row with no visible
// cell gets zeros.
// Sinks: calls with them run SINK instances of their own (the R = 8 ones at
// every group size: attn_dec_launch_rows), which join the head's sink to a
// row's merged state before it is stored, once (unsplit, or after the
// splits' combine: attn_dec_join_sink). The instances without SINK have no
// sink code.
#include <atomic>
#include <limits.h>

#include "cuda/attention_args.h"
#include "cuda/attention_decode.h"
#include "cuda/attention_sink.cuh"
#include "cuda/attention_widen.cuh"
#include "cuda/kv_quant.cuh"
#include "cuda/q8_1.cuh"

#define ATTN_DEC_WARPS 4
#define ATTN_DEC_THREADS (ATTN_DEC_WARPS * VELA_WARP)
// Splits: at most this many; the chunk is a multiple of ATTN_DEC_CHUNK_ALIGN
// cells (one step of 4 warps x 2 cells for F16 head dim 128).
#define ATTN_DEC_MAX_SPLIT 64
#define ATTN_DEC_CHUNK_ALIGN 8
#define ATTN_DEC_LOG2E 1.4426950408889634f

// Lanes per cell (a K or V row as 16-byte pieces, at most a warp), elements
// per lane, cells per warp per load, 16-byte loads per lane per row.
template <typename T, int D> struct attn_dec_shape {
    static constexpr int BYTES = D * (int)sizeof(T);
    static constexpr int LPC = BYTES / 16 < VELA_WARP ? BYTES / 16 : VELA_WARP;
    static constexpr int EPL = D / LPC;
    static constexpr int CPW = VELA_WARP / LPC;
    static constexpr int NV = EPL * (int)sizeof(T) / 16;
};
// Caches of any type (bf16, quantized, or a mix with f16 / f32): the lanes
// of f16's shape, each decoding its run of EPL = 8 elements (inside one
// 32-element block) into registers as it loads it.
template <int D> struct attn_dec_shape<kvq_any, D> : attn_dec_shape<__half, D> {};

// Merges state b into a (m in base 2; an empty state has m -inf, l 0, acc 0).
// Commutative bit for bit: a + b == b + a and fmaxf is symmetric.
template <int EPL>
static __device__ __forceinline__ void attn_dec_merge(float &m, float &l, float (&acc)[EPL],
                                                      float mb, float lb,
                                                      const float (&accb)[EPL]) {
    const float mx = fmaxf(m, mb);
    if (mx == -INFINITY)
        return; // both empty
    const float fa = exp2f(m - mx), fb = exp2f(mb - mx);
    l = l * fa + lb * fb;
#pragma unroll
    for (int e = 0; e < EPL; e++)
        acc[e] = acc[e] * fa + accb[e] * fb;
    m = mx;
}

// Element d of row th (token * n_head + head) merged over the n_split
// partial results in split order, empty splits (m -inf) skipped; the
// weights' sum in *l_out. Every split's results are read through L2
// (__ldcg): other blocks wrote them in this launch.
static __device__ __forceinline__ float attn_dec_combine_row(const float *part_acc,
                                                             const float *part_ml, size_t th,
                                                             int n_split, int DV, int d,
                                                             float *l_out) {
    // unrolled so that several splits' loads are in flight at once
    const float *ml = part_ml + th * n_split * 2;
    float mx = -INFINITY;
#pragma unroll 8
    for (int s = 0; s < n_split; s++)
        mx = fmaxf(mx, __ldcg(ml + 2 * s));
    float l = 0.0f, o = 0.0f;
    bool first = true;
    if (mx != -INFINITY) {
#pragma unroll 8
        for (int s = 0; s < n_split; s++) {
            const float ms = __ldcg(ml + 2 * s), ls = __ldcg(ml + 2 * s + 1);
            const float os = __ldcg(part_acc + (th * n_split + s) * DV + d);
            if (ms == -INFINITY)
                continue;
            const float f = exp2f(ms - mx);
            l = first ? ls * f : l + ls * f;
            o = first ? os * f : o + os * f;
            first = false;
        }
    }
    *l_out = l;
    return o;
}

// One output element: out (and the q8_1 copy, whole warps: DV % 32 == 0).
static __device__ __forceinline__ void attn_dec_store(const struct cuda_attn &a, size_t th, int DV,
                                                      int d, float o, float l) {
    const float v = l > 0.0f ? o * (1.0f / l) : 0.0f;
    a.out[th * DV + d] = v;
    if (a.xq)
        q8_1_store_warp((uint8_t *)a.xq + (th * DV + d) / 32 * Q8_1_BLOCK_BYTES, v,
                        threadIdx.x % VELA_WARP);
}

// Row th's sink (sinks: [n_head]) joined to its merged state (max m in base
// 2, weights' sum l, one output element o): o and l move to the joined max,
// l takes the sink's weight, so that attn_dec_store's o / l has the sink in
// its denominator. A row that saw nothing (l 0) stays zeros.
static __device__ __forceinline__ void attn_dec_join_sink(const struct cuda_attn &a,
                                                          const float *sinks, size_t th, float m,
                                                          float &o, float &l) {
    if (l > 0.0f) {
        float f;
        l = attn_sink_join<true>(m, l, sinks[th % a.n_head] * ATTN_DEC_LOG2E, &f);
        o *= f;
    }
}

// The max of row th's n_split partial results (-inf: all empty), read as
// attn_dec_combine_row reads them: the m of its merged state.
static __device__ __forceinline__ float attn_dec_split_max(const float *part_ml, size_t th,
                                                           int n_split) {
    const float *ml = part_ml + th * n_split * 2;
    float mx = -INFINITY;
#pragma unroll 8
    for (int s = 0; s < n_split; s++)
        mx = fmaxf(mx, __ldcg(ml + 2 * s));
    return mx;
}

// Occupancy (sm_90, ptxas): see bench/results/kernels-sm90-resources.json.
// grid (n_tok * row_chunks, n_head_kv, n_split), ATTN_DEC_THREADS threads.
// The merge of the splits of rows th0 .. th0 + nr - 1 (D values each) and
// its store, the sink joined per row with SINK: what attn_dec_kernel's last
// block and attn_dec_combine_kernel both run, so both give the same bits.
// tid: the thread among the block's ATTN_DEC_THREADS.
template <int D, bool SINK>
static __device__ __forceinline__ void
attn_dec_combine_rows(const struct cuda_attn &a, const float *part_acc, const float *part_ml,
                      const float *sinks, size_t th0, int nr, int n_split, int tid) {
    for (int idx = tid; idx < nr * D; idx += ATTN_DEC_THREADS) {
        const int r = idx / D, d = idx % D;
        float lw;
        float o = attn_dec_combine_row(part_acc, part_ml, th0 + r, n_split, D, d, &lw);
        if constexpr (SINK)
            attn_dec_join_sink(a, sinks, th0 + r, attn_dec_split_max(part_ml, th0 + r, n_split), o,
                               lw);
        attn_dec_store(a, th0 + r, D, d, o, lw);
    }
}

// SINK: the call's sinks ([n_head]; unread without SINK) joined per row.
template <typename T, int D, int R, int NC, bool SINK>
__global__ static void __launch_bounds__(ATTN_DEC_THREADS)
    attn_dec_kernel(const struct cuda_attn a, int chunk, int n_split, int row_chunks,
                    float *__restrict__ part_acc /* [n_tok*n_head][n_split][D] */,
                    float *__restrict__ part_ml /* [n_tok*n_head][n_split][2] */,
                    unsigned int *__restrict__ sync /* [n_tok*row_chunks*n_head_kv] or NULL */,
                    const float *__restrict__ sinks) {
    using S = attn_dec_shape<T, D>;
    constexpr int LPC = S::LPC, EPL = S::EPL, CPW = S::CPW, NV = S::NV;
    constexpr bool KVQ = std::is_same<T, kvq_any>::value;
    static_assert(!KVQ || EPL == 8, "a lane decodes one run of 8");
    constexpr int STEP = ATTN_DEC_WARPS * CPW * NC; // cells a block takes per step
    __shared__ float sM[ATTN_DEC_WARPS][R], sL[ATTN_DEC_WARPS][R];
    __shared__ float sAcc[ATTN_DEC_WARPS][R][D];
    __shared__ int s_last;

    const int tid = threadIdx.x, warp = tid / VELA_WARP, lane = tid % VELA_WARP;
    const int grp = lane / LPC, lig = lane % LPC;
    const int t = blockIdx.x / row_chunks, rc = blockIdx.x % row_chunks;
    const int g = blockIdx.y, split = blockIdx.z;
    const int n_group = a.n_head / a.n_head_kv;
    const int h0 = g * n_group + rc * R;
    const int nr = min(R, n_group - rc * R);
    const int c_begin = split * chunk, c_end = min(a.n_kv, c_begin + chunk);
    const T *kc = (const T *)a.k, *vc = (const T *)a.v;

    int qpos = a.q_pos[t];
    const int qseq = a.q_seq[t];
    if (qseq < 0 || (qseq >> 6) >= a.seq_words)
        qpos = -1; // a sequence id outside the bitset sees nothing
    const int sword = qseq > 0 ? qseq >> 6 : 0, sbit = qseq & 63;

    // q rows in registers, this lane's EPL dims, pre-scaled for base 2
    float q[R][EPL];
    const float qs = a.scale * ATTN_DEC_LOG2E;
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
        for (int e = 0; e < EPL; e += 4) {
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < nr)
                v = *(const float4 *)(a.q + ((size_t)t * a.n_head + h0 + r) * D + lig * EPL + e);
            q[r][e] = v.x * qs;
            q[r][e + 1] = v.y * qs;
            q[r][e + 2] = v.z * qs;
            q[r][e + 3] = v.w * qs;
        }
    }
    float m[R], l[R], acc[R][EPL];
#pragma unroll
    for (int r = 0; r < R; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; e++)
            acc[r][e] = 0.0f;
    }

    // The cells of step c0: cell i of this lane group is c0 + (i * warps +
    // warp) * CPW + grp (a short chunk spreads over every warp first).
    int pos[NC];
    uint64_t word[NC];
#pragma unroll
    for (int i = 0; i < NC; i++) {
        const int c = c_begin + (i * ATTN_DEC_WARPS + warp) * CPW + grp;
        pos[i] = -1;
        word[i] = 0;
        if (c < c_end && qpos >= 0) {
            pos[i] = a.cell_pos[c];
            word[i] = a.cell_seq[(size_t)c * a.seq_words + sword];
        }
    }

    for (int c0 = c_begin; c0 < c_end; c0 += STEP) {
        uint4 kr[NC][NV], vr[NC][NV];
        float kq[KVQ ? NC : 1][EPL], vq[KVQ ? NC : 1][EPL]; // KVQ: decoded at the load
        bool vis[NC];
#pragma unroll
        for (int i = 0; i < NC; i++) {
            const int c = c0 + (i * ATTN_DEC_WARPS + warp) * CPW + grp;
            const int p = pos[i];
            vis[i] = p >= 0 && p <= qpos && (a.window <= 0 || qpos - p < a.window) &&
                     ((word[i] >> sbit) & 1u);
#pragma unroll
            for (int v = 0; v < NV; v++) {
                kr[i][v] = make_uint4(0u, 0u, 0u, 0u);
                vr[i][v] = make_uint4(0u, 0u, 0u, 0u);
            }
            if constexpr (KVQ) {
#pragma unroll
                for (int e = 0; e < EPL; e++)
                    kq[i][e] = vq[i][e] = 0.0f;
            }
            if (vis[i]) {
                const size_t off = ((size_t)c * a.n_head_kv + g) * D + lig * EPL;
                if constexpr (KVQ) {
                    kvq_dequant8(a.type_k, (const uint8_t *)a.k, off, kq[i]);
                    kvq_dequant8(a.type_v, (const uint8_t *)a.v, off, vq[i]);
                } else {
#pragma unroll
                    for (int v = 0; v < NV; v++) {
                        kr[i][v] = *(const uint4 *)(kc + off + v * (16 / sizeof(T)));
                        vr[i][v] = *(const uint4 *)(vc + off + v * (16 / sizeof(T)));
                    }
                }
            }
        }
        // the next step's positions and sequence words, in the same round trip
#pragma unroll
        for (int i = 0; i < NC; i++) {
            const int c = c0 + STEP + (i * ATTN_DEC_WARPS + warp) * CPW + grp;
            pos[i] = -1;
            word[i] = 0;
            if (c < c_end && qpos >= 0) {
                pos[i] = a.cell_pos[c];
                word[i] = a.cell_seq[(size_t)c * a.seq_words + sword];
            }
        }
        // scores (base 2), summed over the lane group
        float s[NC][R];
#pragma unroll
        for (int i = 0; i < NC; i++) {
            float kf[EPL];
            if constexpr (KVQ) {
#pragma unroll
                for (int e = 0; e < EPL; e++)
                    kf[e] = kq[i][e];
            } else {
#pragma unroll
                for (int v = 0; v < NV; v++)
                    attn_widen(kr[i][v], kc, kf + v * (16 / sizeof(T)));
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
                for (int e = 0; e < EPL; e += 2) {
                    s0 = fmaf(q[r][e], kf[e], s0);
                    s1 = fmaf(q[r][e + 1], kf[e + 1], s1);
                }
                float x = s0 + s1;
#pragma unroll
                for (int o = LPC / 2; o > 0; o >>= 1)
                    x += __shfl_xor_sync(VELA_FULL_MASK, x, o);
                s[i][r] = vis[i] ? x : -INFINITY;
            }
        }
        // online softmax: one rescale per row and step
        float alpha[R];
        bool live[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            float mx = m[r];
#pragma unroll
            for (int i = 0; i < NC; i++)
                mx = fmaxf(mx, s[i][r]);
            live[r] = mx != -INFINITY; // the lane group has seen a visible cell
            alpha[r] = live[r] ? exp2f(m[r] - mx) : 1.0f;
            l[r] *= alpha[r];
#pragma unroll
            for (int e = 0; e < EPL; e++)
                acc[r][e] *= alpha[r];
            m[r] = mx;
        }
#pragma unroll
        for (int i = 0; i < NC; i++) {
            if (!vis[i])
                continue; // weight 0 for every row; V is zeros
            float vf[EPL];
            if constexpr (KVQ) {
#pragma unroll
                for (int e = 0; e < EPL; e++)
                    vf[e] = vq[i][e];
            } else {
#pragma unroll
                for (int v = 0; v < NV; v++)
                    attn_widen(vr[i][v], vc, vf + v * (16 / sizeof(T)));
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float p = exp2f(s[i][r] - m[r]);
                l[r] += p;
#pragma unroll
                for (int e = 0; e < EPL; e++)
                    acc[r][e] = fmaf(p, vf[e], acc[r][e]);
            }
        }
    }

    // lane groups of the warp, then the warps in order
#pragma unroll
    for (int o = LPC; o < VELA_WARP; o <<= 1) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float mb = __shfl_xor_sync(VELA_FULL_MASK, m[r], o);
            const float lb = __shfl_xor_sync(VELA_FULL_MASK, l[r], o);
            float ab[EPL];
#pragma unroll
            for (int e = 0; e < EPL; e++)
                ab[e] = __shfl_xor_sync(VELA_FULL_MASK, acc[r][e], o);
            attn_dec_merge<EPL>(m[r], l[r], acc[r], mb, lb, ab);
        }
    }
    if (grp == 0) {
#pragma unroll
        for (int r = 0; r < R; r++) {
#pragma unroll
            for (int e = 0; e < EPL; e++)
                sAcc[warp][r][lig * EPL + e] = acc[r][e];
            if (lig == 0) {
                sM[warp][r] = m[r];
                sL[warp][r] = l[r];
            }
        }
    }
    __syncthreads();
    const size_t th0 = (size_t)t * a.n_head + h0;
    for (int idx = tid; idx < nr * D; idx += ATTN_DEC_THREADS) { // whole warps (D % 32 == 0)
        const int r = idx / D, d = idx % D;
        float mx = sM[0][r], lw = sL[0][r], o[1] = {sAcc[0][r][d]};
#pragma unroll
        for (int w = 1; w < ATTN_DEC_WARPS; w++) {
            const float ob[1] = {sAcc[w][r][d]};
            attn_dec_merge<1>(mx, lw, o, sM[w][r], sL[w][r], ob);
        }
        if (n_split == 1) {
            if constexpr (SINK)
                attn_dec_join_sink(a, sinks, th0 + r, mx, o[0], lw);
            attn_dec_store(a, th0 + r, D, d, o[0], lw);
        } else {
            const size_t ps = (th0 + r) * n_split + split;
            part_acc[ps * D + d] = o[0];
            if (d == 0) {
                part_ml[ps * 2] = mx;
                part_ml[ps * 2 + 1] = lw;
            }
        }
    }
    if (n_split == 1 || !sync)
        return;
    // The last block of this (token, row chunk, KV head) to finish merges.
    __threadfence(); // this block's partial results before its count
    __syncthreads();
    unsigned int *ctr = sync + (size_t)blockIdx.x * gridDim.y + g;
    if (tid == 0)
        s_last = atomicAdd(ctr, 1u) == (unsigned int)n_split - 1;
    __syncthreads();
    if (!s_last)
        return;      // block-uniform
    __threadfence(); // every other split's results before they are read
    if (tid == 0)
        atomicExch(ctr, 0u); // zero again for the next launch
    attn_dec_combine_rows<D, SINK>(a, part_acc, part_ml, sinks, th0, nr, n_split, tid);
}

// Without counters: one block per (token, row chunk, KV head) merges the
// splits, as the last block of attn_dec_kernel would (the same bits).
template <int D, int R, bool SINK>
__global__ static void __launch_bounds__(ATTN_DEC_THREADS)
    attn_dec_combine_kernel(const struct cuda_attn a, int n_split, int row_chunks,
                            const float *__restrict__ part_acc, const float *__restrict__ part_ml,
                            const float *__restrict__ sinks) {
    const int t = blockIdx.x / row_chunks, rc = blockIdx.x % row_chunks, g = blockIdx.y;
    const int n_group = a.n_head / a.n_head_kv;
    const int h0 = g * n_group + rc * R, nr = min(R, n_group - rc * R);
    const size_t th0 = (size_t)t * a.n_head + h0;
    attn_dec_combine_rows<D, SINK>(a, part_acc, part_ml, sinks, th0, nr, n_split, threadIdx.x);
}

struct attn_dec_plan {
    int rows, row_chunks, n_split, chunk;
};

static int attn_dec_rows(int n_group) {
    return n_group == 1 ? 1 : n_group <= 4 ? 4 : 8;
}

// Deterministic in its arguments; n_kv enters only as round_up(n_kv,
// CUDA_ATTN_PLAN_CELLS) except for n_split (splits wholly past n_kv are not
// launched: they would find nothing).
static struct attn_dec_plan attn_dec_make_plan(const struct cuda_attn *a, int sm_count) {
    struct attn_dec_plan p;
    const int n_group = a->n_head / a->n_head_kv;
    p.rows = attn_dec_rows(n_group);
    p.row_chunks = (n_group + p.rows - 1) / p.rows;
    const int64_t blocks = (int64_t)a->n_tok * p.row_chunks * a->n_head_kv;
    const int per_sm =
        a->split_blocks_per_sm > 0 ? a->split_blocks_per_sm : CUDA_ATTN_DEC_BLOCKS_PER_SM;
    const int min_cells = a->split_min_cells > 0 ? a->split_min_cells : CUDA_ATTN_DEC_MIN_CELLS;
    const int64_t target = (int64_t)per_sm * (sm_count > 0 ? sm_count : 1);
    const int64_t n_kv_plan =
        ((int64_t)a->n_kv + CUDA_ATTN_PLAN_CELLS - 1) / CUDA_ATTN_PLAN_CELLS * CUDA_ATTN_PLAN_CELLS;
    int64_t ns = (target + blocks - 1) / blocks;
    const int64_t by_kv = n_kv_plan / min_cells;
    if (ns > by_kv)
        ns = by_kv;
    if (ns > ATTN_DEC_MAX_SPLIT)
        ns = ATTN_DEC_MAX_SPLIT;
    if (ns < 1)
        ns = 1;
    int64_t chunk = (n_kv_plan + ns - 1) / ns;
    chunk = (chunk + ATTN_DEC_CHUNK_ALIGN - 1) / ATTN_DEC_CHUNK_ALIGN * ATTN_DEC_CHUNK_ALIGN;
    p.chunk = (int)(chunk > 0 ? chunk : ATTN_DEC_CHUNK_ALIGN);
    p.n_split = a->n_kv > 0 ? (int)((a->n_kv + p.chunk - 1) / p.chunk) : 1;
    return p;
}

extern "C" bool cuda_attention_decode_eligible(const struct cuda_attn *a) {
    if (a->decode == CUDA_ATTN_DECODE_SPLITK || a->rope_on || a->n_tok < 1 ||
        a->n_tok > CUDA_ATTN_DEC_MAX_TOK || a->n_head_kv < 1 || a->n_head % a->n_head_kv != 0)
        return false;
    const int D = a->head_dim;
    if (D != a->head_dim_v)
        return false;
    if (cuda_attn_kvq(a)) { // the any-cache instances: head dims 64 and 128
        if ((D != 64 && D != 128) || !kvq_is_cache_type(a->type_k) || !kvq_is_cache_type(a->type_v))
            return false;
    } else if ((D != 64 && D != 128 && D != 256) || a->type_k != a->type_v) {
        return false;
    }
    // 16-byte loads of q, and of f16 / f32 caches (the any-cache decoders
    // read 2- and 4-byte words)
    const uintptr_t vec = cuda_attn_kvq(a) ? 0 : (uintptr_t)a->k | (uintptr_t)a->v;
    return ((vec | (uintptr_t)a->q) & 15) == 0 && a->n_head_kv <= 65535;
}

static size_t attn_dec_acc_bytes(const struct cuda_attn *a, int n_split) {
    const size_t n = (size_t)a->n_tok * a->n_head * n_split * a->head_dim_v * sizeof(float);
    return (n + 255) & ~(size_t)255;
}

extern "C" size_t cuda_attention_decode_scratch_bytes(const struct cuda_attn *a, int sm_count) {
    const struct attn_dec_plan p = attn_dec_make_plan(a, sm_count);
    if (p.n_split == 1)
        return 0;
    return attn_dec_acc_bytes(a, p.n_split) +
           (size_t)a->n_tok * a->n_head * p.n_split * 2 * sizeof(float);
}

extern "C" int cuda_attention_decode_sync_count(const struct cuda_attn *a, int sm_count) {
    const struct attn_dec_plan p = attn_dec_make_plan(a, sm_count);
    return p.n_split == 1 ? 0 : a->n_tok * p.row_chunks * a->n_head_kv;
}

template <typename T, int D, int R, bool SINK>
static int attn_dec_launch(const struct cuda_attn *a, const float *sinks,
                           const struct attn_dec_plan *p, float *part_acc, float *part_ml,
                           unsigned int *sync, cudaStream_t stream, struct verr *err) {
    // any cache type: 2 cells a step (its decoded runs are floats in registers)
    constexpr int NC = R >= 8 || std::is_same<T, kvq_any>::value ? 2 : 4;
    const dim3 grid((unsigned int)(a->n_tok * p->row_chunks), (unsigned int)a->n_head_kv,
                    (unsigned int)p->n_split);
    attn_dec_kernel<T, D, R, NC, SINK><<<grid, ATTN_DEC_THREADS, 0, stream>>>(
        *a, p->chunk, p->n_split, p->row_chunks, part_acc, part_ml, sync, sinks);
    VELA_CHECK_LAUNCH(err, "attn_dec_kernel");
    if (p->n_split > 1 && !sync) {
        attn_dec_combine_kernel<D, R, SINK><<<dim3(grid.x, grid.y), ATTN_DEC_THREADS, 0, stream>>>(
            *a, p->n_split, p->row_chunks, part_acc, part_ml, sinks);
        VELA_CHECK_LAUNCH(err, "attn_dec_combine_kernel");
    }
    return VERR_OK;
}

// With sinks the R = 8 instance serves every group size, one SINK instance
// per cache type and head dim: its plan is the same (the plan's row chunks,
// ceil(n_group / rows), are 1 wherever rows < 8, so are ceil(n_group / 8)),
// rows past the group's are masked (nr).
template <typename T, int D>
static int attn_dec_launch_rows(const struct cuda_attn *a, const float *sinks,
                                const struct attn_dec_plan *p, float *part_acc, float *part_ml,
                                unsigned int *sync, cudaStream_t stream, struct verr *err) {
    if (sinks)
        return attn_dec_launch<T, D, 8, true>(a, sinks, p, part_acc, part_ml, sync, stream, err);
    if (p->rows == 1)
        return attn_dec_launch<T, D, 1, false>(a, nullptr, p, part_acc, part_ml, sync, stream, err);
    if (p->rows == 4)
        return attn_dec_launch<T, D, 4, false>(a, nullptr, p, part_acc, part_ml, sync, stream, err);
    return attn_dec_launch<T, D, 8, false>(a, nullptr, p, part_acc, part_ml, sync, stream, err);
}

template <typename T>
static int attn_dec_launch_dim(const struct cuda_attn *a, const float *sinks,
                               const struct attn_dec_plan *p, float *part_acc, float *part_ml,
                               unsigned int *sync, cudaStream_t stream, struct verr *err) {
    if (a->head_dim == 64)
        return attn_dec_launch_rows<T, 64>(a, sinks, p, part_acc, part_ml, sync, stream, err);
    if (a->head_dim == 128)
        return attn_dec_launch_rows<T, 128>(a, sinks, p, part_acc, part_ml, sync, stream, err);
    return attn_dec_launch_rows<T, 256>(a, sinks, p, part_acc, part_ml, sync, stream, err);
}

extern "C" int cuda_attention_decode_apply(const struct cuda_attn *a, const float *sinks,
                                           int sm_count, void *scratch, size_t scratch_bytes,
                                           cudaStream_t stream, struct verr *err) {
    const struct attn_dec_plan p = attn_dec_make_plan(a, sm_count);
    if ((int64_t)a->n_tok * p.row_chunks > INT_MAX)
        return verr_set(err, VERR_RANGE, "attention: grid too large");
    float *part_acc = nullptr, *part_ml = nullptr;
    unsigned int *sync = nullptr;
    if (p.n_split > 1) {
        const size_t need = cuda_attention_decode_scratch_bytes(a, sm_count);
        if (!scratch || scratch_bytes < need)
            return verr_set(err, VERR_RANGE, "attention: scratch of %zu bytes < %zu needed",
                            scratch_bytes, need);
        part_acc = (float *)scratch;
        part_ml = (float *)((char *)scratch + attn_dec_acc_bytes(a, p.n_split));
        if (a->sync && a->sync_n >= cuda_attention_decode_sync_count(a, sm_count))
            sync = a->sync;
    }
    if (cuda_attn_kvq(a))
        return a->head_dim == 64 ? attn_dec_launch_rows<kvq_any, 64>(a, sinks, &p, part_acc,
                                                                     part_ml, sync, stream, err)
                                 : attn_dec_launch_rows<kvq_any, 128>(a, sinks, &p, part_acc,
                                                                      part_ml, sync, stream, err);
    return a->type_k == GGML_TYPE_F16
               ? attn_dec_launch_dim<__half>(a, sinks, &p, part_acc, part_ml, sync, stream, err)
               : attn_dec_launch_dim<float>(a, sinks, &p, part_acc, part_ml, sync, stream, err);
}
