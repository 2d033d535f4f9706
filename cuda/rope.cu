// RoPE with the YaRN ramp (llama.cpp's semantics, host/backend/rope.h), the fused
// rotate-and-store into KV cache cells, and the KV shift over all layers.
//
// The angle of pair i is formed exactly as the CPU reference forms it: the
// running product pos * theta_scale^i (i float multiplications, not powf),
// divided by the frequency factor, then the YaRN mix. Products and sums that
// the host evaluates without FMA use __fmul_rn/__fadd_rn here so nvcc cannot
// contract them; theta_scale, the corr dims and mscale come from the host.
// What remains different is cosf/sinf (CUDA's are within 2 ulp, glibc's
// within 1), so results agree to a few float ulps of |x|.
#include <limits.h>

#include "cuda/hadamard.cuh"
#include "cuda/kv_quant.cuh"
#include "cuda/launch.cuh"
#include "cuda/rope.cuh"
#include "cuda/rope.h"

#define ROPE_THREADS 64
#define ROPE_SHIFT_THREADS 128

static __device__ __forceinline__ void store_as(float *p, float v) {
    *p = v;
}
static __device__ __forceinline__ void store_as(__half *p, float v) {
    *p = __float2half_rn(v);
}
static __device__ __forceinline__ float load_as(const float *p) {
    return *p;
}
static __device__ __forceinline__ float load_as(const __half *p) {
    return __half2float(*p);
}

// Rotates one head xh in place to position p; kc (or NULL): where the
// rotated pairs are also stored.
template <typename KT>
static __device__ __forceinline__ void rope_head(float *xh, float p, const struct cuda_rope &c,
                                                 KT *kc) {
    for (int i = threadIdx.x; i < c.n_rot / 2; i += ROPE_THREADS) {
        float cs, sn, y0, y1;
        rope_cos_sin(c, p, i, &cs, &sn);
        int e0, e1;
        rope_pair(c.mode, c.n_rot, i, &e0, &e1);
        rope_rotate(xh[e0], xh[e1], cs, sn, &y0, &y1);
        xh[e0] = y0;
        xh[e1] = y1;
        if (kc) {
            store_as(kc + e0, y0);
            store_as(kc + e1, y1);
        }
    }
}

// One block per (token, head). STORE: also writes the rotated K row and the V
// row into cache cell cells[t] (KT, VT: cache element types), and the first
// n_qblk = n_tok * n_head_q blocks rotate the query heads q in place (Q's rope
// folded into the same launch).
template <bool STORE, typename KT, typename VT>
__global__ static void __launch_bounds__(ROPE_THREADS)
    rope_kernel(float *__restrict__ x /* [n_tok][n_head][head_dim] */,
                const int32_t *__restrict__ pos /* [n_tok] */, int n_head, int head_dim,
                const struct cuda_rope c, const float *__restrict__ v /* [n_tok][n_head][hdv] */,
                KT *__restrict__ k_cache /* [n_ctx][n_head][head_dim] */,
                VT *__restrict__ v_cache /* [n_ctx][n_head][hdv] */,
                const int32_t *__restrict__ cells /* [n_tok] */, int head_dim_v,
                float *__restrict__ q /* [n_tok][n_head_q][head_dim] or NULL */, int n_head_q,
                int64_t n_qblk) {
    cuda_pdl_wait();
    if (STORE && (int64_t)blockIdx.x < n_qblk) { // uniform per block
        const int64_t t = blockIdx.x / n_head_q;
        rope_head<float>(q + (size_t)blockIdx.x * head_dim, (float)pos[t], c, nullptr);
        return;
    }
    const int64_t th = blockIdx.x - (STORE ? n_qblk : 0); // t * n_head + h
    const int64_t t = th / n_head, h = th % n_head;
    float *xh = x + (size_t)th * head_dim;
    KT *kc = nullptr;
    if (STORE)
        kc = k_cache + ((size_t)cells[t] * n_head + h) * head_dim;
    rope_head<KT>(xh, (float)pos[t], c, kc);
    if (STORE) {
        for (int d = c.n_rot + threadIdx.x; d < head_dim; d += ROPE_THREADS)
            store_as(kc + d, xh[d]);
        const float *vh = v + (size_t)th * head_dim_v;
        VT *vc = v_cache + ((size_t)cells[t] * n_head + h) * head_dim_v;
        for (int d = threadIdx.x; d < head_dim_v; d += ROPE_THREADS)
            store_as(vc + d, vh[d]);
    }
}

