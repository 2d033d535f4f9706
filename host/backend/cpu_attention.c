// The CPU backend's attention op (cpu_attention.h): plain float32, the
// reference the CUDA kernels are tested against.
//
// A call takes one of two paths, which compute the same rows to the bit
// (below): the item path for batches (prefill, many sequences), the decode
// path for calls of at most ATTN_DEC_TOK tokens and ATTN_DEC_ROWS query rows
// whose values of G fit one round.
//
// The item path:
//   1. K (and V) are made float32 once per call where the cache is F16; in
//      the unrotated mode (a->rope) each key is also rotated once per call at
//      its cell's position (near) and, for each distinct G > 1 among the
//      tokens' self-extend (G, W) (se_g / se_w, or q_se per token), at pos / G
//      (a far copy per G), from cos/sin rows kept per position across calls
//      (struct attn_rope_tab). At most ATTN_FAR_MAX far copies exist at once:
//      with more distinct G the call runs in rounds, each making the far
//      copies of the next ATTN_FAR_MAX values of G (ascending) and computing
//      only the rows of the tokens using them (the first round also those
//      with G = 1, which need no far keys: far equals near).
//   2. Work items are (block of query tokens, KV head). An item computes the
//      scores of its query rows (the group of query heads reading that KV
//      head, for each token of the block) over the visible cells in tiles of
//      ATTN_CB cells, so that each key tile is read from memory once per item;
//      then per row: mask, max, exp and the sum; then P.V over the same tiles.
//      Each token's scores take near or far keys by its own W, the far ones
//      from its own G's copy.
//
// The decode path (a step of generation over a long cache: making every
// cell float32 up front, and rotating it, costs more memory traffic than the
// attention itself, and (token block, KV head) items leave threads idle when
// there are fewer KV heads than threads):
//   1. Work items are chunks of ATTN_CHUNK cells, every token and head: the
//      visibility, then the scores a tile of ATTN_CB cells at a time, K read
//      straight from the cache (F16 converted in the kernel: the same floats
//      as widening first), or with RoPE inside attention made float32 and
//      rotated for that tile only, near and far rows as the tile's tokens
//      need them; then each row's mask and its max over the chunk.
//   2. A row's max is the max of its chunks' (exact in any order); items are
//      chunks again: the weights attn_exp(s - max).
//   3. Items are slices of the (KV head, ATTN_DB dims of V) blocks, one per
//      thread: P.V a tile at a time, V straight from the cache, then each
//      row's sum (over all its cells, as below) and the division.
// The chunks and slices only split the work: every score, weight and output
// element is computed by the same operations in the same order as in the
// item path, whichever chunk or thread computes it.
//
// A quantized cache (K or V of a type backend_cache_type_quantized, as the
// store wrote them with quant_quantize_row): before either path, the rows
// of cells [0, n_kv) of each quantized tensor are dequantized into float32
// buffers of the state once per call (empty cells as zeros), and the call
// then runs as on an F32 cache holding those rows. So a quantized cache's
// output is, to the bit, that of an F32 cache holding
// dequantize(quantize(k)) and dequantize(quantize(v)); the unrotated mode
// rotates K after its dequantization; F16 and F32 caches take no part in it.
// Dequantizing every cell costs a pass over the cache per call and layer
// (kernels that read blocks in their tiles, as the F16 decode path does, are
// the next step where that pass shows).
//
// What each output row is, whatever the batch, the block, the thread or
// where the cells sit in the cache:
//   score(c) = dot(q, k_c) * scale, the dot as eight running sums (lane j
//     takes dims j, j+8, ...) combined as ((0+1)+(2+3))+((4+5)+(6+7)), then
//     the dims past the last multiple of 8 in order;
//   max = the largest visible score, and with sinks (attn_args.sinks) the
//     head's sink where that is larger;
//   w(c) = attn_exp(score(c) - max) for visible cells, 0 otherwise;
//   the visible cells in order: by position, ties by cell index ("the order
//     of a row's sums" below);
//   sum = eight running sums of w (lane i % 8 for the i-th visible cell in
//     that order), combined as above, then with sinks + attn_exp(sink - max);
//   out[d] = (sum over the visible c in that order of w(c) * v_c[d]) * (1/sum).
// Every step is a float multiply or add in a fixed order (no FMA, no
// reassociation), so the AVX2 kernels and the plain C ones give the same
// bits, and results are bit-identical for any thread count and batch split.
// A row that sees nothing is zeros. A token's rows depend on nothing of the
// other tokens (their (G, W) included) nor on which cells hold its
// sequence's positions: the same bits in any batch, alone in a fresh cache
// or beside others in a fragmented one (tests/test_batch_invariance.c).
#include "host/backend/cpu_attention.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATTN_X86 1
#include <immintrin.h>
#endif

#include "gguf/quant.h"
#include "host/backend/rope.h"
#include "host/ops/selfextend.h"

#define ATTN_ALIGN 64
#define ATTN_CB 64             // cells per tile: 64 keys of 64 floats = 16 KiB, within L1
#define ATTN_ROWS 48           // query rows per work item (tokens x heads of the group)
#define ATTN_TAB_MAX (1 << 20) // positions the cos/sin table may hold (beyond: per-call rows)
#define ATTN_FAR_MAX 4         // far-rotated copies of K at once (distinct G > 1 per round)
#define ATTN_DEC_TOK 8         // the decode path: calls of at most this many tokens
#define ATTN_DEC_ROWS 64       // ... and of at most this many query rows (tokens x heads)
#define ATTN_CHUNK 512         // its cells per work item of scores (a multiple of ATTN_CB)
#define ATTN_DB 32             // its dims of V per work item of P.V (the AVX2 kernel's block)

// cos/sin rows [pos][n_rot] for positions [0, n), made with rope_cache_fill
// for the params in rp (and the frequency factors copied in ff): the very
// values the rotated-K store uses, computed once per position, not per call.
struct attn_rope_tab {
    struct rope_params rp;
    float ff[256]; // rp.freq_factors[0 .. n_rot/2) when rp.freq_factors
    struct rope_consts rc;
    float *cs;
    int32_t n;
    size_t cap; // positions cs has room for
};

struct cpu_attn {
    int n_threads;
    bool avx2;               // the AVX2 kernels run here (same bits as the plain ones)
    unsigned char **scratch; // [n_threads] buffers of scratch_bytes each (64-byte aligned)
    size_t scratch_bytes;
    float *kbuf; // K as float32: [n_kv][n_head_kv][head_dim] near, then the far copies
    size_t kbuf_floats;
    float *vbuf; // V as float32 when the cache is F16: [n_kv][n_head_kv][head_dim_v]
    size_t vbuf_floats;
    float *dbuf; // the decode path's shared buffers (struct attn_dec)
    size_t dbuf_floats;
    float *kq; // a quantized K dequantized: [n_kv][n_head_kv][head_dim]
    size_t kq_floats;
    float *vq; // a quantized V dequantized: [n_kv][n_head_kv][head_dim_v]
    size_t vq_floats;
    struct attn_rope_tab tab;
};

static void *attn_aligned(size_t bytes) {
    bytes = (bytes + ATTN_ALIGN - 1) / ATTN_ALIGN * ATTN_ALIGN;
    return aligned_alloc(ATTN_ALIGN, bytes ? bytes : ATTN_ALIGN);
}

// cpu_attention_pin_plain's choice for states created from now on.
static _Atomic bool attn_pin_plain;

void cpu_attention_pin_plain(bool plain) {
    attn_pin_plain = plain;
}

static bool attn_have_avx2(void) {
#ifdef ATTN_X86
    if (attn_pin_plain)
        return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
    return false;
#endif
}

static void attn_fp16_table_init(void);
static pthread_once_t attn_fp16_once;

static struct cpu_attn *attn_state_new(struct threadpool *pool) {
    pthread_once(&attn_fp16_once, attn_fp16_table_init);
    struct cpu_attn *st = calloc(1, sizeof *st);
    if (!st)
        return NULL;
    st->n_threads = threadpool_size(pool);
    st->avx2 = attn_have_avx2();
    st->scratch = calloc((size_t)st->n_threads, sizeof *st->scratch);
    if (!st->scratch) {
        free(st);
        return NULL;
    }
    return st;
}

void cpu_attention_free(struct cpu_attn *st) {
    if (!st)
        return;
    for (int i = 0; i < st->n_threads; i++)
        free(st->scratch[i]);
    free(st->scratch);
    free(st->kbuf);
    free(st->vbuf);
    free(st->dbuf);
    free(st->kq);
    free(st->vq);
    free(st->tab.cs);
    free(st);
}

// Grows every thread's scratch to at least `bytes`.
static int attn_scratch_reserve(struct cpu_attn *st, size_t bytes, struct verr *err) {
    if (bytes <= st->scratch_bytes)
        return VERR_OK;
    for (int i = 0; i < st->n_threads; i++) {
        free(st->scratch[i]);
        st->scratch[i] = attn_aligned(bytes);
        if (!st->scratch[i]) {
            for (int j = 0; j < st->n_threads; j++) {
                free(st->scratch[j]);
                st->scratch[j] = NULL;
            }
            st->scratch_bytes = 0;
            return verr_set(err, VERR_NOMEM,
                            "cpu attention: out of memory for %d x %zu bytes of scratch",
                            st->n_threads, bytes);
        }
    }
    st->scratch_bytes = bytes;
    return VERR_OK;
}

static int attn_buf_reserve(float **buf, size_t *have, size_t floats, struct verr *err) {
    if (floats <= *have)
        return VERR_OK;
    free(*buf);
    *buf = attn_aligned(floats * sizeof(float));
    *have = *buf ? floats : 0;
    if (!*buf)
        return verr_set(err, VERR_NOMEM, "cpu attention: out of memory for %zu floats of K/V",
                        floats);
    return VERR_OK;
}

// ---------------------------------------------------------------------------
// the arithmetic, once in plain C and once in AVX2 with the same operations

