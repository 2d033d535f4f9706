// The CPU reference backend: every op of struct backend_ops in plain float32
// C, following llama.cpp's semantics; the CUDA backend is tested against it.
//
// Memory is ordinary host memory (64-byte aligned). Ops run synchronously on
// the calling thread plus the backend's thread pool, so sync is a no-op.
// One op at a time per backend: the pool and the per-thread scratch are shared.
//
// Determinism: every output element is computed by one thread with the same
// sequential code whatever the thread count, so results are bit-identical
// for n_threads = 1 and n_threads = N.
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/quant.h"
#include "gguf/quant_q8.h"
#include "host/backend/cpu_attention.h"
#include "host/backend/cpu_moe.h"
#include "host/backend/cpu_q8.h"
#include "host/backend/rope.h"
#include "host/backend/sampler.h"
#include "host/backend/threadpool.h"
#include "host/ops/backend.h"
#include "host/ops/selfextend.h"

#define CPU_ALIGN 64

struct cpu_state {
    struct threadpool *pool;
    int n_threads;
    float **scratch; // [n_threads] buffers of scratch_bytes each (64-byte aligned)
    size_t scratch_bytes;
    struct cpu_attn *attn; // attention's buffers, made on its first call (cpu_attention.h)
    void *xq;              // act_q8: the q8_1 activations of the current matmul (64-byte aligned)
    size_t xq_bytes;
    enum cpu_q8_isa q8_isa; // act_q8's SIMD kernels (cpu_q8.h), NONE: the reference dots
    // xq_valid: xq holds the activations of the op running now, quantized by
    // an earlier matrix of it. Set by cpu_matmul_q8_fast, cleared by every
    // matmul that is not marked xq_shared; a fused op whose matrices all read
    // the same x (matmul_multi, the gated matmuls) marks its later matrices
    // xq_shared, so they skip quantizing again.
    bool xq_valid;
    bool xq_shared;
};

static struct cpu_state *cpu_state_of(struct backend *be) {
    return (struct cpu_state *)be->impl;
}

// ---------------------------------------------------------------------------
// helpers

// Grows every thread's scratch to at least `bytes`. Called by an op on the
// calling thread before its parallel_for.
static int cpu_scratch_reserve(struct backend *be, size_t bytes, const char *what) {
    struct cpu_state *st = cpu_state_of(be);
    if (bytes <= st->scratch_bytes)
        return VERR_OK;
    size_t sz = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    for (int i = 0; i < st->n_threads; i++) {
        free(st->scratch[i]);
        st->scratch[i] = aligned_alloc(CPU_ALIGN, sz);
        if (!st->scratch[i]) {
            for (int j = 0; j < st->n_threads; j++) {
                free(st->scratch[j]);
                st->scratch[j] = NULL;
            }
            st->scratch_bytes = 0;
            return verr_set(&be->err, VERR_NOMEM, "%s: out of memory for %d x %zu bytes of scratch",
                            what, st->n_threads, sz);
        }
    }
    st->scratch_bytes = sz;
    return VERR_OK;
}

// The cache types the CPU runs: the floats and every quantized one
// (backend_cache_type_quantized), which its store quantizes, its kv_shift
// re-quantizes and its attention dequantizes (cpu_attention.c).
static bool cpu_is_cache_type(enum ggml_type t) {
    return backend_cache_type_ok(t) || backend_cache_type_quantized(t);
}

// Stores n floats into a cache row of type t (F32 copy, F16 round to nearest
// even, a quantized type through quant_quantize_row, which fails on a
// non-finite value or one that overflows the block's f16 scale). Returns 0 or
// the quantizer's code.
static int cpu_store_row(void *dst, enum ggml_type t, const float *src, int64_t n) {
    if (t == GGML_TYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (t == GGML_TYPE_F16) {
        uint16_t *d = (uint16_t *)dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = quant_f32_to_fp16(src[i]);
    } else {
        return quant_quantize_row(t, src, dst, n, NULL);
    }
    return 0;
}

// Grain of a parallel_for over items of `work` scalar operations each: chunks
// of about 16K operations, below which waking threads costs more than it saves.
static int64_t cpu_grain(int64_t work_per_item) {
    if (work_per_item < 1)
        work_per_item = 1;
    int64_t g = 16384 / work_per_item;
    return g < 1 ? 1 : g;
}

// ---------------------------------------------------------------------------
// memory

static int cpu_alloc(struct backend *be, size_t bytes, void **out) {
    *out = NULL;
    if (bytes > SIZE_MAX - CPU_ALIGN)
        return verr_set(&be->err, VERR_NOMEM, "cpu alloc: %zu bytes is too large", bytes);
    // aligned_alloc wants a multiple of the alignment; 0 bytes still gets a
    // unique pointer so that free() pairs up.
    size_t sz = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    if (sz == 0)
        sz = CPU_ALIGN;
    void *p = aligned_alloc(CPU_ALIGN, sz);
    if (!p)
        return verr_set(&be->err, VERR_NOMEM, "cpu alloc: out of memory for %zu bytes", bytes);
    *out = p;
    return VERR_OK;
}

static void cpu_free(struct backend *be, void *ptr) {
    (void)be;
    free(ptr);
}

static int cpu_copy(struct backend *be, void *dst, const void *src, size_t bytes,
                    const char *what) {
    if (bytes == 0)
        return VERR_OK;
    if (!dst || !src)
        return verr_set(&be->err, VERR_RANGE, "cpu %s: NULL pointer for %zu bytes", what, bytes);
    memcpy(dst, src, bytes);
    return VERR_OK;
}

static int cpu_upload(struct backend *be, void *dst, const void *src, size_t bytes) {
    return cpu_copy(be, dst, src, bytes, "upload");
}

int backend_cpu_mem_info(size_t *free_bytes, size_t *total_bytes) {
    // MemAvailable counts the page cache the kernel would give back (the
    // mmap'ed model file lives there); sysconf's free pages do not.
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long avail_kb = 0, total_kb = 0;
        while (fgets(line, sizeof line, f)) {
            sscanf(line, "MemAvailable: %llu kB", &avail_kb);
            sscanf(line, "MemTotal: %llu kB", &total_kb);
        }
        fclose(f);
        if (avail_kb && total_kb) {
            *free_bytes = (size_t)avail_kb * 1024;
            *total_bytes = (size_t)total_kb * 1024;
            return 0;
        }
    }
    long page = sysconf(_SC_PAGESIZE);
    long avail = sysconf(_SC_AVPHYS_PAGES), phys = sysconf(_SC_PHYS_PAGES);
    if (page <= 0 || avail < 0 || phys <= 0) {
        // Unknown: the plan treats the CPU as unlimited rather than refuse.
        *free_bytes = BACKEND_MEM_UNLIMITED;
        *total_bytes = BACKEND_MEM_UNLIMITED;
        return 0;
    }
    *free_bytes = (size_t)avail * (size_t)page;
    *total_bytes = (size_t)phys * (size_t)page;
    return 0;
}

