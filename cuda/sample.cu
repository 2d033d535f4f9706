// Sampling on the device. Greedy: argmax per row, the lowest index on ties
// (the order the CPU reference's left-to-right scan gives). NaN never
// compares greater, so it never wins; a row of NaN gives 0.
#include <limits.h>
#include <stdlib.h>

#include "cuda/cuda_common.cuh"
#include "cuda/launch.cuh"
#include "cuda/sample.h"

#define ARGMAX_THREADS 256

// (v, i) beats (bv, bi) when larger, or equal with a lower index.
static __device__ __forceinline__ void argmax_merge(float v, int i, float *bv, int *bi) {
    if (v > *bv || (v == *bv && i < *bi)) {
        *bv = v;
        *bi = i;
    }
}

__global__ static void __launch_bounds__(ARGMAX_THREADS)
    argmax_kernel(int32_t *__restrict__ out /* [n_rows] */,
                  const float *__restrict__ logits /* [n_rows][n_vocab] */, int n_vocab) {
    __shared__ float s_val[ARGMAX_THREADS / VELA_WARP];
    __shared__ int s_idx[ARGMAX_THREADS / VELA_WARP];
    cuda_pdl_wait();
    const float *row = logits + (size_t)blockIdx.x * n_vocab;
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int i = threadIdx.x; i < n_vocab; i += ARGMAX_THREADS)
        argmax_merge(row[i], i, &bv, &bi);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(VELA_FULL_MASK, bv, o);
        const int i = __shfl_xor_sync(VELA_FULL_MASK, bi, o);
        argmax_merge(v, i, &bv, &bi);
    }
    if (threadIdx.x % VELA_WARP == 0) {
        s_val[threadIdx.x / VELA_WARP] = bv;
        s_idx[threadIdx.x / VELA_WARP] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ARGMAX_THREADS / VELA_WARP; w++)
            argmax_merge(s_val[w], s_idx[w], &bv, &bi);
        out[blockIdx.x] = bi == INT_MAX ? 0 : bi;
    }
}

extern "C" int cuda_argmax_rows(int32_t *out, const float *logits, int n_rows, int n_vocab,
                                bool pdl, cudaStream_t stream, struct verr *err) {
    if (n_rows <= 0)
        return VERR_OK;
    if (n_vocab <= 0)
        return verr_set(err, VERR_RANGE, "argmax: n_vocab %d", n_vocab);
    cuda_launch(pdl, argmax_kernel, (unsigned int)n_rows, ARGMAX_THREADS, 0, stream, out, logits,
                n_vocab);
    VELA_CHECK_LAUNCH(err, "argmax_kernel");
    return VERR_OK;
}

// ---------------------------------------------------------------------------
// Sampling on the device: host/backend/sampler.c's chain after the penalties
// (sampler_chain), row by row, with the uniform draw u given by the host.
//
// How the same token as the CPU reference comes out:
// - the candidates are ordered exactly as the host orders them: by logit
//   descending, the lower id first on ties (-0 and +0 tie, as they compare
//   equal there); top_k is an exact radix select of that order;
// - every float step is the host's own operation in the host's order where
//   the result depends on order: top_p's running float sum is one thread's
//   sequential loop; min_p's threshold is max + logf(min_p) with logf taken on
//   the host (backend_cuda.c); temp is the IEEE division;
// - exp is (float)exp((double)x), correctly rounded but with odds of about
//   1e-8; glibc's expf (the host's) is correctly rounded in all but rare
//   cases (its bound is 0.502 ulp), where CUDA's expf may be 2 ulp off: so
//   the probabilities have the host's bits in all but rare cases;
// - the double sums (softmax normalizer, dist's cumulative sum) are summed in
//   another order than the host's, which changes them by about 1e-16.
// So the picks differ only where u (or top_p) lies within rounding of a
// cumulative sum; tests/gpu/test_cuda_sample.c detects and allows those.
//
// Rows go one of three ways (decided on the host from the parameters):
// greedy (argmax); top_k in [1, CUDA_SAMPLE_MAX_K] (two stages: a block per
// SAMPLE_CHUNK logits of the row keeps the chunk's own best k by radix
// select, then one block per row selects the row's k from those candidates,
// sorts them and runs the chain in shared memory; greedy rows take the same
// two stages with the chunk's argmax); anything else (top_k off or larger)
// sorts whole rows with cub's radix sort in chunks, then runs the chain over
// the sorted row in global memory. The row's k are among its chunks' k (the
// order is total: logit, then id), so both stages select what one pass over
// the row would.
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#define SAMPLE_THREADS 512
#define SAMPLE_WARPS (SAMPLE_THREADS / VELA_WARP)
#define SAMPLE_MAX_K CUDA_SAMPLE_MAX_K
#define SAMPLE_STAGE 2048           // floats of top_p's running sum staged in shared memory
#define SAMPLE_SORT_ITEMS (1 << 22) // keys sorted per chunk of sort-path rows (2 x 32 MiB)
#define SAMPLE_SORT_MAX_ROWS 1024   // rows per chunk (the row index sits in the key)
#define SAMPLE_KEYS_THREADS 256
#define SAMPLE_CHUNK 4096 // logits of a row one block of the first stage reads

