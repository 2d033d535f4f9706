// The CPU backend's attention op (cpu_attention.h): plain float32, the
// reference the CUDA kernels are tested against.
//
// How a call runs:
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
// What each output row is, whatever the batch, the block or the thread:
//   score(c) = dot(q, k_c) * scale, the dot as eight running sums (lane j
//     takes dims j, j+8, ...) combined as ((0+1)+(2+3))+((4+5)+(6+7)), then
//     the dims past the last multiple of 8 in order;
//   w(c) = attn_exp(score(c) - max) for visible cells, 0 otherwise;
//   sum = eight running sums of w (lane c % 8, cells in order), combined as
//     above; out[d] = (sum over visible c in order of w(c) * v_c[d]) * (1/sum).
// Every step is a float multiply or add in a fixed order (no FMA, no
// reassociation), so the AVX2 kernels and the plain C ones give the same
// bits, and results are bit-identical for any thread count and batch split.
// A row that sees nothing is zeros. A token's rows depend on nothing of the
// other tokens (their (G, W) included): the same bits in any batch.
#include "host/backend/cpu_attention.h"

#include <math.h>
#include <pthread.h>
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
    struct attn_rope_tab tab;
};

static void *attn_aligned(size_t bytes) {
    bytes = (bytes + ATTN_ALIGN - 1) / ATTN_ALIGN * ATTN_ALIGN;
    return aligned_alloc(ATTN_ALIGN, bytes ? bytes : ATTN_ALIGN);
}