static int cpu_mem_info(struct backend *be, size_t *free_bytes, size_t *total_bytes) {
    return backend_cpu_mem_info(free_bytes, total_bytes);
}

static int cpu_download(struct backend *be, void *dst, const void *src, size_t bytes) {
    return cpu_copy(be, dst, src, bytes, "download");
}

static int cpu_memset_zero(struct backend *be, void *dst, size_t bytes) {
    if (bytes == 0)
        return VERR_OK;
    if (!dst)
        return verr_set(&be->err, VERR_RANGE, "cpu memset_zero: NULL pointer for %zu bytes", bytes);
    memset(dst, 0, bytes);
    return VERR_OK;
}

static int cpu_sync(struct backend *be) {
    (void)be;
    return VERR_OK;
}

// ---------------------------------------------------------------------------
// embed

static int cpu_check_weight(struct backend *be, const struct backend_weight *w, const char *what,
                            size_t *row_bytes) {
    if (!w || !w->data)
        return verr_set(&be->err, VERR_RANGE, "cpu %s: weight is NULL", what);
    if (w->n_in <= 0 || w->n_out <= 0)
        return verr_set(&be->err, VERR_RANGE, "cpu %s: weight shape %lld x %lld is empty", what,
                        (long long)w->n_out, (long long)w->n_in);
    if (!quant_can_dequantize(w->type))
        return verr_set(&be->err, VERR_UNSUPPORTED, "cpu %s: weight type %s is not supported", what,
                        ggml_type_name(w->type));
    *row_bytes = ggml_row_bytes(w->type, w->n_in);
    if (*row_bytes == 0)
        return verr_set(&be->err, VERR_RANGE,
                        "cpu %s: n_in %lld is not a multiple of the %s block size", what,
                        (long long)w->n_in, ggml_type_name(w->type));
    return VERR_OK;
}

static int cpu_embed(struct backend *be, float *out, const struct backend_weight *table,
                     const int32_t *tokens, int n_tok) {
    size_t rb;
    int rc = cpu_check_weight(be, table, "embed", &rb);
    if (rc)
        return rc;
    if (n_tok < 0)
        return verr_set(&be->err, VERR_RANGE, "cpu embed: n_tok %d < 0", n_tok);
    if (n_tok > 0 && (!out || !tokens))
        return verr_set(&be->err, VERR_RANGE, "cpu embed: NULL out or tokens");
    for (int t = 0; t < n_tok; t++)
        if (tokens[t] < 0 || tokens[t] >= table->n_out)
            return verr_set(&be->err, VERR_RANGE, "cpu embed: token %d at %d outside [0, %lld)",
                            tokens[t], t, (long long)table->n_out);
    for (int t = 0; t < n_tok; t++) {
        const char *row = (const char *)table->data + (size_t)tokens[t] * rb;
        rc = quant_dequantize_row(table->type, row, out + (size_t)t * table->n_in, table->n_in,
                                  &be->err);
        if (rc)
            return verr_wrap(&be->err, "cpu embed: token %d", tokens[t]);
    }
    return VERR_OK;
}

// ---------------------------------------------------------------------------
// rms_norm

struct rms_job {
    float *out;     // [n_rows][n]
    const float *x; // [n_rows][n]
    const float *w; // [n]
    int n;
    float eps;
};

static void rms_norm_range(void *ctx, int64_t r0, int64_t r1, int thread) {
    (void)thread;
    const struct rms_job *j = ctx;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + (size_t)r * j->n;
        float *y = j->out + (size_t)r * j->n;
        // The sum of squares in double, as ggml's ggml_float; then the float
        // steps of llama.cpp: scale = 1/sqrtf(mean + eps), y = (x*scale)*w.
        double sum = 0.0;
        for (int i = 0; i < j->n; i++)
            sum += (double)(x[i] * x[i]);
        const float mean = (float)(sum / j->n);
        const float scale = 1.0f / sqrtf(mean + j->eps);
        for (int i = 0; i < j->n; i++)
            y[i] = (x[i] * scale) * j->w[i];
    }
}

static int cpu_rms_norm(struct backend *be, float *out, const float *x, const float *w, int n_rows,
                        int n, float eps) {
    if (n_rows < 0 || n <= 0)
        return verr_set(&be->err, VERR_RANGE, "cpu rms_norm: shape %d x %d", n_rows, n);
    if (n_rows == 0)
        return VERR_OK;
    if (!out || !x || !w)
        return verr_set(&be->err, VERR_RANGE, "cpu rms_norm: NULL pointer");
    if (!(eps >= 0.0f))
        return verr_set(&be->err, VERR_RANGE, "cpu rms_norm: eps %g must be >= 0", (double)eps);
    struct rms_job j = {out, x, w, n, eps};
    threadpool_parallel_for(cpu_state_of(be)->pool, n_rows, cpu_grain(n), rms_norm_range, &j);
    return VERR_OK;
}

// ---------------------------------------------------------------------------
// matmul
//
// One token: each output is quant_dot_row(W[o], x) (rows split across threads).
// Several tokens: each thread dequantizes a block of weight rows once into its
// scratch and dots every token with them, so the dequantization cost is paid
// once per row instead of once per (row, token), and x[t] stays in cache
// across the rows of the block. The dot over the dequantized row is
// quant_dot_row(F32, ...), which sums in the same chunks and order as
// quant_dot_row on the stored row, so a token's output is bit-identical
// whether it comes alone or in a batch (tests/test_ops_cpu.c checks this).

struct mm_job {
    float *out; // [n_tok][w->n_out]
    const struct backend_weight *w;
    const float *x;    // [n_tok][w->n_in]
    const float *bias; // [w->n_out] or NULL
    int n_tok;
    size_t row_bytes;  // of one stored weight row
    bool accumulate;   // out += W x (matmul_add) instead of out = W x
    const uint8_t *xq; // act_q8: x as q8_1 rows of xq_row bytes, else NULL
    size_t xq_row;
    int64_t rows_per_block;
    float **scratch;    // per thread [rows_per_block][w->n_in]
    _Atomic int failed; // a dequantization error (not expected after the checks)
};

// act_q8 (backend.h): every token's dot with a weight row through q8_1.
static void mm_q8_range(void *ctx, int64_t o0, int64_t o1, int thread) {
    (void)thread;
    struct mm_job *j = ctx;
    const char *wd = (const char *)j->w->data;
    const int64_t n_out = j->w->n_out;
    for (int64_t o = o0; o < o1; o++) {
        for (int t = 0; t < j->n_tok; t++) {
            float s = 0.0f;
            if (quant_dot_q8_1(j->w->type, wd + (size_t)o * j->row_bytes,
                               j->xq + (size_t)t * j->xq_row, j->w->n_in, &s, NULL) != 0)
                atomic_store(&j->failed, 1);
            if (j->bias)
                s += j->bias[o];
            float *dst = j->out + (size_t)t * n_out + o;
            *dst = j->accumulate ? *dst + s : s;
        }
    }
}