// A block-quantized cache has no encoding for inf or NaN (the CPU store
// refuses them): a block that meets one in x [n] of token t marks *bad with
// INT_MAX - t (atomicMax: the lowest t wins), which the backend reads at its
// next sync. Float caches store them as they are.
static __device__ __forceinline__ void kvq_flag_nonfinite(int type, const float *x, int n,
                                                          int64_t t, int *bad) {
    if (!bad || type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16)
        return;
    bool ok = true;
    for (int i = threadIdx.x; i < n; i += ROPE_THREADS)
        ok &= isfinite(x[i]);
    if (!ok)
        atomicMax(bad, INT_MAX - (int)t);
}

// rope_kernel<true, ...> for caches of any type (cuda/kv_quant.cuh; the
// quantized ones and bf16, which the float kernels do not take): K is
// rotated in place in x first, then the block encodes the rotated K row and
// the V row of its (token, head) into cell cells[t] (a block of 32 values a
// thread: gguf/quant.c's quantizer, the same bits as the CPU store).
__global__ static void __launch_bounds__(ROPE_THREADS)
    rope_kvq_kernel(float *__restrict__ x /* [n_tok][n_head][head_dim] */,
                    const int32_t *__restrict__ pos /* [n_tok] */, int n_head, int head_dim,
                    const struct cuda_rope c,
                    const float *__restrict__ v /* [n_tok][n_head][hdv] */,
                    uint8_t *__restrict__ k_cache /* [n_ctx][n_head] rows of head_dim */,
                    int type_k, uint8_t *__restrict__ v_cache /* [n_ctx][n_head] rows of hdv */,
                    int type_v, const int32_t *__restrict__ cells /* [n_tok] */, int head_dim_v,
                    float *__restrict__ q /* [n_tok][n_head_q][head_dim] or NULL */, int n_head_q,
                    int64_t n_qblk, int *__restrict__ bad) {
    if ((int64_t)blockIdx.x < n_qblk) { // uniform per block
        const int64_t t = blockIdx.x / n_head_q;
        rope_head<float>(q + (size_t)blockIdx.x * head_dim, (float)pos[t], c, nullptr);
        return;
    }
    const int64_t th = blockIdx.x - n_qblk; // t * n_head + h
    const int64_t t = th / n_head, h = th % n_head;
    float *xh = x + (size_t)th * head_dim;
    rope_head<float>(xh, (float)pos[t], c, nullptr);
    __syncthreads(); // the rotated row, written by every thread, before it is encoded
    const size_t row = (size_t)cells[t] * n_head + h;
    kvq_flag_nonfinite(type_k, xh, head_dim, t, bad);
    kvq_flag_nonfinite(type_v, v + (size_t)th * head_dim_v, head_dim_v, t, bad);
    kvq_store_row(type_k, xh, k_cache + row * kvq_row_bytes(type_k, head_dim), head_dim,
                  threadIdx.x, ROPE_THREADS);
    kvq_store_row(type_v, v + (size_t)th * head_dim_v,
                  v_cache + row * kvq_row_bytes(type_v, head_dim_v), head_dim_v, threadIdx.x,
                  ROPE_THREADS);
}