// exp(x) for x <= 0 (a score minus the row's max), Cephes' expf: x = n ln2 + r,
// |r| <= ln2/2, a degree-5 polynomial for e^r, times 2^n. Within 2 ulp of
// expf; below -87.3 (and for -inf, an invisible cell) it is 0.
#define ATTN_EXP_LO (-87.3f)
static inline float attn_exp(float x) {
    const float xc = x < ATTN_EXP_LO ? ATTN_EXP_LO : x;
    const int n = (int)(xc * 1.44269504088896341f - 0.5f); // round to nearest (xc <= 0)
    const float fn = (float)n;
    float r = xc - fn * 0.693359375f;
    r = r - fn * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = (p * (r * r) + r) + 1.0f;
    const uint32_t bits = (uint32_t)(n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x < ATTN_EXP_LO ? 0.0f : y * scale;
}

static inline float attn_tree8(const float s[8]) {
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// K and V reach the kernels as float32 or, where h, as F16 (the cache's
// own rows): element i of row p is the same float either way (widening is
// exact), so the arithmetic and its bits do not depend on h.
static float attn_fp16_table[1 << 16];

static inline float attn_el(const void *p, size_t i, bool h) {
    return h ? attn_fp16_table[((const uint16_t *)p)[i]] : ((const float *)p)[i];
}

static inline const void *attn_at(const void *p, size_t i, bool h) {
    return (const char *)p + i * (h ? sizeof(uint16_t) : sizeof(float));
}

static float attn_dot_plain(const float *a, const void *b, int n, bool h) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * attn_el(b, (size_t)(i + j), h);
    float s = attn_tree8(acc);
    for (; i < n; i++)
        s += a[i] * attn_el(b, (size_t)i, h);
    return s;
}

// sc[r][c] = dot(q[r], k_c) for nr rows and cells [c0, c1); k_c = k + c * ldk
// elements (F16 where h).
static void attn_scores_plain(float *sc, size_t ldsc, const float *q, int nr, const void *k,
                              size_t ldk, int c0, int c1, int D, bool h) {
    for (int r = 0; r < nr; r++)
        for (int c = c0; c < c1; c++)
            sc[r * ldsc + c] =
                attn_dot_plain(q + (size_t)r * D, attn_at(k, (size_t)c * ldk, h), D, h);
}

// s = visible ? s * scale : -inf over cells [c0, c1); returns the max.
static float attn_mask_max_plain(float *s, const unsigned char *vis, int c0, int c1, float scale) {
    float mx = -INFINITY;
    for (int c = c0; c < c1; c++) {
        const float x = vis[c] ? s[c] * scale : -INFINITY;
        s[c] = x;
        mx = x > mx ? x : mx;
    }
    return mx;
}

// Row softmax numerators over cells [c0, c1) (invisible cells hold -inf):
// s = attn_exp(s - mx) in place.
static void attn_exp_plain(float *s, int c0, int c1, float mx) {
    for (int c = c0; c < c1; c++)
        s[c] = attn_exp(s[c] - mx);
}

// The sum of w[0 .. n) as eight running sums (lane i % 8) combined by
// attn_tree8. Lanes go by rank among the visible cells, not by cell index,
// so that a row's sum does not depend on where its cells sit in the cache.
static float attn_sum_plain(const float *w, int n) {
    float s8[8] = {0};
    for (int i = 0; i < n; i++)
        s8[i & 7] += w[i];
    return attn_tree8(s8);
}

// acc[r][d] += p[r][c] * v_c[d] for cells [c0, c1) in order, or with a
// list for cells[c0], cells[c0 + 1], ..., cells[c1 - 1] (attn_order_cells),
// skipping a cell whose p is 0 in every row (invisible: nothing is added, as
// if skipped).
static void attn_pv_plain(float *acc, int nr, const float *p, size_t ldp, const void *v, size_t ldv,
                          const int *cells, int c0, int c1, int Dv, bool h) {
    for (int k = c0; k < c1; k++) {
        const int c = cells ? cells[k] : k;
        bool any = false;
        for (int r = 0; r < nr; r++)
            any |= p[r * ldp + c] != 0.0f;
        if (!any)
            continue;
        const void *vc = attn_at(v, (size_t)c * ldv, h);
        for (int r = 0; r < nr; r++) {
            const float w = p[r * ldp + c];
            float *o = acc + (size_t)r * Dv;
            for (int d = 0; d < Dv; d++)
                o[d] += w * attn_el(vc, (size_t)d, h);
        }
    }
}

#ifdef ATTN_X86
#define ATTN_AVX2 __attribute__((target("avx2,f16c")))
#define ATTN_AVX2_INLINE __attribute__((target("avx2,f16c"), always_inline))

// Elements [i, i + 8) of row p (F16 where h) as floats.
ATTN_AVX2_INLINE static inline __m256 attn_ld8(const void *p, size_t i, bool h) {
    if (h)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    return _mm256_loadu_ps((const float *)p + i);
}

// The 8 lanes of a, b, c, d each combined as attn_tree8: {ta, tb, tc, td}.
ATTN_AVX2 static inline __m128 attn_tree8x4(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 ab = _mm256_hadd_ps(a, b); // a01 a23 b01 b23 | a45 a67 b45 b67
    const __m256 cd = _mm256_hadd_ps(c, d);
    const __m256 h = _mm256_hadd_ps(ab, cd); // (01+23) of a b c d | (45+67) of a b c d
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// Two rows (or one: q1 == NULL) against 4 cells (F16 where h); D a multiple of 8.
ATTN_AVX2_INLINE static inline void attn_dot_2x4(float *s0, float *s1, const float *q0,
                                                 const float *q1, const void *k, size_t ldk, int D,
                                                 bool h) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    const void *k0 = k, *k1 = attn_at(k, ldk, h), *k2 = attn_at(k, 2 * ldk, h),
               *k3 = attn_at(k, 3 * ldk, h);
    if (q1) {
        for (int i = 0; i < D; i += 8) {
            const __m256 x0 = _mm256_loadu_ps(q0 + i), x1 = _mm256_loadu_ps(q1 + i);
            __m256 kv = attn_ld8(k0, (size_t)i, h);
            a00 = _mm256_add_ps(a00, _mm256_mul_ps(x0, kv));
            a10 = _mm256_add_ps(a10, _mm256_mul_ps(x1, kv));
            kv = attn_ld8(k1, (size_t)i, h);
            a01 = _mm256_add_ps(a01, _mm256_mul_ps(x0, kv));
            a11 = _mm256_add_ps(a11, _mm256_mul_ps(x1, kv));
            kv = attn_ld8(k2, (size_t)i, h);
            a02 = _mm256_add_ps(a02, _mm256_mul_ps(x0, kv));
            a12 = _mm256_add_ps(a12, _mm256_mul_ps(x1, kv));
            kv = attn_ld8(k3, (size_t)i, h);
            a03 = _mm256_add_ps(a03, _mm256_mul_ps(x0, kv));
            a13 = _mm256_add_ps(a13, _mm256_mul_ps(x1, kv));
        }
        _mm_storeu_ps(s1, attn_tree8x4(a10, a11, a12, a13));
    } else {
        for (int i = 0; i < D; i += 8) {
            const __m256 x0 = _mm256_loadu_ps(q0 + i);
            a00 = _mm256_add_ps(a00, _mm256_mul_ps(x0, attn_ld8(k0, (size_t)i, h)));
            a01 = _mm256_add_ps(a01, _mm256_mul_ps(x0, attn_ld8(k1, (size_t)i, h)));
            a02 = _mm256_add_ps(a02, _mm256_mul_ps(x0, attn_ld8(k2, (size_t)i, h)));
            a03 = _mm256_add_ps(a03, _mm256_mul_ps(x0, attn_ld8(k3, (size_t)i, h)));
        }
    }
    _mm_storeu_ps(s0, attn_tree8x4(a00, a01, a02, a03));
}

ATTN_AVX2_INLINE static inline void attn_scores_avx2_t(float *sc, size_t ldsc, const float *q,
                                                       int nr, const void *k, size_t ldk, int c0,
                                                       int c1, int D, bool h) {
    int c = c0;
    for (; c + 4 <= c1; c += 4) {
        const void *kc = attn_at(k, (size_t)c * ldk, h);
        int r = 0;
        for (; r + 2 <= nr; r += 2)
            attn_dot_2x4(sc + r * ldsc + c, sc + (r + 1) * ldsc + c, q + (size_t)r * D,
                         q + (size_t)(r + 1) * D, kc, ldk, D, h);
        if (r < nr)
            attn_dot_2x4(sc + r * ldsc + c, NULL, q + (size_t)r * D, NULL, kc, ldk, D, h);
    }
    if (c < c1)
        attn_scores_plain(sc, ldsc, q, nr, k, ldk, c, c1, D, h);
}

// attn_scores_plain's scores, four cells at a time (the tail: plain).
ATTN_AVX2 static void attn_scores_avx2(float *sc, size_t ldsc, const float *q, int nr,
                                       const void *k, size_t ldk, int c0, int c1, int D, bool h) {
    if (D % 8 != 0)
        attn_scores_plain(sc, ldsc, q, nr, k, ldk, c0, c1, D, h);
    else if (h)
        attn_scores_avx2_t(sc, ldsc, q, nr, k, ldk, c0, c1, D, true);
    else
        attn_scores_avx2_t(sc, ldsc, q, nr, k, ldk, c0, c1, D, false);
}

ATTN_AVX2 static inline __m256 attn_exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(ATTN_EXP_LO);
    const __m256 xc = _mm256_max_ps(x, lo); // x < lo ? lo : x (x is never NaN here)
    const __m256i n = _mm256_cvttps_epi32(_mm256_sub_ps(
        _mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)), _mm256_set1_ps(0.5f)));
    const __m256 fn = _mm256_cvtepi32_ps(n);
    __m256 r = _mm256_sub_ps(xc, _mm256_mul_ps(fn, _mm256_set1_ps(0.693359375f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(fn, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
    const __m256 y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r),
                                   _mm256_set1_ps(1.0f));
    const __m256 scale =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
    const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    return _mm256_and_ps(_mm256_mul_ps(y, scale), keep);
}

ATTN_AVX2 static float attn_mask_max_avx2(float *s, const unsigned char *vis, int c0, int c1,
                                          float scale) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY), sc = _mm256_set1_ps(scale);
    __m256 mx = ninf;
    int c = c0;
    for (; c + 8 <= c1; c += 8) {
        const __m128i b = _mm_loadl_epi64((const __m128i *)(vis + c));
        const __m256 on = _mm256_castsi256_ps(
            _mm256_cmpgt_epi32(_mm256_cvtepu8_epi32(b), _mm256_setzero_si256()));
        const __m256 x = _mm256_blendv_ps(ninf, _mm256_mul_ps(_mm256_loadu_ps(s + c), sc), on);
        _mm256_storeu_ps(s + c, x);
        mx = _mm256_max_ps(mx, x);
    }
    float m8[8];
    _mm256_storeu_ps(m8, mx);
    float m = attn_mask_max_plain(s, vis, c, c1, scale); // the max is exact in any order
    for (int i = 0; i < 8; i++)
        m = m8[i] > m ? m8[i] : m;
    return m;
}

ATTN_AVX2 static void attn_exp_avx2(float *s, int c0, int c1, float mx) {
    const __m256 m = _mm256_set1_ps(mx);
    int c = c0;
    for (; c + 8 <= c1; c += 8)
        _mm256_storeu_ps(s + c, attn_exp8(_mm256_sub_ps(_mm256_loadu_ps(s + c), m)));
    attn_exp_plain(s, c, c1, mx);
}

ATTN_AVX2 static float attn_sum_avx2(const float *w, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_add_ps(acc, _mm256_loadu_ps(w + i));
    float s8[8];
    _mm256_storeu_ps(s8, acc);
    for (; i < n; i++)
        s8[i & 7] += w[i];
    return attn_tree8(s8);
}

// acc rows r0 (and r1 unless NULL) += p * v over cells [c0, c1) (with
// cells: cells[c0 .. c1)), 32 dims (F16 where h).
ATTN_AVX2_INLINE static inline void attn_pv_2x32(float *o0, float *o1, const float *p0,
                                                 const float *p1, const void *v, size_t ldv,
                                                 const int *cells, int c0, int c1, bool h) {
    __m256 a0 = _mm256_loadu_ps(o0), a1 = _mm256_loadu_ps(o0 + 8);
    __m256 a2 = _mm256_loadu_ps(o0 + 16), a3 = _mm256_loadu_ps(o0 + 24);
    if (o1) {
        __m256 b0 = _mm256_loadu_ps(o1), b1 = _mm256_loadu_ps(o1 + 8);
        __m256 b2 = _mm256_loadu_ps(o1 + 16), b3 = _mm256_loadu_ps(o1 + 24);
        for (int k = c0; k < c1; k++) {
            const int c = cells ? cells[k] : k;
            if (p0[c] == 0.0f && p1[c] == 0.0f)
                continue;
            const void *vc = attn_at(v, (size_t)c * ldv, h);
            const __m256 w0 = _mm256_set1_ps(p0[c]), w1 = _mm256_set1_ps(p1[c]);
            __m256 x = attn_ld8(vc, 0, h);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(w0, x));
            b0 = _mm256_add_ps(b0, _mm256_mul_ps(w1, x));
            x = attn_ld8(vc, 8, h);
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(w0, x));
            b1 = _mm256_add_ps(b1, _mm256_mul_ps(w1, x));
            x = attn_ld8(vc, 16, h);
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(w0, x));
            b2 = _mm256_add_ps(b2, _mm256_mul_ps(w1, x));
            x = attn_ld8(vc, 24, h);
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(w0, x));
            b3 = _mm256_add_ps(b3, _mm256_mul_ps(w1, x));
        }
        _mm256_storeu_ps(o1, b0);
        _mm256_storeu_ps(o1 + 8, b1);
        _mm256_storeu_ps(o1 + 16, b2);
        _mm256_storeu_ps(o1 + 24, b3);
    } else {
        for (int k = c0; k < c1; k++) {
            const int c = cells ? cells[k] : k;
            if (p0[c] == 0.0f)
                continue;
            const void *vc = attn_at(v, (size_t)c * ldv, h);
            const __m256 w0 = _mm256_set1_ps(p0[c]);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(w0, attn_ld8(vc, 0, h)));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(w0, attn_ld8(vc, 8, h)));
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(w0, attn_ld8(vc, 16, h)));
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(w0, attn_ld8(vc, 24, h)));
        }
    }
    _mm256_storeu_ps(o0, a0);
    _mm256_storeu_ps(o0 + 8, a1);
    _mm256_storeu_ps(o0 + 16, a2);
    _mm256_storeu_ps(o0 + 24, a3);
}