static void mm_vec_range(void *ctx, int64_t o0, int64_t o1, int thread) {
    (void)thread;
    struct mm_job *j = ctx;
    const char *wd = (const char *)j->w->data;
    for (int64_t o = o0; o < o1; o++) {
        float s = quant_dot_row(j->w->type, wd + (size_t)o * j->row_bytes, j->x, j->w->n_in);
        if (j->bias)
            s += j->bias[o];
        j->out[o] = j->accumulate ? j->out[o] + s : s;
    }
}

static void mm_batch_range(void *ctx, int64_t b0, int64_t b1, int thread) {
    struct mm_job *j = ctx;
    const int64_t n_in = j->w->n_in, n_out = j->w->n_out;
    const char *wd = (const char *)j->w->data;
    float *deq = j->scratch[thread]; // [rows_per_block][n_in]
    for (int64_t b = b0; b < b1; b++) {
        const int64_t o0 = b * j->rows_per_block;
        const int64_t o1 = o0 + j->rows_per_block < n_out ? o0 + j->rows_per_block : n_out;
        for (int64_t o = o0; o < o1; o++) {
            float *dst = deq + (size_t)(o - o0) * n_in;
            if (quant_dequantize_row(j->w->type, wd + (size_t)o * j->row_bytes, dst, n_in, NULL) !=
                0) {
                atomic_store(&j->failed, 1);
                memset(dst, 0, (size_t)n_in * sizeof(float));
            }
        }
        for (int t = 0; t < j->n_tok; t++) {
            const float *xt = j->x + (size_t)t * n_in;
            float *yt = j->out + (size_t)t * n_out;
            for (int64_t o = o0; o < o1; o++) {
                float s = quant_dot_row(GGML_TYPE_F32, deq + (size_t)(o - o0) * n_in, xt, n_in);
                if (j->bias)
                    s += j->bias[o];
                yt[o] = j->accumulate ? yt[o] + s : s;
            }
        }
    }
}

// Grows the act_q8 activation buffer to at least `bytes` (64-byte aligned).
static int cpu_xq_reserve(struct backend *be, size_t bytes) {
    struct cpu_state *st = cpu_state_of(be);
    if (bytes <= st->xq_bytes)
        return VERR_OK;
    const size_t sz = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    void *p = aligned_alloc(CPU_ALIGN, sz);
    if (!p)
        return verr_set(&be->err, VERR_NOMEM, "cpu matmul: out of memory for %zu bytes", sz);
    free(st->xq);
    st->xq = p;
    st->xq_bytes = sz;
    st->xq_valid = false;
    return VERR_OK;
}

// act_q8 with the SIMD kernels (cpu_q8.h), for every batch size: the tokens
// are quantized in parallel (unless an earlier matrix of the same fused op
// did, xq_valid), then the rows are split across threads.
struct q8_fill_job {
    struct cpu_q8_x *x;
    const float *src; // [n_tok][n_in]
    int64_t n_in;
    enum cpu_q8_isa isa; // not NONE: the SIMD fill, which needs no scratch
    _Atomic int failed;
};

static void q8_fill_range(void *ctx, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    struct q8_fill_job *f = ctx;
    for (int64_t t = t0; t < t1; t++)
        if (cpu_q8_x_fill(f->isa, f->x, (int)t, f->src + (size_t)t * (size_t)f->n_in, f->n_in, NULL,
                          NULL) != 0)
            atomic_store(&f->failed, 1);
}

struct q8_rows_job {
    struct cpu_q8_job q;
    enum cpu_q8_isa isa;
};

static void mm_q8_fast_range(void *ctx, int64_t o0, int64_t o1, int thread) {
    (void)thread;
    const struct q8_rows_job *r = ctx;
    cpu_q8_rows(r->isa, &r->q, o0, o1);
}

static int cpu_matmul_q8_fast(struct backend *be, const struct mm_job *j) {
    struct cpu_state *st = cpu_state_of(be);
    const struct backend_weight *w = j->w;
    const size_t bytes = cpu_q8_x_bytes(w->n_in, j->n_tok);
    if (!bytes)
        return verr_set(&be->err, VERR_RANGE, "cpu matmul: n_in %lld is not a multiple of 32",
                        (long long)w->n_in);
    int rc = cpu_xq_reserve(be, bytes);
    if (rc)
        return rc;
    struct cpu_q8_x x;
    cpu_q8_x_init(&x, st->xq, w->n_in, j->n_tok);
    if (!st->xq_valid) {
        struct q8_fill_job f = {.x = &x, .src = j->x, .n_in = w->n_in, .isa = st->q8_isa};
        atomic_init(&f.failed, 0);
        threadpool_parallel_for(st->pool, j->n_tok, cpu_grain(w->n_in * 4), q8_fill_range, &f);
        if (atomic_load(&f.failed))
            return verr_set(&be->err, VERR_RANGE, "cpu matmul: quantizing the activations failed");
        st->xq_valid = true;
    }
    struct q8_rows_job r = {
        .q = {.w = w->data,
              .wtype = w->type,
              .row_bytes = j->row_bytes,
              .n_in = w->n_in,
              .n_out = w->n_out,
              .x = &x,
              .out = j->out,
              .bias = j->bias,
              .accumulate = j->accumulate},
        .isa = st->q8_isa,
    };
    threadpool_parallel_for(st->pool, w->n_out, cpu_grain(w->n_in * j->n_tok), mm_q8_fast_range,
                            &r);
    return VERR_OK;
}

