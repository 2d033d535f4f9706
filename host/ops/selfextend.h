// Exact Self-Extend (Jin et al. 2024, "LLM Maybe LongLM", datamllab/LongLM):
// the contract every backend's attention follows when struct attn_args has
// rope != NULL and se_g > 1. This header is the reference; the CPU backend
// implements it plainly, the CUDA kernels in registers.
//
// Group size G >= 1, neighbor window W >= 1. A query at position i and a key
// at position j <= i of the same sequence (the usual causal mask decides
// which cells are visible at all):
//   - near, i - j < W: the score is q rotated at i . k rotated at j (normal
//     RoPE positions);
//   - far, i - j >= W: q is rotated at floor(i/G) + W - floor(W/G) and k at
//     floor(j/G).
// Both kinds of score enter one softmax per query (scaled by attn scale as
// usual). G = 1 is ordinary attention (the far positions are then i and j).
// A query with i < W has no far keys (LongLM's rule). Both rotations are
// ordinary RoPE with the same rope_params (YaRN ramp, linear scaling,
// frequency factors) and the same magnitude on q and k (attn_factor / YaRN
// mscale) as the rotated-K cache applies when it stores K.
//
// It needs K stored without rotation ("unrotated" cache mode: rope_kv_store
// with rp == NULL; attention rotates q and K itself), so a change of cell
// positions (context shift, seq_add) never rewrites K: kv_prepare runs
// without rope params and the shift is metadata only.
//
// The usable context: for positions i up to (n_ctx_train - W) * G + W - 1 the
// largest relative position a score uses (a far key at j = 0:
// floor(i/G) + W - floor(W/G)) is n_ctx_train - 1 when G divides W, at most
// n_ctx_train otherwise; near keys stay below W.
#ifndef VELA_HOST_OPS_SELFEXTEND_H
#define VELA_HOST_OPS_SELFEXTEND_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __CUDACC__
#define SE_HD __host__ __device__
#else
#define SE_HD
#endif

// Whether key position j is a neighbor of query position i (j <= i).
static inline SE_HD bool se_is_near(int32_t i, int32_t j, int w) {
    return i - j < w;
}

// The position a query at i is rotated to for its far keys.
static inline SE_HD int32_t se_q_pos_far(int32_t i, int g, int w) {
    return i / g + w - w / g;
}

// The position a key at j is rotated to when it is far.
static inline SE_HD int32_t se_k_pos_far(int32_t j, int g) {
    return j / g;
}

// The context self-extend makes usable: (n_ctx_train - W) * G + W, or 0 when
// W >= n_ctx_train (no extension possible) or the value overflows int.
static inline int64_t se_extended_ctx(int n_ctx_train, int g, int w) {
    if (g < 1 || w < 1 || w >= n_ctx_train)
        return 0;
    int64_t n = ((int64_t)n_ctx_train - w) * g + w;
    return n > INT32_MAX ? 0 : n;
}

// Query token t's G and W in an attention call (struct attn_args.q_se): its
// pair of q_se ([n_tok][2]) when given, else the call's (g, w); values
// below 1 read as 1 (G 1: ordinary attention).
static inline SE_HD void se_token_gw(const int32_t *q_se, int g, int w, int64_t t, int *g_out,
                                     int *w_out) {
    if (q_se) {
        g = q_se[2 * t];
        w = q_se[2 * t + 1];
    }
    *g_out = g < 1 ? 1 : g;
    *w_out = w < 1 ? 1 : w;
}

// How many leading positions of a sequence get the same K/V in every layer
// under the rules (G1, W1) and (G2, W2) (G 1: ordinary attention): all
// (INT32_MAX) when the rules are the same, else the positions below each W
// with G > 1, whose queries have no far key and attend as ordinary
// attention does. A cache reusing one run's cells for another uses this.
static inline int32_t se_same_prefix(int g1, int w1, int g2, int w2) {
    if (g1 <= 1 && g2 <= 1)
        return INT32_MAX;
    if (g1 == g2 && w1 == w2)
        return INT32_MAX;
    int32_t n = INT32_MAX;
    if (g1 > 1 && w1 < n)
        n = w1 > 0 ? w1 : 0;
    if (g2 > 1 && w2 < n)
        n = w2 > 0 ? w2 : 0;
    return n;
}

#undef SE_HD

#endif