enum sample_mode {
    SAMPLE_GREEDY = 0,
    SAMPLE_TOPK = 1,      // 1 <= k <= CUDA_SAMPLE_MAX_K: the one-block path
    SAMPLE_SORT_RAW = 2,  // the sort path, ordered by logit (top_k or top_p on)
    SAMPLE_SORT_TEMP = 3, // the sort path, ordered by logit / temp (top_k and top_p off)
};

// One row as the kernels read it (device memory).
struct sample_row_dev {
    double u;
    float temp, top_p, min_p, log_min_p;
    int mode; // enum sample_mode
    int k;    // candidates the chain starts from: min(top_k, n_vocab), or n_vocab
};

// Float -> uint32 whose unsigned order is the float order, with -0 mapped to
// +0 (the host's comparisons treat them as equal, so they tie by id).
static __device__ __forceinline__ uint32_t sample_ord(float x) {
    const uint32_t b = x == 0.0f ? 0u : __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Correctly rounded but with odds of ~1e-8, as close to glibc's expf as a
// float exp gets (see the top of the section).
static __device__ __forceinline__ float sample_exp(float x) {
    return (float)exp((double)x);
}

struct sample_op_sum_d {
    __device__ double operator()(double a, double b) const {
        return a + b;
    }
};
struct sample_op_max_f {
    __device__ float operator()(float a, float b) const {
        return fmaxf(a, b);
    }
};
struct sample_op_sum_i {
    __device__ int operator()(int a, int b) const {
        return a + b;
    }
};
struct sample_op_min_i {
    __device__ int operator()(int a, int b) const {
        return a < b ? a : b;
    }
};
struct sample_op_max_i {
    __device__ int operator()(int a, int b) const {
        return a > b ? a : b;
    }
};

// Block-wide reduction, the same tree every time (deterministic); every thread
// gets the result. buf: shared [SAMPLE_WARPS].
template <typename T, typename Op>
static __device__ __forceinline__ T sample_block_reduce(T v, Op op, T *buf) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = op(v, __shfl_xor_sync(VELA_FULL_MASK, v, o));
    if (threadIdx.x % VELA_WARP == 0)
        buf[threadIdx.x / VELA_WARP] = v;
    __syncthreads();
    T r = buf[0];
#pragma unroll
    for (int w = 1; w < SAMPLE_WARPS; w++)
        r = op(r, buf[w]);
    __syncthreads(); // buf is reused by the next reduction
    return r;
}

typedef cub::BlockScan<double, SAMPLE_THREADS> sample_scan_d;
typedef cub::BlockScan<int, SAMPLE_THREADS> sample_scan_i;

struct sample_chain_smem {
    double red_d[SAMPLE_WARPS];
    float red_f[SAMPLE_WARPS];
    int red_i[SAMPLE_WARPS];
    float stage[SAMPLE_STAGE];
    float cum; // top_p's running float sum
    int cut;   // top_p's kept prefix
    int found; // dist's pick
    sample_scan_d::TempStorage scan;
};