static int cpu_matmul_impl(struct backend *be, float *out, const struct backend_weight *w,
                           const float *x, const float *bias, int n_tok, bool accumulate) {
    size_t rb;
    int rc = cpu_check_weight(be, w, "matmul", &rb);
    if (rc)
        return rc;
    if (n_tok < 0)
        return verr_set(&be->err, VERR_RANGE, "cpu matmul: n_tok %d < 0", n_tok);
    if (n_tok == 0)
        return VERR_OK;
    if (!out || !x)
        return verr_set(&be->err, VERR_RANGE, "cpu matmul: NULL out or x");
    struct cpu_state *st = cpu_state_of(be);
    if (!st->xq_shared) // a new x: nothing quantized before may be reused
        st->xq_valid = false;
    struct mm_job j = {
        .out = out,
        .w = w,
        .x = x,
        .bias = bias,
        .n_tok = n_tok,
        .row_bytes = rb,
        .accumulate = accumulate,
        .scratch = st->scratch,
    };
    atomic_init(&j.failed, 0);
    if (be->act_q8 && quant_q8_1_dot_supported(w->type) && st->q8_isa != CPU_Q8_ISA_NONE)
        return cpu_matmul_q8_fast(be, &j);
    // Without the SIMD kernels the reference dots, for every batch size too:
    // a token's output must not depend on how many tokens share its batch
    // (f32 activations for the larger ones would round it otherwise).
    if (be->act_q8 && quant_q8_1_dot_supported(w->type)) {
        const size_t xr = (size_t)quant_q8_1_row_bytes(w->n_in);
        if ((rc = cpu_xq_reserve(be, xr * (size_t)n_tok)))
            return rc;
        for (int t = 0; t < n_tok; t++)
            if ((rc = quant_q8_1_row(x + (size_t)t * w->n_in, w->n_in, (uint8_t *)st->xq + t * xr,
                                     &be->err)))
                return rc;
        j.xq = st->xq;
        j.xq_row = xr;
        threadpool_parallel_for(st->pool, w->n_out, cpu_grain(w->n_in * n_tok), mm_q8_range, &j);
        if (atomic_load(&j.failed))
            return verr_set(&be->err, VERR_FORMAT, "cpu matmul: q8_1 dot of a %s row failed",
                            ggml_type_name(w->type));
        return VERR_OK;
    }
    if (n_tok == 1) {
        threadpool_parallel_for(st->pool, w->n_out, cpu_grain(w->n_in), mm_vec_range, &j);
        return VERR_OK;
    }
    // Blocks of about 256 KiB of dequantized rows (4..64 rows).
    int64_t rpb = (256 * 1024 / 4) / w->n_in;
    rpb = rpb < 4 ? 4 : (rpb > 64 ? 64 : rpb);
    j.rows_per_block = rpb;
    rc = cpu_scratch_reserve(be, (size_t)rpb * (size_t)w->n_in * sizeof(float), "cpu matmul");
    if (rc)
        return rc;
    j.scratch = st->scratch;
    const int64_t n_blocks = (w->n_out + rpb - 1) / rpb;
    threadpool_parallel_for(st->pool, n_blocks, 1, mm_batch_range, &j);
    if (atomic_load(&j.failed))
        return verr_set(&be->err, VERR_FORMAT, "cpu matmul: dequantizing a %s row failed",
                        ggml_type_name(w->type));
    return VERR_OK;
}

static int cpu_matmul(struct backend *be, float *out, const struct backend_weight *w,
                      const float *x, const float *bias, int n_tok) {
    return cpu_matmul_impl(be, out, w, x, bias, n_tok, false);
}

// The fused matmuls are their compositions here (backend.h); matmul_add
// adds each finished dot into y, which rounds as matmul then add.
static int cpu_matmul_multi(struct backend *be, const struct backend_mm *mm, int n, const float *x,
                            int n_tok) {
    if (n < 1 || n > BACKEND_MM_MAX || !mm)
        return verr_set(&be->err, VERR_RANGE, "cpu matmul_multi: %d matrices (1 to %d)", n,
                        BACKEND_MM_MAX);
    for (int i = 0; i < n; i++) {
        if (!mm[i].w || mm[i].w->n_in != mm[0].w->n_in)
            return verr_set(&be->err, VERR_RANGE,
                            "cpu matmul_multi: matrix %d: missing or n_in differs from matrix 0",
                            i);
        cpu_state_of(be)->xq_shared = i > 0; // the same x for every matrix
        int rc = cpu_matmul(be, mm[i].out, mm[i].w, x, mm[i].bias, n_tok);
        cpu_state_of(be)->xq_shared = false;
        if (rc)
            return rc;
    }
    return VERR_OK;
}

static int cpu_matmul_add(struct backend *be, float *y, const struct backend_weight *w,
                          const float *x, int n_tok) {
    if (y == x && y)
        return verr_set(&be->err, VERR_RANGE, "cpu matmul_add: y must not alias x");
    return cpu_matmul_impl(be, y, w, x, NULL, n_tok, true);
}

static int cpu_swiglu(struct backend *be, float *out, const float *gate, const float *up,
                      int64_t n);
static int cpu_geglu(struct backend *be, float *out, const float *gate, const float *up, int64_t n);
typedef int (*cpu_glu_fn)(struct backend *be, float *out, const float *gate, const float *up,
                          int64_t n);

// matmul_swiglu / matmul_geglu: the two matmuls, then the activation op glu.
static int cpu_matmul_gated(struct backend *be, float *out, float *up_tmp,
                            const struct backend_weight *w_gate, const struct backend_weight *w_up,
                            const float *x, int n_tok, cpu_glu_fn glu, const char *what) {
    if (!w_gate || !w_up || w_gate->n_in != w_up->n_in || w_gate->n_out != w_up->n_out)
        return verr_set(&be->err, VERR_RANGE,
                        "cpu %s: gate and up weights must have the same shape", what);
    int rc = cpu_matmul(be, out, w_gate, x, NULL, n_tok);
    if (!rc) {
        cpu_state_of(be)->xq_shared = true; // up reads the x gate just quantized
        rc = cpu_matmul(be, up_tmp, w_up, x, NULL, n_tok);
        cpu_state_of(be)->xq_shared = false;
    }
    if (!rc)
        rc = glu(be, out, out, up_tmp, (int64_t)n_tok * w_gate->n_out);
    return rc;
}

static int cpu_matmul_swiglu(struct backend *be, float *out, float *up_tmp,
                             const struct backend_weight *w_gate, const struct backend_weight *w_up,
                             const float *x, int n_tok) {
    return cpu_matmul_gated(be, out, up_tmp, w_gate, w_up, x, n_tok, cpu_swiglu, "matmul_swiglu");
}

static int cpu_matmul_geglu(struct backend *be, float *out, float *up_tmp,
                            const struct backend_weight *w_gate, const struct backend_weight *w_up,
                            const float *x, int n_tok) {
    return cpu_matmul_gated(be, out, up_tmp, w_gate, w_up, x, n_tok, cpu_geglu, "matmul_geglu");
}

// ---------------------------------------------------------------------------
// hadamard