// The store of a cache that keeps K and V Hadamard-rotated
// (backend_ops.rope_kv_store_rot): one block per (token, head) as
// rope_kvq_kernel, the head staged in shared memory (s [head_dim +
// head_dim_v]): RoPE'd there, Hadamard-rotated with block rot_k (q, K) or
// rot_v (V) (hadamard_shared, scale rot_scale_*), written back in place and,
// for K and V, encoded into cell cells[t]. The arithmetic of the op-by-op
// sequence (rope_kernel, hadamard_kernel, rope_kvq_kernel), so the same bits.
__global__ static void __launch_bounds__(ROPE_THREADS)
    rope_kvq_rot_kernel(float *__restrict__ x /* [n_tok][n_head][head_dim] */,
                        const int32_t *__restrict__ pos /* [n_tok] */, int n_head, int head_dim,
                        const struct cuda_rope c, float *__restrict__ v /* [n_tok][n_head][hdv] */,
                        uint8_t *__restrict__ k_cache /* [n_ctx][n_head] rows of head_dim */,
                        int type_k, uint8_t *__restrict__ v_cache /* [n_ctx][n_head] rows of hdv */,
                        int type_v, const int32_t *__restrict__ cells /* [n_tok] */, int head_dim_v,
                        float *__restrict__ q /* [n_tok][n_head_q][head_dim] or NULL */,
                        int n_head_q, int64_t n_qblk, int rot_k, float rot_scale_k, int rot_v,
                        float rot_scale_v, int *__restrict__ bad) {
    extern __shared__ float s[];                    // [head_dim + head_dim_v]
    const bool is_q = (int64_t)blockIdx.x < n_qblk; // uniform per block
    const int64_t th = is_q ? (int64_t)blockIdx.x : (int64_t)blockIdx.x - n_qblk;
    const int nh = is_q ? n_head_q : n_head;
    const int64_t t = th / nh, h = th % nh;
    float *xh = (is_q ? q : x) + (size_t)th * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += ROPE_THREADS)
        s[d] = xh[d];
    __syncthreads();
    rope_head<float>(s, (float)pos[t], c, nullptr);
    if (rot_k)
        hadamard_shared(s, head_dim, rot_k, rot_scale_k, threadIdx.x, ROPE_THREADS);
    else
        __syncthreads();
    for (int d = threadIdx.x; d < head_dim; d += ROPE_THREADS)
        xh[d] = s[d];
    if (is_q)
        return;
    const size_t row = (size_t)cells[t] * n_head + h;
    kvq_flag_nonfinite(type_k, s, head_dim, t, bad);
    kvq_store_row(type_k, s, k_cache + row * kvq_row_bytes(type_k, head_dim), head_dim, threadIdx.x,
                  ROPE_THREADS);
    float *sv = s + head_dim, *vh = v + (size_t)th * head_dim_v;
    for (int d = threadIdx.x; d < head_dim_v; d += ROPE_THREADS)
        sv[d] = vh[d];
    if (rot_v)
        hadamard_shared(sv, head_dim_v, rot_v, rot_scale_v, threadIdx.x, ROPE_THREADS);
    else
        __syncthreads();
    for (int d = threadIdx.x; d < head_dim_v; d += ROPE_THREADS)
        vh[d] = sv[d];
    kvq_flag_nonfinite(type_v, sv, head_dim_v, t, bad);
    kvq_store_row(type_v, sv, v_cache + row * kvq_row_bytes(type_v, head_dim_v), head_dim_v,
                  threadIdx.x, ROPE_THREADS);
}

