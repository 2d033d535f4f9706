// RoPE inside attn_kernel: the unrotated cache mode and exact self-extend
// (host/ops/selfextend.h is the rule). The block's query rows are rotated
// once in shared memory, each K tile as it is loaded: near at the token's /
// cell's position, and with G > 1 also far (q at floor(i/G) + W - floor(W/G),
// k at floor(j/G)) into a second copy. Each key is read from memory once,
// as in the rotated-K mode; the extra work is arithmetic: per tile of
// ATTN_BK cells and KV head, ATTN_BK * n_rot/2 (x2 with G > 1) cos/sin pairs
// with their running products, and per block the same for its query rows.
// attn_tc_kernel (prefill on tensor cores) does the same on its f16 tiles:
// the rotated q and K are rounded to f16 as its q * scale already is, and
// with G > 1 it runs the Q K^T product twice (near and far).
// G and W per query token (cuda_attn.q_se): W and the far query are per row
// anyway; the far K tile depends on G, so a block lists the distinct G > 1
// of its rows (attn_se_list_build) and rotates its K tile once per entry:
// entry 0 together with the near rotation (the uniform case: as with one G
// for the call), every further entry from the cache again (attn_se_far_k,
// attn_se_tc_far_k) between two more barriers. Each row takes its far
// scores from the pass of its own G, so a row's bits are those of a call
// with its (G, W) for every token.
// Included by attention.cu after its ATTN_* constants.
#ifndef VELA_CUDA_ATTENTION_SE_CUH
#define VELA_CUDA_ATTENTION_SE_CUH

#include "cuda/rope.cuh"
#include "host/ops/selfextend.h"

// Item k of one head of head_dim floats: pair k of the rotated dims
// (k < n_rot/2) rotated at pos_n into yn and at pos_f into yf (NULL: near
// only), or dim n_rot + k - n_rot/2 copied to both; every value times s.
// yn may alias x (each item reads and writes its own elements only). x: floats
// (shared memory) or a cache row (F32 / F16, widened exactly by attn_load).
template <typename T>
static __device__ __forceinline__ void attn_se_item(const struct cuda_rope &rp, const T *x,
                                                    float *yn, float *yf, int k, int pos_n,
                                                    int pos_f, float s) {
    const int half = rp.n_rot / 2;
    if (k >= half) {
        const int d = rp.n_rot + (k - half);
        const float v = attn_load(x + d) * s;
        yn[d] = v;
        if (yf)
            yf[d] = v;
        return;
    }
    int e0, e1;
    rope_pair(rp.mode, rp.n_rot, k, &e0, &e1);
    const float x0 = attn_load(x + e0), x1 = attn_load(x + e1);
    float cs, sn, y0, y1;
    rope_cos_sin(rp, (float)pos_n, k, &cs, &sn);
    rope_rotate(x0, x1, cs, sn, &y0, &y1);
    yn[e0] = y0 * s;
    yn[e1] = y1 * s;
    if (yf) {
        rope_cos_sin(rp, (float)pos_f, k, &cs, &sn);
        rope_rotate(x0, x1, cs, sn, &y0, &y1);
        yf[e0] = y0 * s;
        yf[e1] = y1 * s;
    }
}

// The elements of item k of a head: pair k (k < n_rot/2), or the one copied
// dim n_rot + k - n_rot/2 (e0 == e1).
static __device__ __forceinline__ void attn_se_item_dims(const struct cuda_rope &rp, int k, int *e0,
                                                         int *e1) {
    const int half = rp.n_rot / 2;
    if (k >= half)
        *e0 = *e1 = rp.n_rot + (k - half);
    else
        rope_pair(rp.mode, rp.n_rot, k, e0, e1);
}

// Token t's group size G and neighbor window W (se_token_gw, the rule the
// CPU op follows too).
static __device__ __forceinline__ void attn_se_gw(const struct cuda_attn &a, int64_t t, int *G,
                                                  int *W) {
    se_token_gw(a.q_se, a.se_g, a.se_w, t, G, W);
}

// Called by warp 0 of a block whose local rows are global rows row0 ..
// row0 + rows - 1 (rows past n_rows have G 1): writes the distinct G > 1 of
// the rows to list[0 .. *n) in the order of their first row (at most rows
// entries). Deterministic; visible to the block after its next barrier.
static __device__ void attn_se_list_build(const struct cuda_attn &a, int64_t row0, int rows,
                                          int n_group, int64_t n_rows, int *list, int *n_out) {
    const int lane = threadIdx.x % VELA_WARP;
    int n = 0; // warp-uniform
    for (int base = 0; base < rows; base += VELA_WARP) {
        const int64_t gr = row0 + base + lane;
        int G = 1, W;
        if (base + lane < rows && gr < n_rows)
            attn_se_gw(a, gr / n_group, &G, &W);
        bool pending = G > 1;
        for (int i = 0; i < n && pending; i++)
            pending = list[i] != G;
        for (unsigned m; (m = __ballot_sync(VELA_FULL_MASK, pending)) != 0; n++) {
            const int G0 = __shfl_sync(VELA_FULL_MASK, G, __ffs(m) - 1);
            if (lane == 0)
                list[n] = G0;
            pending = pending && G != G0;
        }
        __syncwarp(); // list[] written by lane 0 before the next rows read it
    }
    if (lane == 0)
        *n_out = n;
}