// The chain after top_k over m candidates in the order dist walks, raw
// logits lg[m] (shared or global memory); pbuf[m] is scratch. Returns the
// position of the pick. Mirrors sampler_chain step by step; where the host
// keeps a prefix, `kept` below is that prefix. All threads call it.
static __device__ int sample_chain(const float *lg, int m, const sample_row_dev &p, float *pbuf,
                                   sample_chain_smem &sm) {
    const int tid = threadIdx.x;

    // top_p (only on paths ordered by raw logit): softmax of the m raw
    // logits, then the shortest prefix whose float running sum, added in
    // order by one thread as the host does, reaches top_p.
    int m1 = m;
    if (!(p.top_p >= 1.0f)) {
        const float mx = lg[0];
        double s = 0;
        for (int i = tid; i < m; i += SAMPLE_THREADS) {
            const float e = sample_exp(lg[i] - mx);
            pbuf[i] = e;
            s += (double)e;
        }
        s = sample_block_reduce(s, sample_op_sum_d(), sm.red_d);
        for (int i = tid; i < m; i += SAMPLE_THREADS)
            pbuf[i] = (float)((double)pbuf[i] / s);
        if (tid == 0) {
            sm.cum = 0.0f;
            sm.cut = m;
        }
        __syncthreads();
        for (int base = 0; base < m; base += SAMPLE_STAGE) {
            const int n = min(SAMPLE_STAGE, m - base);
            for (int j = tid; j < n; j += SAMPLE_THREADS)
                sm.stage[j] = pbuf[base + j];
            __syncthreads();
            if (tid == 0) {
                float cum = sm.cum;
                for (int j = 0; j < n; j++) {
                    cum += sm.stage[j];
                    if (cum >= p.top_p) {
                        sm.cut = base + j + 1;
                        break;
                    }
                }
                sm.cum = cum;
            }
            __syncthreads();
            if (sm.cut != m)
                break;
        }
        m1 = sm.cut;
    }

    // min_p: logit >= max + logf(min_p) over the first m1; when none passes
    // (min_p > 1) the host keeps all.
    bool filter = false;
    float thr = 0.0f;
    if (!(p.min_p <= 0.0f)) {
        float mx = -INFINITY;
        for (int i = tid; i < m1; i += SAMPLE_THREADS)
            mx = fmaxf(mx, lg[i]);
        mx = sample_block_reduce(mx, sample_op_max_f(), sm.red_f);
        thr = mx + p.log_min_p;
        int n = 0;
        for (int i = tid; i < m1; i += SAMPLE_THREADS)
            n += lg[i] >= thr;
        n = sample_block_reduce(n, sample_op_sum_i(), sm.red_i);
        filter = n > 0;
    }
#define SAMPLE_KEPT(i) ((i) < m1 && (!filter || lg[i] >= thr))

    // temp, then dist: softmax over the kept candidates from the first kept
    // (the largest logit / temp), then the first whose cumulative sum exceeds u.
    int first = INT_MAX, last = -1;
    for (int i = tid; i < m1; i += SAMPLE_THREADS)
        if (SAMPLE_KEPT(i)) {
            first = min(first, i);
            last = max(last, i);
        }
    first = sample_block_reduce(first, sample_op_min_i(), sm.red_i);
    last = sample_block_reduce(last, sample_op_max_i(), sm.red_i);
    const float t = p.temp;
    const float mt = lg[first] / t;
    double s2 = 0;
    for (int i = first + tid; i <= last; i += SAMPLE_THREADS)
        if (SAMPLE_KEPT(i))
            s2 += (double)sample_exp(lg[i] / t - mt);
    s2 = sample_block_reduce(s2, sample_op_sum_d(), sm.red_d);
    if (tid == 0)
        sm.found = INT_MAX;
    __syncthreads();
    double carry = 0;
    for (int base = 0; base <= last; base += SAMPLE_THREADS) {
        const int i = base + tid;
        const bool kept = i <= last && SAMPLE_KEPT(i);
        const double x = kept ? (double)(float)((double)sample_exp(lg[i] / t - mt) / s2) : 0.0;
        double incl, total;
        sample_scan_d(sm.scan).InclusiveSum(x, incl, total);
        if (kept && p.u < carry + incl)
            atomicMin(&sm.found, i);
        __syncthreads();
        const int found = sm.found;
        __syncthreads(); // everyone has read `found` before the next tile's scan
        if (found != INT_MAX)
            break;
        carry += total;
    }
#undef SAMPLE_KEPT
    // Rounding left the sum at or below u: the last candidate takes it.
    return sm.found != INT_MAX ? sm.found : last;
}

// Ascending order of these keys = logit descending, then id ascending.
static __device__ __forceinline__ uint64_t sample_key(uint32_t ord, int id) {
    return ((uint64_t)(uint32_t)~ord << 32) | (uint32_t)id;
}

// A greedy row's chunk result in a candidate slot: the largest logit's bits
// and its index (INT_MAX: none, every value NaN).
static __device__ __forceinline__ uint64_t sample_pack_best(float v, int i) {
    return ((uint64_t)__float_as_uint(v) << 32) | (uint32_t)i;
}

// Block-wide argmax of (bv, bi) (argmax_merge's order); thread 0 gets it.
static __device__ __forceinline__ void sample_block_argmax(float *bv, int *bi, float *s_val,
                                                           int *s_idx) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(VELA_FULL_MASK, *bv, o);
        const int i = __shfl_xor_sync(VELA_FULL_MASK, *bi, o);
        argmax_merge(v, i, bv, bi);
    }
    if (tid % VELA_WARP == 0) {
        s_val[tid / VELA_WARP] = *bv;
        s_idx[tid / VELA_WARP] = *bi;
    }
    __syncthreads();
    if (tid == 0)
        for (int w = 1; w < SAMPLE_WARPS; w++)
            argmax_merge(s_val[w], s_idx[w], bv, bi);
}