static bool attn_have_avx2(void) {
#ifdef ATTN_X86
    // VELA_CPU_ATTN=plain runs the plain C kernels (to compare them).
    const char *pin = getenv("VELA_CPU_ATTN");
    if (pin && strcmp(pin, "plain") == 0)
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

static float attn_dot_plain(const float *a, const float *b, int n) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * b[i + j];
    float s = attn_tree8(acc);
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

// sc[r][c] = dot(q[r], k_c) for nr rows and cells [c0, c1); k_c = k + c * ldk.
static void attn_scores_plain(float *sc, size_t ldsc, const float *q, int nr, const float *k,
                              size_t ldk, int c0, int c1, int D) {
    for (int r = 0; r < nr; r++)
        for (int c = c0; c < c1; c++)
            sc[r * ldsc + c] = attn_dot_plain(q + (size_t)r * D, k + (size_t)c * ldk, D);
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

// acc[r][d] += p[r][c] * v_c[d] for cells [c0, c1) in order, skipping a cell
// whose p is 0 in every row (invisible: nothing is added, as if skipped).
static void attn_pv_plain(float *acc, int nr, const float *p, size_t ldp, const float *v,
                          size_t ldv, int c0, int c1, int Dv) {
    for (int c = c0; c < c1; c++) {
        bool any = false;
        for (int r = 0; r < nr; r++)
            any |= p[r * ldp + c] != 0.0f;
        if (!any)
            continue;
        const float *vc = v + (size_t)c * ldv;
        for (int r = 0; r < nr; r++) {
            const float w = p[r * ldp + c];
            float *o = acc + (size_t)r * Dv;
            for (int d = 0; d < Dv; d++)
                o[d] += w * vc[d];
        }
    }
}

#ifdef ATTN_X86
#define ATTN_AVX2 __attribute__((target("avx2,f16c")))

// The 8 lanes of a, b, c, d each combined as attn_tree8: {ta, tb, tc, td}.
ATTN_AVX2 static inline __m128 attn_tree8x4(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 ab = _mm256_hadd_ps(a, b); // a01 a23 b01 b23 | a45 a67 b45 b67
    const __m256 cd = _mm256_hadd_ps(c, d);
    const __m256 h = _mm256_hadd_ps(ab, cd); // (01+23) of a b c d | (45+67) of a b c d
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// Two rows (or one: q1 == NULL) against 4 cells; D a multiple of 8.
ATTN_AVX2 static inline void attn_dot_2x4(float *s0, float *s1, const float *q0, const float *q1,
                                          const float *k, size_t ldk, int D) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    const float *k0 = k, *k1 = k + ldk, *k2 = k + 2 * ldk, *k3 = k + 3 * ldk;
    if (q1) {
        for (int i = 0; i < D; i += 8) {
            const __m256 x0 = _mm256_loadu_ps(q0 + i), x1 = _mm256_loadu_ps(q1 + i);
            __m256 kv = _mm256_loadu_ps(k0 + i);
            a00 = _mm256_add_ps(a00, _mm256_mul_ps(x0, kv));
            a10 = _mm256_add_ps(a10, _mm256_mul_ps(x1, kv));
            kv = _mm256_loadu_ps(k1 + i);
            a01 = _mm256_add_ps(a01, _mm256_mul_ps(x0, kv));
            a11 = _mm256_add_ps(a11, _mm256_mul_ps(x1, kv));
            kv = _mm256_loadu_ps(k2 + i);
            a02 = _mm256_add_ps(a02, _mm256_mul_ps(x0, kv));
            a12 = _mm256_add_ps(a12, _mm256_mul_ps(x1, kv));
            kv = _mm256_loadu_ps(k3 + i);
            a03 = _mm256_add_ps(a03, _mm256_mul_ps(x0, kv));
            a13 = _mm256_add_ps(a13, _mm256_mul_ps(x1, kv));
        }
        _mm_storeu_ps(s1, attn_tree8x4(a10, a11, a12, a13));
    } else {
        for (int i = 0; i < D; i += 8) {
            const __m256 x0 = _mm256_loadu_ps(q0 + i);
            a00 = _mm256_add_ps(a00, _mm256_mul_ps(x0, _mm256_loadu_ps(k0 + i)));
            a01 = _mm256_add_ps(a01, _mm256_mul_ps(x0, _mm256_loadu_ps(k1 + i)));
            a02 = _mm256_add_ps(a02, _mm256_mul_ps(x0, _mm256_loadu_ps(k2 + i)));
            a03 = _mm256_add_ps(a03, _mm256_mul_ps(x0, _mm256_loadu_ps(k3 + i)));
        }
    }
    _mm_storeu_ps(s0, attn_tree8x4(a00, a01, a02, a03));
}

ATTN_AVX2 static void attn_scores_avx2(float *sc, size_t ldsc, const float *q, int nr,
                                       const float *k, size_t ldk, int c0, int c1, int D) {
    if (D % 8 != 0) {
        attn_scores_plain(sc, ldsc, q, nr, k, ldk, c0, c1, D);
        return;
    }
    int c = c0;
    for (; c + 4 <= c1; c += 4) {
        const float *kc = k + (size_t)c * ldk;
        int r = 0;
        for (; r + 2 <= nr; r += 2)
            attn_dot_2x4(sc + r * ldsc + c, sc + (r + 1) * ldsc + c, q + (size_t)r * D,
                         q + (size_t)(r + 1) * D, kc, ldk, D);
        if (r < nr)
            attn_dot_2x4(sc + r * ldsc + c, NULL, q + (size_t)r * D, NULL, kc, ldk, D);
    }
    if (c < c1)
        attn_scores_plain(sc, ldsc, q, nr, k, ldk, c, c1, D);
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

// acc rows r0 (and r1 unless NULL) += p * v over cells [c0, c1), 32 dims.
ATTN_AVX2 static inline void attn_pv_2x32(float *o0, float *o1, const float *p0, const float *p1,
                                          const float *v, size_t ldv, int c0, int c1) {
    __m256 a0 = _mm256_loadu_ps(o0), a1 = _mm256_loadu_ps(o0 + 8);
    __m256 a2 = _mm256_loadu_ps(o0 + 16), a3 = _mm256_loadu_ps(o0 + 24);
    if (o1) {
        __m256 b0 = _mm256_loadu_ps(o1), b1 = _mm256_loadu_ps(o1 + 8);
        __m256 b2 = _mm256_loadu_ps(o1 + 16), b3 = _mm256_loadu_ps(o1 + 24);
        for (int c = c0; c < c1; c++) {
            if (p0[c] == 0.0f && p1[c] == 0.0f)
                continue;
            const float *vc = v + (size_t)c * ldv;
            const __m256 w0 = _mm256_set1_ps(p0[c]), w1 = _mm256_set1_ps(p1[c]);
            __m256 x = _mm256_loadu_ps(vc);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(w0, x));
            b0 = _mm256_add_ps(b0, _mm256_mul_ps(w1, x));
            x = _mm256_loadu_ps(vc + 8);
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(w0, x));
            b1 = _mm256_add_ps(b1, _mm256_mul_ps(w1, x));
            x = _mm256_loadu_ps(vc + 16);
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(w0, x));
            b2 = _mm256_add_ps(b2, _mm256_mul_ps(w1, x));
            x = _mm256_loadu_ps(vc + 24);
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(w0, x));
            b3 = _mm256_add_ps(b3, _mm256_mul_ps(w1, x));
        }
        _mm256_storeu_ps(o1, b0);
        _mm256_storeu_ps(o1 + 8, b1);
        _mm256_storeu_ps(o1 + 16, b2);
        _mm256_storeu_ps(o1 + 24, b3);
    } else {
        for (int c = c0; c < c1; c++) {
            if (p0[c] == 0.0f)
                continue;
            const float *vc = v + (size_t)c * ldv;
            const __m256 w0 = _mm256_set1_ps(p0[c]);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(w0, _mm256_loadu_ps(vc)));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(w0, _mm256_loadu_ps(vc + 8)));
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(w0, _mm256_loadu_ps(vc + 16)));
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(w0, _mm256_loadu_ps(vc + 24)));
        }
    }
    _mm256_storeu_ps(o0, a0);
    _mm256_storeu_ps(o0 + 8, a1);
    _mm256_storeu_ps(o0 + 16, a2);
    _mm256_storeu_ps(o0 + 24, a3);
}