// Grid (n_ctx, n_layer): the block of cell c rotates all heads of that cell in
// one layer by delta[c] positions; blocks of cells with delta 0 exit at once.
template <typename KT>
__global__ static void __launch_bounds__(ROPE_SHIFT_THREADS)
    rope_shift_kernel(KT *__restrict__ k_cache /* [n_layer][n_ctx][n_head_kv][head_dim] */,
                      const int32_t *__restrict__ delta /* [n_ctx] */, int n_ctx, int n_head_kv,
                      int head_dim, const struct cuda_rope c) {
    const int cell = blockIdx.x;
    const int dlt = delta[cell];
    if (dlt == 0)
        return;
    KT *row = k_cache + ((size_t)blockIdx.y * n_ctx + cell) * (size_t)n_head_kv * head_dim;
    const int n_pairs = c.n_rot / 2;
    for (int idx = threadIdx.x; idx < n_head_kv * n_pairs; idx += ROPE_SHIFT_THREADS) {
        const int h = idx / n_pairs, i = idx % n_pairs;
        float cs, sn, y0, y1;
        rope_cos_sin(c, (float)dlt, i, &cs, &sn);
        int e0, e1;
        rope_pair(c.mode, c.n_rot, i, &e0, &e1);
        KT *kh = row + (size_t)h * head_dim;
        rope_rotate(load_as(kh + e0), load_as(kh + e1), cs, sn, &y0, &y1);
        store_as(kh + e0, y0);
        store_as(kh + e1, y1);
    }
}

// rope_shift_kernel for K caches of any type (cuda/kv_quant.cuh): the
// cell's row of all heads is decoded into shared memory (srow [n_head_kv *
// head_dim] floats), rotated there and encoded again, as the CPU's kv_shift
// (one more rounding for a quantized K a shift). rot_block > 0: the row is
// Hadamard-rotated (kv_shift's contract), rotated back before RoPE and
// again after it, with rot_scale as the hadamard op's scale.
__global__ static void __launch_bounds__(ROPE_SHIFT_THREADS)
    rope_shift_kvq_kernel(uint8_t *__restrict__ k_cache /* [n_layer][n_ctx] rows */, int type_k,
                          const int32_t *__restrict__ delta /* [n_ctx] */, int n_ctx, int n_head_kv,
                          int head_dim, const struct cuda_rope c, int rot_block, float rot_scale) {
    extern __shared__ float srow[];
    const int cell = blockIdx.x;
    const int dlt = delta[cell];
    if (dlt == 0)
        return;
    const int n = n_head_kv * head_dim;
    uint8_t *row = k_cache + ((size_t)blockIdx.y * n_ctx + cell) * kvq_row_bytes(type_k, n);
    for (int i = threadIdx.x; i < n; i += ROPE_SHIFT_THREADS)
        srow[i] = kvq_get1(kvq_ptr{row, type_k, (size_t)i});
    __syncthreads();
    if (rot_block)
        hadamard_shared(srow, n, rot_block, rot_scale, threadIdx.x, ROPE_SHIFT_THREADS);
    const int n_pairs = c.n_rot / 2;
    for (int idx = threadIdx.x; idx < n_head_kv * n_pairs; idx += ROPE_SHIFT_THREADS) {
        const int h = idx / n_pairs, i = idx % n_pairs;
        float cs, sn;
        rope_cos_sin(c, (float)dlt, i, &cs, &sn);
        int e0, e1;
        rope_pair(c.mode, c.n_rot, i, &e0, &e1);
        float *kh = srow + (size_t)h * head_dim;
        rope_rotate(kh[e0], kh[e1], cs, sn, &kh[e0], &kh[e1]);
    }
    __syncthreads(); // every head rotated before the row is encoded
    if (rot_block)
        hadamard_shared(srow, n, rot_block, rot_scale, threadIdx.x, ROPE_SHIFT_THREADS);
    kvq_store_row(type_k, srow, row, n, threadIdx.x, ROPE_SHIFT_THREADS);
}

