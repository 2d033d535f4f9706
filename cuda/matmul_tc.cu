// Fused quantized GEMM on tensor cores for small and medium batches
// (CUDA_MATVEC_MAX_TOK < n_tok <= cuda_matmul_tc_max_tok()): the weights are
// read from HBM once per launch (per 128 tokens), decoded tile by tile into
// shared memory as f16 and multiplied with WMMA m16n16k16 (f16 A/B, f32
// accumulators). Numerics are those of the dequant + cuBLAS path of
// matmul.cu: weights decoded by dequant.cuh (bit-identical to the host
// decoder) then rounded to f16, activations rounded to f16 (by the caller,
// with the same conversion kernel), products accumulated in f32.
//
// Why: the cuBLAS path writes the whole matrix as f16 to scratch and reads it
// back (4 bytes of traffic per weight on top of the 0.56..1.06 bytes of the
// quantized weight); for a batch of tens of tokens that traffic, not the
// math, sets the time.
//
// Work decomposition. A block owns BM = 16 * MT output rows (32 or 64) and
// up to `tpb` tokens (128, fewer on GPUs with less shared memory; blockIdx.y
// walks further token chunks, each re-reading the weights). It walks n_in in
// tiles of TC_BK = 256 elements (one K-quant block, eight 32-blocks):
//   raw stage: the tile's raw weight bytes of the BM rows, copied with
//     16-byte cp.async from 16-byte aligned addresses (a row's bytes start
//     anywhere mod 16: the copy starts at the aligned address below and the
//     decoder reads at the same offset mod 16 inside the 16-byte aligned
//     smem row, so dequant.cuh's alignment contract holds as in global
//     memory; MXFP4's 17-byte blocks, at any byte, are read by bytes);
//     TC_WSTAGES = 3 stages, two tiles in flight ahead of the one being
//     decoded;
//   activation stage: the tile's f16 activations of the block's tokens
//     ([tok][TC_LDH] halves, cp.async, 2 stages, one tile ahead);
//   decode: every thread decodes whole 32-element sub-blocks
//     (dequant_sub32) from the raw stage into one f16 tile [BM][TC_LDH];
//   mma: warp w owns row tile w % MT and token tiles w / MT + (8 / MT) j,
//     j < MT (accumulators: MT fragments of 8 floats per lane); token tiles
//     past the block's tokens are skipped (warp-uniform).
// One iteration: wait for the raw tile kt and activation tile kt; barrier;
// issue activation tile kt+1 then raw tile kt+2 (each its own commit group,
// so wait_prior(1) at the next iteration leaves only raw kt+2 in flight);
// decode tile kt; barrier; mma. Buffers written after the first barrier of
// iteration kt were last read before it (raw stage (kt+2)%3 by the decode
// of kt-1, activation stage (kt+1)%2 and the f16 tile by the mma of kt-1).
// Edges: rows past n_out are neither copied nor decoded and tokens past
// n_tok neither copied; their smem holds stale values that only reach
// accumulator entries that are never stored. A last K tile shorter than 256
// (32-element types) copies, decodes and multiplies only its whole 32-element
// sub-blocks (k steps of 16), so nothing past n_in is read.
// Epilogue: accumulators go through smem (col-major [tok][BM + 4] floats, in
// the activation stages) so that each token's BM outputs are written as one
// coalesced run; out = acc (+ bias[o]) or out = out + acc: the same
// expressions, hence the same roundings, as the cuBLAS GEMM followed by
// matmul_add_bias_kernel, or matmul followed by the add op.
#include <atomic>
#include <stdlib.h>

#include <cuda_pipeline_primitives.h>
#include <mma.h>

#include "cuda/dequant.cuh"
#include "cuda/matmul_tc.h"

#define TC_THREADS 256
#define TC_WARPS (TC_THREADS / VELA_WARP)
#define TC_BK 256
#define TC_LDH (TC_BK + 8) // halves; +16 bytes per row staggers the banks of WMMA row loads
#define TC_TOK_MAX 128     // tokens per block at most (8 column tiles)
#define TC_WSTAGES 3

