// RoPE inside attn_kernel: the unrotated cache mode and exact self-extend
// (host/ops/selfextend.h is the rule). The block's query rows are rotated
// once in shared memory, each K tile as it is loaded: near at the token's /
// cell's position, and with G > 1 also far (q at floor(i/G) + W - floor(W/G),
// k at floor(j/G)) into a second copy. Each key is read from memory once,
// as in the rotated-K mode; the extra work is arithmetic: per tile of
// ATTN_BK cells and KV head, ATTN_BK * n_rot/2 (x2 with G > 1) cos/sin pairs,
// and per block the same for its query rows. Each thread takes a run of
// consecutive pairs of one row (attn_se_run) and carries the angle's running
// product along it, one multiplication a pair: rope_cos_sin alone forms pair
// k's with k of them (about 2,000 a 64-pair head, more than its cos/sin).
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
// A part of attention.cu, which includes it after cuda/attention.h and its
// ATTN_* constants (it reads both; it is not a header of its own).
#ifndef VELA_CUDA_ATTENTION_SE_CUH
#define VELA_CUDA_ATTENTION_SE_CUH

#include "cuda/rope.cuh"
#include "host/ops/selfextend.h"

// Threads share a rows x per grid of head items (item k < n_rot/2: pair k;
// then the copied dims n_rot ..) as runs of consecutive items of one row,
// threads / rows of them a row (at least 1), so that each thread walks the
// angle chain along its run: one multiplication a pair, where pair k alone
// takes k (rope_theta). A thread's rows are r0, r0 + dr, ... < rows, its run
// [k0, k1); a thread past the last whole row group gets none.
struct attn_se_run {
    int r0, dr, k0, k1;
};

static __device__ __forceinline__ attn_se_run attn_se_run_of(int rows, int per, int threads) {
    const int tpr = threads >= rows ? threads / rows : 1, chunk = (per + tpr - 1) / tpr;
    const int tid = threadIdx.x;
    attn_se_run u;
    u.r0 = tid < tpr * (threads / tpr) ? tid / tpr : rows;
    u.dr = threads / tpr;
    u.k0 = (tid % tpr) * chunk;
    u.k1 = min(per, u.k0 + chunk);
    return u;
}

