// The CPU backend's attention op (cpu_attention.h): plain float32, the
// reference the CUDA kernels are tested against.
//
// Determinism: every output row is computed by one thread with the same
// sequential code whatever the thread count, so results are bit-identical
// for n_threads = 1 and n_threads = N.
#include "host/backend/cpu_attention.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"
#include "host/backend/rope.h"
#include "host/ops/selfextend.h"

#define ATTN_ALIGN 64

struct cpu_attn {
    int n_threads;
    float **scratch; // [n_threads] buffers of scratch_bytes each (64-byte aligned)
    size_t scratch_bytes;
};

// F16 -> F32 for every half: attention converts each K/V element many times,
// a table lookup keeps that cheap. Filled once from quant_fp16_to_f32, so it
// is exactly that function.
static float attn_fp16_table[1 << 16];
static pthread_once_t attn_fp16_once = PTHREAD_ONCE_INIT;

static void attn_fp16_table_init(void) {
    for (uint32_t h = 0; h < (1u << 16); h++)
        attn_fp16_table[h] = quant_fp16_to_f32((uint16_t)h);
}

static inline float cpu_h2f(uint16_t h) {
    return attn_fp16_table[h];
}

static struct cpu_attn *attn_state_new(struct threadpool *pool) {
    pthread_once(&attn_fp16_once, attn_fp16_table_init);
    struct cpu_attn *st = calloc(1, sizeof *st);
    if (!st)
        return NULL;
    st->n_threads = threadpool_size(pool);
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
    free(st);
}

// Grows every thread's scratch to at least `bytes`, on the calling thread
// before a parallel_for.
static int attn_scratch_reserve(struct cpu_attn *st, size_t bytes, const char *what,
                                struct verr *err) {
    if (bytes <= st->scratch_bytes)
        return VERR_OK;
    size_t sz = (bytes + ATTN_ALIGN - 1) / ATTN_ALIGN * ATTN_ALIGN;
    for (int i = 0; i < st->n_threads; i++) {
        free(st->scratch[i]);
        st->scratch[i] = aligned_alloc(ATTN_ALIGN, sz);
        if (!st->scratch[i]) {
            for (int j = 0; j < st->n_threads; j++) {
                free(st->scratch[j]);
                st->scratch[j] = NULL;
            }
            st->scratch_bytes = 0;
            return verr_set(err, VERR_NOMEM, "%s: out of memory for %d x %zu bytes of scratch",
                            what, st->n_threads, sz);
        }
    }
    st->scratch_bytes = sz;
    return VERR_OK;
}

// Dot product of two float rows. Eight running sums (combined pairwise at the
// end) let the compiler vectorize without -ffast-math; the order is fixed, so
// the result does not depend on threads.
static float cpu_dot_f32(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * b[i + j];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static float cpu_dot_f16(const float *a, const uint16_t *b, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * cpu_h2f(b[i + j]);
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++)
        s += a[i] * cpu_h2f(b[i]);
    return s;
}

static bool cpu_is_cache_type(enum ggml_type t) {
    return t == GGML_TYPE_F32 || t == GGML_TYPE_F16;
}

// Grain of a parallel_for over items of `work` scalar operations each
// (backend_cpu.c's rule): chunks of about 16K operations.
static int64_t cpu_grain(int64_t work_per_item) {
    if (work_per_item < 1)
        work_per_item = 1;
    int64_t g = 16384 / work_per_item;
    return g < 1 ? 1 : g;
}

struct attn_job {
    const struct attn_args *a;
    float **scratch; // per thread [n_kv] scores, then weights
    int group;       // n_head / n_head_kv
};

static inline bool attn_visible(const struct attn_args *a, int c, int32_t qpos, int qseq) {
    const int32_t p = a->cell_pos[c];
    if (p < 0 || p > qpos || (a->window > 0 && qpos - p >= a->window))
        return false;
    const uint64_t word = a->cell_seq[(size_t)c * a->seq_words + (size_t)(qseq / 64)];
    return (word >> (qseq % 64)) & 1u;
}

// One query row's softmax over the scores sc[] of its visible cells (max mx)
// and P.V into out (zeroed by the caller), the max subtracted so that expf
// never overflows.
static void attn_softmax_v(const struct attn_args *a, const float *sc, float mx, int hk,
                           int32_t qpos, int qseq, float *out) {
    const size_t v_row = (size_t)a->n_head_kv * a->head_dim_v;
    float sum = 0.0f;
    for (int c = 0; c < a->n_kv; c++) {
        if (!attn_visible(a, c, qpos, qseq))
            continue;
        const float w = expf(sc[c] - mx);
        sum += w;
        const size_t off = (size_t)c * v_row + (size_t)hk * a->head_dim_v;
        if (a->type_v == GGML_TYPE_F32) {
            const float *vv = (const float *)a->v + off;
            for (int d = 0; d < a->head_dim_v; d++)
                out[d] += w * vv[d];
        } else {
            const uint16_t *vv = (const uint16_t *)a->v + off;
            for (int d = 0; d < a->head_dim_v; d++)
                out[d] += w * cpu_h2f(vv[d]);
        }
    }
    const float inv = 1.0f / sum;
    for (int d = 0; d < a->head_dim_v; d++)
        out[d] *= inv;
}