// Raw bytes of one row's tile, and the smem stride that holds them from any
// start offset mod 16 (whole 16-byte chunks).
template <int T> struct tc_raw {
    static constexpr int tile_bytes = TC_BK / qtype<T>::block * qtype<T>::bytes;
    static constexpr int chunks = (tile_bytes + 15 + 15) / 16;
    static constexpr int stride = chunks * 16;
};

// Shared memory of one block: raw stages, the f16 weight tile, two
// activation stages of tpb tokens (which the epilogue reuses).
// Static shared memory of the kernel (its token rows), which the opt-in
// limit covers too.
#define TC_STATIC_SMEM (2 * TC_TOK_MAX * 4)

template <int T, int MT> static size_t tc_smem_bytes(int tpb) {
    constexpr int BM = 16 * MT;
    return (size_t)TC_WSTAGES * BM * tc_raw<T>::stride + (size_t)BM * TC_LDH * 2 +
           (size_t)2 * tpb * TC_LDH * 2;
}

// The grouped form's tiles (cuda_matmul_q_tc_grouped); tiles NULL: a plain
// GEMM, blockIdx.y the token chunk.
struct tc_group {
    const int32_t *tiles;   // [gridDim.y][2]: expert (-1: no tile), first index into order
    const int32_t *offsets; // [n_expert + 1]
    const int32_t *order;   // [n_pairs]
    size_t expert_bytes;    // one expert's matrix
    int x_div;
};