// Warp 0 finds, in hist[256] counted in digit order `up` (ascending digits)
// or down (descending), the digit whose run holds rank kk (1-based) and the
// count before that run: *bucket, *before.
static __device__ __forceinline__ void sample_hist_pick(const int *hist, bool up, int kk,
                                                        int *bucket, int *before) {
    const int lane = threadIdx.x % VELA_WARP;
    // lane l owns 8 digits in walk order, from 8l
    int c[8], sum = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        c[j] = hist[up ? 8 * lane + j : 255 - 8 * lane - j];
        sum += c[j];
    }
    int incl = sum;
#pragma unroll
    for (int o = 1; o < VELA_WARP; o <<= 1) {
        const int y = __shfl_up_sync(VELA_FULL_MASK, incl, o);
        if (lane >= o)
            incl += y;
    }
    int above = incl - sum;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        if (above < kk && kk <= above + c[j]) {
            *bucket = up ? 8 * lane + j : 255 - 8 * lane - j;
            *before = above;
        }
        above += c[j];
    }
}

struct sample_local_smem {
    uint32_t ord[SAMPLE_CHUNK];
    int hist[256];
    int sel_bucket, sel_above, n_gt;
    float am_val[SAMPLE_WARPS];
    int am_idx[SAMPLE_WARPS];
    sample_scan_i::TempStorage iscan;
};

// Stage 1, grid (n_rows, n_chunks): the block of chunk c of row r writes
// into cand[r][c] (stride slots) the keys (sample_key) of the chunk's best
// min(k, chunk length) logits, unordered; a greedy row's block writes its
// argmax (sample_pack_best) into slot 0. Rows of the sort path are left
// alone.
__global__ static void __launch_bounds__(SAMPLE_THREADS)
    sample_local_kernel(uint64_t *__restrict__ cand /* [n_rows][n_chunks][stride] */,
                        const float *__restrict__ logits /* [n_rows][n_vocab] */, int n_vocab,
                        const sample_row_dev *__restrict__ rows /* [n_rows] */, int stride) {
    __shared__ sample_local_smem sm;
    const int tid = threadIdx.x, lane = tid % VELA_WARP;
    const sample_row_dev p = rows[blockIdx.x];
    if (p.mode != SAMPLE_GREEDY && p.mode != SAMPLE_TOPK)
        return;
    const int i0 = (int)blockIdx.y * SAMPLE_CHUNK;
    const int n = min(SAMPLE_CHUNK, n_vocab - i0);
    const float *row = logits + (size_t)blockIdx.x * n_vocab + i0;
    uint64_t *out = cand + ((size_t)blockIdx.x * gridDim.y + blockIdx.y) * stride;

    if (p.mode == SAMPLE_GREEDY) {
        float bv = -INFINITY;
        int bi = INT_MAX;
        for (int i = tid; i < n; i += SAMPLE_THREADS)
            argmax_merge(row[i], i0 + i, &bv, &bi);
        sample_block_argmax(&bv, &bi, sm.am_val, sm.am_idx);
        if (tid == 0)
            out[0] = sample_pack_best(bv, bi);
        return;
    }
    const int k = min(p.k, n);
    if (k == n) { // the whole chunk
        for (int i = tid; i < n; i += SAMPLE_THREADS)
            out[i] = sample_key(sample_ord(row[i]), i0 + i);
        return;
    }
    for (int i = tid; i < n; i += SAMPLE_THREADS)
        sm.ord[i] = sample_ord(row[i]);

    // Radix select of the k-th largest ord, 8 bits a pass from the top:
    // `prefix` holds its decided bits, kk its rank among the candidates left.
    uint32_t prefix = 0, mask = 0;
    int kk = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += SAMPLE_THREADS)
            sm.hist[b] = 0;
        __syncthreads();
        // Whole warps iterate together so lanes of one digit add once.
        for (int base = 0; base < n; base += SAMPLE_THREADS) {
            const int i = base + tid;
            int digit = 256; // none
            if (i < n) {
                const uint32_t o = sm.ord[i];
                if ((o & mask) == prefix)
                    digit = (int)((o >> shift) & 255u);
            }
            const unsigned int peers = __match_any_sync(VELA_FULL_MASK, digit);
            if (digit < 256 && lane == __ffs(peers) - 1)
                atomicAdd(&sm.hist[digit], __popc(peers));
        }
        __syncthreads();
        if (tid < VELA_WARP)
            sample_hist_pick(sm.hist, false, kk, &sm.sel_bucket, &sm.sel_above);
        __syncthreads();
        prefix |= (uint32_t)sm.sel_bucket << shift;
        mask |= 255u << shift;
        kk -= sm.sel_above;
        __syncthreads(); // hist and sel_* are rewritten by the next pass
    }

    // The k: every ord above the k-th, and the kk lowest ids of ord == k-th
    // (ranked in index order by a block scan, tile by tile).
    const uint32_t kth = prefix;
    const int n_gt = k - kk;
    if (tid == 0)
        sm.n_gt = 0;
    __syncthreads();
    int eq_base = 0;
    for (int base = 0; base < n; base += SAMPLE_THREADS) {
        const int i = base + tid;
        uint32_t o = 0;
        bool gt = false, eq = false;
        if (i < n) {
            o = sm.ord[i];
            gt = o > kth;
            eq = o == kth;
        }
        if (gt) {
            const int s = atomicAdd(&sm.n_gt, 1);
            if (s < n_gt)
                out[s] = sample_key(o, i0 + i);
        }
        const int n_eq = __syncthreads_count(eq);
        if (n_eq > 0 && eq_base < kk) {
            int rank;
            sample_scan_i(sm.iscan).ExclusiveSum(eq ? 1 : 0, rank);
            if (eq && eq_base + rank < kk)
                out[n_gt + eq_base + rank] = sample_key(o, i0 + i);
            __syncthreads(); // iscan is reused by the next tile
        }
        eq_base += n_eq;
    }
}

