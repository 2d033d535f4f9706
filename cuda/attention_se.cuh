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
// Included by attention.cu after its ATTN_* constants.
#ifndef VELA_CUDA_ATTENTION_SE_CUH
#define VELA_CUDA_ATTENTION_SE_CUH

#include "cuda/rope.cuh"
#include "host/ops/selfextend.h"

// Item k of one head of head_dim floats: pair k of the rotated dims
// (k < n_rot/2) rotated at pos_n into yn and at pos_f into yf (NULL: near
// only), or dim n_rot + k - n_rot/2 copied to both; every value times s.
// yn may alias x (each item reads and writes its own elements only).
static __device__ __forceinline__ void attn_se_item(const struct cuda_attn &a, const float *x,
                                                    float *yn, float *yf, int k, int pos_n,
                                                    int pos_f, float s) {
    const int half = a.rope.n_rot / 2;
    if (k >= half) {
        const int d = a.rope.n_rot + (k - half);
        const float v = x[d] * s;
        yn[d] = v;
        if (yf)
            yf[d] = v;
        return;
    }
    int e0, e1;
    rope_pair(a.rope.mode, a.rope.n_rot, k, &e0, &e1);
    const float x0 = x[e0], x1 = x[e1];
    float cs, sn, y0, y1;
    rope_cos_sin(a.rope, (float)pos_n, k, &cs, &sn);
    rope_rotate(x0, x1, cs, sn, &y0, &y1);
    yn[e0] = y0 * s;
    yn[e1] = y1 * s;
    if (yf) {
        rope_cos_sin(a.rope, (float)pos_f, k, &cs, &sn);
        rope_rotate(x0, x1, cs, sn, &y0, &y1);
        yf[e0] = y0 * s;
        yf[e1] = y1 * s;
    }
}

// The block's ATTN_ROWS raw query rows sQ [ATTN_ROWS][D]: rotated in place
// to their token's position and (G > 1) into sQf to the far position, both
// times a.scale (the rotated-K path's pre-scaling of the rotated q).
static __device__ void attn_se_rotate_q(const struct cuda_attn &a, float *sQ, float *sQf,
                                        int64_t row0, int n_group, int64_t n_rows) {
    const int per = a.rope.n_rot / 2 + (a.head_dim - a.rope.n_rot), D = a.head_dim;
    const bool grouped = a.se_g > 1;
    for (int e = threadIdx.x; e < ATTN_ROWS * per; e += ATTN_THREADS) {
        const int r = e / per;
        const int64_t gr = row0 + r;
        const int i = gr < n_rows ? max(a.q_pos[gr / n_group], 0) : 0; // unseen rows: any angle
        attn_se_item(a, sQ + r * D, sQ + r * D, grouped ? sQf + r * D : nullptr, e % per, i,
                     se_q_pos_far(i, a.se_g, a.se_w), a.scale);
    }
}

// A raw K tile sK [ATTN_BK][ld] of cells at positions sPos: rotated in place
// to the cell's position and (G > 1) into sKf to the far position.
static __device__ void attn_se_rotate_k(const struct cuda_attn &a, float *sK, float *sKf, int ld,
                                        const int *sPos) {
    const int per = a.rope.n_rot / 2 + (a.head_dim - a.rope.n_rot);
    const bool grouped = a.se_g > 1;
    for (int e = threadIdx.x; e < ATTN_BK * per; e += ATTN_THREADS) {
        const int j = e / per;
        const int p = sPos[j] > 0 ? sPos[j] : 0; // empty cells are masked: any angle
        attn_se_item(a, sK + j * ld, sK + j * ld, grouped ? sKf + j * ld : nullptr, e % per, p,
                     se_k_pos_far(p, a.se_g), 1.0f);
    }
}

// The elements of item k of a head: pair k (k < n_rot/2), or the one copied
// dim n_rot + k - n_rot/2 (e0 == e1).
static __device__ __forceinline__ void attn_se_item_dims(const struct cuda_attn &a, int k, int *e0,
                                                         int *e1) {
    const int half = a.rope.n_rot / 2;
    if (k >= half)
        *e0 = *e1 = a.rope.n_rot + (k - half);
    else
        rope_pair(a.rope.mode, a.rope.n_rot, k, e0, e1);
}

// attn_tc_kernel's query rows (rows rows of KV head g from global row row0):
// q read unrotated from a.q, rotated near into qn and (G > 1) far into qf,
// times a.scale, rounded to f16 (ld halves a row); rows past n_rows are 0.
static __device__ void attn_se_tc_q(const struct cuda_attn &a, __half *qn, __half *qf, int ld,
                                    int g, int64_t row0, int n_group, int64_t n_rows, int rows,
                                    int threads) {
    const int D = a.head_dim, half = a.rope.n_rot / 2, per = half + (D - a.rope.n_rot);
    for (int e = threadIdx.x; e < rows * per; e += threads) {
        const int r = e / per, k = e % per;
        const int64_t gr = row0 + r;
        int e0, e1;
        attn_se_item_dims(a, k, &e0, &e1);
        float n0 = 0.0f, n1 = 0.0f, f0 = 0.0f, f1 = 0.0f;
        if (gr < n_rows) {
            const int64_t t = gr / n_group, h = (int64_t)g * n_group + gr % n_group;
            const float *x = a.q + ((size_t)t * a.n_head + h) * D;
            const int i = max(a.q_pos[t], 0); // unseen rows: any angle
            if (k >= half) {
                n0 = f0 = x[e0] * a.scale;
            } else {
                float cs, sn;
                rope_cos_sin(a.rope, (float)i, k, &cs, &sn);
                rope_rotate(x[e0], x[e1], cs, sn, &n0, &n1);
                rope_cos_sin(a.rope, (float)se_q_pos_far(i, a.se_g, a.se_w), k, &cs, &sn);
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

// attn_tc_kernel's f16 K tile kn [bk][ld] of cells at positions sPos:
// rotated in place to the cell's position and (G > 1) into kf to the far
// position, each value rounded to f16 again.
static __device__ void attn_se_tc_k(const struct cuda_attn &a, __half *kn, __half *kf, int ld,
                                    const int *sPos, int bk, int threads) {
    const int half = a.rope.n_rot / 2, per = half + (a.head_dim - a.rope.n_rot);
    for (int e = threadIdx.x; e < bk * per; e += threads) {
        const int j = e / per, k = e % per;
        const int p = sPos[j] > 0 ? sPos[j] : 0; // empty cells are zeros and masked
        int e0, e1;
        attn_se_item_dims(a, k, &e0, &e1);
        __half *xn = kn + j * ld, *xf = kf + j * ld;
        if (k >= half) {
            xf[e0] = xn[e0];
            continue;
        }
        const float x0 = __half2float(xn[e0]), x1 = __half2float(xn[e1]);
        float cs, sn, y0, y1;
        rope_cos_sin(a.rope, (float)p, k, &cs, &sn);
        rope_rotate(x0, x1, cs, sn, &y0, &y1);
        xn[e0] = __float2half_rn(y0);
        xn[e1] = __float2half_rn(y1);
        rope_cos_sin(a.rope, (float)se_k_pos_far(p, a.se_g), k, &cs, &sn);
        rope_rotate(x0, x1, cs, sn, &y0, &y1);
        xf[e0] = __float2half_rn(y0);
        xf[e1] = __float2half_rn(y1);
    }
}

#endif