template <int T, int MT>
__global__ static void __launch_bounds__(TC_THREADS, 1)
    matmul_tc_kernel(float *__restrict__ out /* [n_tok][n_out] */,
                     const uint8_t *__restrict__ w /* [n_out] rows of row_bytes */,
                     size_t row_bytes, int64_t n_in, int64_t n_out,
                     const __half *__restrict__ xh /* [n_tok][n_in] */,
                     const float *__restrict__ bias /* [n_out] or NULL */, int n_tok, int tpb,
                     int accumulate, const tc_group grp) {
    using namespace nvcuda;
    constexpr int BM = 16 * MT;
    constexpr int TB = tc_raw<T>::tile_bytes, CH = tc_raw<T>::chunks, RS = tc_raw<T>::stride;
    constexpr int WN = TC_WARPS / MT; // warps side by side along the tokens
    constexpr int LDO = BM + 4;       // epilogue floats per token
    static_assert(TC_WARPS % MT == 0 && (TC_TOK_MAX / 16) % WN == 0, "warp layout");
    static_assert((TC_TOK_MAX / 16) / WN == MT, "fragments per warp");

    extern __shared__ __align__(128) unsigned char tc_smem[];
    uint8_t *raw = tc_smem;                                          // [3][BM][RS]
    __half *wh = (__half *)(tc_smem + (size_t)TC_WSTAGES * BM * RS); // [BM][TC_LDH]
    __half *act = wh + (size_t)BM * TC_LDH;                          // [2][tpb][TC_LDH]
    float *stage = (float *)act;                                     // [tpb][LDO]

    // The block's tokens: activation row xrow[t] and output row orow[t] of
    // its t-th token (a plain GEMM: chunk blockIdx.y; grouped: one tile of
    // one expert's pairs, in the order of grp.order).
    __shared__ int xrow[TC_TOK_MAX], orow[TC_TOK_MAX];
    const int tid = threadIdx.x, warp = tid / VELA_WARP;
    const int64_t o0 = (int64_t)blockIdx.x * BM;
    int tok_n;
    if (grp.tiles) {
        const int e = grp.tiles[2 * blockIdx.y], first = grp.tiles[2 * blockIdx.y + 1];
        if (e < 0)
            return; // past the last tile: uniform per block
        tok_n = min(tpb, grp.offsets[e + 1] - first);
        if (tok_n <= 0)
            return; // uniform per block
        w += (size_t)e * grp.expert_bytes;
        for (int t = tid; t < tok_n; t += TC_THREADS) {
            const int p = grp.order[first + t];
            xrow[t] = p / grp.x_div;
            orow[t] = p;
        }
    } else {
        const int t0 = blockIdx.y * tpb;
        tok_n = min(tpb, n_tok - t0);
        for (int t = tid; t < tok_n; t += TC_THREADS)
            xrow[t] = orow[t] = t0 + t;
    }
    __syncthreads();
    const int ntt = (tok_n + 15) / 16;
    const int rows = (int)min((int64_t)BM, n_out - o0);
    const int nk = (int)((n_in + TC_BK - 1) / TC_BK);
    const size_t mat_end = (size_t)n_out * row_bytes;

    // Raw weight tile kt of the block's rows into stage kt % 3. Only the
    // matrix's last chunk can extend past its end: its valid bytes are copied
    // with plain loads and the rest zeroed (cp.async's zero-fill form reads
    // no more than its source size, but compute-sanitizer flags it as a
    // 16-byte read past the allocation). Plain stores are seen by the decode
    // after the same wait + __syncthreads as the asynchronous copies.
    auto issue_raw = [&](int kt) {
        uint8_t *dst = raw + (size_t)(kt % TC_WSTAGES) * BM * RS;
        const size_t k_off = (size_t)kt * TB;
        const int len = (int)min((size_t)TB, row_bytes - k_off);
        for (int i = tid; i < rows * CH; i += TC_THREADS) {
            const int r = i / CH, c = i % CH;
            const size_t s = (size_t)(o0 + r) * row_bytes + k_off;
            const size_t a = (s & ~(size_t)15) + 16 * (size_t)c;
            if (c < (int)(((s & 15) + len + 15) >> 4)) {
                uint8_t *d = dst + (size_t)r * RS + 16 * c;
                const size_t valid = mat_end - a;
                if (valid >= 16) {
                    __pipeline_memcpy_async(d, w + a, 16);
                } else {
                    for (int b = 0; b < 16; b++)
                        d[b] = b < (int)valid ? w[a + b] : 0;
                }
            }
        }
    };
    // f16 activation tile kt of the block's tokens into stage kt % 2
    // (n_in is a multiple of 32: the tile is whole 16-byte chunks).
    auto issue_act = [&](int kt) {
        __half *dst = act + (size_t)(kt & 1) * tpb * TC_LDH;
        const int64_t k0 = (int64_t)kt * TC_BK;
        const int nch = (int)min((int64_t)TC_BK, n_in - k0) / 8;
        for (int i = tid; i < tok_n * (TC_BK / 8); i += TC_THREADS) {
            const int t = i / (TC_BK / 8), c = i % (TC_BK / 8);
            if (c < nch)
                __pipeline_memcpy_async(dst + (size_t)t * TC_LDH + 8 * c,
                                        xh + (size_t)xrow[t] * n_in + k0 + 8 * c, 16);
        }
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[MT];
#pragma unroll
    for (int j = 0; j < MT; j++)
        wmma::fill_fragment(acc[j], 0.0f);
    const int mt = warp % MT, nt0 = warp / MT;

    issue_act(0);
    __pipeline_commit();
    issue_raw(0);
    __pipeline_commit();
    if (nk > 1)
        issue_raw(1);
    __pipeline_commit();

    for (int kt = 0; kt < nk; kt++) {
        __pipeline_wait_prior(1);
        __syncthreads();
        if (kt + 1 < nk)
            issue_act(kt + 1);
        __pipeline_commit();
        if (kt + 2 < nk)
            issue_raw(kt + 2);
        __pipeline_commit();

        // decode: sub-block sb of row r, written as four 16-byte stores
        const int nsb = (int)min((int64_t)TC_BK, n_in - (int64_t)kt * TC_BK) / 32;
        const uint8_t *src = raw + (size_t)(kt % TC_WSTAGES) * BM * RS;
        for (int i = tid; i < BM * (TC_BK / 32); i += TC_THREADS) {
            const int r = i / (TC_BK / 32), sb = i % (TC_BK / 32);
            if (r >= rows || sb >= nsb)
                continue;
            const size_t s = (size_t)(o0 + r) * row_bytes + (size_t)kt * TB;
            float v[32];
            dequant_sub32<T>(src + (size_t)r * RS + (s & 15), sb, v);
            uint4 *d = (uint4 *)(wh + (size_t)r * TC_LDH + sb * 32);
#pragma unroll
            for (int q = 0; q < 4; q++) {
                __half2 h[4];
#pragma unroll
                for (int e = 0; e < 4; e++)
                    h[e] = __floats2half2_rn(v[8 * q + 2 * e], v[8 * q + 2 * e + 1]);
                uint4 u;
                u.x = *(uint32_t *)&h[0];
                u.y = *(uint32_t *)&h[1];
                u.z = *(uint32_t *)&h[2];
                u.w = *(uint32_t *)&h[3];
                d[q] = u;
            }
        }
        __syncthreads();

        if (nt0 < ntt) {
            const __half *a_tile = act + (size_t)(kt & 1) * tpb * TC_LDH;
            for (int ks = 0; ks < nsb * 2; ks++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
                wmma::load_matrix_sync(fa, wh + (size_t)mt * 16 * TC_LDH + ks * 16, TC_LDH);
#pragma unroll
                for (int j = 0; j < MT; j++) {
                    const int nt = nt0 + WN * j;
                    if (nt < ntt) {
                        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
                        wmma::load_matrix_sync(fb, a_tile + (size_t)nt * 16 * TC_LDH + ks * 16,
                                               TC_LDH);
                        wmma::mma_sync(acc[j], fa, fb, acc[j]);
                    }
                }
            }
        }
    }

    // Epilogue (only empty commit groups can still be pending; the stages
    // are reused once every warp is past its last mma).
    __pipeline_wait_prior(0);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < MT; j++) {
        const int nt = nt0 + WN * j;
        if (nt < ntt)
            wmma::store_matrix_sync(stage + (size_t)nt * 16 * LDO + mt * 16, acc[j], LDO,
                                    wmma::mem_col_major);
    }
    __syncthreads();
    for (int i = tid; i < tok_n * BM; i += TC_THREADS) {
        const int t = i / BM, r = i % BM;
        if (r >= rows)
            continue;
        float v = stage[(size_t)t * LDO + r];
        float *o = out + (size_t)orow[t] * n_out + o0 + r;
        if (bias)
            v = v + bias[o0 + r];
        if (accumulate)
            v = *o + v;
        *o = v;
    }
}