template <typename KT, typename VT>
static int rope_launch_store(float *x, const int32_t *pos, int n_tok, int n_head, int head_dim,
                             const struct cuda_rope *c, const float *v, void *k_cache,
                             void *v_cache, const int32_t *cells, int head_dim_v, float *q,
                             int n_head_q, bool pdl, cudaStream_t stream, struct verr *err) {
    const int64_t n_qblk = q ? (int64_t)n_tok * n_head_q : 0;
    const int64_t blocks = n_qblk + (int64_t)n_tok * n_head;
    if (blocks > INT32_MAX)
        return verr_set(err, VERR_RANGE, "rope_kv_store: %lld (token, head) blocks",
                        (long long)blocks);
    cuda_launch(pdl, rope_kernel<true, KT, VT>, (unsigned int)blocks, ROPE_THREADS, 0, stream, x,
                pos, n_head, head_dim, *c, v, (KT *)k_cache, (VT *)v_cache, cells, head_dim_v, q,
                n_head_q, n_qblk);
    VELA_CHECK_LAUNCH(err, "rope_kernel<store>");
    return VERR_OK;
}

static bool rope_cache_type_ok(enum ggml_type t) {
    return t == GGML_TYPE_F32 || t == GGML_TYPE_F16;
}

extern "C" int cuda_rope_apply(float *x, const int32_t *pos, int n_tok, int n_head, int head_dim,
                               const struct cuda_rope *c, const float *v, void *k_cache,
                               enum ggml_type type_k, void *v_cache, enum ggml_type type_v,
                               const int32_t *cells, int head_dim_v, float *q, int n_head_q,
                               void *bad, bool pdl, cudaStream_t stream, struct verr *err) {
    if (n_tok <= 0 || n_head <= 0)
        return VERR_OK;
    if (q && (!k_cache || n_head_q <= 0))
        return verr_set(err, VERR_RANGE, "rope: q (%d heads) goes only with the KV store",
                        n_head_q);
    // n_rot 0 with the store: K and V stored as they are (the unrotated cache).
    if ((c->n_rot < 2 && !(k_cache && c->n_rot == 0)) || c->n_rot % 2 || c->n_rot > head_dim)
        return verr_set(err, VERR_RANGE, "rope: n_rot %d must be even and in [2, %d]", c->n_rot,
                        head_dim);
    if (!k_cache) {
        cuda_launch(pdl, rope_kernel<false, float, float>, (unsigned int)((int64_t)n_tok * n_head),
                    ROPE_THREADS, 0, stream, x, pos, n_head, head_dim, *c, (const float *)nullptr,
                    (float *)nullptr, (float *)nullptr, (const int32_t *)nullptr, 0,
                    (float *)nullptr, 0, (int64_t)0);
        VELA_CHECK_LAUNCH(err, "rope_kernel");
        return VERR_OK;
    }
    if (!kvq_is_cache_type(type_k) || !kvq_is_cache_type(type_v) || head_dim % kvq_block(type_k) ||
        head_dim_v % kvq_block(type_v))
        return verr_set(err, VERR_UNSUPPORTED,
                        "rope_kv_store: cache types %s/%s with head dims %d/%d (f32, f16, bf16, "
                        "or q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl with head dims multiples of 32)",
                        ggml_type_name(type_k), ggml_type_name(type_v), head_dim, head_dim_v);
    if (!rope_cache_type_ok(type_k) || !rope_cache_type_ok(type_v)) {
        const int64_t n_qblk = q ? (int64_t)n_tok * n_head_q : 0;
        const int64_t blocks = n_qblk + (int64_t)n_tok * n_head;
        if (blocks > INT32_MAX)
            return verr_set(err, VERR_RANGE, "rope_kv_store: %lld (token, head) blocks",
                            (long long)blocks);
        rope_kvq_kernel<<<(unsigned int)blocks, ROPE_THREADS, 0, stream>>>(
            x, pos, n_head, head_dim, *c, v, (uint8_t *)k_cache, type_k, (uint8_t *)v_cache, type_v,
            cells, head_dim_v, q, n_head_q, n_qblk, (int *)bad);
        VELA_CHECK_LAUNCH(err, "rope_kvq_kernel");
        return VERR_OK;
    }
    const bool k16 = type_k == GGML_TYPE_F16, v16 = type_v == GGML_TYPE_F16;
    if (k16 && v16)
        return rope_launch_store<__half, __half>(x, pos, n_tok, n_head, head_dim, c, v, k_cache,
                                                 v_cache, cells, head_dim_v, q, n_head_q, pdl,
                                                 stream, err);
    if (k16)
        return rope_launch_store<__half, float>(x, pos, n_tok, n_head, head_dim, c, v, k_cache,
                                                v_cache, cells, head_dim_v, q, n_head_q, pdl,
                                                stream, err);
    if (v16)
        return rope_launch_store<float, __half>(x, pos, n_tok, n_head, head_dim, c, v, k_cache,
                                                v_cache, cells, head_dim_v, q, n_head_q, pdl,
                                                stream, err);
    return rope_launch_store<float, float>(x, pos, n_tok, n_head, head_dim, c, v, k_cache, v_cache,
                                           cells, head_dim_v, q, n_head_q, pdl, stream, err);
}