// The same as attn_pv_plain. A cell is skipped when its p is 0 in the rows
// of the call; with two rows of one token that is the plain rule (both rows
// see the same cells), and a skipped cell adds nothing either way.
ATTN_AVX2 static void attn_pv_avx2(float *acc, int nr, const float *p, size_t ldp, const float *v,
                                   size_t ldv, int c0, int c1, int Dv) {
    int d = 0;
    for (; d + 32 <= Dv; d += 32) {
        int r = 0;
        for (; r + 2 <= nr; r += 2)
            attn_pv_2x32(acc + (size_t)r * Dv + d, acc + (size_t)(r + 1) * Dv + d, p + r * ldp,
                         p + (r + 1) * ldp, v + d, ldv, c0, c1);
        if (r < nr)
            attn_pv_2x32(acc + (size_t)r * Dv + d, NULL, p + r * ldp, NULL, v + d, ldv, c0, c1);
    }
    for (; d < Dv; d++) // dims past the last 32: each element is its own sum
        for (int c = c0; c < c1; c++) {
            const float *vc = v + (size_t)c * ldv;
            for (int r = 0; r < nr; r++) {
                const float w = p[r * ldp + c];
                if (w != 0.0f)
                    acc[(size_t)r * Dv + d] += w * vc[d];
            }
        }
}
#endif

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
    float **tmp;    // per thread [n_rot]: a cos/sin row beyond the table
};

// F16 -> F32 of the plain path: a table filled once from quant_fp16_to_f32
// (the AVX2 path's F16C conversion is exact too: the same floats).
static float attn_fp16_table[1 << 16];
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

// Rotates the n_head_kv heads of one key row at position p.
static void attn_rotate_row(const struct attn_prep *j, float *k, int32_t p, int thread) {
    const struct rope_params *rp = j->a->rope;
    const float *cs = attn_cs_row(j->st, rp, p, j->tmp[thread]);
    for (int h = 0; h < j->a->n_head_kv; h++)
        rope_rotate_f32(k + (size_t)h * j->a->head_dim, cs, rp->n_rot, rp->mode);
}