// ---------------------------------------------------------------------------
// launcher

struct tc_plan {
    int mt;      // 2 or 4: BM = 32 or 64 rows per block
    int tpb;     // tokens per block
    size_t smem; // dynamic shared memory
};

template <int T, int MT> static size_t tc_smem_most(void) {
    return tc_smem_bytes<T, MT>(TC_TOK_MAX);
}

// BM = 64 when that still gives every SM a block (fewer activation re-reads
// per weight byte: each block reads all its tokens' activations once), else
// BM = 32 (7B-class 4096-row matrices: 128 blocks instead of 64). Tokens per
// block: 128, halved until the block fits the device's opt-in shared memory
// (tpb_fixed > 0: exactly that many, else no plan).
template <int T>
static int tc_make_plan(int64_t n_out, int n_tok, int sm_count, int smem_optin, int tpb_fixed,
                        struct tc_plan *p) {
    int tpb = tpb_fixed > 0 ? tpb_fixed : TC_TOK_MAX;
    while (!tpb_fixed && tpb > 16 && tpb / 2 >= n_tok)
        tpb /= 2; // a block's activation stages need not exceed the batch
    const int64_t chunks = (n_tok + tpb - 1) / tpb;
    int mt = (n_out + 63) / 64 * chunks >= sm_count ? 4 : 2;
    for (;;) {
        const size_t s = mt == 4 ? tc_smem_bytes<T, 4>(tpb) : tc_smem_bytes<T, 2>(tpb);
        if (s + TC_STATIC_SMEM <= (size_t)smem_optin) {
            p->mt = mt;
            p->tpb = tpb;
            p->smem = s;
            return 0;
        }
        if (mt == 4)
            mt = 2;
        else if (!tpb_fixed && tpb > 16)
            tpb /= 2;
        else
            return -1;
    }
}