extern "C" int cuda_rope_store_rotated(float *x, const int32_t *pos, int n_tok, int n_head,
                                       int head_dim, const struct cuda_rope *c, float *v,
                                       void *k_cache, enum ggml_type type_k, void *v_cache,
                                       enum ggml_type type_v, const int32_t *cells, int head_dim_v,
                                       float *q, int n_head_q, int rot_k, int rot_v, void *bad,
                                       cudaStream_t stream, struct verr *err) {
    if (n_tok <= 0 || n_head <= 0)
        return VERR_OK;
    const auto block_ok = [](int n, int b) {
        return b == 0 || (b >= 2 && b <= 1024 && (b & (b - 1)) == 0 && n % b == 0);
    };
    if (!block_ok(head_dim, rot_k) || !block_ok(head_dim_v, rot_v))
        return verr_set(err, VERR_RANGE,
                        "rope_kv_store_rot: rotation blocks %d/%d for head dims %d/%d (0 or a "
                        "power of two in [2, 1024] dividing the head dim)",
                        rot_k, rot_v, head_dim, head_dim_v);
    if (q && n_head_q <= 0)
        return verr_set(err, VERR_RANGE, "rope_kv_store_rot: q with %d heads", n_head_q);
    if (c->n_rot % 2 || c->n_rot < 0 || c->n_rot > head_dim)
        return verr_set(err, VERR_RANGE, "rope_kv_store_rot: n_rot %d must be even and in [0, %d]",
                        c->n_rot, head_dim);
    if (!kvq_is_cache_type(type_k) || !kvq_is_cache_type(type_v) || head_dim % kvq_block(type_k) ||
        head_dim_v % kvq_block(type_v))
        return verr_set(err, VERR_UNSUPPORTED,
                        "rope_kv_store_rot: cache types %s/%s with head dims %d/%d (f32, f16, "
                        "bf16, or q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl with head dims multiples "
                        "of 32)",
                        ggml_type_name(type_k), ggml_type_name(type_v), head_dim, head_dim_v);
    const size_t smem = (size_t)(head_dim + head_dim_v) * sizeof(float);
    if (smem > 48 * 1024)
        return verr_set(err, VERR_UNSUPPORTED,
                        "rope_kv_store_rot: head dims %d + %d (at most %d floats of shared memory)",
                        head_dim, head_dim_v, 48 * 1024 / 4);
    const int64_t n_qblk = q ? (int64_t)n_tok * n_head_q : 0;
    const int64_t blocks = n_qblk + (int64_t)n_tok * n_head;
    if (blocks > INT32_MAX)
        return verr_set(err, VERR_RANGE, "rope_kv_store_rot: %lld (token, head) blocks",
                        (long long)blocks);
    // the hadamard op's scales (host sqrtf), so both give the same bits
    const float sk = rot_k ? 1.0f / sqrtf((float)rot_k) : 1.0f;
    const float sv = rot_v ? 1.0f / sqrtf((float)rot_v) : 1.0f;
    rope_kvq_rot_kernel<<<(unsigned int)blocks, ROPE_THREADS, smem, stream>>>(
        x, pos, n_head, head_dim, *c, v, (uint8_t *)k_cache, type_k, (uint8_t *)v_cache, type_v,
        cells, head_dim_v, q, n_head_q, n_qblk, rot_k, sk, rot_v, sv, (int *)bad);
    VELA_CHECK_LAUNCH(err, "rope_kvq_rot_kernel");
    return VERR_OK;
}