// x [block] = H x, the backend_ops.hadamard contract's butterflies and scale.
static void hadamard_f32(float *x, int block) {
    for (int h = 1; h < block; h *= 2)
        for (int i = 0; i < block; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    const float s = 1.0f / sqrtf((float)block);
    for (int i = 0; i < block; i++)
        x[i] *= s;
}

struct hadamard_job {
    float *x; // [n_blocks][block]
    int block;
};

static void hadamard_range(void *ctx, int64_t b0, int64_t b1, int thread) {
    (void)thread;
    const struct hadamard_job *j = ctx;
    for (int64_t b = b0; b < b1; b++)
        hadamard_f32(j->x + b * j->block, j->block);
}

static int cpu_hadamard(struct backend *be, float *x, int64_t n_rows, int n, int block) {
    if (n_rows < 0 || !backend_hadamard_block_ok(n, block))
        return verr_set(&be->err, VERR_RANGE,
                        "cpu hadamard: %lld rows of %d with block %d (a power of two in [2, %d] "
                        "dividing the row)",
                        (long long)n_rows, n, block, BACKEND_HADAMARD_MAX);
    if (n_rows == 0)
        return VERR_OK;
    if (!x)
        return verr_set(&be->err, VERR_RANGE, "cpu hadamard: NULL pointer");
    struct hadamard_job j = {x, block};
    threadpool_parallel_for(cpu_state_of(be)->pool, n_rows * (n / block), cpu_grain(block),
                            hadamard_range, &j);
    return VERR_OK;
}

// ---------------------------------------------------------------------------
// rope, rope_kv_store, kv_shift

struct rope_job {
    const struct rope_params *rp;
    struct rope_consts rc;
    float **scratch; // per thread [n_rot/2][2]
    // rope / rope_kv_store
    float *x;           // [n_tok][n_head][head_dim]
    const int32_t *pos; // [n_tok]
    int n_head;
    int head_dim;
    // rope_kv_store
    const float *v; // [n_tok][n_head][head_dim_v]
    void *k_cache;  // [n_ctx][n_head][head_dim]
    void *v_cache;  // [n_ctx][n_head][head_dim_v]
    enum ggml_type type_k, type_v;
    const int32_t *cells; // [n_tok]
    int head_dim_v;
    // kv_shift
    const int32_t *delta; // [n_ctx]
    int n_layer;
    int n_ctx;
    int rot_block; // K stored Hadamard-rotated with this block; 0: not
    // a quantized row failed to quantize (rope_kv_store, kv_shift): the first
    // token or cell that failed, plus one; 0 when none did
    _Atomic int64_t bad;
};

// Records that token or cell i of a job failed to quantize (the lowest i
// wins, so the message does not depend on the threads).
static void cpu_job_bad(struct rope_job *j, int64_t i) {
    int64_t cur = atomic_load(&j->bad);
    while ((cur == 0 || cur > i + 1) && !atomic_compare_exchange_weak(&j->bad, &cur, i + 1)) {
    }
}

static void rope_tokens_range(void *ctx, int64_t t0, int64_t t1, int thread) {
    struct rope_job *j = ctx;
    float *cs = j->rp ? j->scratch[thread] : NULL;
    const size_t row = (size_t)j->n_head * j->head_dim;
    for (int64_t t = t0; t < t1; t++) {
        if (j->rp) { // NULL: rope_kv_store of the unrotated cache mode, a plain store
            rope_cache_fill(cs, (float)j->pos[t], j->rp, &j->rc);
            for (int h = 0; h < j->n_head; h++)
                rope_rotate_f32(j->x + t * row + (size_t)h * j->head_dim, cs, j->rp->n_rot,
                                j->rp->mode);
        }
        if (j->k_cache) {
            const size_t c = (size_t)j->cells[t];
            const size_t vrow = (size_t)j->n_head * j->head_dim_v;
            if (cpu_store_row((char *)j->k_cache + c * ggml_row_bytes(j->type_k, (int64_t)row),
                              j->type_k, j->x + t * row, (int64_t)row) ||
                cpu_store_row((char *)j->v_cache + c * ggml_row_bytes(j->type_v, (int64_t)vrow),
                              j->type_v, j->v + t * vrow, (int64_t)vrow))
                cpu_job_bad(j, t);
        }
    }
}

static int cpu_rope_prepare(struct backend *be, struct rope_job *j, const struct rope_params *rp,
                            int head_dim, bool magnitude, const char *what) {
    int rc = rope_params_check(rp, head_dim, what, &be->err);
    if (rc)
        return rc;
    j->rp = rp;
    rope_consts_init(&j->rc, rp, magnitude);
    rc = cpu_scratch_reserve(be, (size_t)rp->n_rot * sizeof(float), what);
    if (rc)
        return rc;
    j->scratch = cpu_state_of(be)->scratch;
    return VERR_OK;
}

static int cpu_rope(struct backend *be, float *x, const int32_t *pos, int n_tok, int n_head,
                    int head_dim, const struct rope_params *rp) {
    if (n_tok < 0 || n_head <= 0 || head_dim <= 0)
        return verr_set(&be->err, VERR_RANGE, "cpu rope: shape %d x %d x %d", n_tok, n_head,
                        head_dim);
    struct rope_job j = {.x = x, .pos = pos, .n_head = n_head, .head_dim = head_dim};
    int rc = cpu_rope_prepare(be, &j, rp, head_dim, true, "cpu rope");
    if (rc || n_tok == 0)
        return rc;
    if (!x || !pos)
        return verr_set(&be->err, VERR_RANGE, "cpu rope: NULL x or pos");
    threadpool_parallel_for(cpu_state_of(be)->pool, n_tok, cpu_grain((int64_t)n_head * head_dim),
                            rope_tokens_range, &j);
    return VERR_OK;
}

static int cpu_rope_kv_store(struct backend *be, float *q, int n_head, float *k, const float *v,
                             void *k_cache, enum ggml_type type_k, void *v_cache,
                             enum ggml_type type_v, const int32_t *pos, const int32_t *cells,
                             int n_tok, int n_head_kv, int head_dim, int head_dim_v,
                             const struct rope_params *rp) {
    if (n_tok < 0 || n_head_kv <= 0 || head_dim <= 0 || head_dim_v <= 0)
        return verr_set(&be->err, VERR_RANGE, "cpu rope_kv_store: shape %d x %d x (%d, %d)", n_tok,
                        n_head_kv, head_dim, head_dim_v);
    if (!cpu_is_cache_type(type_k) || !cpu_is_cache_type(type_v))
        return verr_set(&be->err, VERR_UNSUPPORTED,
                        "cpu rope_kv_store: cache types %s/%s: the cpu backend runs f32, f16, "
                        "bf16, q8_0, q4_0, q4_1, q5_0, q5_1 and iq4_nl",
                        ggml_type_name(type_k), ggml_type_name(type_v));
    if (!ggml_row_bytes(type_k, (int64_t)n_head_kv * head_dim) ||
        !ggml_row_bytes(type_v, (int64_t)n_head_kv * head_dim_v))
        return verr_set(&be->err, VERR_RANGE,
                        "cpu rope_kv_store: a cell's K (%d x %d of %s) or V (%d x %d of %s) is "
                        "not whole blocks",
                        n_head_kv, head_dim, ggml_type_name(type_k), n_head_kv, head_dim_v,
                        ggml_type_name(type_v));
    struct rope_job j = {
        .x = k,
        .pos = pos,
        .n_head = n_head_kv,
        .head_dim = head_dim,
        .v = v,
        .k_cache = k_cache,
        .v_cache = v_cache,
        .type_k = type_k,
        .type_v = type_v,
        .cells = cells,
        .head_dim_v = head_dim_v,
    };
    int rc = rp ? cpu_rope_prepare(be, &j, rp, head_dim, true, "cpu rope_kv_store") : VERR_OK;
    if (rc || n_tok == 0)
        return rc;
    if (!k || !v || !k_cache || !v_cache || !pos || !cells)
        return verr_set(&be->err, VERR_RANGE, "cpu rope_kv_store: NULL pointer");
    // Two tokens writing one cell would race; the cache is sized by the
    // caller (cells[t] < n_ctx is its precondition, n_ctx is not passed).
    for (int t = 0; t < n_tok; t++)
        if (cells[t] < 0)
            return verr_set(&be->err, VERR_RANGE, "cpu rope_kv_store: cell %d of token %d < 0",
                            cells[t], t);
    threadpool_parallel_for(cpu_state_of(be)->pool, n_tok,
                            cpu_grain((int64_t)n_head_kv * (head_dim + head_dim_v)),
                            rope_tokens_range, &j);
    const int64_t bad = atomic_load(&j.bad);
    if (bad)
        return verr_set(&be->err, VERR_RANGE,
                        "cpu rope_kv_store: token %lld's K or V does not fit the %s/%s cache "
                        "(a non-finite value, or beyond an f16 block scale)",
                        (long long)(bad - 1), ggml_type_name(type_k), ggml_type_name(type_v));
    return q && rp ? cpu_rope(be, q, pos, n_tok, n_head, head_dim, rp) : VERR_OK;
}

static void kv_shift_range(void *ctx, int64_t c0, int64_t c1, int thread) {
    struct rope_job *j = ctx;
    float *cs = j->scratch[thread];
    const size_t row = (size_t)j->n_head * j->head_dim; // elements of one cell
    const size_t layer = (size_t)j->n_ctx * row;        // elements of one layer
    const bool quantized = !backend_cache_type_ok(j->type_k);
    const size_t row_bytes = ggml_row_bytes(j->type_k, (int64_t)row);
    float *x = cs + j->rp->n_rot; // [row]: a quantized row as float32
    for (int64_t c = c0; c < c1; c++) {
        if (j->delta[c] == 0)
            continue;
        rope_cache_fill(cs, (float)j->delta[c], j->rp, &j->rc);
        // A quantized K is dequantized, rotated and quantized again, as
        // llama.cpp's K shift (ggml_rope on the dequantized rows, then a copy
        // back into the cache's type): one more rounding per shift, no drift
        // in magnitude (a pure rotation, as below).
        for (int l = 0; quantized && l < j->n_layer; l++) {
            char *r = (char *)j->k_cache + ((size_t)l * j->n_ctx + (size_t)c) * row_bytes;
            if (quant_dequantize_row(j->type_k, r, x, (int64_t)row, NULL)) {
                cpu_job_bad(j, c);
                continue;
            }
            for (size_t i = 0; j->rot_block && i < row; i += (size_t)j->rot_block)
                hadamard_f32(x + i, j->rot_block); // back to RoPE's basis (H H = I)
            for (int h = 0; h < j->n_head; h++)
                rope_rotate_f32(x + (size_t)h * j->head_dim, cs, j->rp->n_rot, j->rp->mode);
            for (size_t i = 0; j->rot_block && i < row; i += (size_t)j->rot_block)
                hadamard_f32(x + i, j->rot_block);
            if (quant_quantize_row(j->type_k, x, r, (int64_t)row, NULL))
                cpu_job_bad(j, c);
        }
        for (int l = 0; !quantized && l < j->n_layer; l++) {
            for (int h = 0; h < j->n_head; h++) {
                const size_t off = l * layer + (size_t)c * row + (size_t)h * j->head_dim;
                if (j->type_k == GGML_TYPE_F32)
                    rope_rotate_f32((float *)j->k_cache + off, cs, j->rp->n_rot, j->rp->mode);
                else
                    rope_rotate_f16((uint16_t *)j->k_cache + off, cs, j->rp->n_rot, j->rp->mode);
            }
        }
    }
}

// The contract's sequence op by op: the CPU has no launches to save.
static int cpu_rope_kv_store_rot(struct backend *be, float *q, int n_head, float *k, float *v,
                                 void *k_cache, enum ggml_type type_k, void *v_cache,
                                 enum ggml_type type_v, const int32_t *pos, const int32_t *cells,
                                 int n_tok, int n_head_kv, int head_dim, int head_dim_v,
                                 const struct rope_params *rp, int rot_k, int rot_v) {
    if ((rot_k && !backend_hadamard_block_ok(head_dim, rot_k)) ||
        (rot_v && !backend_hadamard_block_ok(head_dim_v, rot_v)))
        return verr_set(&be->err, VERR_RANGE,
                        "cpu rope_kv_store_rot: rotation blocks %d/%d for head dims %d/%d (0 or a "
                        "power of two in [2, %d] dividing the head dim)",
                        rot_k, rot_v, head_dim, head_dim_v, BACKEND_HADAMARD_MAX);
    if (q && n_head <= 0)
        return verr_set(&be->err, VERR_RANGE, "cpu rope_kv_store_rot: q with %d heads", n_head);
    int rc = VERR_OK;
    if (rp && q)
        rc = cpu_rope(be, q, pos, n_tok, n_head, head_dim, rp);
    if (!rc && rp)
        rc = cpu_rope(be, k, pos, n_tok, n_head_kv, head_dim, rp);
    if (!rc && rot_k && q)
        rc = cpu_hadamard(be, q, (int64_t)n_tok * n_head, head_dim, rot_k);
    if (!rc && rot_k)
        rc = cpu_hadamard(be, k, (int64_t)n_tok * n_head_kv, head_dim, rot_k);
    if (!rc && rot_v)
        rc = cpu_hadamard(be, v, (int64_t)n_tok * n_head_kv, head_dim_v, rot_v);
    if (!rc)
        rc = cpu_rope_kv_store(be, NULL, n_head, k, v, k_cache, type_k, v_cache, type_v, pos, cells,
                               n_tok, n_head_kv, head_dim, head_dim_v, NULL);
    return rc;
}

static int cpu_kv_shift(struct backend *be, void *k_cache, enum ggml_type type_k,
                        const int32_t *delta, int n_layer, int n_ctx, int n_head_kv, int head_dim,
                        const struct rope_params *rp, int rot_block) {
    if (n_layer < 0 || n_ctx < 0 || n_head_kv <= 0 || head_dim <= 0)
        return verr_set(&be->err, VERR_RANGE, "cpu kv_shift: shape %d x %d x %d x %d", n_layer,
                        n_ctx, n_head_kv, head_dim);
    if (rot_block &&
        (backend_cache_type_ok(type_k) || !backend_hadamard_block_ok(head_dim, rot_block)))
        return verr_set(&be->err, VERR_RANGE,
                        "cpu kv_shift: rotation block %d with a %s K of head dim %d (a quantized "
                        "K and a power of two in [2, %d] dividing the head dim)",
                        rot_block, ggml_type_name(type_k), head_dim, BACKEND_HADAMARD_MAX);
    if (!cpu_is_cache_type(type_k))
        return verr_set(&be->err, VERR_UNSUPPORTED,
                        "cpu kv_shift: cache type %s: the cpu backend runs f32, f16, bf16, q8_0, "
                        "q4_0, q4_1, q5_0, q5_1 and iq4_nl",
                        ggml_type_name(type_k));
    if (!ggml_row_bytes(type_k, (int64_t)n_head_kv * head_dim))
        return verr_set(&be->err, VERR_RANGE,
                        "cpu kv_shift: a cell's K row (%d heads x %d) is not whole %s blocks",
                        n_head_kv, head_dim, ggml_type_name(type_k));
    struct rope_job j = {
        .n_head = n_head_kv,
        .head_dim = head_dim,
        .k_cache = k_cache,
        .type_k = type_k,
        .delta = delta,
        .n_layer = n_layer,
        .n_ctx = n_ctx,
        .rot_block = rot_block,
    };
    // magnitude = false: a pure rotation; K carries attn_factor / mscale from
    // the store already, and llama.cpp's re-application on every shift grows
    // K by mscale per shift.
    int rc = cpu_rope_prepare(be, &j, rp, head_dim, false, "cpu kv_shift");
    if (!rc && !backend_cache_type_ok(type_k)) // kv_shift_range's float32 row after cs
        rc = cpu_scratch_reserve(
            be, ((size_t)rp->n_rot + (size_t)n_head_kv * head_dim) * sizeof(float), "cpu kv_shift");
    if (rc || n_layer == 0 || n_ctx == 0)
        return rc;
    if (!k_cache || !delta)
        return verr_set(&be->err, VERR_RANGE, "cpu kv_shift: NULL k_cache or delta");
    if (ggml_row_bytes(type_k, (int64_t)n_head_kv * head_dim) == 0)
        return verr_set(&be->err, VERR_RANGE,
                        "cpu kv_shift: a %s row of %d x %d values is not whole blocks",
                        ggml_type_name(type_k), n_head_kv, head_dim);
    threadpool_parallel_for(cpu_state_of(be)->pool, n_ctx,
                            cpu_grain((int64_t)n_layer * n_head_kv * head_dim), kv_shift_range, &j);
    const int64_t bad = atomic_load(&j.bad);
    if (bad)
        return verr_set(&be->err, VERR_RANGE,
                        "cpu kv_shift: cell %lld's K did not quantize back to %s after its "
                        "rotation",
                        (long long)(bad - 1), ggml_type_name(type_k));
    return VERR_OK;
}

// ---------------------------------------------------------------------------
// attention (cpu_attention.c)

static int cpu_attention(struct backend *be, const struct attn_args *a) {
    struct cpu_state *st = cpu_state_of(be);
    return cpu_attention_run(&st->attn, st->pool, a, &be->err);
}

// ---------------------------------------------------------------------------
// elementwise, get_rows, argmax

struct ew_job {
    float *out;     // [n]
    const float *a; // [n] (swiglu: gate)
    const float *b; // [n] (swiglu: up; add: y)
    float s;        // scale
};

static void swiglu_range(void *ctx, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const struct ew_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) {
        const float g = j->a[i];
        j->out[i] = g / (1.0f + expf(-g)) * j->b[i]; // silu(g) * up, as ggml_silu_f32
    }
}