ATTN_AVX2_INLINE static inline void attn_pv_avx2_t(float *acc, int nr, const float *p, size_t ldp,
                                                   const void *v, size_t ldv, const int *cells,
                                                   int c0, int c1, int Dv, bool h) {
    int d = 0;
    for (; d + 32 <= Dv; d += 32) {
        const void *vd = attn_at(v, (size_t)d, h);
        int r = 0;
        for (; r + 2 <= nr; r += 2)
            attn_pv_2x32(acc + (size_t)r * Dv + d, acc + (size_t)(r + 1) * Dv + d, p + r * ldp,
                         p + (r + 1) * ldp, vd, ldv, cells, c0, c1, h);
        if (r < nr)
            attn_pv_2x32(acc + (size_t)r * Dv + d, NULL, p + r * ldp, NULL, vd, ldv, cells, c0, c1,
                         h);
    }
    for (; d < Dv; d++) // dims past the last 32: each element is its own sum
        for (int k = c0; k < c1; k++) {
            const int c = cells ? cells[k] : k;
            const void *vc = attn_at(v, (size_t)c * ldv, h);
            for (int r = 0; r < nr; r++) {
                const float w = p[r * ldp + c];
                if (w != 0.0f)
                    acc[(size_t)r * Dv + d] += w * attn_el(vc, (size_t)d, h);
            }
        }
}

// The same as attn_pv_plain. A cell is skipped when its p is 0 in the rows
// of the call; with two rows of one token that is the plain rule (both rows
// see the same cells), and a skipped cell adds nothing either way.
ATTN_AVX2 static void attn_pv_avx2(float *acc, int nr, const float *p, size_t ldp, const void *v,
                                   size_t ldv, const int *cells, int c0, int c1, int Dv, bool h) {
    if (cells && h)
        attn_pv_avx2_t(acc, nr, p, ldp, v, ldv, cells, c0, c1, Dv, true);
    else if (cells)
        attn_pv_avx2_t(acc, nr, p, ldp, v, ldv, cells, c0, c1, Dv, false);
    else if (h)
        attn_pv_avx2_t(acc, nr, p, ldp, v, ldv, NULL, c0, c1, Dv, true);
    else
        attn_pv_avx2_t(acc, nr, p, ldp, v, ldv, NULL, c0, c1, Dv, false);
}

// rope_rotate_f32 of the first pairs of one head from x (F16 where h) into
// y (y may be x when F32), 8 (NeoX) or 4 (normal) at a time: each element is
// the same two products and one add or subtract as there (no FMA; x0*s +
// x1*c and x1*c + x0*s are the same float), so the same bits. Returns the
// pairs done.
ATTN_AVX2_INLINE static inline int attn_rotate_avx2_t(float *y, const void *x, const float *cs,
                                                      int half, enum rope_mode mode, bool h) {
    int i = 0;
    if (mode == ROPE_MODE_NEOX) {
        // Pair i is (x[i], x[i + half]); cs holds c_i s_i interleaved: split
        // 8 pairs' values into c_i..c_i+7 and s_i..s_i+7.
        for (; i + 8 <= half; i += 8) {
            const __m256 a = _mm256_loadu_ps(cs + 2 * i), b = _mm256_loadu_ps(cs + 2 * i + 8);
            const __m256d ci =
                _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)); // c0 c1 c4 c5 | c2 c3 c6 c7
            const __m256d si = _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD));
            const __m256 c = _mm256_castpd_ps(_mm256_permute4x64_pd(ci, 0xD8));
            const __m256 s = _mm256_castpd_ps(_mm256_permute4x64_pd(si, 0xD8));
            const __m256 x0 = attn_ld8(x, (size_t)i, h), x1 = attn_ld8(x, (size_t)(half + i), h);
            _mm256_storeu_ps(y + i, _mm256_sub_ps(_mm256_mul_ps(x0, c), _mm256_mul_ps(x1, s)));
            _mm256_storeu_ps(y + half + i,
                             _mm256_add_ps(_mm256_mul_ps(x0, s), _mm256_mul_ps(x1, c)));
        }
        return i;
    }
    // Pair i is (x[2i], x[2i + 1]), in the same places as its c_i s_i.
    for (; i + 4 <= half; i += 4) {
        const __m256 v = _mm256_loadu_ps(cs + 2 * i);
        const __m256 c = _mm256_moveldup_ps(v), s = _mm256_movehdup_ps(v);
        const __m256 xv = attn_ld8(x, (size_t)(2 * i), h);
        const __m256 xs = _mm256_permute_ps(xv, 0xB1); // x1 x0 x3 x2 ...
        _mm256_storeu_ps(y + 2 * i, _mm256_addsub_ps(_mm256_mul_ps(xv, c), _mm256_mul_ps(xs, s)));
    }
    return i;
}

ATTN_AVX2 static int attn_rotate_avx2(float *y, const void *x, const float *cs, int half,
                                      enum rope_mode mode, bool h) {
    return h ? attn_rotate_avx2_t(y, x, cs, half, mode, true)
             : attn_rotate_avx2_t(y, x, cs, half, mode, false);
}
#endif

// P.V with the kernels st runs (attn_pv_plain's arithmetic either way).
static void attn_pv(const struct cpu_attn *st, float *acc, int nr, const float *p, size_t ldp,
                    const void *v, size_t ldv, const int *cells, int c0, int c1, int Dv, bool h) {
#ifdef ATTN_X86
    if (st->avx2) {
        attn_pv_avx2(acc, nr, p, ldp, v, ldv, cells, c0, c1, Dv, h);
        return;
    }
#endif
    attn_pv_plain(acc, nr, p, ldp, v, ldv, cells, c0, c1, Dv, h);
}

// ---------------------------------------------------------------------------
// the order of a row's sums
//
// A row's softmax sum and its P.V add its visible cells in order of position
// (ties by cell index), not of cell index: where a sequence's cells sit in
// the cache depends on what else used the cache (kv_find_slot takes the first
// free run from a head that goes back to the first freed cell, so a later
// token may land below an earlier one), while a request alone has them in
// position order. Where a query's visible cells are in position order
// already (almost always) the kernels run over ranges of cells; otherwise
// over the list attn_order_cells makes.

// Positions a counting sort spans (1 MiB of counts); beyond: a heapsort.
#define ATTN_ORDER_SPAN 262144

// Whether cell x comes before cell y: by position, then by index.
static inline bool attn_cell_before(const int32_t *pos, int x, int y) {
    return pos[x] < pos[y] || (pos[x] == pos[y] && x < y);
}

static void attn_heap_sift(int *o, int i, int n, const int32_t *pos) {
    for (;;) {
        const int l = 2 * i + 1, r = l + 1;
        int m = i;
        if (l < n && attn_cell_before(pos, o[m], o[l]))
            m = l;
        if (r < n && attn_cell_before(pos, o[m], o[r]))
            m = r;
        if (m == i)
            return;
        const int x = o[i];
        o[i] = o[m];
        o[m] = x;
        i = m;
    }
}

// The n cells of [lo, hi) with vis[c] set into ord, in order of position
// (pos[c]), ties by index: a counting sort when their positions span at most
// n_cnt values (cnt: n_cnt ints of scratch), else a heapsort.
static void attn_order_cells(const unsigned char *vis, const int32_t *pos, int lo, int hi, int n,
                             int *ord, int *cnt, int n_cnt) {
    int32_t pmin = INT32_MAX, pmax = INT32_MIN;
    for (int c = lo; c < hi; c++)
        if (vis[c]) {
            pmin = pos[c] < pmin ? pos[c] : pmin;
            pmax = pos[c] > pmax ? pos[c] : pmax;
        }
    if (n == 0)
        return;
    if ((int64_t)pmax - pmin < n_cnt) {
        const int span = pmax - pmin + 1;
        memset(cnt, 0, (size_t)span * sizeof *cnt);
        for (int c = lo; c < hi; c++)
            if (vis[c])
                cnt[pos[c] - pmin]++;
        for (int i = 0, at = 0; i < span; i++) { // counts -> first slot of each position
            const int k = cnt[i];
            cnt[i] = at;
            at += k;
        }
        for (int c = lo; c < hi; c++)
            if (vis[c])
                ord[cnt[pos[c] - pmin]++] = c;
        return;
    }
    int k = 0;
    for (int c = lo; c < hi; c++)
        if (vis[c])
            ord[k++] = c;
    for (int i = n / 2 - 1; i >= 0; i--)
        attn_heap_sift(ord, i, n, pos);
    for (int e = n - 1; e > 0; e--) {
        const int x = ord[0];
        ord[0] = ord[e];
        ord[e] = x;
        attn_heap_sift(ord, 0, e, pos);
    }
}

// The counts attn_order_cells gets for the queries of a: their visible
// cells' positions lie in [0, max q_pos].
static int attn_order_span(const struct attn_args *a) {
    int32_t m = 0;
    for (int t = 0; t < a->n_tok; t++)
        m = a->q_pos[t] > m ? a->q_pos[t] : m;
    return m < ATTN_ORDER_SPAN ? m + 1 : ATTN_ORDER_SPAN;
}

// ---------------------------------------------------------------------------
// preparing K and V

struct attn_job {
    const struct attn_args *a;
    struct cpu_attn *st;
    const float *k_near; // [n_kv][n_head_kv][head_dim] float32 (rotated at pos with rope)
    // The round's far copies: k_far[i] [n_kv][n_head_kv][head_dim] rotated at
    // pos / far_g[i] (far_g ascending, each > 1); n_far of them.
    const float *k_far[ATTN_FAR_MAX];
    int far_g[ATTN_FAR_MAX];
    int n_far;
    bool with_g1;   // the round computes the tokens with G = 1 too (the first round)
    const float *v; // [n_kv][n_head_kv][head_dim_v] float32
    int group;      // n_head / n_head_kv
    int tb;         // tokens per work item
    int n_tb;       // token blocks
    size_t ld;      // scores row stride (floats): n_kv rounded up to 8, + 8
    int n_cnt;      // attn_order_cells' counts in an item's scratch (attn_order_span)
    float **tmp;    // per thread [n_rot]: a cos/sin row beyond the table
};

// F16 -> F32 of the plain path: a table filled once from quant_fp16_to_f32
// (the AVX2 path's F16C conversion is exact too: the same floats).
static pthread_once_t attn_fp16_once = PTHREAD_ONCE_INIT;

static void attn_fp16_table_init(void) {
    for (uint32_t h = 0; h < (1u << 16); h++)
        attn_fp16_table[h] = quant_fp16_to_f32((uint16_t)h);
}

#ifdef ATTN_X86
ATTN_AVX2 static void attn_widen_f16c(float *dst, const uint16_t *h, size_t n) {
    size_t e = 0;
    for (; e + 8 <= n; e += 8)
        _mm256_storeu_ps(dst + e, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + e))));
    for (; e < n; e++)
        dst[e] = attn_fp16_table[h[e]];
}
#endif