// The pass (index into the block's list of n distinct G) of a row with
// group size G, or -1 for G 1 (its far scores equal the near ones).
static __device__ __forceinline__ int attn_se_pass(const int *list, int n, int G) {
    for (int i = 0; i < n && G > 1; i++)
        if (list[i] == G)
            return i;
    return -1;
}

// The block's ATTN_ROWS raw query rows sQ [ATTN_ROWS][D]: rotated in place
// to their token's position and (the token's G > 1) into sQf to the far
// position of its G and W, both times a.scale (the rotated-K path's
// pre-scaling of the rotated q).
static __device__ void attn_se_rotate_q(const struct cuda_attn &a, float *sQ, float *sQf,
                                        int64_t row0, int n_group, int64_t n_rows) {
    const int per = a.rope.n_rot / 2 + (a.head_dim - a.rope.n_rot), D = a.head_dim;
    for (int e = threadIdx.x; e < ATTN_ROWS * per; e += ATTN_THREADS) {
        const int r = e / per;
        const int64_t gr = row0 + r;
        int i = 0, G = 1, W = 1; // unseen rows: any angle
        if (gr < n_rows) {
            i = max(a.q_pos[gr / n_group], 0);
            attn_se_gw(a, gr / n_group, &G, &W);
        }
        attn_se_item(a.rope, sQ + r * D, sQ + r * D, G > 1 ? sQf + r * D : nullptr, e % per, i,
                     se_q_pos_far(i, G, W), a.scale);
    }
}

// A raw K tile sK [ATTN_BK][ld] of cells at positions sPos: rotated in place
// to the cell's position and (sKf non-NULL) into sKf to the far position of
// group size G.
static __device__ void attn_se_rotate_k(const struct cuda_attn &a, float *sK, float *sKf, int ld,
                                        const int *sPos, int G) {
    const int per = a.rope.n_rot / 2 + (a.head_dim - a.rope.n_rot);
    for (int e = threadIdx.x; e < ATTN_BK * per; e += ATTN_THREADS) {
        const int j = e / per;
        const int p = sPos[j] > 0 ? sPos[j] : 0; // empty cells are masked: any angle
        attn_se_item(a.rope, sK + j * ld, sK + j * ld, sKf ? sKf + j * ld : nullptr, e % per, p,
                     se_k_pos_far(p, G), 1.0f);
    }
}

// The far K tile of group size G again, for a further G of the block: cells
// [c0, c0 + ATTN_BK) of KV head g (of n_head_kv, D dims) read from the cache
// (cells at or past c_end as zeros) and rotated into sKf [ATTN_BK][ld] to
// the far position, the same bits as attn_se_rotate_k's far copy of that G
// (attn_load widens exactly, as attn_load_tile does).
template <typename T>
static __device__ void attn_se_far_k(struct cuda_rope rp, int n_head_kv, int D, float *sKf, int ld,
                                     const T *cache, int c0, int c_end, int g, const int *sPos,
                                     int G) {
    const int per = rp.n_rot / 2 + (D - rp.n_rot);
    for (int e = threadIdx.x; e < ATTN_BK * per; e += ATTN_THREADS) {
        const int j = e / per, k = e % per;
        const int p = sPos[j] > 0 ? sPos[j] : 0;
        if (c0 + j < c_end) {
            const T *x = cache + ((size_t)(c0 + j) * n_head_kv + g) * D;
            attn_se_item(rp, x, sKf + j * ld, nullptr, k, se_k_pos_far(p, G), 0, 1.0f);
        } else { // never read: no row sees the cell
            int e0, e1;
            attn_se_item_dims(rp, k, &e0, &e1);
            sKf[j * ld + e0] = sKf[j * ld + e1] = 0.0f;
        }
    }
}