struct sample_topk_smem {
    uint64_t key[SAMPLE_MAX_K]; // the k selected, unordered
    float lg[SAMPLE_MAX_K];     // sorted
    int id[SAMPLE_MAX_K];       // sorted
    float p[SAMPLE_MAX_K];
    int hist[256];
    int sel_bucket, sel_above, n_sel;
    float am_val[SAMPLE_WARPS];
    int am_idx[SAMPLE_WARPS];
    sample_chain_smem chain;
};

// Stage 2, one block per row: the row's pick from its chunks' candidates
// (sample_local_kernel). Rows of the sort path are left to the kernels below.
__global__ static void __launch_bounds__(SAMPLE_THREADS)
    sample_topk_kernel(int32_t *__restrict__ out /* [n_rows] */,
                       const float *__restrict__ logits /* [n_rows][n_vocab] */, int n_vocab,
                       const sample_row_dev *__restrict__ rows /* [n_rows] */,
                       const uint64_t *__restrict__ cand /* [n_rows][n_chunks][stride] */,
                       int n_chunks, int stride) {
    __shared__ sample_topk_smem sm;
    const int tid = threadIdx.x;
    const sample_row_dev p = rows[blockIdx.x];
    if (p.mode != SAMPLE_GREEDY && p.mode != SAMPLE_TOPK)
        return;
    const float *row = logits + (size_t)blockIdx.x * n_vocab;
    const uint64_t *cr = cand + (size_t)blockIdx.x * n_chunks * stride;

    if (p.mode == SAMPLE_GREEDY) {
        float bv = -INFINITY;
        int bi = INT_MAX;
        for (int c = tid; c < n_chunks; c += SAMPLE_THREADS) {
            const uint64_t b = cr[(size_t)c * stride];
            argmax_merge(__uint_as_float((uint32_t)(b >> 32)), (int)(uint32_t)b, &bv, &bi);
        }
        sample_block_argmax(&bv, &bi, sm.am_val, sm.am_idx);
        if (tid == 0)
            out[blockIdx.x] = bi == INT_MAX ? 0 : bi;
        return;
    }

    // The k smallest keys among the candidates: chunk c holds
    // min(k, its length) of them. Keys are distinct (the id is in them), so
    // a radix select over all 64 bits, 8 a pass from the top, ends on the
    // k-th key itself and the k are the keys up to it.
    const int k = p.k;
    const int n_cand = n_chunks * stride;
#define SAMPLE_CAND_OK(f)                                                                          \
    ((f) % stride < min(k, min(SAMPLE_CHUNK, n_vocab - (f) / stride * SAMPLE_CHUNK)))
    uint64_t prefix = 0, mask = 0;
    int kk = k;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += SAMPLE_THREADS)
            sm.hist[b] = 0;
        __syncthreads();
        for (int f = tid; f < n_cand; f += SAMPLE_THREADS) {
            if (!SAMPLE_CAND_OK(f))
                continue;
            const uint64_t key = cr[f];
            if ((key & mask) == prefix)
                atomicAdd(&sm.hist[(int)((key >> shift) & 255u)], 1);
        }
        __syncthreads();
        if (tid < VELA_WARP)
            sample_hist_pick(sm.hist, true, kk, &sm.sel_bucket, &sm.sel_above);
        __syncthreads();
        prefix |= (uint64_t)sm.sel_bucket << shift;
        mask |= (uint64_t)255u << shift;
        kk -= sm.sel_above;
        __syncthreads(); // hist and sel_* are rewritten by the next pass
    }
    if (tid == 0)
        sm.n_sel = 0;
    __syncthreads();
    for (int f = tid; f < n_cand; f += SAMPLE_THREADS) {
        if (!SAMPLE_CAND_OK(f))
            continue;
        const uint64_t key = cr[f];
        if (key <= prefix)
            sm.key[atomicAdd(&sm.n_sel, 1)] = key;
    }