static void attn_range(void *ctx, int64_t i0, int64_t i1, int thread) {
    const struct attn_job *j = ctx;
    const struct attn_args *a = j->a;
    float *sc = j->scratch[thread];
    const size_t k_row = (size_t)a->n_head_kv * a->head_dim; // elements per cell
    for (int64_t it = i0; it < i1; it++) {
        const int t = (int)(it / a->n_head), h = (int)(it % a->n_head);
        const int hk = h / j->group;
        const float *q = a->q + ((size_t)t * a->n_head + h) * a->head_dim;
        float *out = a->out + ((size_t)t * a->n_head + h) * a->head_dim_v;
        const int32_t qpos = a->q_pos[t];
        const int qseq = a->q_seq[t];

        float mx = -INFINITY;
        int n_vis = 0;
        for (int c = 0; c < a->n_kv; c++) {
            if (!attn_visible(a, c, qpos, qseq))
                continue;
            const size_t off = (size_t)c * k_row + (size_t)hk * a->head_dim;
            const float d = a->type_k == GGML_TYPE_F32
                                ? cpu_dot_f32(q, (const float *)a->k + off, a->head_dim)
                                : cpu_dot_f16(q, (const uint16_t *)a->k + off, a->head_dim);
            sc[c] = d * a->scale;
            if (sc[c] > mx)
                mx = sc[c];
            n_vis++;
        }
        memset(out, 0, (size_t)a->head_dim_v * sizeof(float));
        if (n_vis == 0)
            continue; // a row that sees nothing is defined as zeros
        attn_softmax_v(a, sc, mx, hk, qpos, qseq, out);
    }
}

// ---------------------------------------------------------------------------
// attention with RoPE inside (the unrotated cache mode; exact self-extend,
// host/ops/selfextend.h). K of cells [0, n_kv) is widened and rotated once
// per call at the cell's position (near) and, when G > 1, at pos / G (far);
// each query is rotated at i (near) and at floor(i/G) + W - floor(W/G)
// (far). Scores, softmax and P.V then run as attn_range does, in the same
// order and the same float steps, so G = 1 on an F32 cache gives exactly the
// bits of the rotated-K cache.

struct attn_rope_job {
    const struct attn_args *a;
    struct rope_consts rc;
    float **scratch; // per thread: [n_kv + 1] scores, [head_dim] q near, q far, [n_rot] cos/sin
    float *k_near;   // [n_kv][n_head_kv][head_dim] K rotated at the cell's position
    float *k_far;    // [n_kv][n_head_kv][head_dim] K rotated at pos / G; NULL when G == 1
    int group;       // n_head / n_head_kv
};

static void attn_rope_keys_range(void *ctx, int64_t c0, int64_t c1, int thread) {
    const struct attn_rope_job *j = ctx;
    const struct attn_args *a = j->a;
    const struct rope_params *rp = a->rope;
    const size_t row = (size_t)a->n_head_kv * a->head_dim;
    float *cs = j->scratch[thread];
    for (int64_t c = c0; c < c1; c++) {
        const int32_t p = a->cell_pos[c];
        if (p < 0)
            continue;
        float *kn = j->k_near + (size_t)c * row;
        if (a->type_k == GGML_TYPE_F32)
            memcpy(kn, (const float *)a->k + (size_t)c * row, row * sizeof(float));
        else
            for (size_t e = 0; e < row; e++)
                kn[e] = cpu_h2f(((const uint16_t *)a->k)[(size_t)c * row + e]);
        float *kf = j->k_far ? j->k_far + (size_t)c * row : NULL;
        if (kf)
            memcpy(kf, kn, row * sizeof(float));
        rope_cache_fill(cs, (float)p, rp, &j->rc);
        for (int h = 0; h < a->n_head_kv; h++)
            rope_rotate_f32(kn + (size_t)h * a->head_dim, cs, rp->n_rot, rp->mode);
        if (!kf)
            continue;
        rope_cache_fill(cs, (float)se_k_pos_far(p, a->se_g), rp, &j->rc);
        for (int h = 0; h < a->n_head_kv; h++)
            rope_rotate_f32(kf + (size_t)h * a->head_dim, cs, rp->n_rot, rp->mode);
    }
}