// Cell c's keys: the near row where j->k_near (float32, rotated at its
// position with rope) and each far copy (rotated at pos / far_g[i]), all from
// the same widened row (widening is exact). Empty cells get zeros: never
// visible, and the scores stay finite.
static void attn_prep_k(const struct attn_prep *j, int64_t c, int thread) {
    const struct attn_args *a = j->a;
    const size_t krow = (size_t)a->n_head_kv * a->head_dim;
    const size_t ek = a->type_k == GGML_TYPE_F16 ? 2 : 4;
    const int32_t p = a->cell_pos[c];
    float *kn = j->k_near ? j->k_near + c * krow : NULL;
    float *src = kn ? kn : j->k_far[0] + c * krow; // n_far >= 1 without k_near
    if (p < 0) {
        if (kn)
            memset(kn, 0, krow * sizeof(float));
        for (int i = 0; i < j->n_far; i++)
            memset(j->k_far[i] + c * krow, 0, krow * sizeof(float));
        return;
    }
    attn_widen(src, (const char *)a->k + c * krow * ek, a->type_k, krow, j->st->avx2);
    if (!a->rope)
        return;
    for (int i = 0; i < j->n_far; i++)
        if (j->k_far[i] + c * krow != src)
            memcpy(j->k_far[i] + c * krow, src, krow * sizeof(float));
    if (kn)
        attn_rotate_row(j, kn, p, thread);
    for (int i = 0; i < j->n_far; i++)
        attn_rotate_row(j, j->k_far[i] + c * krow, se_k_pos_far(p, j->far_g[i]), thread);
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

// Scratch of one work item, in floats (the visibility bytes at the end).
static size_t attn_item_floats(const struct attn_args *a, int tb, int group, size_t ld) {
    const size_t rows = (size_t)tb * group;
    return rows * ld + 2 * rows * a->head_dim + rows * a->head_dim_v + rows * 8 +
           ((size_t)tb * ld + sizeof(float) - 1) / sizeof(float) + 2 * ld + 64;
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
    it->LO = a->n_kv;
    it->HI = 0;
}

// Token t's exact self-extend: G and W from q_se (G < 1 and W < 1 read as
// 1) or the call's se_g / se_w; G = 1 without rope.
static inline void attn_tok_se(const struct attn_args *a, int tok, int *g, int *w) {
    const int gg = a->q_se ? a->q_se[2 * tok] : a->se_g;
    const int ww = a->q_se ? a->q_se[2 * tok + 1] : a->se_w;
    *g = !a->rope || gg < 1 ? 1 : gg;
    *w = ww < 1 ? 1 : ww;
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

// Token t's visibility row and range. The mask (host/ops/backend.h): cell c
// is visible iff it holds qseq, 0 <= pos <= qpos and, with a window,
// qpos - pos < window.
static void attn_item_visibility(const struct attn_job *j, struct attn_item *it, int t,
                                 int *kp_seq) {
    const struct attn_args *a = j->a;
    const int32_t qpos = a->q_pos[it->t0 + t];
    const int qseq = a->q_seq[it->t0 + t];
    unsigned char *vt = it->vis + (size_t)t * j->ld;
    int32_t *kp = it->kp;
    if (qseq != *kp_seq) { // the cells' positions as the tokens of qseq see them
        for (int c = 0; c < a->n_kv; c++) {
            const uint64_t w = a->cell_seq[(size_t)c * a->seq_words + (size_t)(qseq / 64)];
            const int32_t p = a->cell_pos[c];
            kp[c] = p >= 0 && ((w >> (qseq % 64)) & 1u) ? p : INT32_MAX;
        }
        *kp_seq = qseq;
    }
    if (a->window > 0)
        for (int c = 0; c < a->n_kv; c++)
            vt[c] = kp[c] <= qpos && (int64_t)qpos - kp[c] < a->window;
    else
        for (int c = 0; c < a->n_kv; c++)
            vt[c] = kp[c] <= qpos;
    int l = 0, h = a->n_kv, n = 0;
    for (int c = 0; c < a->n_kv; c++)
        n += vt[c];
    while (l < h && !vt[l])
        l++;
    while (h > l && !vt[h - 1])
        h--;
    it->lo[t] = l;
    it->hi[t] = h;
    it->n_vis[t] = n;
    it->LO = l < it->LO ? l : it->LO;
    it->HI = h > it->HI ? h : it->HI;
}

// Token t's query rows: copied, and with RoPE inside attention rotated at
// its position (and, when it has far keys, at its grouped position).
static void attn_item_queries(const struct attn_job *j, struct attn_item *it, int t,
                              float *cs_tmp) {
    const struct attn_args *a = j->a;
    const int D = a->head_dim, tok = it->t0 + t;
    const int32_t qpos = a->q_pos[tok];
    for (int g = 0; g < it->G; g++) {
        const float *q = a->q + ((size_t)tok * a->n_head + (size_t)it->hk * it->G + g) * D;
        float *dn = it->qn + (size_t)(t * it->G + g) * D;
        memcpy(dn, q, (size_t)D * sizeof(float));
        if (!a->rope)
            continue;
        const struct rope_params *rp = a->rope;
        const float *cs = attn_cs_row(j->st, rp, qpos, cs_tmp);
        rope_rotate_f32(dn, cs, rp->n_rot, rp->mode);
        if (it->far[t] < 0)
            continue;
        float *df = it->qf + (size_t)(t * it->G + g) * D;
        memcpy(df, q, (size_t)D * sizeof(float));
        cs = attn_cs_row(j->st, rp, se_q_pos_far(qpos, j->far_g[it->far[t]], it->w[t]), cs_tmp);
        rope_rotate_f32(df, cs, rp->n_rot, rp->mode);
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
                    attn_scores_avx2(st, ld, near ? qnt : qft, G, near ? kn : kf, ldk, c, e, D);
                else
#endif
                    attn_scores_plain(st, ld, near ? qnt : qft, G, near ? kn : kf, ldk, c, e, D);
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
#ifdef ATTN_X86
            if (avx2)
                attn_exp_avx2(s, c0, c1, mx);
            else
#endif
                attn_exp_plain(s, c0, c1, mx);
            float *w = s + c0;
            if (it->n_vis[t] != c1 - c0) { // holes: the visible weights, packed
                int k = 0;
                for (int c = c0; c < c1; c++)
                    if (vt[c])
                        it->packed[k++] = s[c];
                w = it->packed;
            }
#ifdef ATTN_X86
            if (avx2)
                it->sum[t * it->G + g] = attn_sum_avx2(w, it->n_vis[t]);
            else
#endif
                it->sum[t * it->G + g] = attn_sum_plain(w, it->n_vis[t]);
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
            if (!attn_item_tile(it, cb, t, &c0, &c1))
                continue;
            float *acc = it->acc + (size_t)t * G * Dv;
            const float *w = it->S + (size_t)t * G * ld;
#ifdef ATTN_X86
            if (j->st->avx2)
                attn_pv_avx2(acc, G, w, ld, v, ldv, c0, c1, Dv);
            else
#endif
                attn_pv_plain(acc, G, w, ld, v, ldv, c0, c1, Dv);
        }
    }
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
    if ((a->type_k != GGML_TYPE_F32 && a->type_k != GGML_TYPE_F16) ||
        (a->type_v != GGML_TYPE_F32 && a->type_v != GGML_TYPE_F16))
        return verr_set(err, VERR_UNSUPPORTED,
                        "cpu attention: cache types %s/%s, only f32 and f16 are supported",
                        ggml_type_name(a->type_k), ggml_type_name(a->type_v));
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
    const size_t item = attn_item_floats(a, tb, group, j->ld);
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

int cpu_attention_run(struct cpu_attn **stp, struct threadpool *pool, const struct attn_args *a,
                      struct verr *err) {
    int rc = attn_check(a, err);
    if (rc || a->n_tok == 0)
        return rc;
    struct cpu_attn *st = *stp;
    if (!st) {
        if (!(st = attn_state_new(pool)))
            return verr_set(err, VERR_NOMEM, "cpu attention: out of memory");
        *stp = st;
    }
    struct attn_job j = {.a = a, .st = st};
    const int n_far = attn_next_gs(a, 1, j.far_g);
    struct attn_prep p = {.a = a, .st = st};
    if ((rc = attn_reserve(st, a, n_far, &p, err)))
        return rc;
    float *tmp[ATTN_ROWS];
    float **tmpp = st->n_threads <= ATTN_ROWS ? tmp : malloc((size_t)st->n_threads * sizeof *tmpp);
    if (!tmpp)
        return verr_set(err, VERR_NOMEM, "cpu attention: out of memory");
    if (!(rc = attn_layout(st, a, &j, tmpp, err))) {
        p.tmp = tmpp;
        attn_rounds(pool, a, &p, &j, n_far);
    }
    if (tmpp != tmp)
        free(tmpp);
    return rc;
}