#undef SAMPLE_CAND_OK
    __syncthreads();

    // Sort the k by rank (keys are distinct: the id is in them).
    for (int a = tid; a < k; a += SAMPLE_THREADS) {
        const uint64_t ka = sm.key[a];
        int rank = 0;
        for (int b = 0; b < k; b++)
            rank += sm.key[b] < ka;
        const int id = (int)(uint32_t)ka;
        sm.id[rank] = id;
        sm.lg[rank] = row[id];
    }
    __syncthreads();
    const int pos = sample_chain(sm.lg, k, p, sm.p, sm.chain);
    if (tid == 0)
        out[blockIdx.x] = sm.id[pos];
}

// Sort path, step 1: one key per logit of each row of the chunk, so that one
// ascending radix sort orders every row (its slot in the high bits) by its
// value descending (logit, or logit / temp), then id ascending.
__global__ static void __launch_bounds__(SAMPLE_KEYS_THREADS)
    sample_sort_keys_kernel(uint64_t *__restrict__ keys /* [n_slots][n_vocab] */,
                            const float *__restrict__ logits /* [n_rows][n_vocab] */, int n_vocab,
                            const sample_row_dev *__restrict__ rows /* [n_rows] */,
                            const int *__restrict__ slot_rows /* [n_slots] */, int id_bits) {
    const int s = blockIdx.y;
    const int r = slot_rows[s];
    const int i = blockIdx.x * SAMPLE_KEYS_THREADS + threadIdx.x;
    if (i >= n_vocab)
        return;
    float v = logits[(size_t)r * n_vocab + i];
    if (rows[r].mode == SAMPLE_SORT_TEMP)
        v = v / rows[r].temp; // the host sorts after temp here: ties it makes go to the lower id
    keys[(size_t)s * n_vocab + i] = ((uint64_t)s << (32 + id_bits)) |
                                    ((uint64_t)(uint32_t)~sample_ord(v) << id_bits) | (uint64_t)i;
}

// Sort path, step 2: the chain over each sorted row. work: the sort's other
// buffer, [n_slots][2][n_vocab] floats (the sorted raw logits, then pbuf).
__global__ static void __launch_bounds__(SAMPLE_THREADS)
    sample_sorted_kernel(int32_t *__restrict__ out /* [n_rows] */,
                         const float *__restrict__ logits /* [n_rows][n_vocab] */, int n_vocab,
                         const sample_row_dev *__restrict__ rows /* [n_rows] */,
                         const int *__restrict__ slot_rows /* [n_slots] */,
                         const uint64_t *__restrict__ keys /* [n_slots][n_vocab], sorted */,
                         float *work, int id_bits) {
    __shared__ sample_chain_smem sm;
    const int s = blockIdx.x;
    const int r = slot_rows[s];
    const sample_row_dev p = rows[r];
    const uint64_t *ks = keys + (size_t)s * n_vocab;
    const uint64_t id_mask = ((uint64_t)1 << id_bits) - 1;
    const float *row = logits + (size_t)r * n_vocab;
    float *lg = work + (size_t)s * 2 * n_vocab;
    float *pbuf = lg + n_vocab;
    const int m = p.k;
    for (int i = threadIdx.x; i < m; i += SAMPLE_THREADS)
        lg[i] = row[ks[i] & id_mask];
    __syncthreads();
    const int pos = sample_chain(lg, m, p, pbuf, sm);
    if (threadIdx.x == 0)
        out[r] = (int32_t)(ks[pos] & id_mask);
}

// --- host side -----------------------------------------------------------------

static int sample_bits(int64_t n) { // bits to hold 0..n-1
    int b = 0;
    while (b < 62 && ((int64_t)1 << b) < n)
        b++;
    return b;
}

static size_t sample_align(size_t x) {
    return (x + 255) & ~(size_t)255;
}

struct sample_plan {
    int n_sort; // rows on the sort path
    int chunk;  // of them per sort
    int id_bits;
    int n_block;          // greedy and top-k rows (the two stages)
    int n_chunks, stride; // the first stage's chunks per row, candidate slots per chunk
    size_t off_list, off_cand, off_keys0, off_keys1, off_temp, temp_bytes, total;
};