template <int T, int MT>
static int tc_launch(const struct tc_plan *p, float *out, const void *w, size_t row_bytes,
                     int64_t n_in, int64_t n_out, const __half *xh, const float *bias, int n_tok,
                     int accumulate, const tc_group &grp, unsigned int grid_y, int dev,
                     int smem_optin, cudaStream_t stream, struct verr *err) {
    // Raised once per device to the most any call asks for (capped by the
    // device's opt-in limit), so a call recorded into a CUDA graph makes no
    // attribute call (devices >= 64 set it every time).
    static std::atomic<unsigned long long> raised{0};
    if (p->smem > 48 * 1024) {
        const unsigned long long bit = dev < 64 ? 1ull << dev : 0;
        if (!bit || !(raised.load() & bit)) {
            size_t most = tc_smem_most<T, MT>();
            if (most > (size_t)smem_optin - TC_STATIC_SMEM)
                most = (size_t)smem_optin - TC_STATIC_SMEM;
            VELA_CUDA_CALL(err, cudaFuncSetAttribute(matmul_tc_kernel<T, MT>,
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     (int)most));
            raised.fetch_or(bit);
        }
    }
    const dim3 grid(ceil_div_u(n_out, 16 * MT), grid_y);
    matmul_tc_kernel<T, MT><<<grid, TC_THREADS, p->smem, stream>>>(
        out, (const uint8_t *)w, row_bytes, n_in, n_out, xh, bias, n_tok, p->tpb, accumulate, grp);
    VELA_CHECK_LAUNCH(err, "matmul_tc_kernel");
    return VERR_OK;
}

// tc_launch with the plan's BM.
template <int T>
static int tc_launch_plan(const struct tc_plan *p, float *out, const void *w, size_t row_bytes,
                          int64_t n_in, int64_t n_out, const __half *xh, const float *bias,
                          int n_tok, int accumulate, const tc_group &grp, unsigned int grid_y,
                          int dev, int smem_optin, cudaStream_t stream, struct verr *err) {
    if (p->mt == 4)
        return tc_launch<T, 4>(p, out, w, row_bytes, n_in, n_out, xh, bias, n_tok, accumulate, grp,
                               grid_y, dev, smem_optin, stream, err);
    return tc_launch<T, 2>(p, out, w, row_bytes, n_in, n_out, xh, bias, n_tok, accumulate, grp,
                           grid_y, dev, smem_optin, stream, err);
}

// Device facts the plan needs: compute capability (WMMA needs 7.0), SM
// count, opt-in shared memory per block; queried once per device (< 64).
struct tc_dev_info {
    std::atomic<int> ready;
    int cc_major, sm_count, smem_optin;
};
static tc_dev_info tc_dev_cache[64];

static int tc_device(int *dev, int *cc_major, int *sm_count, int *smem_optin, struct verr *err) {
    VELA_CUDA_CALL(err, cudaGetDevice(dev));
    tc_dev_info *c = *dev >= 0 && *dev < 64 ? &tc_dev_cache[*dev] : nullptr;
    if (c && c->ready.load(std::memory_order_acquire)) {
        *cc_major = c->cc_major;
        *sm_count = c->sm_count;
        *smem_optin = c->smem_optin;
        return VERR_OK;
    }
    VELA_CUDA_CALL(err, cudaDeviceGetAttribute(cc_major, cudaDevAttrComputeCapabilityMajor, *dev));
    VELA_CUDA_CALL(err, cudaDeviceGetAttribute(sm_count, cudaDevAttrMultiProcessorCount, *dev));
    VELA_CUDA_CALL(
        err, cudaDeviceGetAttribute(smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, *dev));
    if (c) { // racing writers store the same values
        c->cc_major = *cc_major;
        c->sm_count = *sm_count;
        c->smem_optin = *smem_optin;
        c->ready.store(1, std::memory_order_release);
    }
    return VERR_OK;
}