static void attn_widen(float *dst, const void *src, enum ggml_type t, size_t n, bool avx2) {
    if (t == GGML_TYPE_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    const uint16_t *h = src;
#ifdef ATTN_X86
    if (avx2) {
        attn_widen_f16c(dst, h, n);
        return;
    }
#endif
    for (size_t e = 0; e < n; e++)
        dst[e] = attn_fp16_table[h[e]];
}

// The cos/sin row of position p: from the table, or computed into tmp.
static const float *attn_cs_row(const struct cpu_attn *st, const struct rope_params *rp, int32_t p,
                                float *tmp) {
    if (p >= 0 && p < st->tab.n)
        return st->tab.cs + (size_t)p * rp->n_rot;
    rope_cache_fill(tmp, (float)p, rp, &st->tab.rc);
    return tmp;
}

struct attn_prep {
    const struct attn_args *a;
    struct cpu_attn *st;
    float *k_near, *v;          // NULL where nothing is to be made
    float *k_far[ATTN_FAR_MAX]; // the round's far copies (rope only), for G = far_g[i]
    const int *far_g;           // [n_far]
    int n_far;
    float **tmp; // per thread [n_rot] floats
};

// One head of a cache row, x (F16 where h), rotated by the cos/sin row cs
// into y (y may be x when F32): exactly rope_rotate_f32 of its float32
// copy. Pairs by the AVX2 kernel where it runs, the rest here; dims n_rot..
// copied (widened).
static void attn_rotate_head(float *y, const void *x, bool h, const float *cs,
                             const struct rope_params *rp, int head_dim, bool avx2) {
    const int half = rp->n_rot / 2;
    const int step0 = rp->mode == ROPE_MODE_NEOX ? 1 : 2,
              off = rp->mode == ROPE_MODE_NEOX ? half : 1;
    int i = 0;
#ifdef ATTN_X86
    if (avx2)
        i = attn_rotate_avx2(y, x, cs, half, rp->mode, h);
#endif
    for (; i < half; i++) {
        const float c = cs[2 * i], s = cs[2 * i + 1];
        const float x0 = attn_el(x, (size_t)(i * step0), h),
                    x1 = attn_el(x, (size_t)(i * step0 + off), h);
        y[i * step0] = x0 * c - x1 * s;
        y[i * step0 + off] = x0 * s + x1 * c;
    }
    if (y != x)
        attn_widen(y + rp->n_rot, attn_at(x, (size_t)rp->n_rot, h),
                   h ? GGML_TYPE_F16 : GGML_TYPE_F32, (size_t)(head_dim - rp->n_rot), avx2);
}

// The n_head_kv heads of cell c's cache row rotated at position p into y.
static void attn_rotate_row(const struct attn_prep *j, float *y, int64_t c, int32_t p, int thread) {
    const struct attn_args *a = j->a;
    const bool h = a->type_k == GGML_TYPE_F16;
    const size_t krow = (size_t)a->n_head_kv * a->head_dim;
    const void *x = attn_at(a->k, (size_t)c * krow, h);
    const float *cs = attn_cs_row(j->st, a->rope, p, j->tmp[thread]);
    for (int hk = 0; hk < a->n_head_kv; hk++) {
        const size_t o = (size_t)hk * a->head_dim;
        attn_rotate_head(y + o, attn_at(x, o, h), h, cs, a->rope, a->head_dim, j->st->avx2);
    }
}

// Cell c's keys into kn, the near row (float32, rotated at its position
// with rope; NULL: not made), and into each non-NULL kf[i], i < n_far (the far
// copy rotated at pos / far_g[i]), each made from the cache row (widening is
// exact: the same floats as rotating a widened copy). At least one is
// non-NULL. Empty cells get zeros: never visible, and the scores stay finite.
static void attn_make_k(const struct attn_prep *j, int64_t c, float *kn, float *const *kf,
                        int thread) {
    const struct attn_args *a = j->a;
    const size_t krow = (size_t)a->n_head_kv * a->head_dim;
    const int32_t p = a->cell_pos[c];
    if (p < 0) {
        if (kn)
            memset(kn, 0, krow * sizeof(float));
        for (int i = 0; i < j->n_far; i++)
            if (kf[i])
                memset(kf[i], 0, krow * sizeof(float));
        return;
    }
    if (!a->rope) { // no far copies without rope
        const bool h = a->type_k == GGML_TYPE_F16;
        attn_widen(kn, attn_at(a->k, (size_t)c * krow, h), a->type_k, krow, j->st->avx2);
        return;
    }
    if (kn)
        attn_rotate_row(j, kn, c, p, thread);
    for (int i = 0; i < j->n_far; i++)
        if (kf[i])
            attn_rotate_row(j, kf[i], c, se_k_pos_far(p, j->far_g[i]), thread);
}

// Cell c's rows of the call's buffers (attn_make_k).
static void attn_prep_k(const struct attn_prep *j, int64_t c, int thread) {
    const size_t krow = (size_t)j->a->n_head_kv * j->a->head_dim;
    float *kf[ATTN_FAR_MAX] = {0};
    for (int i = 0; i < j->n_far; i++)
        kf[i] = j->k_far[i] + c * krow;
    attn_make_k(j, c, j->k_near ? j->k_near + c * krow : NULL, kf, thread);
}

static void attn_prep_range(void *ctx, int64_t c0, int64_t c1, int thread) {
    const struct attn_prep *j = ctx;
    const struct attn_args *a = j->a;
    const size_t vrow = (size_t)a->n_head_kv * a->head_dim_v;
    const size_t ev = a->type_v == GGML_TYPE_F16 ? 2 : 4;
    for (int64_t c = c0; c < c1; c++) {
        if (j->v)
            attn_widen(j->v + c * vrow, (const char *)a->v + c * vrow * ev, a->type_v, vrow,
                       j->st->avx2);
        if (j->k_near || j->n_far)
            attn_prep_k(j, c, thread);
    }
}

static bool attn_same_rope(const struct attn_rope_tab *t, const struct rope_params *rp) {
    const struct rope_params *o = &t->rp;
    if (o->mode != rp->mode || o->n_rot != rp->n_rot || o->n_ctx_orig != rp->n_ctx_orig ||
        o->freq_base != rp->freq_base || o->freq_scale != rp->freq_scale ||
        o->ext_factor != rp->ext_factor || o->attn_factor != rp->attn_factor ||
        o->beta_fast != rp->beta_fast || o->beta_slow != rp->beta_slow ||
        !o->freq_factors != !rp->freq_factors)
        return false;
    return !rp->freq_factors ||
           memcmp(t->ff, rp->freq_factors, (size_t)(rp->n_rot / 2) * sizeof(float)) == 0;
}

// Makes the table hold positions [0, n) for rp (n capped at ATTN_TAB_MAX).
static int attn_tab_reserve(struct cpu_attn *st, const struct rope_params *rp, int64_t n,
                            struct verr *err) {
    struct attn_rope_tab *t = &st->tab;
    if ((size_t)(rp->n_rot / 2) > sizeof t->ff / sizeof t->ff[0])
        return verr_set(err, VERR_RANGE, "cpu attention: n_rot %d above 512", rp->n_rot);
    if (t->cs && !attn_same_rope(t, rp))
        t->n = 0;
    if (t->n == 0) {
        t->rp = *rp;
        if (rp->freq_factors)
            memcpy(t->ff, rp->freq_factors, (size_t)(rp->n_rot / 2) * sizeof(float));
        rope_consts_init(&t->rc, rp, true);
    }
    if (n > ATTN_TAB_MAX)
        n = ATTN_TAB_MAX;
    if (n <= t->n)
        return VERR_OK;
    if ((size_t)n > t->cap) {
        size_t cap = t->cap ? t->cap : 4096;
        while (cap < (size_t)n)
            cap *= 2;
        float *cs = attn_aligned(cap * (size_t)rp->n_rot * sizeof(float));
        if (!cs)
            return verr_set(err, VERR_NOMEM, "cpu attention: out of memory for %zu RoPE rows", cap);
        if (t->n)
            memcpy(cs, t->cs, (size_t)t->n * rp->n_rot * sizeof(float));
        free(t->cs);
        t->cs = cs;
        t->cap = cap;
    }
    for (int32_t p = t->n; p < n; p++)
        rope_cache_fill(t->cs + (size_t)p * rp->n_rot, (float)p, rp, &t->rc);
    t->n = (int32_t)n;
    return VERR_OK;
}

// ---------------------------------------------------------------------------
// one work item: tokens [t0, t0 + nt) x KV head hk

// Scratch of one work item, in floats (attn_item_init's layout).
static size_t attn_item_floats(const struct attn_args *a, int tb, int group, size_t ld, int n_cnt) {
    const size_t rows = (size_t)tb * group;
    return rows * ld + 2 * rows * a->head_dim + rows * a->head_dim_v + rows * 8 +
           ((size_t)tb * ld + sizeof(float) - 1) / sizeof(float) + 2 * ld + (size_t)tb * ld +
           (size_t)n_cnt + 64;
}

// A work item's state: its rows (nt tokens x G query heads of KV head hk)
// and their buffers in the thread's scratch (attn_item_floats).
struct attn_item {
    int t0, nt, hk, G, R;
    float *S;           // [R][ld] scores, then weights
    float *qn;          // [R][D] q (rotated at i with rope)
    float *qf;          // [R][D] q rotated for far keys
    float *acc;         // [R][Dv]
    float *sum;         // [R] softmax denominators
    unsigned char *vis; // [nt][ld]
    float *packed;      // [ld]
    int32_t *kp;        // [n_kv] cell positions for kp_seq, INT32_MAX: not its
    int *ord_buf;       // [tb][ld] the tokens' lists of attn_order_cells
    int *cnt;           // [n_cnt] its counts
    // A token's visible cells by position (in ord_buf), NULL: in cell order already.
    const int *ord[ATTN_ROWS];
    int lo[ATTN_ROWS], hi[ATTN_ROWS], n_vis[ATTN_ROWS]; // each token's visible range
    int LO, HI;                                         // their union
    bool on[ATTN_ROWS]; // the token's rows are computed in this round
    int far[ATTN_ROWS]; // its far copy (index into k_far), -1: no far keys
    int w[ATTN_ROWS];   // its W (with far >= 0)
};

static void attn_item_init(const struct attn_job *j, int t0, int nt, int hk, float *scr,
                           struct attn_item *it) {
    const struct attn_args *a = j->a;
    const size_t ld = j->ld;
    it->t0 = t0;
    it->nt = nt;
    it->hk = hk;
    it->G = j->group;
    it->R = nt * j->group;
    it->S = scr;
    it->qn = it->S + (size_t)it->R * ld;
    it->qf = it->qn + (size_t)it->R * a->head_dim;
    it->acc = it->qf + (size_t)it->R * a->head_dim;
    it->sum = it->acc + (size_t)it->R * a->head_dim_v;
    it->vis = (unsigned char *)(it->sum + (size_t)it->R * 8);
    it->packed = (float *)it->vis + ((size_t)nt * ld + sizeof(float) - 1) / sizeof(float);
    it->kp = (int32_t *)(it->packed + ld);
    it->ord_buf = (int *)(it->kp + ld);
    it->cnt = it->ord_buf + (size_t)j->tb * ld;
    it->LO = a->n_kv;
    it->HI = 0;
}

// Token t's exact self-extend: G and W from q_se (G < 1 and W < 1 read as
// 1) or the call's se_g / se_w; G = 1 without rope.
static inline void attn_tok_se(const struct attn_args *a, int tok, int *g, int *w) {
    se_token_gw(a->q_se, a->se_g, a->se_w, tok, g, w);
    if (!a->rope)
        *g = 1;
}

// Whether token t is computed in this round, and its far keys: none with
// G = 1, nor when its position is below W (a visible key, at j <= i < W, is
// always near: the same scores), else its G's copy of the round.
static void attn_item_token_se(const struct attn_job *j, struct attn_item *it, int t) {
    int g, w;
    attn_tok_se(j->a, it->t0 + t, &g, &w);
    it->w[t] = w;
    it->far[t] = -1;
    it->on[t] = g == 1 && j->with_g1;
    for (int i = 0; i < j->n_far; i++)
        if (j->far_g[i] == g) {
            it->on[t] = true;
            it->far[t] = j->a->q_pos[it->t0 + t] < w ? -1 : i;
        }
}

// Cell c's position as the tokens of sequence qseq see it: its position
// when it holds qseq, else INT32_MAX (never visible).
static inline int32_t attn_cell_pos_for(const struct attn_args *a, int c, int qseq) {
    const uint64_t w = a->cell_seq[(size_t)c * a->seq_words + (size_t)(qseq / 64)];
    const int32_t p = a->cell_pos[c];
    return p >= 0 && ((w >> (qseq % 64)) & 1u) ? p : INT32_MAX;
}

// Whether a query at qpos sees a key at kp (attn_cell_pos_for's): causal,
// and within the window when there is one.
static inline bool attn_visible(const struct attn_args *a, int32_t kp, int32_t qpos) {
    return kp <= qpos && (a->window <= 0 || (int64_t)qpos - kp < a->window);
}

// Token t's visibility row and range, and its list of attn_order_cells
// where its visible cells are out of position order. The mask
// (host/ops/backend.h): cell c is visible iff it holds qseq, 0 <= pos <=
// qpos and, with a window, qpos - pos < window.
static void attn_item_visibility(const struct attn_job *j, struct attn_item *it, int t,
                                 int *kp_seq) {
    const struct attn_args *a = j->a;
    const int32_t qpos = a->q_pos[it->t0 + t];
    const int qseq = a->q_seq[it->t0 + t];
    unsigned char *vt = it->vis + (size_t)t * j->ld;
    int32_t *kp = it->kp;
    if (qseq != *kp_seq) { // the cells' positions as the tokens of qseq see them
        for (int c = 0; c < a->n_kv; c++)
            kp[c] = attn_cell_pos_for(a, c, qseq);
        *kp_seq = qseq;
    }
    for (int c = 0; c < a->n_kv; c++)
        vt[c] = attn_visible(a, kp[c], qpos);
    int l = 0, h = a->n_kv, n = 0;
    while (l < h && !vt[l])
        l++;
    while (h > l && !vt[h - 1])
        h--;
    bool in_order = true;
    for (int c = l, last = 0; c < h; c++)
        if (vt[c]) {
            n++;
            in_order &= kp[c] >= last;
            last = kp[c];
        }
    it->ord[t] = NULL;
    if (!in_order) {
        int *ord = it->ord_buf + (size_t)t * j->ld;
        attn_order_cells(vt, a->cell_pos, l, h, n, ord, it->cnt, j->n_cnt);
        it->ord[t] = ord;
    }
    it->lo[t] = l;
    it->hi[t] = h;
    it->n_vis[t] = n;
    it->LO = l < it->LO ? l : it->LO;
    it->HI = h > it->HI ? h : it->HI;
}

// One query head q [D] copied to dn and, with RoPE inside attention (rp),
// rotated at qpos; with df also copied there and rotated at pf, its far
// position. Both paths make their query rows with this.
static void attn_query_head(const struct cpu_attn *st, const struct rope_params *rp, const float *q,
                            int D, int32_t qpos, float *dn, float *df, int32_t pf, float *cs_tmp) {
    memcpy(dn, q, (size_t)D * sizeof(float));
    if (!rp)
        return;
    rope_rotate_f32(dn, attn_cs_row(st, rp, qpos, cs_tmp), rp->n_rot, rp->mode);
    if (!df)
        return;
    memcpy(df, q, (size_t)D * sizeof(float));
    rope_rotate_f32(df, attn_cs_row(st, rp, pf, cs_tmp), rp->n_rot, rp->mode);
}

// Token t's query rows: copied, and with RoPE inside attention rotated at
// its position (and, when it has far keys, at its grouped position).
static void attn_item_queries(const struct attn_job *j, struct attn_item *it, int t,
                              float *cs_tmp) {
    const struct attn_args *a = j->a;
    const int D = a->head_dim, tok = it->t0 + t;
    const int32_t qpos = a->q_pos[tok];
    const bool far = a->rope && it->far[t] >= 0;
    const int32_t pf = far ? se_q_pos_far(qpos, j->far_g[it->far[t]], it->w[t]) : 0;
    for (int g = 0; g < it->G; g++) {
        const size_t r = (size_t)(t * it->G + g) * D;
        attn_query_head(j->st, a->rope,
                        a->q + ((size_t)tok * a->n_head + (size_t)it->hk * it->G + g) * D, D, qpos,
                        it->qn + r, far ? it->qf + r : NULL, pf, cs_tmp);
    }
}

// Cells [*c0, *c1) of the tile starting at cb that token t may see (its
// visible range clipped to the tile); false when there are none.
static inline bool attn_item_tile(const struct attn_item *it, int cb, int t, int *c0, int *c1) {
    const int ce = cb + ATTN_CB < it->HI ? cb + ATTN_CB : it->HI;
    *c0 = cb > it->lo[t] ? cb : it->lo[t];
    *c1 = ce < it->hi[t] ? ce : it->hi[t];
    return *c0 < *c1;
}

// Scores, a tile of cells at a time for every token.
static void attn_item_scores(const struct attn_job *j, struct attn_item *it) {
    const struct attn_args *a = j->a;
    const int D = a->head_dim, G = it->G;
    const size_t ld = j->ld, ldk = (size_t)a->n_head_kv * D;
    const float *kn = j->k_near + (size_t)it->hk * D;
    for (int cb = it->LO; cb < it->HI; cb += ATTN_CB) {
        for (int t = 0; t < it->nt; t++) {
            int c0, c1;
            if (!attn_item_tile(it, cb, t, &c0, &c1))
                continue;
            float *st = it->S + (size_t)t * G * ld;
            const float *qnt = it->qn + (size_t)t * G * D, *qft = it->qf + (size_t)t * G * D;
            const int32_t qpos = a->q_pos[it->t0 + t];
            const int W = it->w[t];
            const float *kf = it->far[t] < 0 ? NULL : j->k_far[it->far[t]] + (size_t)it->hk * D;
            // near keys are those with pos > qpos - W: a contiguous run only
            // when cells are in position order, so the choice is per cell,
            // computed in runs of cells of the same kind.
            int c = c0;
            while (c < c1) {
                const bool near = !kf || se_is_near(qpos, a->cell_pos[c], W);
                int e = c + 1;
                while (e < c1 && (!kf || se_is_near(qpos, a->cell_pos[e], W)) == near)
                    e++;
#ifdef ATTN_X86
                if (j->st->avx2)
                    attn_scores_avx2(st, ld, near ? qnt : qft, G, near ? kn : kf, ldk, c, e, D,
                                     false);
                else
#endif
                    attn_scores_plain(st, ld, near ? qnt : qft, G, near ? kn : kf, ldk, c, e, D,
                                      false);
                c = e;
            }
        }
    }
}

// Mask, max, exp and the softmax sums of every row.
static void attn_item_softmax(const struct attn_job *j, struct attn_item *it) {
    const struct attn_args *a = j->a;
    const bool avx2 = j->st->avx2;
    (void)avx2;
    for (int t = 0; t < it->nt; t++) {
        if (it->lo[t] >= it->hi[t])
            continue;
        const int c0 = it->lo[t], c1 = it->hi[t];
        const unsigned char *vt = it->vis + (size_t)t * j->ld;
        for (int g = 0; g < it->G; g++) {
            float *s = it->S + (size_t)(t * it->G + g) * j->ld;
            float mx;
#ifdef ATTN_X86
            if (avx2)
                mx = attn_mask_max_avx2(s, vt, c0, c1, a->scale);
            else
#endif
                mx = attn_mask_max_plain(s, vt, c0, c1, a->scale);
            const float sink = a->sinks ? a->sinks[it->hk * it->G + g] : -INFINITY;
            mx = sink > mx ? sink : mx;
#ifdef ATTN_X86
            if (avx2)
                attn_exp_avx2(s, c0, c1, mx);
            else
#endif
                attn_exp_plain(s, c0, c1, mx);
            float *w = s + c0;
            if (it->ord[t]) { // the visible weights by position
                for (int k = 0; k < it->n_vis[t]; k++)
                    it->packed[k] = s[it->ord[t][k]];
                w = it->packed;
            } else if (it->n_vis[t] != c1 - c0) { // holes: the visible weights, packed
                int k = 0;
                for (int c = c0; c < c1; c++)
                    if (vt[c])
                        it->packed[k++] = s[c];
                w = it->packed;
            }
            float sum;
#ifdef ATTN_X86
            if (avx2)
                sum = attn_sum_avx2(w, it->n_vis[t]);
            else
#endif
                sum = attn_sum_plain(w, it->n_vis[t]);
            it->sum[t * it->G + g] = a->sinks ? sum + attn_exp(sink - mx) : sum;
        }
    }
}

// P.V over the same tiles, then each row divided by its sum into out.
static void attn_item_output(const struct attn_job *j, struct attn_item *it) {
    const struct attn_args *a = j->a;
    const int Dv = a->head_dim_v, G = it->G;
    const size_t ld = j->ld, ldv = (size_t)a->n_head_kv * Dv;
    const float *v = j->v + (size_t)it->hk * Dv;
    memset(it->acc, 0, (size_t)it->R * Dv * sizeof(float));
    for (int cb = it->LO; cb < it->HI; cb += ATTN_CB) {
        for (int t = 0; t < it->nt; t++) {
            int c0, c1;
            if (it->ord[t] || !attn_item_tile(it, cb, t, &c0, &c1))
                continue;
            attn_pv(j->st, it->acc + (size_t)t * G * Dv, G, it->S + (size_t)t * G * ld, ld, v, ldv,
                    NULL, c0, c1, Dv, false);
        }
    }
    for (int t = 0; t < it->nt; t++) // tokens whose cells are out of position order
        if (it->ord[t])
            attn_pv(j->st, it->acc + (size_t)t * G * Dv, G, it->S + (size_t)t * G * ld, ld, v, ldv,
                    it->ord[t], 0, it->n_vis[t], Dv, false);
    for (int t = 0; t < it->nt; t++)
        for (int g = 0; g < G && it->on[t]; g++) {
            const int r = t * G + g;
            float *out = a->out + ((size_t)(it->t0 + t) * a->n_head + (size_t)it->hk * G + g) * Dv;
            if (it->lo[t] >= it->hi[t]) { // a row that sees nothing is defined as zeros
                memset(out, 0, (size_t)Dv * sizeof(float));
                continue;
            }
            const float inv = 1.0f / it->sum[r];
            for (int d = 0; d < Dv; d++)
                out[d] = it->acc[(size_t)r * Dv + d] * inv;
        }
}

// Tokens [t0, t0 + nt) x KV head hk, in the steps above.
static void attn_item(const struct attn_job *j, int t0, int nt, int hk, float *scr, float *cs_tmp) {
    struct attn_item it;
    attn_item_init(j, t0, nt, hk, scr, &it);
    int kp_seq = -1;
    for (int t = 0; t < nt; t++) {
        attn_item_token_se(j, &it, t);
        if (!it.on[t]) { // another round's: no cells, no output
            it.lo[t] = it.hi[t] = it.n_vis[t] = 0;
            it.ord[t] = NULL;
            continue;
        }
        attn_item_visibility(j, &it, t, &kp_seq);
        attn_item_queries(j, &it, t, cs_tmp);
    }
    attn_item_scores(j, &it);
    attn_item_softmax(j, &it);
    attn_item_output(j, &it);
}

static void attn_items_range(void *ctx, int64_t i0, int64_t i1, int thread) {
    const struct attn_job *j = ctx;
    float *scr = (float *)j->st->scratch[thread];
    for (int64_t it = i0; it < i1; it++) {
        const int b = (int)(it / j->a->n_head_kv), hk = (int)(it % j->a->n_head_kv);
        const int t0 = b * j->tb;
        const int nt = t0 + j->tb <= j->a->n_tok ? j->tb : j->a->n_tok - t0;
        attn_item(j, t0, nt, hk, scr, j->tmp[thread]);
    }
}

// ---------------------------------------------------------------------------
// the op

static int attn_check(const struct attn_args *a, struct verr *err) {
    if (!a)
        return verr_set(err, VERR_RANGE, "cpu attention: NULL args");
    if (a->n_tok < 0 || a->n_kv < 0 || a->n_head <= 0 || a->n_head_kv <= 0 || a->head_dim <= 0 ||
        a->head_dim_v <= 0)
        return verr_set(err, VERR_RANGE,
                        "cpu attention: n_tok %d, n_kv %d, n_head %d, n_head_kv %d, head_dim "
                        "%d, head_dim_v %d",
                        a->n_tok, a->n_kv, a->n_head, a->n_head_kv, a->head_dim, a->head_dim_v);
    if (a->n_head % a->n_head_kv != 0)
        return verr_set(err, VERR_RANGE,
                        "cpu attention: n_head %d is not a multiple of n_head_kv %d", a->n_head,
                        a->n_head_kv);
    for (int i = 0; i < 2; i++) {
        const enum ggml_type t = i ? a->type_v : a->type_k;
        const int64_t n = (int64_t)a->n_head_kv * (i ? a->head_dim_v : a->head_dim);
        if (!backend_cache_type_ok(t) && !backend_cache_type_quantized(t))
            return verr_set(err, VERR_UNSUPPORTED,
                            "cpu attention: cache types %s/%s: the cpu backend runs f32, f16, "
                            "bf16, q8_0, q4_0, q4_1, q5_0, q5_1 and iq4_nl",
                            ggml_type_name(a->type_k), ggml_type_name(a->type_v));
        if (!ggml_row_bytes(t, n))
            return verr_set(err, VERR_RANGE,
                            "cpu attention: a cell's %s (%lld values of %s) is not whole blocks",
                            i ? "V" : "K", (long long)n, ggml_type_name(t));
    }
    if (a->n_tok == 0)
        return VERR_OK;
    if (!a->out || !a->q || !a->q_pos || !a->q_seq ||
        (a->n_kv > 0 && (!a->k || !a->v || !a->cell_pos || !a->cell_seq)))
        return verr_set(err, VERR_RANGE, "cpu attention: NULL pointer");
    if (a->seq_words <= 0 && a->n_kv > 0)
        return verr_set(err, VERR_RANGE, "cpu attention: seq_words %d <= 0", a->seq_words);
    for (int t = 0; t < a->n_tok; t++)
        if (a->q_seq[t] < 0 || (int64_t)a->q_seq[t] >= (int64_t)a->seq_words * 64)
            return verr_set(err, VERR_RANGE,
                            "cpu attention: token %d has sequence %d outside [0, %d)", t,
                            a->q_seq[t], a->seq_words * 64);
    if (!a->rope)
        return VERR_OK;
    int rc = rope_params_check(a->rope, a->head_dim, "cpu attention", err);
    if (rc)
        return rc;
    if (a->se_g < 1 || (a->se_g > 1 && a->se_w < 1))
        return verr_set(err, VERR_RANGE,
                        "cpu attention: self-extend group %d must be >= 1 and window %d >= 1",
                        a->se_g, a->se_w);
    return VERR_OK;
}

// The next round's values of G: of the distinct G > 1 of the call's tokens
// above `after`, the ATTN_FAR_MAX smallest (or all when fewer), ascending.
// Returns how many.
static int attn_next_gs(const struct attn_args *a, int after, int gs[ATTN_FAR_MAX]) {
    int n = 0;
    for (int t = 0; t < a->n_tok; t++) {
        int g, w;
        attn_tok_se(a, t, &g, &w);
        if (g <= after) // after >= 1: G = 1 is never a far copy
            continue;
        int k = 0;
        while (k < n && gs[k] < g)
            k++;
        if (k == ATTN_FAR_MAX || (k < n && gs[k] == g))
            continue;
        if (n == ATTN_FAR_MAX) // g displaces the largest
            n--;
        memmove(gs + k + 1, gs + k, (size_t)(n - k) * sizeof *gs);
        gs[k] = g;
        n++;
    }
    return n;
}

// ---------------------------------------------------------------------------
// the decode path: a few tokens over the whole cache (see the top)

// The decode path's call: its buffers shared by the steps are in st->dbuf.
struct attn_dec {
    const struct attn_args *a;
    struct cpu_attn *st;
    struct attn_prep prep; // a, st, far_g, n_far and tmp, for attn_make_k
    int G, R;              // group; rows: row tok * n_head + head (head = hk * G + g)
    int n_ch, n_db, n_sl;  // chunks of ATTN_CHUNK cells; blocks of ATTN_DB dims of V; slices
    size_t ld, krow;       // scores row stride (as the items'); floats of a K cell
    bool tiles;            // K is made a tile at a time (rotated: RoPE inside attention)
    bool hk, hv;           // else K, and V always, are read from the cache: F16 where set
    float *S;              // [R][ld] scores, then weights
    float *qn, *qf;        // [R][D] the queries (qf: for far keys)
    float *cmax;           // [n_ch][R] each chunk's max of a row's visible scores
    float *mx;             // [R] the row's max
    unsigned char *vis;    // [n_tok][ld]
    int *clo, *chi;        // [n_ch][n_tok] a chunk's visible cells of a token: first, last + 1
    int *ord_buf;          // [n_tok][ld] the tokens' lists of attn_order_cells
    int *cnt;              // [n_cnt] its counts
    int n_cnt;
    int lo[ATTN_DEC_TOK], hi[ATTN_DEC_TOK], n_vis[ATTN_DEC_TOK]; // a token's, all chunks
    int far[ATTN_DEC_TOK], w[ATTN_DEC_TOK];                      // its far copy (-1: none) and W
    // Its visible cells by position (in ord_buf), NULL: in cell order already.
    const int *ord[ATTN_DEC_TOK];
    int far_g[ATTN_FAR_MAX];
    size_t thr_floats; // each thread's scratch: K tiles, acc, packed weights, a cos/sin row
};

// Whether the call takes the decode path: few rows (n_tok <= ATTN_DEC_TOK and
// n_tok * n_head <= ATTN_DEC_ROWS) and the far copies of one round.
static bool attn_dec_fits(const struct attn_args *a) {
    if (a->n_tok > ATTN_DEC_TOK || (int64_t)a->n_tok * a->n_head > ATTN_DEC_ROWS)
        return false;
    int gs[ATTN_FAR_MAX];
    const int n = attn_next_gs(a, 1, gs);
    return n < ATTN_FAR_MAX || attn_next_gs(a, gs[n - 1], gs) == 0;
}

// Floats of the shared buffers, and of each thread's.
static size_t attn_dec_shared_floats(const struct attn_dec *d) {
    const struct attn_args *a = d->a;
    const size_t R = (size_t)d->R, nt = (size_t)a->n_tok;
    return R * d->ld + 2 * R * a->head_dim + (size_t)d->n_ch * R + R + (nt * d->ld + 3) / 4 +
           2 * (size_t)d->n_ch * nt + nt * d->ld + (size_t)d->n_cnt + 64;
}

static size_t attn_dec_thread_floats(const struct attn_dec *d) {
    const struct attn_args *a = d->a;
    const size_t rows = (size_t)a->n_tok * d->G;
    return (size_t)(1 + d->prep.n_far) * ATTN_CB * d->krow +
           (size_t)a->n_head_kv * d->n_db * rows * ATTN_DB + d->ld +
           (a->rope ? a->rope->n_rot : 0) + 64;
}

// Lays out the buffers of d in st (grown as needed).
static int attn_dec_layout(struct cpu_attn *st, struct attn_dec *d, float **tmpp,
                           struct verr *err) {
    const struct attn_args *a = d->a;
    const size_t nt = (size_t)a->n_tok;
    int rc = attn_buf_reserve(&st->dbuf, &st->dbuf_floats, attn_dec_shared_floats(d), err);
    if (rc || (rc = attn_scratch_reserve(st, d->thr_floats * sizeof(float), err)))
        return rc;
    d->S = st->dbuf;
    d->qn = d->S + (size_t)d->R * d->ld;
    d->qf = d->qn + (size_t)d->R * a->head_dim;
    d->cmax = d->qf + (size_t)d->R * a->head_dim;
    d->mx = d->cmax + (size_t)d->n_ch * d->R;
    d->vis = (unsigned char *)(d->mx + d->R);
    d->clo = (int *)(d->mx + d->R + (nt * d->ld + 3) / 4);
    d->chi = d->clo + (size_t)d->n_ch * nt;
    d->ord_buf = d->chi + (size_t)d->n_ch * nt;
    d->cnt = d->ord_buf + nt * d->ld;
    const size_t cs = d->thr_floats - (a->rope ? a->rope->n_rot : 0) - 64;
    for (int i = 0; i < st->n_threads; i++)
        tmpp[i] = (float *)st->scratch[i] + cs;
    d->prep.tmp = tmpp;
    return VERR_OK;
}

// Each token's far copy and W, and its query rows (as attn_item_queries).
static void attn_dec_queries(struct attn_dec *d) {
    const struct attn_args *a = d->a;
    const int D = a->head_dim;
    for (int t = 0; t < a->n_tok; t++) {
        int g, w;
        attn_tok_se(a, t, &g, &w);
        d->w[t] = w;
        d->far[t] = -1;
        for (int i = 0; i < d->prep.n_far; i++)
            if (d->far_g[i] == g && a->q_pos[t] >= w)
                d->far[t] = i;
        const bool far = a->rope && d->far[t] >= 0;
        const int32_t pf = far ? se_q_pos_far(a->q_pos[t], g, w) : 0;
        for (int h = 0; h < a->n_head; h++) {
            const size_t r = ((size_t)t * a->n_head + h) * D;
            attn_query_head(d->st, a->rope, a->q + r, D, a->q_pos[t], d->qn + r,
                            far ? d->qf + r : NULL, pf, d->prep.tmp[0]);
        }
    }
}

// Chunk ch's visibility for every token (the mask of attn_item_visibility)
// and the chunk's visible range per token (clo = chi = the chunk's first
// cell when it has none).
static void attn_dec_visibility(struct attn_dec *d, int ch) {
    const struct attn_args *a = d->a;
    const int C0 = ch * ATTN_CHUNK, C1 = C0 + ATTN_CHUNK < a->n_kv ? C0 + ATTN_CHUNK : a->n_kv;
    for (int t = 0; t < a->n_tok; t++) {
        const int32_t qpos = a->q_pos[t];
        const int qseq = a->q_seq[t];
        unsigned char *vt = d->vis + (size_t)t * d->ld;
        int l = C1, h = C0;
        for (int c = C0; c < C1; c++) {
            vt[c] = attn_visible(a, attn_cell_pos_for(a, c, qseq), qpos);
            if (vt[c]) {
                l = c < l ? c : l;
                h = c + 1;
            }
        }
        d->clo[ch * a->n_tok + t] = l < h ? l : C0;
        d->chi[ch * a->n_tok + t] = l < h ? h : C0;
    }
}

// Asks for the bytes [p, p + n) to be brought into the cache (the next
// tile's rows while this one's are computed: the loads of the kernels come
// one after another, and alone they leave the memory idle).
static inline void attn_prefetch(const void *p, size_t n) {
    for (size_t o = 0; o < n; o += 64)
        __builtin_prefetch((const char *)p + o);
}

// Token t's cells [*c0, *c1) in the tile [cb, ce) (its chunk's visible
// range clipped); false when none.
static inline bool attn_dec_clip(const struct attn_dec *d, int ch, int t, int cb, int ce, int *c0,
                                 int *c1) {
    const int l = d->clo[ch * d->a->n_tok + t], h = d->chi[ch * d->a->n_tok + t];
    *c0 = cb > l ? cb : l;
    *c1 = ce < h ? ce : h;
    return *c0 < *c1;
}

// The keys tile [cb, ce) of chunk ch: the near rows and far copies some
// token's scores read there, of the cells [m0, m1) some token reads, into
// kt (near at kt, far copy i at kt + (1 + i) * ATTN_CB * krow; cell c at row c - cb).
static void attn_dec_keys(const struct attn_dec *d, int ch, int cb, int ce, float *kt, int thread) {
    const struct attn_args *a = d->a;
    bool need[1 + ATTN_FAR_MAX] = {false};
    int m0 = ce, m1 = cb;
    for (int t = 0; t < a->n_tok; t++) {
        int c0, c1;
        if (!attn_dec_clip(d, ch, t, cb, ce, &c0, &c1))
            continue;
        m0 = c0 < m0 ? c0 : m0;
        m1 = c1 > m1 ? c1 : m1;
        for (int c = c0; c < c1; c++) {
            const bool near = d->far[t] < 0 || se_is_near(a->q_pos[t], a->cell_pos[c], d->w[t]);
            need[near ? 0 : 1 + d->far[t]] = true;
        }
    }
    const size_t tile = (size_t)ATTN_CB * d->krow;
    for (int c = m0; c < m1; c++) {
        float *kf[ATTN_FAR_MAX] = {0};
        bool any = need[0];
        for (int i = 0; i < d->prep.n_far; i++) {
            kf[i] = need[1 + i] ? kt + (1 + i) * tile + (size_t)(c - cb) * d->krow : NULL;
            any |= need[1 + i];
        }
        if (any)
            attn_make_k(&d->prep, c, need[0] ? kt + (size_t)(c - cb) * d->krow : NULL, kf, thread);
    }
}

// Token t's scores over [c0, c1) of the tile at cb, every KV head: near or
// far keys per cell by the token's W (as attn_item_scores).
static void attn_dec_scores_tok(const struct attn_dec *d, int t, int cb, int c0, int c1,
                                const float *kt) {
    const struct attn_args *a = d->a;
    const int D = a->head_dim, G = d->G;
    const int32_t qpos = a->q_pos[t];
    const size_t tile = (size_t)ATTN_CB * d->krow;
    const bool h = !d->tiles && d->hk;
    for (int hk = 0; hk < a->n_head_kv; hk++) {
        const size_t r0 = (size_t)t * a->n_head + (size_t)hk * G;
        float *st = d->S + r0 * d->ld + cb;
        const void *kn = d->tiles ? (const void *)(kt + (size_t)hk * D)
                                  : attn_at(a->k, (size_t)cb * d->krow + (size_t)hk * D, h);
        const float *kf = d->far[t] < 0 ? NULL : kt + (1 + d->far[t]) * tile + (size_t)hk * D;
        int c = c0;
        while (c < c1) {
            const bool near = !kf || se_is_near(qpos, a->cell_pos[c], d->w[t]);
            int e = c + 1;
            while (e < c1 && (!kf || se_is_near(qpos, a->cell_pos[e], d->w[t])) == near)
                e++;
            const float *q = (near ? d->qn : d->qf) + r0 * D;
#ifdef ATTN_X86
            if (d->st->avx2)
                attn_scores_avx2(st, d->ld, q, G, near ? kn : kf, d->krow, c - cb, e - cb, D, h);
            else
#endif
                attn_scores_plain(st, d->ld, q, G, near ? kn : kf, d->krow, c - cb, e - cb, D, h);
            c = e;
        }
    }
}

// Step 1 of chunk ch: visibility, scores a tile at a time, then each row's
// mask and max over the chunk's visible range.
static void attn_dec_chunk_scores(void *ctx, int64_t i0, int64_t i1, int thread) {
    struct attn_dec *d = ctx;
    const struct attn_args *a = d->a;
    float *kt = (float *)d->st->scratch[thread];
    for (int ch = (int)i0; ch < i1; ch++) {
        attn_dec_visibility(d, ch);
        const int C0 = ch * ATTN_CHUNK, C1 = C0 + ATTN_CHUNK < a->n_kv ? C0 + ATTN_CHUNK : a->n_kv;
        for (int cb = C0; cb < C1; cb += ATTN_CB) {
            const int ce = cb + ATTN_CB < C1 ? cb + ATTN_CB : C1;
            const int pe = ce + ATTN_CB < a->n_kv ? ce + ATTN_CB : a->n_kv;
            if (ce < pe)
                attn_prefetch(attn_at(a->k, (size_t)ce * d->krow, d->hk),
                              (size_t)(pe - ce) * d->krow * (d->hk ? 2 : 4));
            if (d->tiles)
                attn_dec_keys(d, ch, cb, ce, kt, thread);
            for (int t = 0; t < a->n_tok; t++) {
                int c0, c1;
                if (attn_dec_clip(d, ch, t, cb, ce, &c0, &c1))
                    attn_dec_scores_tok(d, t, cb, c0, c1, kt);
            }
        }
        for (int r = 0; r < d->R; r++) {
            const int t = r / a->n_head, l = d->clo[ch * a->n_tok + t];
            const int h = d->chi[ch * a->n_tok + t];
            const unsigned char *vt = d->vis + (size_t)t * d->ld;
            float *s = d->S + (size_t)r * d->ld;
#ifdef ATTN_X86
            if (d->st->avx2)
                d->cmax[(size_t)ch * d->R + r] = attn_mask_max_avx2(s, vt, l, h, a->scale);
            else
#endif
                d->cmax[(size_t)ch * d->R + r] = attn_mask_max_plain(s, vt, l, h, a->scale);
        }
    }
}

// Between steps 1 and 2: each token's visible range and count (and its
// list of attn_order_cells where its cells are out of position order), each
// row's max (the max of its chunks' maxima: exact in any order).
static void attn_dec_ranges(struct attn_dec *d) {
    const struct attn_args *a = d->a;
    for (int t = 0; t < a->n_tok; t++) {
        const unsigned char *vt = d->vis + (size_t)t * d->ld;
        int l = a->n_kv, h = 0, n = 0, last = 0;
        bool in_order = true;
        for (int ch = 0; ch < d->n_ch; ch++) {
            const int cl = d->clo[ch * a->n_tok + t], chh = d->chi[ch * a->n_tok + t];
            if (cl >= chh)
                continue;
            l = cl < l ? cl : l;
            h = chh;
            for (int c = cl; c < chh; c++)
                if (vt[c]) {
                    n++;
                    in_order &= a->cell_pos[c] >= last;
                    last = a->cell_pos[c];
                }
        }
        d->lo[t] = l < h ? l : 0;
        d->hi[t] = l < h ? h : 0;
        d->n_vis[t] = n;
        d->ord[t] = NULL;
        if (!in_order) {
            int *ord = d->ord_buf + (size_t)t * d->ld;
            attn_order_cells(vt, a->cell_pos, d->lo[t], d->hi[t], n, ord, d->cnt, d->n_cnt);
            d->ord[t] = ord;
        }
    }
    for (int r = 0; r < d->R; r++) {
        float m = -INFINITY;
        for (int ch = 0; ch < d->n_ch; ch++) {
            const float x = d->cmax[(size_t)ch * d->R + r];
            m = x > m ? x : m;
        }
        if (a->sinks && a->sinks[r % a->n_head] > m)
            m = a->sinks[r % a->n_head];
        d->mx[r] = m;
    }
}

// Step 2 of chunk ch: the weights attn_exp(s - max) over its visible range,
// and zeros in the rest of the token's range within the chunk (cells no
// chunk scored: invisible, as the items' -inf gives).
static void attn_dec_chunk_exp(void *ctx, int64_t i0, int64_t i1, int thread) {
    struct attn_dec *d = ctx;
    const struct attn_args *a = d->a;
    (void)thread;
    for (int ch = (int)i0; ch < i1; ch++) {
        const int C0 = ch * ATTN_CHUNK, C1 = C0 + ATTN_CHUNK < a->n_kv ? C0 + ATTN_CHUNK : a->n_kv;
        for (int r = 0; r < d->R; r++) {
            const int t = r / a->n_head, l = d->clo[ch * a->n_tok + t];
            const int h = d->chi[ch * a->n_tok + t];
            float *s = d->S + (size_t)r * d->ld;
            const int z0 = C0 > d->lo[t] ? C0 : d->lo[t], z1 = C1 < d->hi[t] ? C1 : d->hi[t];
            for (int c = z0; c < z1; c++)
                if (c < l || c >= h)
                    s[c] = 0.0f;
            if (l >= h)
                continue;
#ifdef ATTN_X86
            if (d->st->avx2)
                attn_exp_avx2(s, l, h, d->mx[r]);
            else
#endif
                attn_exp_plain(s, l, h, d->mx[r]);
        }
    }
}

// Row r's softmax sum (as attn_item_softmax): its visible weights, packed
// into pk where the range has holes.
static float attn_dec_sum(const struct attn_dec *d, int r, float *pk) {
    const int t = r / d->a->n_head;
    const float *s = d->S + (size_t)r * d->ld;
    const float *w = s + d->lo[t];
    if (d->ord[t]) { // by position
        for (int k = 0; k < d->n_vis[t]; k++)
            pk[k] = s[d->ord[t][k]];
        w = pk;
    } else if (d->n_vis[t] != d->hi[t] - d->lo[t]) {
        const unsigned char *vt = d->vis + (size_t)t * d->ld;
        int k = 0;
        for (int c = d->lo[t]; c < d->hi[t]; c++)
            if (vt[c])
                pk[k++] = s[c];
        w = pk;
    }
#ifdef ATTN_X86
    if (d->st->avx2)
        return attn_sum_avx2(w, d->n_vis[t]);
#endif
    return attn_sum_plain(w, d->n_vis[t]);
}

// The tokens' cells [*LO, *HI): the union of their visible ranges.
static void attn_dec_union(const struct attn_dec *d, int *LO, int *HI) {
    *LO = d->a->n_kv;
    *HI = 0;
    for (int t = 0; t < d->a->n_tok; t++)
        if (d->lo[t] < d->hi[t]) {
            *LO = d->lo[t] < *LO ? d->lo[t] : *LO;
            *HI = d->hi[t] > *HI ? d->hi[t] : *HI;
        }
}

// Where block b of V's dims starts in a cell's row: KV head b / n_db, dims
// from (b % n_db) * ATTN_DB.
static inline size_t attn_dec_block_off(const struct attn_dec *d, int b) {
    return (size_t)(b / d->n_db) * d->a->head_dim_v + (size_t)(b % d->n_db) * ATTN_DB;
}

// acc += P.V for the blocks [b0, b1) of (KV head, ATTN_DB dims of V): block
// b is head b / n_db, dims from (b % n_db) * ATTN_DB, its rows' sums at acc +
// (b - b0) * n_tok * G * ATTN_DB. A tile at a time over each token's range
// (as attn_item_output), every block of the tile before the next tile, so
// that the V rows are read as one stream; V straight from the cache.
static void attn_dec_pv(const struct attn_dec *d, int b0, int b1, float *acc) {
    const struct attn_args *a = d->a;
    const int G = d->G, Dv = a->head_dim_v;
    const size_t ldv = (size_t)a->n_head_kv * Dv, blk = (size_t)a->n_tok * G * ATTN_DB;
    int LO, HI;
    attn_dec_union(d, &LO, &HI);
    for (int cb = LO; cb < HI; cb += ATTN_CB) {
        const int ce = cb + ATTN_CB < HI ? cb + ATTN_CB : HI;
        const int pe = ce + ATTN_CB < HI ? ce + ATTN_CB : HI;
        const size_t p0 = attn_dec_block_off(d, b0), p1 = attn_dec_block_off(d, b1 - 1) + ATTN_DB;
        for (int c = ce; c < pe; c++) // the next tile's bytes of the blocks
            attn_prefetch(attn_at(a->v, c * ldv + p0, d->hv), (p1 - p0) * (d->hv ? 2 : 4));
        for (int b = b0; b < b1; b++) {
            const int hk = b / d->n_db, d0 = (b % d->n_db) * ATTN_DB;
            const int bw = Dv - d0 < ATTN_DB ? Dv - d0 : ATTN_DB;
            const void *v = attn_at(a->v, cb * ldv + (size_t)hk * Dv + d0, d->hv);
            for (int t = 0; t < a->n_tok; t++) {
                const int c0 = cb > d->lo[t] ? cb : d->lo[t], c1 = ce < d->hi[t] ? ce : d->hi[t];
                if (d->ord[t] || c0 >= c1)
                    continue;
                const float *p = d->S + ((size_t)t * a->n_head + (size_t)hk * G) * d->ld + cb;
                attn_pv(d->st, acc + (size_t)(b - b0) * blk + (size_t)t * G * bw, G, p, d->ld, v,
                        ldv, NULL, c0 - cb, c1 - cb, bw, d->hv);
            }
        }
    }
    for (int b = b0; b < b1; b++) // tokens whose cells are out of position order
        for (int t = 0; t < a->n_tok; t++)
            if (d->ord[t]) {
                const int hk = b / d->n_db, d0 = (b % d->n_db) * ATTN_DB;
                const int bw = Dv - d0 < ATTN_DB ? Dv - d0 : ATTN_DB;
                const float *p = d->S + ((size_t)t * a->n_head + (size_t)hk * G) * d->ld;
                attn_pv(d->st, acc + (size_t)(b - b0) * blk + (size_t)t * G * bw, G, p, d->ld,
                        attn_at(a->v, (size_t)hk * Dv + d0, d->hv), ldv, d->ord[t], 0, d->n_vis[t],
                        bw, d->hv);
            }
}

// Step 3, slice i of n_sl: the blocks [i * nb / n_sl, (i + 1) * nb / n_sl)
// of (KV head, dims of V) (attn_dec_pv), then each row divided by its sum
// into out (zeros for a row that sees nothing). Every element is computed
// alone, so the slicing changes no bits.
static void attn_dec_outputs(void *ctx, int64_t i0, int64_t i1, int thread) {
    struct attn_dec *d = ctx;
    const struct attn_args *a = d->a;
    const int G = d->G, Dv = a->head_dim_v, nb = a->n_head_kv * d->n_db;
    const size_t blk = (size_t)a->n_tok * G * ATTN_DB;
    float *acc = (float *)d->st->scratch[thread] + (size_t)(1 + d->prep.n_far) * ATTN_CB * d->krow;
    float *pk = acc + (size_t)nb * blk;
    for (int64_t i = i0; i < i1; i++) {
        const int b0 = (int)(i * nb / d->n_sl), b1 = (int)((i + 1) * nb / d->n_sl);
        memset(acc, 0, (size_t)(b1 - b0) * blk * sizeof(float));
        attn_dec_pv(d, b0, b1, acc);
        for (int b = b0; b < b1; b++) {
            const int hk = b / d->n_db, d0 = (b % d->n_db) * ATTN_DB;
            const int bw = Dv - d0 < ATTN_DB ? Dv - d0 : ATTN_DB;
            for (int t = 0; t < a->n_tok; t++)
                for (int g = 0; g < G; g++) {
                    const size_t r = (size_t)t * a->n_head + (size_t)hk * G + g;
                    float *out = a->out + r * Dv + d0;
                    const float *ar = acc + (size_t)(b - b0) * blk + (size_t)(t * G + g) * bw;
                    if (d->lo[t] >= d->hi[t]) {
                        memset(out, 0, (size_t)bw * sizeof(float));
                        continue;
                    }
                    float sum = attn_dec_sum(d, (int)r, pk);
                    if (a->sinks)
                        sum += attn_exp(a->sinks[r % a->n_head] - d->mx[r]);
                    const float inv = 1.0f / sum;
                    for (int e = 0; e < bw; e++)
                        out[e] = ar[e] * inv;
                }
        }
    }
}

// The decode path (attn_dec_fits): queries, then the three steps.
static int attn_dec_run(struct cpu_attn *st, struct threadpool *pool, const struct attn_args *a,
                        float **tmpp, struct verr *err) {
    struct attn_dec d = {.a = a, .st = st, .prep = {.a = a, .st = st}};
    d.prep.n_far = attn_next_gs(a, 1, d.far_g);
    d.prep.far_g = d.far_g;
    d.G = a->n_head / a->n_head_kv;
    d.R = a->n_tok * a->n_head;
    d.n_ch = (a->n_kv + ATTN_CHUNK - 1) / ATTN_CHUNK;
    d.n_db = (a->head_dim_v + ATTN_DB - 1) / ATTN_DB;
    d.n_sl = a->n_head_kv * d.n_db < st->n_threads ? a->n_head_kv * d.n_db : st->n_threads;
    d.ld = ((size_t)a->n_kv + 7) / 8 * 8 + 8;
    d.krow = (size_t)a->n_head_kv * a->head_dim;
    d.n_cnt = attn_order_span(a);
    d.tiles = a->rope != NULL;
    d.hk = a->type_k == GGML_TYPE_F16;
    d.hv = a->type_v == GGML_TYPE_F16;
    d.thr_floats = attn_dec_thread_floats(&d);
    int rc = attn_dec_layout(st, &d, tmpp, err);
    if (rc)
        return rc;
    if (a->rope) {
        int32_t maxp = 0; // far positions are at most their near ones
        for (int c = 0; c < a->n_kv; c++)
            maxp = a->cell_pos[c] > maxp ? a->cell_pos[c] : maxp;
        for (int t = 0; t < a->n_tok; t++)
            maxp = a->q_pos[t] > maxp ? a->q_pos[t] : maxp;
        if ((rc = attn_tab_reserve(st, a->rope, (int64_t)maxp + 1, err)))
            return rc;
    }
    attn_dec_queries(&d);
    threadpool_parallel_for(pool, d.n_ch, 1, attn_dec_chunk_scores, &d);
    attn_dec_ranges(&d);
    threadpool_parallel_for(pool, d.n_ch, 1, attn_dec_chunk_exp, &d);
    threadpool_parallel_for(pool, d.n_sl, 1, attn_dec_outputs, &d);
    return VERR_OK;
}

// The call's buffers: K as float32 (near, then n_far far copies) where it is
// to be made, V as float32 from an F16 cache, and the cos/sin table up to the
// largest position. Fills p's pointers (NULL where nothing is to be made).
static int attn_reserve(struct cpu_attn *st, const struct attn_args *a, int n_far,
                        struct attn_prep *p, struct verr *err) {
    const size_t n_kv = (size_t)a->n_kv;
    const size_t kf = n_kv * a->n_head_kv * a->head_dim, vf = n_kv * a->n_head_kv * a->head_dim_v;
    const bool make_k = a->rope || a->type_k != GGML_TYPE_F32;
    const bool make_v = a->type_v != GGML_TYPE_F32;
    int rc;
    if (make_k && (rc = attn_buf_reserve(&st->kbuf, &st->kbuf_floats, kf * (1 + n_far), err)))
        return rc;
    if (make_v && (rc = attn_buf_reserve(&st->vbuf, &st->vbuf_floats, vf, err)))
        return rc;
    p->k_near = make_k ? st->kbuf : NULL;
    for (int i = 0; i < n_far; i++)
        p->k_far[i] = st->kbuf + kf * (1 + i);
    p->v = make_v ? st->vbuf : NULL;
    if (!a->rope)
        return VERR_OK;
    int32_t maxp = 0; // far positions are at most their near ones
    for (int c = 0; c < a->n_kv; c++)
        maxp = a->cell_pos[c] > maxp ? a->cell_pos[c] : maxp;
    for (int t = 0; t < a->n_tok; t++)
        maxp = a->q_pos[t] > maxp ? a->q_pos[t] : maxp;
    return attn_tab_reserve(st, a->rope, (int64_t)maxp + 1, err);
}

// The work items (blocks of tokens x KV heads, enough of them for every
// thread) and each thread's scratch: the item's buffers, then a cos/sin row
// for positions beyond the table (tmpp[thread]).
static int attn_layout(struct cpu_attn *st, const struct attn_args *a, struct attn_job *j,
                       float **tmpp, struct verr *err) {
    const int group = a->n_head / a->n_head_kv;
    int tb = ATTN_ROWS / group < 1 ? 1 : ATTN_ROWS / group;
    tb = tb > a->n_tok ? a->n_tok : tb;
    while (tb > 1 && (int64_t)((a->n_tok + tb - 1) / tb) * a->n_head_kv < 4 * st->n_threads)
        tb /= 2;
    j->group = group;
    j->tb = tb;
    j->n_tb = (a->n_tok + tb - 1) / tb;
    j->ld = ((size_t)a->n_kv + 7) / 8 * 8 + 8;
    j->n_cnt = attn_order_span(a);
    const size_t item = attn_item_floats(a, tb, group, j->ld, j->n_cnt);
    const size_t cs_floats = (size_t)st->n_threads * (a->rope ? a->rope->n_rot : 0);
    int rc = attn_scratch_reserve(st, (item + cs_floats) * sizeof(float), err);
    if (rc)
        return rc;
    for (int i = 0; i < st->n_threads; i++)
        tmpp[i] = (float *)st->scratch[i] + item;
    j->tmp = tmpp;
    return VERR_OK;
}

// Runs the rounds (see the top of the file): round by round the far copies
// of the next values of G, then every work item for the tokens of the round.
static void attn_rounds(struct threadpool *pool, const struct attn_args *a, struct attn_prep *p,
                        struct attn_job *j, int n_far) {
    const int64_t grain = (int64_t)(4096 / (a->n_head_kv * (a->head_dim + a->head_dim_v))) + 1;
    j->k_near = p->k_near ? p->k_near : (const float *)a->k;
    j->v = p->v ? p->v : (const float *)a->v;
    j->with_g1 = true;
    j->n_far = p->n_far = n_far;
    p->far_g = j->far_g;
    for (;;) {
        for (int i = 0; i < n_far; i++)
            j->k_far[i] = p->k_far[i];
        if (p->k_near || p->v || p->n_far)
            threadpool_parallel_for(pool, a->n_kv, grain, attn_prep_range, p);
        threadpool_parallel_for(pool, (int64_t)j->n_tb * a->n_head_kv, 1, attn_items_range, j);
        if (n_far < ATTN_FAR_MAX)
            return;
        // near keys and V are made, the G = 1 rows done: the next values of G
        p->k_near = p->v = NULL;
        j->with_g1 = false;
        n_far = attn_next_gs(a, j->far_g[n_far - 1], j->far_g);
        if (n_far == 0)
            return;
        j->n_far = p->n_far = n_far;
    }
}

// The item path: K and V made once, then the rounds.
static int attn_items_run(struct cpu_attn *st, struct threadpool *pool, const struct attn_args *a,
                          float **tmpp, struct verr *err) {
    struct attn_job j = {.a = a, .st = st};
    const int n_far = attn_next_gs(a, 1, j.far_g);
    struct attn_prep p = {.a = a, .st = st};
    int rc = attn_reserve(st, a, n_far, &p, err);
    if (rc || (rc = attn_layout(st, a, &j, tmpp, err)))
        return rc;
    p.tmp = tmpp;
    attn_rounds(pool, a, &p, &j, n_far);
    return VERR_OK;
}

// ---------------------------------------------------------------------------
// a quantized cache (see the top)

struct attn_deq {
    const struct attn_args *a;
    float *k, *v;    // the float32 rows, or NULL where that tensor is not quantized
    _Atomic int bad; // a row failed to dequantize (a type quant.c cannot read)
};

static void attn_deq_range(void *ctx, int64_t c0, int64_t c1, int thread) {
    (void)thread;
    struct attn_deq *j = ctx;
    const struct attn_args *a = j->a;
    for (int i = 0; i < 2; i++) {
        float *dst = i ? j->v : j->k;
        if (!dst)
            continue;
        const enum ggml_type t = i ? a->type_v : a->type_k;
        const int64_t n = (int64_t)a->n_head_kv * (i ? a->head_dim_v : a->head_dim);
        const size_t rb = ggml_row_bytes(t, n);
        const char *src = i ? a->v : a->k;
        for (int64_t c = c0; c < c1; c++) {
            float *d = dst + (size_t)c * (size_t)n;
            if (a->cell_pos[c] < 0) // never visible: zeros keep the scores finite
                memset(d, 0, (size_t)n * sizeof *d);
            else if (quant_dequantize_row(t, src + (size_t)c * rb, d, n, NULL))
                atomic_store(&j->bad, 1);
        }
    }
}

// *b = a, with each quantized tensor of a dequantized into st's buffers and
// given as F32.
static int attn_dequantize(struct cpu_attn *st, struct threadpool *pool, const struct attn_args *a,
                           struct attn_args *b, struct verr *err) {
    *b = *a;
    const bool qk = !backend_cache_type_ok(a->type_k), qv = !backend_cache_type_ok(a->type_v);
    if ((!qk && !qv) || a->n_kv == 0)
        return VERR_OK;
    const size_t nk = (size_t)a->n_kv * a->n_head_kv * a->head_dim;
    const size_t nv = (size_t)a->n_kv * a->n_head_kv * a->head_dim_v;
    int rc = qk ? attn_buf_reserve(&st->kq, &st->kq_floats, nk, err) : VERR_OK;
    if (rc || (qv && (rc = attn_buf_reserve(&st->vq, &st->vq_floats, nv, err))))
        return rc;
    struct attn_deq j = {.a = a, .k = qk ? st->kq : NULL, .v = qv ? st->vq : NULL};
    const int64_t per_cell = (int64_t)a->n_head_kv * (a->head_dim + a->head_dim_v);
    threadpool_parallel_for(pool, a->n_kv, per_cell >= 8192 ? 1 : 8192 / per_cell, attn_deq_range,
                            &j);
    if (atomic_load(&j.bad))
        return verr_set(err, VERR_UNSUPPORTED, "cpu attention: cannot dequantize a %s/%s cache",
                        ggml_type_name(a->type_k), ggml_type_name(a->type_v));
    if (qk) {
        b->k = st->kq;
        b->type_k = GGML_TYPE_F32;
    }
    if (qv) {
        b->v = st->vq;
        b->type_v = GGML_TYPE_F32;
    }
    return VERR_OK;
}

int cpu_attention_run(struct cpu_attn **stp, struct threadpool *pool, const struct attn_args *a_in,
                      struct verr *err) {
    int rc = attn_check(a_in, err);
    if (rc || a_in->n_tok == 0)
        return rc;
    struct cpu_attn *st = *stp;
    if (!st) {
        if (!(st = attn_state_new(pool)))
            return verr_set(err, VERR_NOMEM, "cpu attention: out of memory");
        *stp = st;
    }
    struct attn_args deq;
    if ((rc = attn_dequantize(st, pool, a_in, &deq, err)))
        return rc;
    const struct attn_args *a = &deq;
    float *tmp[ATTN_ROWS];
    float **tmpp = st->n_threads <= ATTN_ROWS ? tmp : malloc((size_t)st->n_threads * sizeof *tmpp);
    if (!tmpp)
        return verr_set(err, VERR_NOMEM, "cpu attention: out of memory");
    rc = attn_dec_fits(a) ? attn_dec_run(st, pool, a, tmpp, err)
                          : attn_items_run(st, pool, a, tmpp, err);
    if (tmpp != tmp)
        free(tmpp);
    return rc;
}