static int sample_mode_of(const struct cuda_sample_row *q, int n_vocab, int *k) {
    if (q->temp <= 0) {
        *k = 0;
        return SAMPLE_GREEDY;
    }
    if (q->top_k > 0 && (q->top_k < n_vocab ? q->top_k : n_vocab) <= SAMPLE_MAX_K) {
        *k = q->top_k < n_vocab ? q->top_k : n_vocab;
        return SAMPLE_TOPK;
    }
    *k = q->top_k > 0 && q->top_k < n_vocab ? q->top_k : n_vocab;
    // With top_k and top_p off the host's dist sorts after temp (sampler_chain).
    return q->top_k <= 0 && q->top_p >= 1.0f ? SAMPLE_SORT_TEMP : SAMPLE_SORT_RAW;
}

static int sample_sort_temp_bytes(int n_items, int end_bit, size_t *bytes, struct verr *err) {
    cub::DoubleBuffer<uint64_t> db(NULL, NULL);
    *bytes = 0;
    VELA_CUDA_CALL(err, cub::DeviceRadixSort::SortKeys(NULL, *bytes, db, n_items, 0, end_bit));
    return VERR_OK;
}

static int sample_plan_make(int n_rows, int n_vocab, const struct cuda_sample_row *rows,
                            struct sample_plan *pl, struct verr *err) {
    memset(pl, 0, sizeof *pl);
    pl->stride = 1; // a greedy row's argmax
    for (int r = 0; r < n_rows; r++) {
        int k;
        const int mode = sample_mode_of(&rows[r], n_vocab, &k);
        pl->n_sort += mode >= SAMPLE_SORT_RAW;
        pl->n_block += mode < SAMPLE_SORT_RAW;
        if (mode == SAMPLE_TOPK && (k < SAMPLE_CHUNK ? k : SAMPLE_CHUNK) > pl->stride)
            pl->stride = k < SAMPLE_CHUNK ? k : SAMPLE_CHUNK;
    }
    pl->n_chunks = (int)(((int64_t)n_vocab + SAMPLE_CHUNK - 1) / SAMPLE_CHUNK);
    if (pl->n_block > 0 && pl->n_chunks > 65535)
        return verr_set(err, VERR_RANGE,
                        "sample: n_vocab %d (greedy and top-k rows take at most %d)", n_vocab,
                        65535 * SAMPLE_CHUNK);
    size_t off = sample_align((size_t)n_rows * sizeof(struct sample_row_dev));
    pl->off_list = off;
    off += sample_align((size_t)(pl->n_sort > 0 ? pl->n_sort : 1) * sizeof(int));
    pl->off_cand = off;
    if (pl->n_block > 0)
        off += sample_align((size_t)n_rows * pl->n_chunks * pl->stride * sizeof(uint64_t));
    if (pl->n_sort > 0) {
        int chunk = SAMPLE_SORT_ITEMS / n_vocab;
        chunk = chunk < 1 ? 1 : chunk > SAMPLE_SORT_MAX_ROWS ? SAMPLE_SORT_MAX_ROWS : chunk;
        pl->chunk = chunk < pl->n_sort ? chunk : pl->n_sort;
        pl->id_bits = sample_bits(n_vocab) > 0 ? sample_bits(n_vocab) : 1;
        const size_t keys = sample_align((size_t)pl->chunk * n_vocab * sizeof(uint64_t));
        pl->off_keys0 = off;
        pl->off_keys1 = off + keys;
        pl->off_temp = off + 2 * keys;
        // The full chunk and the last, shorter one.
        const int sizes[2] = {pl->chunk, pl->n_sort % pl->chunk};
        for (int j = 0; j < 2; j++) {
            if (sizes[j] == 0)
                continue;
            size_t b;
            const int end_bit = 32 + pl->id_bits + sample_bits(sizes[j]);
            int rc = sample_sort_temp_bytes(sizes[j] * n_vocab, end_bit, &b, err);
            if (rc)
                return rc;
            pl->temp_bytes = b > pl->temp_bytes ? b : pl->temp_bytes;
        }
        off = pl->off_temp + sample_align(pl->temp_bytes);
    }
    pl->total = off;
    return VERR_OK;
}

extern "C" int cuda_sample_scratch_bytes(int n_rows, int n_vocab,
                                         const struct cuda_sample_row *rows, size_t *bytes,
                                         struct verr *err) {
    *bytes = 0;
    if (n_rows <= 0)
        return VERR_OK;
    if (n_vocab <= 0)
        return verr_set(err, VERR_RANGE, "sample: n_vocab %d", n_vocab);
    struct sample_plan pl;
    int rc = sample_plan_make(n_rows, n_vocab, rows, &pl, err);
    if (rc)
        return rc;
    *bytes = pl.total;
    return VERR_OK;
}