// Items [k0, k1) of one head: pair(e0, e1, cn, sn, cf, sf) for each pair k,
// with the cos/sin of its near (pos_n) and, when far, its far (pos_f) angle,
// each the bits of rope_cos_sin (the running product carried from pair k - 1
// to k by one multiplication); copy(d) for each copied dim d.
template <typename Pair, typename Copy>
static __device__ __forceinline__ void attn_se_walk(const struct cuda_rope &rp, int k0, int k1,
                                                    int pos_n, int pos_f, bool far, Pair pair,
                                                    Copy copy) {
    const int half = rp.n_rot / 2, kp = min(k1, half);
    float tn = 0.0f, tf = 0.0f;
    if (k0 < kp) {
        tn = rope_theta(rp, (float)pos_n, k0);
        if (far)
            tf = rope_theta(rp, (float)pos_f, k0);
    }
#pragma unroll 1
    for (int k = k0; k < kp; k++) {
        int e0, e1;
        rope_pair(rp.mode, rp.n_rot, k, &e0, &e1);
        float cn, sn, cf = 0.0f, sf = 0.0f;
        rope_cos_sin_theta(rp, tn, k, &cn, &sn);
        tn = __fmul_rn(tn, rp.theta_scale);
        if (far) {
            rope_cos_sin_theta(rp, tf, k, &cf, &sf);
            tf = __fmul_rn(tf, rp.theta_scale);
        }
        pair(e0, e1, cn, sn, cf, sf);
    }
    for (int k = max(k0, half); k < k1; k++)
        copy(rp.n_rot + (k - half));
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

// Items [k0, k1) of a row that nothing reads, set to zero in y (and in y2
// when not NULL).
template <typename T>
static __device__ __forceinline__ void attn_se_zero_items(const struct cuda_rope &rp, int k0,
                                                          int k1, T *y, T *y2, T zero) {
    for (int k = k0; k < k1; k++) {
        int e0, e1;
        attn_se_item_dims(rp, k, &e0, &e1);
        y[e0] = y[e1] = zero;
        if (y2)
            y2[e0] = y2[e1] = zero;
    }
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
    const float s = a.scale;
    const attn_se_run u = attn_se_run_of(ATTN_ROWS, per, ATTN_THREADS);
    for (int r = u.r0; r < ATTN_ROWS; r += u.dr) {
        const int64_t gr = row0 + r;
        int i = 0, G = 1, W = 1; // unseen rows: any angle
        if (gr < n_rows) {
            i = max(a.q_pos[gr / n_group], 0);
            attn_se_gw(a, gr / n_group, &G, &W);
        }
        float *q = sQ + r * D, *qf = sQf + r * D;
        const bool far = G > 1;
        attn_se_walk(
            a.rope, u.k0, u.k1, i, se_q_pos_far(i, G, W), far,
            [&](int e0, int e1, float cn, float sn, float cf, float sf) {
                const float x0 = q[e0], x1 = q[e1];
                float y0, y1;
                rope_rotate(x0, x1, cn, sn, &y0, &y1);
                q[e0] = y0 * s;
                q[e1] = y1 * s;
                if (far) {
                    rope_rotate(x0, x1, cf, sf, &y0, &y1);
                    qf[e0] = y0 * s;
                    qf[e1] = y1 * s;
                }
            },
            [&](int d) {
                const float v = q[d] * s;
                q[d] = v;
                if (far)
                    qf[d] = v;
            });
    }
}

// A raw K tile sK [ATTN_BK][ld] of cells at positions sPos: rotated in place
// to the cell's position and (sKf non-NULL) into sKf to the far position of
// group size G.
static __device__ void attn_se_rotate_k(const struct cuda_attn &a, float *sK, float *sKf, int ld,
                                        const int *sPos, int G) {
    const int per = a.rope.n_rot / 2 + (a.head_dim - a.rope.n_rot);
    const attn_se_run u = attn_se_run_of(ATTN_BK, per, ATTN_THREADS);
    for (int j = u.r0; j < ATTN_BK; j += u.dr) {
        const int p = sPos[j] > 0 ? sPos[j] : 0; // empty cells are masked: any angle
        float *k = sK + j * ld, *kf = sKf ? sKf + j * ld : nullptr;
        attn_se_walk(
            a.rope, u.k0, u.k1, p, se_k_pos_far(p, G), kf != nullptr,
            [&](int e0, int e1, float cn, float sn, float cf, float sf) {
                const float x0 = k[e0], x1 = k[e1];
                rope_rotate(x0, x1, cn, sn, &k[e0], &k[e1]);
                if (kf)
                    rope_rotate(x0, x1, cf, sf, &kf[e0], &kf[e1]);
            },
            [&](int d) {
                if (kf)
                    kf[d] = k[d];
            });
    }
}

// The far K tile of group size G again, for a further G of the block: cells
// [c0, c0 + ATTN_BK) of KV head g (of n_head_kv, D dims) read from the cache
// (cells at or past c_end as zeros) and rotated into sKf [ATTN_BK][ld] to
// the far position, the same bits as attn_se_rotate_k's far copy of that G
// (attn_load widens exactly, as attn_load_tile does).
template <typename P>
static __device__ void attn_se_far_k(struct cuda_rope rp, int n_head_kv, int D, float *sKf, int ld,
                                     P cache, int c0, int c_end, int g, const int *sPos, int G) {
    const int per = rp.n_rot / 2 + (D - rp.n_rot);
    const attn_se_run u = attn_se_run_of(ATTN_BK, per, ATTN_THREADS);
    for (int j = u.r0; j < ATTN_BK; j += u.dr) {
        const int p = sPos[j] > 0 ? sPos[j] : 0;
        float *y = sKf + j * ld;
        if (c0 + j >= c_end) { // never read: no row sees the cell
            attn_se_zero_items(rp, u.k0, u.k1, y, (float *)nullptr, 0.0f);
            continue;
        }
        const P x = cache + ((size_t)(c0 + j) * n_head_kv + g) * D;
        attn_se_walk(
            rp, u.k0, u.k1, se_k_pos_far(p, G), 0, false,
            [&](int e0, int e1, float cs, float sn, float, float) {
                rope_rotate(attn_load(x + e0), attn_load(x + e1), cs, sn, &y[e0], &y[e1]);
            },
            [&](int d) { y[d] = attn_load(x + d); });
    }
}

// attn_tc_kernel's query rows (rows rows of KV head g from global row row0):
// q read unrotated from a.q, rotated near into qn and far (the token's G and
// W; G 1: the near values) into qf, times a.scale, rounded to f16 (ld
// halves a row); rows past n_rows are 0.
static __device__ void attn_se_tc_q(const struct cuda_attn &a, __half *qn, __half *qf, int ld,
                                    int g, int64_t row0, int n_group, int64_t n_rows, int rows,
                                    int threads) {
    const int D = a.head_dim, per = a.rope.n_rot / 2 + (D - a.rope.n_rot);
    const float s = a.scale;
    const attn_se_run u = attn_se_run_of(rows, per, threads);
    for (int r = u.r0; r < rows; r += u.dr) {
        const int64_t gr = row0 + r;
        __half *yn = qn + r * ld, *yf = qf + r * ld;
        if (gr >= n_rows) {
            attn_se_zero_items(a.rope, u.k0, u.k1, yn, yf, __float2half_rn(0.0f));
            continue;
        }
        const int64_t t = gr / n_group, h = (int64_t)g * n_group + gr % n_group;
        const float *x = a.q + ((size_t)t * a.n_head + h) * D;
        const int i = max(a.q_pos[t], 0); // unseen rows: any angle
        int G, W;
        attn_se_gw(a, t, &G, &W);
        attn_se_walk(
            a.rope, u.k0, u.k1, i, se_q_pos_far(i, G, W), true,
            [&](int e0, int e1, float cn, float sn, float cf, float sf) {
                float n0, n1, f0, f1;
                rope_rotate(x[e0], x[e1], cn, sn, &n0, &n1);
                rope_rotate(x[e0], x[e1], cf, sf, &f0, &f1);
                yn[e0] = __float2half_rn(n0 * s);
                yn[e1] = __float2half_rn(n1 * s);
                yf[e0] = __float2half_rn(f0 * s);
                yf[e1] = __float2half_rn(f1 * s);
            },
            [&](int d) { yn[d] = yf[d] = __float2half_rn(x[d] * s); });
    }
}

// x0, x1 rotated by cs, sn into y[e0], y[e1], rounded to f16.
static __device__ __forceinline__ void attn_se_tc_rot(float x0, float x1, float cs, float sn,
                                                      __half *y, int e0, int e1) {
    float y0, y1;
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
    const attn_se_run u = attn_se_run_of(bk, per, threads);
    for (int j = u.r0; j < bk; j += u.dr) {
        const int p = sPos[j] > 0 ? sPos[j] : 0; // empty cells are zeros and masked
        __half *yn = kn + j * ld, *yf = kf ? kf + j * ld : nullptr;
        attn_se_walk(
            a.rope, u.k0, u.k1, p, se_k_pos_far(p, G), yf != nullptr,
            [&](int e0, int e1, float cn, float sn, float cf, float sf) {
                const float x0 = __half2float(yn[e0]), x1 = __half2float(yn[e1]);
                attn_se_tc_rot(x0, x1, cn, sn, yn, e0, e1);
                if (yf)
                    attn_se_tc_rot(x0, x1, cf, sf, yf, e0, e1);
            },
            [&](int d) {
                if (yf)
                    yf[d] = yn[d];
            });
    }
}

// The far K tile of group size G again, for a further G of the block: the
// bk cells from c0 of KV head g (of n_head_kv, D dims) read from the cache
// (any type, decoded and rounded to f16 as attn_tc_load_tile does; empty
// cells, sPos < 0, as zeros, as the tile load) and rotated into kf
// [bk][ld]: the same bits as attn_se_tc_k's far copy of that G. Not
// inlined: it runs only when a block mixes G, and inlined (its cos/sin)
// attn_tc_kernel spilled registers in every tile (ptxas, sm_90).
static __device__ __noinline__ void attn_se_tc_far_k(struct cuda_rope rp, int n_head_kv, int D,
                                                     __half *kf, int ld, kvq_ptr cache, int c0,
                                                     int g, const int *sPos, int bk, int threads,
                                                     int G) {
    const int per = rp.n_rot / 2 + (D - rp.n_rot);
    const attn_se_run u = attn_se_run_of(bk, per, threads);
    for (int j = u.r0; j < bk; j += u.dr) {
        const int p = sPos[j] > 0 ? sPos[j] : 0;
        __half *y = kf + j * ld;
        const bool has = sPos[j] >= 0;
        const kvq_ptr x = cache + ((size_t)(c0 + j) * n_head_kv + g) * D;
        // the tile's value: decoded and rounded to f16 (exact for an f16 cache)
        auto tile = [&](int e) {
            return has ? __half2float(__float2half_rn(kvq_get1(x + e))) : 0.0f;
        };
        attn_se_walk(
            rp, u.k0, u.k1, se_k_pos_far(p, G), 0, false,
            [&](int e0, int e1, float cs, float sn, float, float) {
                attn_se_tc_rot(tile(e0), tile(e1), cs, sn, y, e0, e1);
            },
            [&](int d) { y[d] = __float2half_rn(tile(d)); });
    }
}

#endif