// GELU, tanh approximation, as ggml's CPU backend computes it (the geglu op,
// host/ops/backend.h): f16(gelu(f16(g))) inside (-10, 10), where ggml reads
// its 64Ki-entry f16 table; the constants are ggml's.
static float gelu_f16(float g) {
    if (g <= -10.0f)
        return 0.0f;
    if (g >= 10.0f)
        return g;
    const float x = quant_fp16_to_f32(quant_f32_to_fp16(g));
    const float y =
        0.5f * x *
        (1.0f + tanhf(0.79788456080286535587989211986876f * x * (1.0f + 0.044715f * x * x)));
    return quant_fp16_to_f32(quant_f32_to_fp16(y));
}

static void geglu_range(void *ctx, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const struct ew_job *j = ctx;
    for (int64_t i = i0; i < i1; i++)
        j->out[i] = gelu_f16(j->a[i]) * j->b[i];
}

static void scale_range(void *ctx, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const struct ew_job *j = ctx;
    for (int64_t i = i0; i < i1; i++)
        j->out[i] *= j->s;
}

static void add_range(void *ctx, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const struct ew_job *j = ctx;
    for (int64_t i = i0; i < i1; i++)
        j->out[i] += j->b[i];
}

static int cpu_swiglu(struct backend *be, float *out, const float *gate, const float *up,
                      int64_t n) {
    if (n < 0)
        return verr_set(&be->err, VERR_RANGE, "cpu swiglu: n %lld < 0", (long long)n);
    if (n == 0)
        return VERR_OK;
    if (!out || !gate || !up)
        return verr_set(&be->err, VERR_RANGE, "cpu swiglu: NULL pointer");
    struct ew_job j = {out, gate, up, 0.0f};
    threadpool_parallel_for(cpu_state_of(be)->pool, n, 32768, swiglu_range, &j);
    return VERR_OK;
}