extern "C" int cuda_sample_rows(int32_t *out, const float *logits, int n_rows, int n_vocab,
                                const struct cuda_sample_row *rows, void *scratch,
                                size_t scratch_bytes, cudaStream_t stream, struct verr *err) {
    if (n_rows <= 0)
        return VERR_OK;
    if (n_vocab <= 0)
        return verr_set(err, VERR_RANGE, "sample: n_vocab %d", n_vocab);
    struct sample_plan pl;
    int rc = sample_plan_make(n_rows, n_vocab, rows, &pl, err);
    if (rc)
        return rc;
    if (!scratch || scratch_bytes < pl.total)
        return verr_set(err, VERR_RANGE, "sample: scratch of %zu bytes, %zu needed", scratch_bytes,
                        pl.total);

    // The rows and the sort path's row list, staged on the host and copied:
    // a pageable source is read before cudaMemcpyAsync returns.
    char *host = (char *)malloc(pl.off_cand);
    if (!host)
        return verr_set(err, VERR_NOMEM, "sample: out of host memory");
    struct sample_row_dev *hr = (struct sample_row_dev *)host;
    int *hl = (int *)(host + pl.off_list);
    int n_sort = 0, n_block = 0;
    for (int r = 0; r < n_rows; r++) {
        const struct cuda_sample_row *q = &rows[r];
        int k;
        const int mode = sample_mode_of(q, n_vocab, &k);
        hr[r] = (struct sample_row_dev){q->u, q->temp, q->top_p, q->min_p, q->log_min_p, mode, k};
        if (mode >= SAMPLE_SORT_RAW)
            hl[n_sort++] = r;
        else
            n_block++;
    }
    char *dev = (char *)scratch;
    const struct sample_row_dev *d_rows = (const struct sample_row_dev *)dev;
    const int *d_list = (const int *)(dev + pl.off_list);
    cudaError_t e = cudaMemcpyAsync(dev, host, pl.off_list + (size_t)n_sort * sizeof(int),
                                    cudaMemcpyHostToDevice, stream);
    free(host);
    if (e != cudaSuccess)
        return verr_set(err, VERR_BACKEND, "sample: cudaMemcpyAsync of the rows: %s (%s:%d)",
                        cudaGetErrorString(e), __FILE__, __LINE__);

    if (n_block > 0) {
        uint64_t *d_cand = (uint64_t *)(dev + pl.off_cand);
        const dim3 grid((unsigned int)n_rows, (unsigned int)pl.n_chunks);
        sample_local_kernel<<<grid, SAMPLE_THREADS, 0, stream>>>(d_cand, logits, n_vocab, d_rows,
                                                                 pl.stride);
        VELA_CHECK_LAUNCH(err, "sample_local_kernel");
        sample_topk_kernel<<<(unsigned int)n_rows, SAMPLE_THREADS, 0, stream>>>(
            out, logits, n_vocab, d_rows, d_cand, pl.n_chunks, pl.stride);
        VELA_CHECK_LAUNCH(err, "sample_topk_kernel");
    }
    for (int c0 = 0; c0 < n_sort; c0 += pl.chunk) {
        const int n_slots = n_sort - c0 < pl.chunk ? n_sort - c0 : pl.chunk;
        const dim3 grid(ceil_div_u(n_vocab, SAMPLE_KEYS_THREADS), (unsigned int)n_slots);
        cub::DoubleBuffer<uint64_t> db((uint64_t *)(dev + pl.off_keys0),
                                       (uint64_t *)(dev + pl.off_keys1));
        sample_sort_keys_kernel<<<grid, SAMPLE_KEYS_THREADS, 0, stream>>>(
            db.Current(), logits, n_vocab, d_rows, d_list + c0, pl.id_bits);
        VELA_CHECK_LAUNCH(err, "sample_sort_keys_kernel");
        size_t temp_bytes = pl.temp_bytes;
        const int end_bit = 32 + pl.id_bits + sample_bits(n_slots);
        VELA_CUDA_CALL(err, cub::DeviceRadixSort::SortKeys(dev + pl.off_temp, temp_bytes, db,
                                                           n_slots * n_vocab, 0, end_bit, stream));
        sample_sorted_kernel<<<(unsigned int)n_slots, SAMPLE_THREADS, 0, stream>>>(
            out, logits, n_vocab, d_rows, d_list + c0, db.Current(), (float *)db.Alternate(),
            pl.id_bits);
        VELA_CHECK_LAUNCH(err, "sample_sorted_kernel");
    }
    return VERR_OK;
}