static void attn_rope_range(void *ctx, int64_t i0, int64_t i1, int thread) {
    const struct attn_rope_job *j = ctx;
    const struct attn_args *a = j->a;
    const struct rope_params *rp = a->rope;
    const int D = a->head_dim;
    float *sc = j->scratch[thread];
    float *qn = sc + a->n_kv + 1, *qf = qn + D, *cs = qf + D;
    const size_t k_row = (size_t)a->n_head_kv * D;
    for (int64_t it = i0; it < i1; it++) {
        const int t = (int)(it / a->n_head), h = (int)(it % a->n_head);
        const int hk = h / j->group;
        const float *q = a->q + ((size_t)t * a->n_head + h) * D;
        float *out = a->out + ((size_t)t * a->n_head + h) * a->head_dim_v;
        const int32_t qpos = a->q_pos[t];
        const int qseq = a->q_seq[t];
        memcpy(qn, q, (size_t)D * sizeof(float));
        rope_cache_fill(cs, (float)qpos, rp, &j->rc);
        rope_rotate_f32(qn, cs, rp->n_rot, rp->mode);
        if (j->k_far) {
            memcpy(qf, q, (size_t)D * sizeof(float));
            rope_cache_fill(cs, (float)se_q_pos_far(qpos, a->se_g, a->se_w), rp, &j->rc);
            rope_rotate_f32(qf, cs, rp->n_rot, rp->mode);
        }
        float mx = -INFINITY;
        int n_vis = 0;
        for (int c = 0; c < a->n_kv; c++) {
            if (!attn_visible(a, c, qpos, qseq))
                continue;
            const bool near = !j->k_far || se_is_near(qpos, a->cell_pos[c], a->se_w);
            const size_t off = (size_t)c * k_row + (size_t)hk * D;
            const float d =
                near ? cpu_dot_f32(qn, j->k_near + off, D) : cpu_dot_f32(qf, j->k_far + off, D);
            sc[c] = d * a->scale;
            if (sc[c] > mx)
                mx = sc[c];
            n_vis++;
        }
        memset(out, 0, (size_t)a->head_dim_v * sizeof(float));
        if (n_vis > 0) // a row that sees nothing is defined as zeros
            attn_softmax_v(a, sc, mx, hk, qpos, qseq, out);
    }
}

// cpu_attention for a->rope != NULL, after its shape and pointer checks.
static int cpu_attention_rope(struct cpu_attn *st, struct threadpool *pool,
                              const struct attn_args *a, struct verr *err) {
    int rc = rope_params_check(a->rope, a->head_dim, "cpu attention", err);
    if (rc)
        return rc;
    if (a->se_g < 1 || (a->se_g > 1 && a->se_w < 1))
        return verr_set(err, VERR_RANGE,
                        "cpu attention: self-extend group %d must be >= 1 and window %d >= 1",
                        a->se_g, a->se_w);
    const size_t per_thread = (size_t)a->n_kv + 1 + 2 * (size_t)a->head_dim + a->rope->n_rot;
    if ((rc = attn_scratch_reserve(st, per_thread * sizeof(float), "cpu attention", err)))
        return rc;
    struct attn_rope_job j = {.a = a, .scratch = st->scratch, .group = a->n_head / a->n_head_kv};
    rope_consts_init(&j.rc, a->rope, true);
    const size_t k_floats = (size_t)a->n_kv * a->n_head_kv * a->head_dim;
    j.k_near = malloc((k_floats ? k_floats : 1) * sizeof(float));
    j.k_far = a->se_g > 1 ? malloc((k_floats ? k_floats : 1) * sizeof(float)) : NULL;
    if (!j.k_near || (a->se_g > 1 && !j.k_far)) {
        free(j.k_near);
        free(j.k_far);
        return verr_set(err, VERR_NOMEM, "cpu attention: out of memory for %zu rotated keys",
                        k_floats);
    }
    threadpool_parallel_for(pool, a->n_kv, cpu_grain((int64_t)a->n_head_kv * a->head_dim * 4),
                            attn_rope_keys_range, &j);
    threadpool_parallel_for(pool, (int64_t)a->n_tok * a->n_head,
                            cpu_grain((int64_t)a->n_kv * (a->head_dim + a->head_dim_v)),
                            attn_rope_range, &j);
    free(j.k_near);
    free(j.k_far);
    return VERR_OK;
}

int cpu_attention_run(struct cpu_attn **stp, struct threadpool *pool, const struct attn_args *a,
                      struct verr *err) {
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
    if (!cpu_is_cache_type(a->type_k) || !cpu_is_cache_type(a->type_v))
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
    struct cpu_attn *st = *stp;
    if (!st) {
        if (!(st = attn_state_new(pool)))
            return verr_set(err, VERR_NOMEM, "cpu attention: out of memory");
        *stp = st;
    }
    if (a->rope)
        return cpu_attention_rope(st, pool, a, err);
    int rc = attn_scratch_reserve(st, ((size_t)a->n_kv + 1) * sizeof(float), "cpu attention", err);
    if (rc)
        return rc;
    struct attn_job j = {a, st->scratch, a->n_head / a->n_head_kv};
    threadpool_parallel_for(pool, (int64_t)a->n_tok * a->n_head,
                            cpu_grain((int64_t)a->n_kv * (a->head_dim + a->head_dim_v)), attn_range,
                            &j);
    return VERR_OK;
}