static int cpu_geglu(struct backend *be, float *out, const float *gate, const float *up,
                     int64_t n) {
    if (n < 0)
        return verr_set(&be->err, VERR_RANGE, "cpu geglu: n %lld < 0", (long long)n);
    if (n == 0)
        return VERR_OK;
    if (!out || !gate || !up)
        return verr_set(&be->err, VERR_RANGE, "cpu geglu: NULL pointer");
    struct ew_job j = {out, gate, up, 0.0f};
    threadpool_parallel_for(cpu_state_of(be)->pool, n, 32768, geglu_range, &j);
    return VERR_OK;
}

static int cpu_scale(struct backend *be, float *x, float s, int64_t n) {
    if (n < 0)
        return verr_set(&be->err, VERR_RANGE, "cpu scale: n %lld < 0", (long long)n);
    if (n == 0)
        return VERR_OK;
    if (!x)
        return verr_set(&be->err, VERR_RANGE, "cpu scale: NULL pointer");
    struct ew_job j = {x, NULL, NULL, s};
    threadpool_parallel_for(cpu_state_of(be)->pool, n, 32768, scale_range, &j);
    return VERR_OK;
}

static int cpu_add(struct backend *be, float *x, const float *y, int64_t n) {
    if (n < 0)
        return verr_set(&be->err, VERR_RANGE, "cpu add: n %lld < 0", (long long)n);
    if (n == 0)
        return VERR_OK;
    if (!x || !y)
        return verr_set(&be->err, VERR_RANGE, "cpu add: NULL pointer");
    struct ew_job j = {x, NULL, y, 0.0f};
    threadpool_parallel_for(cpu_state_of(be)->pool, n, 65536, add_range, &j);
    return VERR_OK;
}

static int cpu_get_rows(struct backend *be, float *out, const float *x, const int32_t *rows,
                        int n_out_rows, int n) {
    if (n_out_rows < 0 || n < 0)
        return verr_set(&be->err, VERR_RANGE, "cpu get_rows: shape %d x %d", n_out_rows, n);
    if (n_out_rows == 0 || n == 0)
        return VERR_OK;
    if (!out || !x || !rows)
        return verr_set(&be->err, VERR_RANGE, "cpu get_rows: NULL pointer");
    for (int r = 0; r < n_out_rows; r++)
        if (rows[r] < 0)
            return verr_set(&be->err, VERR_RANGE, "cpu get_rows: row %d at %d is negative", rows[r],
                            r);
    for (int r = 0; r < n_out_rows; r++)
        memmove(out + (size_t)r * n, x + (size_t)rows[r] * n, (size_t)n * sizeof(float));
    return VERR_OK;
}