extern "C" int cuda_rope_shift_kv(void *k_cache, enum ggml_type type_k, const int32_t *delta,
                                  int n_layer, int n_ctx, int n_head_kv, int head_dim,
                                  const struct cuda_rope *c, int rot_block, cudaStream_t stream,
                                  struct verr *err) {
    if (n_layer <= 0 || n_ctx <= 0 || n_head_kv <= 0)
        return VERR_OK;
    if (rot_block && (rot_block < 2 || rot_block > 1024 || (rot_block & (rot_block - 1)) ||
                      head_dim % rot_block || rope_cache_type_ok(type_k)))
        return verr_set(err, VERR_RANGE,
                        "kv_shift: rotation block %d with a %s K of head dim %d (a quantized K "
                        "and a power of two in [2, 1024] dividing the head dim)",
                        rot_block, ggml_type_name(type_k), head_dim);
    if (n_layer > 65535)
        return verr_set(err, VERR_RANGE, "kv_shift: %d layers (at most 65535)", n_layer);
    if (c->n_rot < 2 || c->n_rot % 2 || c->n_rot > head_dim)
        return verr_set(err, VERR_RANGE, "kv_shift: n_rot %d must be even and in [2, %d]", c->n_rot,
                        head_dim);
    const dim3 grid((unsigned int)n_ctx, (unsigned int)n_layer);
    if (type_k == GGML_TYPE_F16) {
        rope_shift_kernel<__half><<<grid, ROPE_SHIFT_THREADS, 0, stream>>>(
            (__half *)k_cache, delta, n_ctx, n_head_kv, head_dim, *c);
        VELA_CHECK_LAUNCH(err, "rope_shift_kernel<f16>");
    } else if (type_k == GGML_TYPE_F32) {
        rope_shift_kernel<float><<<grid, ROPE_SHIFT_THREADS, 0, stream>>>(
            (float *)k_cache, delta, n_ctx, n_head_kv, head_dim, *c);
        VELA_CHECK_LAUNCH(err, "rope_shift_kernel<f32>");
    } else if (kvq_is_cache_type(type_k) && head_dim % kvq_block(type_k) == 0) {
        const size_t smem = (size_t)n_head_kv * head_dim * sizeof(float);
        if (smem > 48 * 1024)
            return verr_set(err, VERR_UNSUPPORTED,
                            "kv_shift: a %s cell of %d x %d values (at most %d decoded in "
                            "48 KiB of shared memory)",
                            ggml_type_name(type_k), n_head_kv, head_dim, 48 * 1024 / 4);
        rope_shift_kvq_kernel<<<grid, ROPE_SHIFT_THREADS, smem, stream>>>(
            (uint8_t *)k_cache, type_k, delta, n_ctx, n_head_kv, head_dim, *c, rot_block,
            rot_block ? 1.0f / sqrtf((float)rot_block) : 1.0f); // the CPU's scale (host sqrtf)
        VELA_CHECK_LAUNCH(err, "rope_shift_kvq_kernel");
    } else {
        return verr_set(err, VERR_UNSUPPORTED,
                        "kv_shift: cache type %s with head dim %d (f32, f16, bf16, or a "
                        "quantized type with head dims multiples of 32)",
                        ggml_type_name(type_k), head_dim);
    }
    return VERR_OK;
}