// What both launches (plain and grouped) check and ask the device before
// planning: the weight rows are whole blocks, the weights and activations
// 16-byte aligned, the row tiles countable in an int, and the device has
// tensor cores. `what` names the entry point in the messages.
struct tc_target {
    size_t row_bytes;
    int dev, sm_count, smem_optin;
};

static int tc_prepare(const char *what, const void *w, enum ggml_type type, int64_t n_in,
                      int64_t n_out, const uint16_t *xh, struct tc_target *d, struct verr *err) {
    d->row_bytes = ggml_row_bytes(type, n_in);
    if (d->row_bytes == 0)
        return verr_set(err, VERR_RANGE, "%s: %s row of %lld elements is not whole blocks", what,
                        ggml_type_name(type), (long long)n_in);
    if ((((uintptr_t)w | (uintptr_t)xh) & 15u) != 0)
        return verr_set(err, VERR_RANGE, "%s: weights %p / activations %p are not 16-byte aligned",
                        what, w, (const void *)xh);
    if ((n_out + 31) / 32 > INT32_MAX)
        return verr_set(err, VERR_RANGE, "%s: %lld rows are too many", what, (long long)n_out);
    int cc_major = 0;
    const int rc = tc_device(&d->dev, &cc_major, &d->sm_count, &d->smem_optin, err);
    if (rc)
        return rc;
    if (cc_major < 7)
        return verr_set(err, VERR_UNSUPPORTED, "%s: compute capability %d.x has no tensor cores",
                        what, cc_major);
    return VERR_OK;
}

extern "C" int cuda_matmul_q_tc(float *out, const void *w, enum ggml_type type, int64_t n_in,
                                int64_t n_out, const uint16_t *xh, const float *bias, int n_tok,
                                int accumulate, cudaStream_t stream, struct verr *err) {
    if (n_tok <= 0 || n_out <= 0)
        return VERR_OK;
    if (accumulate && bias)
        return verr_set(err, VERR_RANGE, "matmul_tc: accumulate with a bias is not supported");
    struct tc_target d;
    int rc = tc_prepare("matmul_tc", w, type, n_in, n_out, xh, &d, err);
    if (rc)
        return rc;
    const size_t row_bytes = d.row_bytes;
    const int dev = d.dev, sm_count = d.sm_count, smem_optin = d.smem_optin;
    const __half *x16 = (const __half *)xh;
    auto run = [&](auto tc) -> int {
        constexpr int T = decltype(tc)::value;
        struct tc_plan p;
        if (tc_make_plan<T>(n_out, n_tok, sm_count, smem_optin, 0, &p) != 0)
            return verr_set(err, VERR_UNSUPPORTED,
                            "matmul_tc: %d bytes of shared memory per block are too few",
                            smem_optin);
        const tc_group none = {};
        const unsigned int gy = ceil_div_u(n_tok, p.tpb);
        return tc_launch_plan<T>(&p, out, w, row_bytes, n_in, n_out, x16, bias, n_tok, accumulate,
                                 none, gy, dev, smem_optin, stream, err);
    };
    rc = VELA_DISPATCH_QTYPE_MX(type, run, 1);
    if (rc == 1)
        return verr_set(err, VERR_UNSUPPORTED, "matmul_tc: weight type %s is not supported",
                        ggml_type_name(type));
    return rc;
}

// The types the fused kernel decodes (cuda_matmul_tc_takes without the
// batch threshold): VELA_DISPATCH_QTYPE_MX's.
static bool tc_type_ok(enum ggml_type type) {
    auto yes = [](auto) -> int { return 1; };
    return VELA_DISPATCH_QTYPE_MX(type, yes, 0) == 1;
}