struct argmax_job {
    int32_t *out;        // [n_rows]
    const float *logits; // [n_rows][n_vocab]
    int n_vocab;
};

static void argmax_range(void *ctx, int64_t r0, int64_t r1, int thread) {
    (void)thread;
    const struct argmax_job *j = ctx;
    for (int64_t r = r0; r < r1; r++) {
        const float *l = j->logits + (size_t)r * j->n_vocab;
        // Strictly greater keeps the lowest index on ties (llama.cpp's greedy
        // sampler); NaN never wins; a row of NaN / -inf gives 0.
        float best = -INFINITY;
        int32_t idx = 0;
        for (int i = 0; i < j->n_vocab; i++) {
            if (l[i] > best) {
                best = l[i];
                idx = i;
            }
        }
        j->out[r] = idx;
    }
}

static int cpu_argmax(struct backend *be, int32_t *out, const float *logits, int n_rows,
                      int n_vocab) {
    if (n_rows < 0 || n_vocab <= 0)
        return verr_set(&be->err, VERR_RANGE, "cpu argmax: shape %d x %d", n_rows, n_vocab);
    if (n_rows == 0)
        return VERR_OK;
    if (!out || !logits)
        return verr_set(&be->err, VERR_RANGE, "cpu argmax: NULL pointer");
    struct argmax_job j = {out, logits, n_vocab};
    threadpool_parallel_for(cpu_state_of(be)->pool, n_rows, cpu_grain(n_vocab), argmax_range, &j);
    return VERR_OK;
}

// ---------------------------------------------------------------------------
// sample: sampler.c's chain, row by row, with the draws given

struct sample_job {
    int32_t *out;        // [n_rows]
    const float *logits; // [n_rows][n_vocab]
    int n_vocab;
    const struct sample_params *sp; // [n_rows]
    float **scratch;                // per thread [n_vocab] struct sampler_cand
};

static void sample_range(void *ctx, int64_t r0, int64_t r1, int thread) {
    const struct sample_job *j = ctx;
    struct sampler_cand *cd = (struct sampler_cand *)j->scratch[thread];
    for (int64_t r = r0; r < r1; r++) {
        const float *l = j->logits + (size_t)r * j->n_vocab;
        for (int i = 0; i < j->n_vocab; i++)
            cd[i] = (struct sampler_cand){i, l[i], 0.0f};
        struct sampler_cands c = {cd, (size_t)j->n_vocab, false};
        const struct sample_params *p = &j->sp[r];
        j->out[r] = sampler_chain(&c, p->temp, p->top_k, p->top_p, p->min_p, p->u);
    }
}

static int cpu_sample(struct backend *be, int32_t *out, const float *logits, int n_rows,
                      int n_vocab, const struct sample_params *sp) {
    if (n_rows < 0 || n_vocab <= 0)
        return verr_set(&be->err, VERR_RANGE, "cpu sample: shape %d x %d", n_rows, n_vocab);
    if (n_rows == 0)
        return VERR_OK;
    if (!out || !logits || !sp)
        return verr_set(&be->err, VERR_RANGE, "cpu sample: NULL pointer");
    for (int r = 0; r < n_rows; r++)
        if (!(sp[r].u >= 0.0 && sp[r].u < 1.0))
            return verr_set(&be->err, VERR_RANGE, "cpu sample: row %d: u %g is not in [0, 1)", r,
                            sp[r].u);
    int rc = cpu_scratch_reserve(be, (size_t)n_vocab * sizeof(struct sampler_cand), "cpu sample");
    if (rc)
        return rc;
    struct sample_job j = {out, logits, n_vocab, sp, cpu_state_of(be)->scratch};
    threadpool_parallel_for(cpu_state_of(be)->pool, n_rows, 1, sample_range, &j);
    return VERR_OK;
}

// ---------------------------------------------------------------------------
// lifecycle

static void cpu_destroy(struct backend *be) {
    if (!be)
        return;
    struct cpu_state *st = cpu_state_of(be);
    if (st) {
        threadpool_free(st->pool);
        if (st->scratch)
            for (int i = 0; i < st->n_threads; i++)
                free(st->scratch[i]);
        free(st->scratch);
        free(st->xq);
        cpu_attention_free(st->attn);
        free(st);
    }
    free(be);
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .cache_type_supported = cpu_is_cache_type,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .memset_zero = cpu_memset_zero,
    .sync = cpu_sync,
    .embed = cpu_embed,
    .rms_norm = cpu_rms_norm,
    .rms_norm_q8 = cpu_rms_norm, // its matmuls quantize x themselves (act_q8)
    .matmul = cpu_matmul,
    .matmul_multi = cpu_matmul_multi,
    .matmul_add = cpu_matmul_add,
    .matmul_swiglu = cpu_matmul_swiglu,
    .matmul_geglu = cpu_matmul_geglu,
    .rope = cpu_rope,
    .rope_kv_store = cpu_rope_kv_store,
    .rope_kv_store_rot = cpu_rope_kv_store_rot,
    .attention = cpu_attention,
    .hadamard = cpu_hadamard,
    .hadamard_q8 = cpu_hadamard, // its matmuls quantize x themselves (act_q8)
    .kv_shift = cpu_kv_shift,
    .swiglu = cpu_swiglu,
    .geglu = cpu_geglu,
    .scale = cpu_scale,
    .add = cpu_add,
    .get_rows = cpu_get_rows,
    .argmax = cpu_argmax,
    .sample = cpu_sample,
    .moe_route = cpu_moe_route,
    .moe_ffn = cpu_moe_ffn,
    .add_sigmoid_scaled = cpu_add_sigmoid_scaled,
    .mem_info = cpu_mem_info,
    .destroy = cpu_destroy,
};

int backend_cpu_create(struct backend **out, int n_threads, struct verr *err) {
    *out = NULL;
    struct backend *be = calloc(1, sizeof *be);
    struct cpu_state *st = calloc(1, sizeof *st);
    if (!be || !st) {
        free(be);
        free(st);
        return verr_set(err, VERR_NOMEM, "cpu backend: out of memory");
    }
    be->ops = &cpu_ops;
    be->impl = st;
    be->device = -1;
    int rc = threadpool_create(&st->pool, n_threads, err);
    if (rc) {
        cpu_destroy(be);
        return verr_wrap(err, "cpu backend");
    }
    st->n_threads = threadpool_size(st->pool);
    st->q8_isa = cpu_q8_isa();
    st->scratch = calloc((size_t)st->n_threads, sizeof *st->scratch);
    if (!st->scratch) {
        cpu_destroy(be);
        return verr_set(err, VERR_NOMEM, "cpu backend: out of memory");
    }
    be->n_threads = st->n_threads;
    *out = be;
    return VERR_OK;
}