// attn_tc_kernel's query rows (rows rows of KV head g from global row row0):
// q read unrotated from a.q, rotated near into qn and far (the token's G and
// W; G 1: the near values) into qf, times a.scale, rounded to f16 (ld
// halves a row); rows past n_rows are 0.
static __device__ void attn_se_tc_q(const struct cuda_attn &a, __half *qn, __half *qf, int ld,
                                    int g, int64_t row0, int n_group, int64_t n_rows, int rows,
                                    int threads) {
    const int D = a.head_dim, half = a.rope.n_rot / 2, per = half + (D - a.rope.n_rot);
    for (int e = threadIdx.x; e < rows * per; e += threads) {
        const int r = e / per, k = e % per;
        const int64_t gr = row0 + r;
        int e0, e1;
        attn_se_item_dims(a.rope, k, &e0, &e1);
        float n0 = 0.0f, n1 = 0.0f, f0 = 0.0f, f1 = 0.0f;
        if (gr < n_rows) {
            const int64_t t = gr / n_group, h = (int64_t)g * n_group + gr % n_group;
            const float *x = a.q + ((size_t)t * a.n_head + h) * D;
            const int i = max(a.q_pos[t], 0); // unseen rows: any angle
            int G, W;
            attn_se_gw(a, t, &G, &W);
            if (k >= half) {
                n0 = f0 = x[e0] * a.scale;
            } else {
                float cs, sn;
                rope_cos_sin(a.rope, (float)i, k, &cs, &sn);
                rope_rotate(x[e0], x[e1], cs, sn, &n0, &n1);
                rope_cos_sin(a.rope, (float)se_q_pos_far(i, G, W), k, &cs, &sn);
                rope_rotate(x[e0], x[e1], cs, sn, &f0, &f1);
                n0 *= a.scale, n1 *= a.scale, f0 *= a.scale, f1 *= a.scale;
            }
        }
        qn[r * ld + e0] = __float2half_rn(n0);
        qf[r * ld + e0] = __float2half_rn(f0);
        if (k < half) {
            qn[r * ld + e1] = __float2half_rn(n1);
            qf[r * ld + e1] = __float2half_rn(f1);
        }
    }
}

// Item k of a K row: x0, x1 (f16 values; e0 == e1 for a copied dim) rotated
// at position p into y [ld halves a row], rounded to f16.
static __device__ __forceinline__ void attn_se_tc_item(const struct cuda_rope &rp, float x0,
                                                       float x1, int k, int e0, int e1, int p,
                                                       __half *y) {
    if (k >= rp.n_rot / 2) {
        y[e0] = __float2half_rn(x0);
        return;
    }
    float cs, sn, y0, y1;
    rope_cos_sin(rp, (float)p, k, &cs, &sn);
    rope_rotate(x0, x1, cs, sn, &y0, &y1);
    y[e0] = __float2half_rn(y0);
    y[e1] = __float2half_rn(y1);
}

// attn_tc_kernel's f16 K tile kn [bk][ld] of cells at positions sPos:
// rotated in place to the cell's position and (kf non-NULL) into kf to the
// far position of group size G, each value rounded to f16 again.
static __device__ void attn_se_tc_k(const struct cuda_attn &a, __half *kn, __half *kf, int ld,
                                    const int *sPos, int bk, int threads, int G) {
    const int per = a.rope.n_rot / 2 + (a.head_dim - a.rope.n_rot);
    for (int e = threadIdx.x; e < bk * per; e += threads) {
        const int j = e / per, k = e % per;
        const int p = sPos[j] > 0 ? sPos[j] : 0; // empty cells are zeros and masked
        int e0, e1;
        attn_se_item_dims(a.rope, k, &e0, &e1);
        const float x0 = __half2float(kn[j * ld + e0]), x1 = __half2float(kn[j * ld + e1]);
        attn_se_tc_item(a.rope, x0, x1, k, e0, e1, p, kn + j * ld);
        if (kf)
            attn_se_tc_item(a.rope, x0, x1, k, e0, e1, se_k_pos_far(p, G), kf + j * ld);
    }
}

// The far K tile of group size G again, for a further G of the block: the
// bk cells from c0 of KV head g (of n_head_kv, D dims) read from the f16
// cache (empty cells, sPos < 0, as zeros, as the tile load) and rotated into
// kf [bk][ld]: the same bits as attn_se_tc_k's far copy of that G. Not
// inlined: it runs only when a block mixes G, and inlined (its cos/sin)
// attn_tc_kernel spilled registers in every tile (ptxas, sm_90).
static __device__ __noinline__ void attn_se_tc_far_k(struct cuda_rope rp, int n_head_kv, int D,
                                                     __half *kf, int ld, const __half *cache,
                                                     int c0, int g, const int *sPos, int bk,
                                                     int threads, int G) {
    const int per = rp.n_rot / 2 + (D - rp.n_rot);
    for (int e = threadIdx.x; e < bk * per; e += threads) {
        const int j = e / per, k = e % per;
        const int p = sPos[j] > 0 ? sPos[j] : 0;
        int e0, e1;
        attn_se_item_dims(rp, k, &e0, &e1);
        float x0 = 0.0f, x1 = 0.0f;
        if (sPos[j] >= 0) {
            const __half *x = cache + ((size_t)(c0 + j) * n_head_kv + g) * D;
            x0 = __half2float(x[e0]);
            x1 = __half2float(x[e1]);
        }
        attn_se_tc_item(rp, x0, x1, k, e0, e1, se_k_pos_far(p, G), kf + j * ld);
    }
}

#endif