extern "C" int cuda_matmul_tc_group_tpb(enum ggml_type type, int want) {
    if (!tc_type_ok(type) || want < 16)
        return 0;
    int dev = 0, cc_major = 0, sm_count = 0, smem_optin = 0;
    struct verr err = {0};
    if (tc_device(&dev, &cc_major, &sm_count, &smem_optin, &err) != VERR_OK) {
        (void)cudaGetLastError();
        return 0;
    }
    if (cc_major < 7)
        return 0;
    int tpb = TC_TOK_MAX;
    while (tpb > want)
        tpb /= 2;
    auto fits = [&](auto tc) -> int {
        constexpr int T = decltype(tc)::value;
        for (; tpb >= 16; tpb /= 2) {
            struct tc_plan p;
            if (tc_make_plan<T>(1, tpb, sm_count, smem_optin, tpb, &p) == 0)
                return tpb;
        }
        return 0;
    };
    return VELA_DISPATCH_QTYPE_MX(type, fits, 0);
}

extern "C" int cuda_matmul_q_tc_grouped(float *out, const void *w, enum ggml_type type,
                                        int64_t n_in, int64_t n_out, const uint16_t *xh,
                                        const struct cuda_tc_groups *g, cudaStream_t stream,
                                        struct verr *err) {
    if (n_out <= 0 || !g || g->n_tiles <= 0)
        return VERR_OK;
    if (!g->tiles || !g->offsets || !g->order || g->x_div < 1 || g->n_tiles > 65535 ||
        (g->tpb != 16 && g->tpb != 32 && g->tpb != 64 && g->tpb != 128))
        return verr_set(err, VERR_RANGE,
                        "matmul_tc grouped: %d tiles of %d tokens, x_div %d (need the tables, "
                        "at most 65535 tiles of 16, 32, 64 or 128 tokens, x_div >= 1)",
                        g->n_tiles, g->tpb, g->x_div);
    struct tc_target d;
    int rc = tc_prepare("matmul_tc grouped", w, type, n_in, n_out, xh, &d, err);
    if (rc)
        return rc;
    const size_t row_bytes = d.row_bytes;
    const int dev = d.dev, sm_count = d.sm_count, smem_optin = d.smem_optin;
    const tc_group grp = {g->tiles, g->offsets, g->order, (size_t)n_out * row_bytes, g->x_div};
    const __half *x16 = (const __half *)xh;
    auto run = [&](auto tc) -> int {
        constexpr int T = decltype(tc)::value;
        struct tc_plan p;
        // BM as for a plain GEMM of n_tiles chunks (most tiles are real
        // when the groups are large, where the choice matters)
        if (tc_make_plan<T>(n_out, g->n_tiles * g->tpb, sm_count, smem_optin, g->tpb, &p) != 0)
            return verr_set(err, VERR_UNSUPPORTED,
                            "matmul_tc grouped: %d tokens per block do not fit %d bytes of "
                            "shared memory",
                            g->tpb, smem_optin);
        const unsigned int gy = (unsigned int)g->n_tiles;
        return tc_launch_plan<T>(&p, out, w, row_bytes, n_in, n_out, x16, NULL, 0, 0, grp, gy, dev,
                                 smem_optin, stream, err);
    };
    rc = VELA_DISPATCH_QTYPE_MX(type, run, 1);
    if (rc == 1)
        return verr_set(err, VERR_UNSUPPORTED, "matmul_tc grouped: weight type %s is not supported",
                        ggml_type_name(type));
    return rc;
}

// ---------------------------------------------------------------------------
// the threshold cuda_matmul_apply consults

static std::atomic<int> tc_max_tok_override{-1};

extern "C" int cuda_matmul_tc_max_tok(void) {
    const int o = tc_max_tok_override.load();
    return o >= 0 ? o : CUDA_MATMUL_TC_MAX_TOK;
}

extern "C" void cuda_matmul_tc_set_max_tok(int n) {
    tc_max_tok_override.store(n < 0 ? -1 : n);
}

extern "C" int cuda_matmul_tc_takes(enum ggml_type type, int n_tok) {
    if (n_tok <= 0 || n_tok > cuda_matmul_tc_max_tok())
        return 0;
    if (!tc_type_ok(type))
        return 0;
    int dev = 0, cc_major = 0, sm_count = 0, smem_optin = 0;
    struct verr err = {0};
    if (tc_device(&dev, &cc_major, &sm_count, &smem_optin, &err) != VERR_OK) {
        (void)cudaGetLastError();
        return 0;
    }
    return cc_major >= 7;
}
