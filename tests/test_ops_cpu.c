// The CPU reference backend (host/backend/backend_cpu.c), op by op: against values
// computed by hand, against naive implementations written here (random
// inputs, odd sizes), and 1 thread against 3 (must be bit-identical).
// RoPE, rope_kv_store and kv_shift are in tests/test_rope.c.
#define _GNU_SOURCE // sched_getaffinity, CPU_SET
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gguf/quant.h"
#include "gguf/quant_q8.h"
#include "host/ops/backend.h"
#include "host/backend/cpu_attention.h"
#include "host/backend/cpu_q8.h"
#include "host/backend/threadpool.h"
#include "tests/cpu_op_helpers.h"

// ---------------------------------------------------------------------------
// helpers

static float *frand_array(size_t n, float amp) {
    float *x = malloc(n * sizeof *x);
    cr_assert_not_null(x);
    for (size_t i = 0; i < n; i++)
        x[i] = amp * frand();
    return x;
}

// ---------------------------------------------------------------------------
// lifecycle, memory, thread pool

Test(cpu, create_and_memory) {
    struct backend *be = mk_backend(0);
    cr_expect_eq(be->n_threads, threadpool_default_threads(),
                 "n_threads <= 0 means one per physical core the process may use");
    cr_expect_str_eq(be->ops->name, "cpu");
    const size_t sizes[] = {0, 1, 63, 64, 65, 1000, 1 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p = NULL;
        cr_assert_eq(be->ops->alloc(be, sizes[i], &p), 0, "%s", be->err.msg);
        cr_assert_not_null(p);
        cr_expect_eq((uintptr_t)p % 64, 0, "alloc(%zu) not 64-byte aligned", sizes[i]);
        if (sizes[i] >= 64) {
            unsigned char src[64], back[64];
            for (int b = 0; b < 64; b++)
                src[b] = (unsigned char)(b * 7 + 1);
            cr_expect_eq(be->ops->upload(be, p, src, 64), 0);
            cr_expect_eq(be->ops->sync(be), 0);
            cr_expect_eq(be->ops->download(be, back, p, 64), 0);
            cr_expect_arr_eq(back, src, 64);
            cr_expect_eq(be->ops->memset_zero(be, p, 64), 0);
            cr_expect_eq(be->ops->download(be, back, p, 64), 0);
            for (int b = 0; b < 64; b++)
                cr_expect_eq(back[b], 0);
        }
        be->ops->free(be, p);
    }
    void *p = (void *)1;
    cr_expect_eq(be->ops->alloc(be, SIZE_MAX - 8, &p), VERR_NOMEM);
    cr_expect_null(p);
    cr_expect_eq(be->ops->upload(be, NULL, "x", 1), VERR_RANGE);
    backend_destroy(be);
}

struct cover_ctx {
    _Atomic int *hits;
    int size;
    _Atomic int bad_thread;
};

static void cover_fn(void *ctx, int64_t b, int64_t e, int thread) {
    struct cover_ctx *c = ctx;
    if (thread < 0 || thread >= c->size)
        atomic_store(&c->bad_thread, 1);
    for (int64_t i = b; i < e; i++)
        atomic_fetch_add(&c->hits[i], 1);
}

// Every index of [0, n) runs exactly once, thread ids stay below the pool
// size, whatever n, grain and thread count; also in chaos mode
// (VELA_POOL_CHAOS: delayed workers, random solo spells).
Test(cpu, threadpool_covers_range_once) {
    const int threads[] = {1, 2, 3, 8};
    const int64_t ns[] = {0, 1, 7, 1000, 100003};
    const int64_t grains[] = {0, 1, 7, 1000};
    for (size_t ti = 0; ti < 8; ti++) {
        struct threadpool *tp = NULL;
        struct verr err = {0};
        if (ti >= 4)
            setenv("VELA_POOL_CHAOS", "7", 1);
        cr_assert_eq(threadpool_create(&tp, threads[ti % 4], &err), 0, "%s", err.msg);
        unsetenv("VELA_POOL_CHAOS");
        cr_expect_eq(threadpool_size(tp), threads[ti % 4]);
        for (size_t ni = 0; ni < 5; ni++)
            for (size_t gi = 0; gi < 4; gi++) {
                const int64_t n = ns[ni];
                struct cover_ctx c;
                c.hits = calloc((size_t)n + 1, sizeof(_Atomic int));
                c.size = threads[ti % 4];
                atomic_init(&c.bad_thread, 0);
                for (int rep = 0; rep < 3; rep++)
                    threadpool_parallel_for(tp, n, grains[gi], cover_fn, &c);
                for (int64_t i = 0; i < n; i++)
                    if (atomic_load(&c.hits[i]) != 3) {
                        cr_expect_fail("threads %d%s n %lld grain %lld: index %lld ran %d times",
                                       threads[ti % 4], ti >= 4 ? " (chaos)" : "", (long long)n,
                                       (long long)grains[gi], (long long)i,
                                       atomic_load(&c.hits[i]) / 3);
                        break;
                    }
                cr_expect_eq(atomic_load(&c.bad_thread), 0);
                free((void *)c.hits);
            }
        threadpool_free(tp);
    }
}

// Many short jobs back to back on more threads than cores, so workers are
// preempted and wake late: a job must still run each index exactly once, and
// no chunk may run after its parallel_for returned (a late worker taking a
// chunk of a finished job, or the next job's range with the old fn/ctx).
// With and without spinning (VELA_SPIN_US=0: every wait sleeps).
struct late_ctx {
    _Atomic int *hits;
    int64_t n;
    int id;
    const _Atomic int *current; // the job the caller is inside
    _Atomic int *stale;
};

static void late_fn(void *ctx, int64_t b, int64_t e, int thread) {
    struct late_ctx *c = ctx;
    if (atomic_load(c->current) != c->id || b < 0 || e > c->n || b >= e)
        atomic_fetch_add(c->stale, 1);
    for (int64_t i = b; i < e && i < c->n; i++)
        atomic_fetch_add(&c->hits[i], 1);
}

Test(cpu, threadpool_late_workers_never_run_stale_chunks) {
    const char *spins[] = {"0", "200"};
    for (int si = 0; si < 2; si++) {
        setenv("VELA_SPIN_US", spins[si], 1);
        struct threadpool *tp = NULL;
        struct verr err = {0};
        cr_assert_eq(threadpool_create(&tp, 8, &err), 0, "%s", err.msg);
        _Atomic int current, stale;
        atomic_init(&current, -1);
        atomic_init(&stale, 0);
        _Atomic int *hits = calloc(4096, sizeof *hits);
        int bad_jobs = 0;
        for (int job = 0; job < 4000; job++) {
            const int64_t n = 1 + (job * 37) % 4096;
            for (int64_t i = 0; i < n; i++)
                atomic_store(&hits[i], 0);
            struct late_ctx c = {hits, n, job, &current, &stale};
            atomic_store(&current, job);
            threadpool_parallel_for(tp, n, 1 + job % 5, late_fn, &c);
            atomic_store(&current, -1);
            for (int64_t i = 0; i < n; i++)
                if (atomic_load(&hits[i]) != 1) {
                    if (bad_jobs++ < 3)
                        cr_expect_fail("VELA_SPIN_US=%s job %d (n %lld): index %lld ran %d times",
                                       spins[si], job, (long long)n, (long long)i,
                                       atomic_load(&hits[i]));
                    break;
                }
        }
        threadpool_free(tp);
        free((void *)hits);
        cr_expect_eq(atomic_load(&stale), 0,
                     "VELA_SPIN_US=%s: %d chunk(s) ran outside their job or range", spins[si],
                     atomic_load(&stale));
        cr_expect_eq(bad_jobs, 0, "VELA_SPIN_US=%s: %d of 4000 jobs miscounted", spins[si],
                     bad_jobs);
    }
    unsetenv("VELA_SPIN_US");
}

// Solo spells. Two jobs in a row where a worker holds a chunk for 10 ms (as
// if the scheduler put it aside) while the caller's share took much less:
// then the caller runs the jobs of the next VELA_POOL_SOLO_MS alone. A probe
// job tells: its thread 0 waits up to 200 ms for a worker to take a chunk,
// which an ordinary job gives a woken worker ample time to do. The pool
// tells a stall by timing, so on a loaded machine (ctest -j) one may be
// missed: up to 5 attempts. With VELA_POOL_SOLO_MS=0 no probe runs alone.
// Every job must run each index once.
struct stall_ctx {
    _Atomic int *hits;
    _Atomic int worker_in; // a worker has taken a chunk of this job
    int stall_ms;          // how long that worker holds its first chunk
};

static int64_t ms_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void stall_fn(void *ctx, int64_t b, int64_t e, int thread) {
    struct stall_ctx *c = ctx;
    if (thread != 0 && !atomic_exchange(&c->worker_in, 1) && c->stall_ms > 0) {
        const struct timespec ts = {0, c->stall_ms * 1000L * 1000L};
        nanosleep(&ts, NULL);
    }
    // Thread 0 keeps chunks for a worker until one takes one (200 ms at most).
    for (const int64_t until = ms_now() + 200; thread == 0 && !atomic_load(&c->worker_in) &&
                                              ms_now() < until;)
        sched_yield();
    for (int64_t i = b; i < e; i++)
        atomic_fetch_add(&c->hits[i], 1);
}

// Returns the attempt (1..5) whose probe ran alone, 6 if none did.
static int stall_attempts(const char *solo_ms) {
    setenv("VELA_POOL_SOLO_MS", solo_ms, 1);
    struct threadpool *tp = NULL;
    struct verr err = {0};
    cr_assert_eq(threadpool_create(&tp, 2, &err), 0, "%s", err.msg);
    unsetenv("VELA_POOL_SOLO_MS");
    enum { N = 4096 };
    struct stall_ctx c = {.hits = calloc(N, sizeof(_Atomic int))};
    int attempt = 1, jobs = 0;
    for (; attempt <= 5; attempt++) {
        for (int k = 0; k < 3; k++, jobs++) { // two stalls, then the probe
            c.stall_ms = k < 2 ? 10 : 0;
            atomic_store(&c.worker_in, 0);
            threadpool_parallel_for(tp, N, 1, stall_fn, &c);
        }
        if (!atomic_load(&c.worker_in))
            break;
    }
    int wrong = 0;
    for (int i = 0; i < N; i++)
        wrong += atomic_load(&c.hits[i]) != jobs;
    cr_expect_eq(wrong, 0, "VELA_POOL_SOLO_MS=%s: %d of %d indices not run once in each of %d jobs",
                 solo_ms, wrong, N, jobs);
    free((void *)c.hits);
    threadpool_free(tp);
    return attempt;
}

Test(cpu, threadpool_runs_alone_after_stalled_workers) {
    const int attempts = stall_attempts("60000");
    cr_expect_leq(attempts, 5, "after 5 pairs of 10 ms stalls a worker still took chunks");
    cr_log_info("alone after %d attempt(s) of two stalls", attempts);
    cr_expect_eq(stall_attempts("0"), 6, "VELA_POOL_SOLO_MS=0, yet a job ran alone");
}

// The default thread count: the physical cores of the affinity mask. The
// reference counts distinct SMT sibling lists (thread_siblings_list), another
// sysfs view than the (package, core_id) pairs the pool reads; pinned to one
// CPU, the default is 1 thread.
static int ref_physical_cores(const cpu_set_t *set) {
    char lists[CPU_SETSIZE][64];
    int n = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, set))
            continue;
        char path[96], buf[64] = "";
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list",
                 cpu);
        FILE *f = fopen(path, "r");
        if (!f)
            return -1;
        const bool got = fgets(buf, sizeof buf, f) != NULL;
        fclose(f);
        if (!got)
            return -1;
        bool seen = false;
        for (int i = 0; i < n && !seen; i++)
            seen = !strcmp(lists[i], buf);
        if (!seen)
            snprintf(lists[n++], sizeof lists[0], "%s", buf);
    }
    return n;
}

Test(cpu, threadpool_default_threads_are_the_allowed_physical_cores) {
    cpu_set_t all, one;
    cr_assert_eq(sched_getaffinity(0, sizeof all, &all), 0);
    const int want = ref_physical_cores(&all);
    if (want > 0)
        cr_expect_eq(threadpool_default_threads(), want,
                     "%d allowed CPUs on %d physical cores: default %d threads", CPU_COUNT(&all),
                     want, threadpool_default_threads());
    else
        cr_log_warn("no thread_siblings_list in sysfs: only the pinned case is checked");
    int first = 0;
    while (!CPU_ISSET(first, &all))
        first++;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    cr_assert_eq(sched_setaffinity(0, sizeof one, &one), 0);
    const int pinned = threadpool_default_threads();
    struct threadpool *tp = NULL;
    struct verr err = {0};
    const int rc = threadpool_create(&tp, 0, &err);
    const int size = threadpool_size(tp);
    threadpool_free(tp);
    cr_assert_eq(sched_setaffinity(0, sizeof all, &all), 0);
    cr_expect_eq(pinned, 1, "pinned to CPU %d: default %d threads", first, pinned);
    cr_expect_eq(rc, 0, "%s", err.msg);
    cr_expect_eq(size, 1, "pinned to CPU %d: a pool of %d threads", first, size);
}

// ---------------------------------------------------------------------------
// rms_norm

Test(cpu, rms_norm_hand) {
    struct backend *be = mk_backend(1);
    // x = [1, 7]: mean(x^2) = 25, 1/sqrt(25) = 0.2; times w = [2, 0.5]: [0.4, 0.7].
    // eps 24 sits inside the sqrt: 1/sqrt(25 + 24) = 1/7: [2/7, 0.5].
    const float x[2] = {1, 7}, w[2] = {2, 0.5f};
    float y[2];
    cr_assert_eq(be->ops->rms_norm(be, y, x, w, 1, 2, 0.0f), 0);
    cr_expect_float_eq(y[0], 0.4f, 1e-7f);
    cr_expect_float_eq(y[1], 0.7f, 1e-7f);
    cr_assert_eq(be->ops->rms_norm(be, y, x, w, 1, 2, 24.0f), 0);
    cr_expect_float_eq(y[0], 2.0f / 7.0f, 1e-7f);
    cr_expect_float_eq(y[1], 0.5f, 1e-7f);
    cr_expect_eq(be->ops->rms_norm(be, y, x, w, 1, 0, 0.0f), VERR_RANGE);
    backend_destroy(be);
}

// Against out = x * w / sqrt(mean(x^2) + eps) in double, in place (out == x)
// and not. Float error: the double sum of squares rounded to float, then
// + eps, sqrtf, 1/s, x*s and *w: six roundings of half an ulp, < 4e-7
// relative; tol 1e-6 relative.
Test(cpu, rms_norm_random) {
    const int ns[] = {3, 33, 257, 4096};
    struct backend *b1 = mk_backend(1), *b3 = mk_backend(3);
    double worst = 0;
    for (size_t k = 0; k < 4; k++) {
        const int n = ns[k], rows = 5;
        rng_seed(10 + k);
        float *x = frand_array((size_t)rows * n, 3.0f), *w = frand_array((size_t)n, 2.0f);
        float *y1 = malloc(sizeof(float) * rows * n), *y3 = malloc(sizeof(float) * rows * n);
        cr_assert_eq(b1->ops->rms_norm(b1, y1, x, w, rows, n, 1e-5f), 0);
        memcpy(y3, x, sizeof(float) * rows * n);
        cr_assert_eq(b3->ops->rms_norm(b3, y3, y3, w, rows, n, 1e-5f), 0, "aliased");
        cr_expect_arr_eq(y1, y3, sizeof(float) * rows * n, "n %d: 1 vs 3 threads / alias", n);
        for (int r = 0; r < rows; r++) {
            double ss = 0;
            for (int i = 0; i < n; i++)
                ss += (double)x[r * n + i] * x[r * n + i];
            const double inv = 1.0 / sqrt(ss / n + 1e-5);
            for (int i = 0; i < n; i++) {
                const double want = x[r * n + i] * inv * w[i];
                const double e = fabs(y1[r * n + i] - want) / fmax(fabs(want), 1e-30);
                worst = fmax(worst, e);
                cr_expect(e <= 1e-6, "n %d r %d i %d: %.9g vs %.9g", n, r, i,
                          (double)y1[r * n + i], want);
            }
        }
        free(x);
        free(w);
        free(y1);
        free(y3);
    }
    cr_log_info("rms_norm vs naive: worst relative error %.3g (tol 1e-6)", worst);
    backend_destroy(b1);
    backend_destroy(b3);
}

// ---------------------------------------------------------------------------
// swiglu, add, get_rows, argmax

Test(cpu, swiglu_hand_and_random) {
    struct backend *be = mk_backend(3);
    // silu(0) = 0; silu(ln 3) = ln3 / (1 + 1/3) = 0.75 ln 3; silu(-ln 3) =
    // -ln3 / (1 + 3) = -0.25 ln 3. Extremes: expf overflows to inf at -1000
    // (silu -> -0), underflows to 0 at +1000 (silu -> 1000); never NaN.
    const float l3 = logf(3.0f);
    const float g[5] = {0, l3, -l3, -1000.0f, 1000.0f}, u[5] = {5, 2, 2, 3, 0.5f};
    float y[5];
    cr_assert_eq(be->ops->swiglu(be, y, g, u, 5), 0);
    cr_expect_float_eq(y[0], 0.0f, 1e-7f);
    cr_expect_float_eq(y[1], 1.5f * l3, 1e-6f);
    cr_expect_float_eq(y[2], -0.5f * l3, 1e-6f);
    cr_expect(y[3] == 0.0f, "silu(-1000) * 3 = %g", (double)y[3]);
    cr_expect_float_eq(y[4], 500.0f, 1e-4f);

    // Random, n = 100003 (several chunks, odd tail), out aliasing gate.
    // expf is within 1 ulp; with the division and product the result is within
    // a few ulps: tol 1e-6 relative (+1e-30 for zeros).
    enum { N = 100003 };
    rng_seed(3);
    float *gg = frand_array(N, 8.0f), *uu = frand_array(N, 2.0f), *out = malloc(N * sizeof *out);
    memcpy(out, gg, N * sizeof *out);
    cr_assert_eq(be->ops->swiglu(be, out, out, uu, N), 0);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        const double want = gg[i] / (1.0 + exp(-(double)gg[i])) * uu[i];
        const double e = fabs(out[i] - want) / fmax(fabs(want), 1e-30);
        worst = fmax(worst, e);
        if (e > 1e-6) {
            cr_expect_fail("swiglu %d: %.9g vs %.9g", i, (double)out[i], want);
            break;
        }
    }
    cr_log_info("swiglu vs naive: worst relative error %.3g (tol 1e-6)", worst);
    free(gg);
    free(uu);
    free(out);
    backend_destroy(be);
}

Test(cpu, add_get_rows) {
    struct backend *be = mk_backend(3);
    float x[3] = {1, 2, 3};
    const float y[3] = {0.5f, -2, 10};
    cr_assert_eq(be->ops->add(be, x, y, 3), 0);
    const float want[3] = {1.5f, 0, 13};
    cr_expect_arr_eq(x, want, sizeof x);

    // Random n = 200001: float addition is exact to the same float as a + b.
    enum { N = 200001 };
    rng_seed(4);
    float *a = frand_array(N, 1), *b = frand_array(N, 1), *c = malloc(N * sizeof *c);
    memcpy(c, a, N * sizeof *c);
    cr_assert_eq(be->ops->add(be, c, b, N), 0);
    for (int i = 0; i < N; i++)
        if (c[i] != a[i] + b[i]) {
            cr_expect_fail("add %d", i);
            break;
        }
    free(a);
    free(b);
    free(c);

    // get_rows: rows 2, 0, 2 of a 3 x 2 matrix.
    const float m[6] = {1, 2, 3, 4, 5, 6};
    const int32_t rows[3] = {2, 0, 2};
    float g[6];
    cr_assert_eq(be->ops->get_rows(be, g, m, rows, 3, 2), 0);
    const float gw[6] = {5, 6, 1, 2, 5, 6};
    cr_expect_arr_eq(g, gw, sizeof g);
    const int32_t bad = -1;
    cr_expect_eq(be->ops->get_rows(be, g, m, &bad, 1, 2), VERR_RANGE);
    backend_destroy(be);
}

Test(cpu, argmax) {
    struct backend *be = mk_backend(3);
    // Row 0: tie between 1 and 3 -> 1 (lowest). Row 1: all -inf -> 0.
    // Row 2: NaN never wins -> 2. Row 3: max at the last index.
    const float l[4][4] = {
        {0, 5, -1, 5},
        {-INFINITY, -INFINITY, -INFINITY, -INFINITY},
        {NAN, 1, 3, 3},
        {-3, -2, -1, -0.5f},
    };
    int32_t out[4];
    cr_assert_eq(be->ops->argmax(be, out, &l[0][0], 4, 4), 0);
    cr_expect_eq(out[0], 1);
    cr_expect_eq(out[1], 0);
    cr_expect_eq(out[2], 2);
    cr_expect_eq(out[3], 3);

    // Random rows of 257 with planted duplicates of the maximum.
    enum { R = 9, V = 257 };
    rng_seed(5);
    float *x = frand_array(R * V, 1);
    for (int r = 0; r < R; r++) {
        x[r * V + (r * 31) % V] = 2.0f;
        x[r * V + (r * 31 + 17) % V] = 2.0f;
    }
    int32_t got[R];
    cr_assert_eq(be->ops->argmax(be, got, x, R, V), 0);
    for (int r = 0; r < R; r++) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (x[r * V + i] > x[r * V + best])
                best = i;
        cr_expect_eq(got[r], best, "row %d", r);
    }
    free(x);
    backend_destroy(be);
}

// ---------------------------------------------------------------------------
// embed

Test(cpu, embed) {
    struct backend *be = mk_backend(2);
    // F32 table of 3 rows x 2.
    const float t32[6] = {1, 2, 3, 4, 5, 6};
    struct backend_weight w = {t32, GGML_TYPE_F32, 2, 3};
    const int32_t toks[3] = {2, 0, 2};
    float out[6];
    cr_assert_eq(be->ops->embed(be, out, &w, toks, 3), 0, "%s", be->err.msg);
    const float want[6] = {5, 6, 1, 2, 5, 6};
    cr_expect_arr_eq(out, want, sizeof out);

    // F16 table: 0x3E00 = 1.5, 0xC000 = -2, 0x3400 = 0.25, 0x0000 = 0.
    const uint16_t t16[4] = {0x3E00, 0xC000, 0x3400, 0x0000};
    struct backend_weight w16 = {t16, GGML_TYPE_F16, 2, 2};
    const int32_t tk2[2] = {1, 0};
    cr_assert_eq(be->ops->embed(be, out, &w16, tk2, 2), 0, "%s", be->err.msg);
    const float want16[4] = {0.25f, 0, 1.5f, -2};
    cr_expect_arr_eq(out, want16, sizeof want16);

    // Q8_0 (n_in 64): each row is exactly quant_dequantize_row of that row.
    enum { NI = 64, NO = 5 };
    const size_t rb = ggml_row_bytes(GGML_TYPE_Q8_0, NI);
    unsigned char *q = malloc(rb * NO);
    rng_seed(6);
    for (int r = 0; r < NO; r++) {
        float row[NI];
        for (int i = 0; i < NI; i++)
            row[i] = frand();
        cr_assert_eq(quant_quantize_row(GGML_TYPE_Q8_0, row, q + rb * r, NI, NULL), 0);
    }
    struct backend_weight wq = {q, GGML_TYPE_Q8_0, NI, NO};
    const int32_t tq[3] = {4, 1, 4};
    float eq[3 * NI], ref[NI];
    cr_assert_eq(be->ops->embed(be, eq, &wq, tq, 3), 0, "%s", be->err.msg);
    for (int t = 0; t < 3; t++) {
        cr_assert_eq(quant_dequantize_row(GGML_TYPE_Q8_0, q + rb * tq[t], ref, NI, NULL), 0);
        cr_expect_arr_eq(eq + t * NI, ref, sizeof ref, "token %d", t);
    }
    const int32_t oob = NO;
    cr_expect_eq(be->ops->embed(be, eq, &wq, &oob, 1), VERR_RANGE);
    cr_expect(strstr(be->err.msg, "token") != NULL, "%s", be->err.msg);
    free(q);
    backend_destroy(be);
}

// ---------------------------------------------------------------------------
// matmul

Test(cpu, matmul_hand) {
    struct backend *be = mk_backend(1);
    // W = [[1,2,3],[4,5,6]], x0 = [1,0,-1], x1 = [.5,.5,.5], bias [10, 20]:
    // x0: [1-3+10, 4-6+20] = [8, 18]; x1: [3+10, 7.5+20] = [13, 27.5].
    const float W[6] = {1, 2, 3, 4, 5, 6}, x[6] = {1, 0, -1, 0.5f, 0.5f, 0.5f};
    const float bias[2] = {10, 20};
    struct backend_weight w = {W, GGML_TYPE_F32, 3, 2};
    float y[4];
    cr_assert_eq(be->ops->matmul(be, y, &w, x, bias, 2), 0, "%s", be->err.msg);
    const float want[4] = {8, 18, 13, 27.5f};
    cr_expect_arr_eq(y, want, sizeof y);
    cr_assert_eq(be->ops->matmul(be, y, &w, x, NULL, 1), 0);
    cr_expect_eq(y[0], -2.0f);
    cr_expect_eq(y[1], -2.0f);

    // One hand-built Q8_0 block: d = 0.5 (f16 0x3800), q_i = i - 16 for
    // i = 0..31; x = ones: 0.5 * sum(i - 16) = 0.5 * (496 - 512) = -8.
    unsigned char blk[34];
    blk[0] = 0x00;
    blk[1] = 0x38;
    for (int i = 0; i < 32; i++)
        blk[2 + i] = (unsigned char)(int8_t)(i - 16);
    float ones[64];
    for (int i = 0; i < 64; i++)
        ones[i] = 1.0f;
    struct backend_weight wq = {blk, GGML_TYPE_Q8_0, 32, 1};
    cr_assert_eq(be->ops->matmul(be, y, &wq, ones, NULL, 1), 0, "%s", be->err.msg);
    cr_expect_eq(y[0], -8.0f);
    cr_assert_eq(be->ops->matmul(be, y, &wq, ones, NULL, 2), 0, "%s", be->err.msg);
    cr_expect_eq(y[0], -8.0f);
    cr_expect_eq(y[1], -8.0f);

    // Refusals: an unsupported type, n_in not a multiple of the block.
    struct backend_weight bad = {blk, GGML_TYPE_IQ2_XXS, 256, 1};
    cr_expect_eq(be->ops->matmul(be, y, &bad, ones, NULL, 1), VERR_UNSUPPORTED);
    struct backend_weight odd = {blk, GGML_TYPE_Q8_0, 33, 1};
    cr_expect_eq(be->ops->matmul(be, y, &odd, ones, NULL, 1), VERR_RANGE);
    backend_destroy(be);
}

// Random weights quantized with quant_quantize_row, against a naive double
// matmul over quant_dequantize_row's values. The float dot (quant_dot_row:
// 16 running sums over chunks of 256, chunks added in double) carries at
// most ~21 float roundings per term's share, < 2e-6 * sum|w x|; tol
// 1e-5 * (sum|w x| + |bias|). Also: n_tok = 1 and n_tok > 1 take different
// paths (quant_dot_row on the stored row vs a dequantized block); they must
// agree bit for bit, as must 1 and 3 threads.
Test(cpu, matmul_random_vs_naive) {
    const struct {
        enum ggml_type type;
        int n_in;
    } types[] = {
        {GGML_TYPE_F32, 257}, {GGML_TYPE_F16, 33},  {GGML_TYPE_BF16, 3},
        {GGML_TYPE_Q8_0, 96}, {GGML_TYPE_Q4_0, 288}, {GGML_TYPE_Q5_1, 64},
        {GGML_TYPE_Q4_K, 256}, {GGML_TYPE_Q6_K, 512},
    };
    const int n_outs[] = {3, 33, 257};
    const int n_toks[] = {1, 3, 7};
    struct backend *b1 = mk_backend(1), *b3 = mk_backend(3);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const enum ggml_type type = types[ti].type;
        const int n_in = types[ti].n_in;
        double worst = 0;
        for (size_t oi = 0; oi < 3; oi++) {
            const int n_out = n_outs[oi];
            rng_seed(100 + ti * 10 + oi);
            const size_t rb = ggml_row_bytes(type, n_in);
            unsigned char *wq = malloc(rb * n_out);
            float *wd = malloc(sizeof(float) * n_in * n_out);
            for (int o = 0; o < n_out; o++) {
                float row[512];
                for (int i = 0; i < n_in; i++)
                    row[i] = frand();
                cr_assert_eq(quant_quantize_row(type, row, wq + rb * o, n_in, NULL), 0);
                cr_assert_eq(quant_dequantize_row(type, wq + rb * o, wd + (size_t)o * n_in, n_in,
                                                  NULL),
                             0);
            }
            float *bias = frand_array((size_t)n_out, 1);
            struct backend_weight w = {wq, type, n_in, n_out};
            float *single = malloc(sizeof(float) * 7 * n_out);
            for (size_t ki = 0; ki < 3; ki++) {
                const int n_tok = n_toks[ki];
                float *x = frand_array((size_t)n_tok * n_in, 2);
                float *y1 = malloc(sizeof(float) * n_tok * n_out);
                float *y3 = malloc(sizeof(float) * n_tok * n_out);
                const float *bb = ki == 1 ? NULL : bias; // with and without bias
                cr_assert_eq(b1->ops->matmul(b1, y1, &w, x, bb, n_tok), 0, "%s", b1->err.msg);
                cr_assert_eq(b3->ops->matmul(b3, y3, &w, x, bb, n_tok), 0, "%s", b3->err.msg);
                cr_expect_arr_eq(y1, y3, sizeof(float) * n_tok * n_out,
                                 "%s %dx%d n_tok %d: 1 vs 3 threads differ",
                                 ggml_type_name(type), n_out, n_in, n_tok);
                for (int t = 0; t < n_tok; t++) {
                    cr_assert_eq(b3->ops->matmul(b3, single, &w, x + (size_t)t * n_in, bb, 1), 0);
                    cr_expect_arr_eq(single, y1 + (size_t)t * n_out, sizeof(float) * n_out,
                                     "%s %dx%d: token %d of %d differs from it alone",
                                     ggml_type_name(type), n_out, n_in, t, n_tok);
                    for (int o = 0; o < n_out; o++) {
                        double s = bb ? bb[o] : 0, sa = bb ? fabs(bb[o]) : 0;
                        for (int i = 0; i < n_in; i++) {
                            const double p = (double)wd[(size_t)o * n_in + i] * x[t * n_in + i];
                            s += p;
                            sa += fabs(p);
                        }
                        const double e = fabs(y1[t * n_out + o] - s);
                        worst = fmax(worst, e / sa);
                        cr_expect(e <= 1e-5 * sa, "%s %dx%d t%d o%d: %.9g vs %.9g (sum|wx| %g)",
                                  ggml_type_name(type), n_out, n_in, t, o,
                                  (double)y1[t * n_out + o], s, sa);
                    }
                }
                free(x);
                free(y1);
                free(y3);
            }
            free(single);
            free(bias);
            free(wq);
            free(wd);
        }
        cr_log_info("matmul %s vs naive: worst |error| / sum|w x| = %.3g (tol 1e-5)",
                    ggml_type_name(type), worst);
    }
    backend_destroy(b1);
    backend_destroy(b3);
}

// The fused matmuls are their compositions, bit for bit (backend.h), on the
// single-token path and the batched (dequantized block) path, with 1 and 3
// threads; bad shapes are refused.
Test(cpu, matmul_fused_equal_composition) {
    const enum ggml_type types[] = {GGML_TYPE_F32, GGML_TYPE_Q4_0, GGML_TYPE_Q4_K};
    const int n_in = 256, n_ff = 96, n_toks[] = {1, 5};
    struct backend *bes[2] = {mk_backend(1), mk_backend(3)};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const enum ggml_type type = types[ti];
        // down is [n_in][n_ff]; 96 is not a whole K block, so with Q4_K it stays F32
        const enum ggml_type tdn = type == GGML_TYPE_Q4_K ? GGML_TYPE_F32 : type;
        const size_t rb_in = ggml_row_bytes(type, n_in), rb_ff = ggml_row_bytes(tdn, n_ff);
        rng_seed(700 + ti);
        // gate, up: [n_ff][n_in]; down: [n_in][n_ff]
        unsigned char *wg = malloc(rb_in * n_ff), *wu = malloc(rb_in * n_ff);
        unsigned char *wdn = malloc(rb_ff * n_in);
        float row[256];
        for (int o = 0; o < n_ff; o++) {
            for (int i = 0; i < n_in; i++)
                row[i] = frand();
            cr_assert_eq(quant_quantize_row(type, row, wg + rb_in * o, n_in, NULL), 0);
            for (int i = 0; i < n_in; i++)
                row[i] = frand();
            cr_assert_eq(quant_quantize_row(type, row, wu + rb_in * o, n_in, NULL), 0);
        }
        for (int o = 0; o < n_in; o++) {
            for (int i = 0; i < n_ff; i++)
                row[i] = frand();
            cr_assert_eq(quant_quantize_row(tdn, row, wdn + rb_ff * o, n_ff, NULL), 0);
        }
        const struct backend_weight g = {wg, type, n_in, n_ff}, u = {wu, type, n_in, n_ff};
        const struct backend_weight d = {wdn, tdn, n_ff, n_in};
        float *bias = frand_array(n_ff, 1);
        for (int bi = 0; bi < 2; bi++) {
            struct backend *be = bes[bi];
            for (int ki = 0; ki < 2; ki++) {
                const int n_tok = n_toks[ki];
                const size_t nf = (size_t)n_tok * n_ff, ne = (size_t)n_tok * n_in;
                float *x = frand_array(ne, 2), *y = frand_array(ne, 4);
                float *a0 = malloc(nf * 4), *a1 = malloc(nf * 4), *b0 = malloc(nf * 4);
                float *b1 = malloc(nf * 4), *tmp = malloc(nf * 4), *p = malloc(ne * 4);
                float *yf = malloc(ne * 4);
                // matmul_multi: two matrices, the first with a bias
                const struct backend_mm mm[2] = {{a0, &g, bias}, {a1, &u, NULL}};
                cr_assert_eq(be->ops->matmul_multi(be, mm, 2, x, n_tok), 0, "%s", be->err.msg);
                cr_assert_eq(be->ops->matmul(be, b0, &g, x, bias, n_tok), 0);
                cr_assert_eq(be->ops->matmul(be, b1, &u, x, NULL, n_tok), 0);
                cr_expect_arr_eq(a0, b0, nf * 4, "%s n_tok %d: matmul_multi 0",
                                 ggml_type_name(type), n_tok);
                cr_expect_arr_eq(a1, b1, nf * 4, "%s n_tok %d: matmul_multi 1",
                                 ggml_type_name(type), n_tok);
                // matmul_swiglu
                cr_assert_eq(be->ops->matmul_swiglu(be, a0, tmp, &g, &u, x, n_tok), 0, "%s",
                             be->err.msg);
                cr_assert_eq(be->ops->matmul(be, b0, &g, x, NULL, n_tok), 0);
                cr_assert_eq(be->ops->swiglu(be, b0, b0, b1, (int64_t)nf), 0);
                cr_expect_arr_eq(a0, b0, nf * 4, "%s n_tok %d: matmul_swiglu",
                                 ggml_type_name(type), n_tok);
                // matmul_add vs matmul + add, and vs naive y + W a
                memcpy(yf, y, ne * 4);
                cr_assert_eq(be->ops->matmul_add(be, yf, &d, a0, n_tok), 0, "%s", be->err.msg);
                cr_assert_eq(be->ops->matmul(be, p, &d, a0, NULL, n_tok), 0);
                cr_assert_eq(be->ops->add(be, p, y, (int64_t)ne), 0);
                cr_expect_arr_eq(yf, p, ne * 4, "%s n_tok %d: matmul_add", ggml_type_name(type),
                                 n_tok);
                cr_expect_neq(memcmp(yf, y, ne * 4), 0, "matmul_add left y unchanged");
                free(x);
                free(y);
                free(a0);
                free(a1);
                free(b0);
                free(b1);
                free(tmp);
                free(p);
                free(yf);
            }
        }
        struct backend *be = bes[0];
        const struct backend_weight other = {wdn, tdn, n_ff, n_in};
        const struct backend_mm bad[2] = {{row, &g, NULL}, {row, &other, NULL}};
        cr_expect_eq(be->ops->matmul_multi(be, bad, 2, row, 1), VERR_RANGE);
        cr_expect_eq(be->ops->matmul_multi(be, bad, 4, row, 1), VERR_RANGE);
        cr_expect_eq(be->ops->matmul_swiglu(be, row, row, &g, &other, row, 1), VERR_RANGE);
        cr_expect_eq(be->ops->matmul_add(be, row, &d, row, 1), VERR_RANGE);
        free(bias);
        free(wg);
        free(wu);
        free(wdn);
    }
    backend_destroy(bes[0]);
    backend_destroy(bes[1]);
}

// sum_i |w_i x_i| over the dequantized weight row and q8_1 activations: the
// scale of the float summation error of the SIMD q8 kernels.
static double q8_abs_dot(enum ggml_type type, const unsigned char *wrow, const unsigned char *xq,
                         int n) {
    float w[512], xd[512];
    cr_assert(n <= 512);
    cr_assert_eq(quant_dequantize_row(type, wrow, w, n, NULL), 0);
    cr_assert_eq(quant_q8_1_dequantize_row(xq, n, xd, NULL), 0);
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += fabs((double)w[i] * (double)xd[i]);
    return s;
}

// act_q8 (backend.h): a supported type goes through q8_1 activations and
// quant_dot_q8_1's terms (+ bias, accumulate for matmul_add), for every batch
// size (9 tokens: above BACKEND_ACT_Q8_MAX_TOK). Where the SIMD kernels run
// (host/backend/cpu_q8.h) the terms are added in another order: within
// 2 * nb * 2^-24 * sum|w x| of the reference (+ the rounding of the bias
// add); without them bit-identical to quant_dot_q8_1. F32 weights keep f32
// activations.
Test(cpu, matmul_act_q8_rule) {
    const bool fast = cpu_q8_isa() != CPU_Q8_ISA_NONE;
    double worst = 0.0;
    const int n_in = 512, n_out = 37;
    struct backend *be = mk_backend(3);
    be->act_q8 = true;
    rng_seed(901);
    const enum ggml_type types[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q5_1, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K,
                                    GGML_TYPE_F32};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const enum ggml_type type = types[ti];
        const size_t rb = ggml_row_bytes(type, n_in);
        unsigned char *w = malloc(rb * n_out);
        float row[512];
        for (int o = 0; o < n_out; o++) {
            for (int i = 0; i < n_in; i++)
                row[i] = frand();
            cr_assert_eq(quant_quantize_row(type, row, w + rb * o, n_in, NULL), 0);
        }
        const struct backend_weight bw = {w, type, n_in, n_out};
        float *bias = frand_array(n_out, 1);
        const int n_toks[] = {1, 8, 9};
        for (int ki = 0; ki < 3; ki++) {
            const int n_tok = n_toks[ki];
            float *x = frand_array((size_t)n_tok * n_in, 3);
            float *y = malloc(sizeof(float) * n_tok * n_out);
            float *ya = frand_array((size_t)n_tok * n_out, 2),
                  *y0 = malloc(sizeof(float) * n_tok * n_out);
            memcpy(y0, ya, sizeof(float) * n_tok * n_out);
            cr_assert_eq(be->ops->matmul(be, y, &bw, x, bias, n_tok), 0, "%s", be->err.msg);
            cr_assert_eq(be->ops->matmul_add(be, ya, &bw, x, n_tok), 0, "%s", be->err.msg);
            const bool q8 = quant_q8_1_dot_supported(type);
            unsigned char xq[36 * 512 / 32];
            int bad = 0;
            for (int t = 0; t < n_tok; t++) {
                const float *xt = x + (size_t)t * n_in;
                if (q8)
                    cr_assert_eq(quant_q8_1_row(xt, n_in, xq, NULL), 0);
                for (int o = 0; o < n_out; o++) {
                    float d;
                    if (q8)
                        cr_assert_eq(quant_dot_q8_1(type, w + rb * o, xq, n_in, &d, NULL), 0);
                    else
                        d = quant_dot_row(type, w + rb * o, xt, n_in);
                    const size_t i = (size_t)t * n_out + o;
                    if (q8 && fast) {
                        const double sc = 2.0 * (n_in / 32) * ldexp(1.0, -24) *
                                          q8_abs_dot(type, w + rb * o, xq, n_in);
                        const double e1 = fabs((double)y[i] - ((double)d + bias[o])) /
                                          (sc + ldexp(fabs((double)d + bias[o]), -24));
                        const double e2 = fabs((double)ya[i] - ((double)y0[i] + d)) /
                                          (sc + ldexp(fabs((double)y0[i] + d), -24));
                        worst = fmax(worst, fmax(e1, e2));
                        bad += e1 > 1.0 || e2 > 1.0;
                    } else {
                        bad += y[i] != d + bias[o];
                        bad += ya[i] != y0[i] + d;
                    }
                }
            }
            cr_expect_eq(bad, 0, "%s n_tok %d (%s path): %d outputs differ from the rule",
                         ggml_type_name(type), n_tok, q8 ? (fast ? "q8 simd" : "q8_1") : "f32",
                         bad);
            free(x);
            free(y);
            free(ya);
            free(y0);
        }
        free(bias);
        free(w);
    }
    if (fast)
        cr_log_info("act_q8 with the %s kernels: worst %.3f of the summation bound",
                    cpu_q8_isa_name(cpu_q8_isa()), worst);
    backend_destroy(be);
}

// ---------------------------------------------------------------------------
// attention

static void set_seq(uint64_t *cell_seq, int seq_words, int c, int s) {
    cell_seq[(size_t)c * seq_words + s / 64] |= 1ull << (s % 64);
}

// One head, head_dim 2, scale 1. q = [1, 0]; k0 = [0, 0], k1 = [ln 3, 0]:
// scores 0 and ln 3, softmax 1/4 and 3/4; v0 = [1, 0], v1 = [0, 1]:
// out = [0.25, 0.75]. Then the mask, cell by cell.
Test(cpu, attention_hand) {
    struct backend *be = mk_backend(1);
    const float l3 = logf(3.0f);
    float q[2] = {1, 0}, k[6] = {0, 0, l3, 0, 100, 0}, v[6] = {1, 0, 0, 1, 9, 9};
    int32_t cell_pos[3] = {0, 1, 2};
    uint64_t cell_seq[3] = {1, 1, 0}; // cell 2 holds no sequence
    int32_t q_pos = 5, q_seq = 0;
    float out[2];
    struct attn_args a = {
        .out = out, .q = q, .k = k, .v = v, .type_k = GGML_TYPE_F32, .type_v = GGML_TYPE_F32,
        .cell_pos = cell_pos, .cell_seq = cell_seq, .seq_words = 1, .q_pos = &q_pos,
        .q_seq = &q_seq, .n_tok = 1, .n_kv = 3, .n_head = 1, .n_head_kv = 1, .head_dim = 2,
        .head_dim_v = 2, .scale = 1.0f,
    };
    cr_assert_eq(be->ops->attention(be, &a), 0, "%s", be->err.msg);
    cr_expect_float_eq(out[0], 0.25f, 1e-6f);
    cr_expect_float_eq(out[1], 0.75f, 1e-6f);

    // scale 0.5: scores 0 and ln(3)/2 -> weights 1 : sqrt 3.
    a.scale = 0.5f;
    cr_assert_eq(be->ops->attention(be, &a), 0);
    const float s3 = sqrtf(3.0f);
    cr_expect_float_eq(out[0], 1.0f / (1.0f + s3), 1e-6f);
    cr_expect_float_eq(out[1], s3 / (1.0f + s3), 1e-6f);
    a.scale = 1.0f;

    // q_pos 0: cell 1 (pos 1) is in the future -> only v0.
    q_pos = 0;
    cr_assert_eq(be->ops->attention(be, &a), 0);
    cr_expect_float_eq(out[0], 1.0f, 1e-6f);
    cr_expect_float_eq(out[1], 0.0f, 1e-6f);
    // cell 0 empty (pos -1) and q_pos 0: nothing visible -> zeros.
    cell_pos[0] = -1;
    out[0] = out[1] = 42;
    cr_assert_eq(be->ops->attention(be, &a), 0);
    cr_expect_eq(out[0], 0.0f);
    cr_expect_eq(out[1], 0.0f);
    // Another sequence sees none of these cells -> zeros.
    cell_pos[0] = 0;
    q_pos = 5;
    q_seq = 1;
    out[0] = out[1] = 42;
    cr_assert_eq(be->ops->attention(be, &a), 0);
    cr_expect_eq(out[0], 0.0f);
    cr_expect_eq(out[1], 0.0f);
    // Cell 1 joins sequence 1 as well (as seq_cp does): only v1.
    cell_seq[1] |= 2;
    cr_assert_eq(be->ops->attention(be, &a), 0);
    cr_expect_float_eq(out[0], 0.0f, 1e-6f);
    cr_expect_float_eq(out[1], 1.0f, 1e-6f);
    // Sequence out of range of seq_words * 64.
    q_seq = 64;
    cr_expect_eq(be->ops->attention(be, &a), VERR_RANGE);
    backend_destroy(be);
}

// GQA by hand: 4 query heads over 2 KV heads, one cell; a single visible cell
// gets weight 1, so query head h returns V of KV head h / 2.
Test(cpu, attention_gqa_hand) {
    struct backend *be = mk_backend(1);
    float q[4 * 2] = {1, 2, 3, 4, 5, 6, 7, 8};
    float k[2 * 2] = {1, 1, 1, 1};
    float v[2 * 3] = {1, 2, 3, -1, -2, -3}; // KV head 0, KV head 1
    int32_t cell_pos = 0, q_pos = 0, q_seq = 3;
    uint64_t cell_seq = 1u << 3;
    float out[4 * 3];
    struct attn_args a = {
        .out = out, .q = q, .k = k, .v = v, .type_k = GGML_TYPE_F32, .type_v = GGML_TYPE_F32,
        .cell_pos = &cell_pos, .cell_seq = &cell_seq, .seq_words = 1, .q_pos = &q_pos,
        .q_seq = &q_seq, .n_tok = 1, .n_kv = 1, .n_head = 4, .n_head_kv = 2, .head_dim = 2,
        .head_dim_v = 3, .scale = 0.7f,
    };
    cr_assert_eq(be->ops->attention(be, &a), 0, "%s", be->err.msg);
    const float want[12] = {1, 2, 3, 1, 2, 3, -1, -2, -3, -1, -2, -3};
    for (int i = 0; i < 12; i++)
        cr_expect_float_eq(out[i], want[i], 1e-6f, "out[%d] = %g", i, (double)out[i]);
    a.n_head_kv = 3;
    cr_expect_eq(be->ops->attention(be, &a), VERR_RANGE, "4 heads over 3 KV heads");
    backend_destroy(be);
}

// The plain definition in double: visible cells, scores, max-subtracted
// softmax, weighted sum of V; no visible cell -> zeros.
static void naive_attention(double *out, const struct attn_args *a) {
    const int group = a->n_head / a->n_head_kv;
    double *sc = malloc(sizeof(double) * (a->n_kv + 1));
    for (int t = 0; t < a->n_tok; t++)
        for (int h = 0; h < a->n_head; h++) {
            const int hk = h / group;
            const float *q = a->q + ((size_t)t * a->n_head + h) * a->head_dim;
            double *o = out + ((size_t)t * a->n_head + h) * a->head_dim_v;
            double mx = -INFINITY;
            for (int c = 0; c < a->n_kv; c++) {
                const int s = a->q_seq[t];
                const bool vis = a->cell_pos[c] >= 0 && a->cell_pos[c] <= a->q_pos[t] &&
                                 ((a->cell_seq[(size_t)c * a->seq_words + s / 64] >> (s % 64)) & 1);
                sc[c] = NAN;
                if (!vis)
                    continue;
                double d = 0;
                for (int i = 0; i < a->head_dim; i++) {
                    const size_t off = ((size_t)c * a->n_head_kv + hk) * a->head_dim + i;
                    const double kv = a->type_k == GGML_TYPE_F16
                                          ? quant_fp16_to_f32(((const uint16_t *)a->k)[off])
                                          : ((const float *)a->k)[off];
                    d += q[i] * kv;
                }
                sc[c] = d * a->scale;
                mx = fmax(mx, sc[c]);
            }
            double sum = 0;
            for (int i = 0; i < a->head_dim_v; i++)
                o[i] = 0;
            for (int c = 0; c < a->n_kv; c++) {
                if (isnan(sc[c]))
                    continue;
                const double w = exp(sc[c] - mx);
                sum += w;
                for (int i = 0; i < a->head_dim_v; i++) {
                    const size_t off = ((size_t)c * a->n_head_kv + hk) * a->head_dim_v + i;
                    const double vv = a->type_v == GGML_TYPE_F16
                                          ? quant_fp16_to_f32(((const uint16_t *)a->v)[off])
                                          : ((const float *)a->v)[off];
                    o[i] += w * vv;
                }
            }
            if (sum > 0)
                for (int i = 0; i < a->head_dim_v; i++)
                    o[i] /= sum;
        }
    free(sc);
}

// Masked attention against the naive one: 257 cells of three sequences (0, 1
// and 70, so the second bitset word is used), some cells shared by two
// sequences, ~15% empty; GQA 6 heads over 2; head_dim 33, head_dim_v 17;
// queries that see many cells, one, and none. F32 and F16 caches.
// Tolerance: the float score of 33 products (|q k| <= 4) is within ~5 float
// roundings * sum|q k| * scale ≈ 7e-6; that moves softmax weights by the same
// relative amount, and the float sums over <= 257 cells add ~1e-5 relative on
// outputs bounded by max|v| = 1: tol 5e-5 absolute. The naive code reads the
// same F16-decoded values, so F16 needs no more.
Test(cpu, attention_mask_random_vs_naive) {
    enum { NKV = 257, T = 7, H = 6, HKV = 2, D = 33, DV = 17, SW = 2 };
    struct backend *b1 = mk_backend(1), *b3 = mk_backend(3);
    for (int f16 = 0; f16 < 2; f16++) {
        rng_seed(900 + f16);
        const enum ggml_type tk = f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
        float *q = frand_array((size_t)T * H * D, 2.0f);
        float *kf = frand_array((size_t)NKV * HKV * D, 2.0f);
        float *vf = frand_array((size_t)NKV * HKV * DV, 1.0f);
        void *k = kf, *v = vf;
        uint16_t *kh = NULL, *vh = NULL;
        if (f16) {
            kh = malloc(sizeof(uint16_t) * NKV * HKV * D);
            vh = malloc(sizeof(uint16_t) * NKV * HKV * DV);
            for (int i = 0; i < NKV * HKV * D; i++)
                kh[i] = quant_f32_to_fp16(kf[i]);
            for (int i = 0; i < NKV * HKV * DV; i++)
                vh[i] = quant_f32_to_fp16(vf[i]);
            k = kh;
            v = vh;
        }
        int32_t cell_pos[NKV];
        uint64_t cell_seq[NKV * SW];
        memset(cell_seq, 0, sizeof cell_seq);
        const int seqs[3] = {0, 1, 70};
        for (int c = 0; c < NKV; c++) {
            if (irand(0, 99) < 15) {
                cell_pos[c] = -1;
                continue;
            }
            cell_pos[c] = irand(0, 300);
            set_seq(cell_seq, SW, c, seqs[irand(0, 2)]);
            if (irand(0, 9) == 0)
                set_seq(cell_seq, SW, c, seqs[irand(0, 2)]); // shared cell
        }
        // (seq, pos): sees many / many / some / only pos-0 cells of seq 1 /
        // nothing (pos below every cell) / nothing (unused sequence) / many.
        const int32_t q_seq[T] = {0, 1, 70, 1, 0, 5, 70};
        int32_t q_pos[T] = {150, 300, 10, 0, -1, 200, 1000};
        // Make sure query 3 sees exactly the cells of seq 1 at pos 0: plant one.
        cell_pos[11] = 0;
        memset(&cell_seq[11 * SW], 0, sizeof(uint64_t) * SW);
        set_seq(cell_seq, SW, 11, 1);
        float *o1 = malloc(sizeof(float) * T * H * DV), *o3 = malloc(sizeof(float) * T * H * DV);
        double *want = malloc(sizeof(double) * T * H * DV);
        struct attn_args a = {
            .out = o1, .q = q, .k = k, .v = v, .type_k = tk, .type_v = tk,
            .cell_pos = cell_pos, .cell_seq = cell_seq, .seq_words = SW, .q_pos = q_pos,
            .q_seq = q_seq, .n_tok = T, .n_kv = NKV, .n_head = H, .n_head_kv = HKV,
            .head_dim = D, .head_dim_v = DV, .scale = 1.0f / sqrtf((float)D),
        };
        cr_assert_eq(b1->ops->attention(b1, &a), 0, "%s", b1->err.msg);
        a.out = o3;
        cr_assert_eq(b3->ops->attention(b3, &a), 0, "%s", b3->err.msg);
        cr_expect_arr_eq(o1, o3, sizeof(float) * T * H * DV, "f16 %d: 1 vs 3 threads differ",
                         f16);
        naive_attention(want, &a);
        double worst = 0;
        for (int i = 0; i < T * H * DV; i++) {
            const double e = fabs(o1[i] - want[i]);
            worst = fmax(worst, e);
            cr_expect(e <= 5e-5, "%s t%d h%d d%d: %.9g vs %.9g", f16 ? "f16" : "f32",
                      i / (H * DV), (i / DV) % H, i % DV, (double)o1[i], want[i]);
        }
        for (int t = 4; t <= 5; t++)
            for (int i = 0; i < H * DV; i++)
                cr_expect_eq(o1[t * H * DV + i], 0.0f, "query %d sees nothing: zeros", t);
        cr_log_info("attention %s (mask, GQA) vs naive: worst |error| %.3g (tol 5e-5)",
                    f16 ? "f16" : "f32", worst);

        // Stress: scores up to ~1300 (scale 10); the max-subtracted softmax
        // must stay finite and every output a convex mix of V (|out| <= 1).
        a.scale = 10.0f;
        a.out = o1;
        cr_assert_eq(b3->ops->attention(b3, &a), 0);
        for (int i = 0; i < T * H * DV; i++)
            cr_expect(isfinite(o1[i]) && fabsf(o1[i]) <= 1.0f + 1e-5f, "stress out[%d] = %g", i,
                      (double)o1[i]);
        free(q);
        free(kf);
        free(vf);
        free(kh);
        free(vh);
        free(o1);
        free(o3);
        free(want);
    }
    backend_destroy(b1);
    backend_destroy(b3);
}

// ---------------------------------------------------------------------------
// attention with RoPE inside (the unrotated cache) and exact self-extend per
// query token (struct attn_args.q_se)

enum { SE_H = 6, SE_HKV = 2, SE_D = 36, SE_DV = 40, SE_SW = 2, SE_MAXTOK = 64, SE_NKV = 310 };

// A batch over an unrotated cache: sequences 0, 1 and 70 (the second bitset
// word) of 150, 90 and 40 cells at positions 0.., shuffled through the cache
// with 30 empty cells between them; n_tok query tokens of random sequences at
// random positions (a few past the sequence's last cell); random q, K, V
// (F32, or F16 when f16); RoPE on 32 of the 36 dims (normal or NeoX).
struct se_batch {
    float *q, *kf, *vf, *out;
    uint16_t *kh, *vh;
    int32_t cell_pos[SE_NKV], q_pos[SE_MAXTOK], q_seq[SE_MAXTOK], q_se[2 * SE_MAXTOK];
    uint64_t cell_seq[SE_NKV * SE_SW];
    struct rope_params rp;
    struct attn_args a;
};

static void se_batch_make(struct se_batch *b, int n_tok, bool f16, bool neox, uint64_t seed) {
    enum { NKV = SE_NKV };
    memset(b, 0, sizeof *b);
    rng_seed(seed);
    const int seqs[3] = {0, 1, 70}, len[3] = {150, 90, 40};
    b->q = frand_array((size_t)n_tok * SE_H * SE_D, 1.0f);
    b->kf = frand_array((size_t)NKV * SE_HKV * SE_D, 1.0f);
    b->vf = frand_array((size_t)NKV * SE_HKV * SE_DV, 1.0f);
    b->out = malloc(sizeof(float) * n_tok * SE_H * SE_DV);
    int c = 0;
    for (int s = 0; s < 3; s++)
        for (int p = 0; p < len[s]; p++, c++) {
            b->cell_pos[c] = p;
            set_seq(b->cell_seq, SE_SW, c, seqs[s]);
        }
    for (; c < NKV; c++)
        b->cell_pos[c] = -1;
    for (int i = NKV - 1; i > 0; i--) { // shuffle the cells
        const int k = irand(0, i);
        const int32_t p = b->cell_pos[i];
        b->cell_pos[i] = b->cell_pos[k];
        b->cell_pos[k] = p;
        for (int w = 0; w < SE_SW; w++) {
            const uint64_t x = b->cell_seq[i * SE_SW + w];
            b->cell_seq[i * SE_SW + w] = b->cell_seq[k * SE_SW + w];
            b->cell_seq[k * SE_SW + w] = x;
        }
    }
    for (int t = 0; t < n_tok; t++) {
        const int s = irand(0, 2);
        b->q_seq[t] = seqs[s];
        b->q_pos[t] = irand(0, len[s] + 4);
    }
    const void *k = b->kf, *v = b->vf;
    if (f16) {
        b->kh = malloc(sizeof(uint16_t) * NKV * SE_HKV * SE_D);
        b->vh = malloc(sizeof(uint16_t) * NKV * SE_HKV * SE_DV);
        for (int i = 0; i < NKV * SE_HKV * SE_D; i++)
            b->kh[i] = quant_f32_to_fp16(b->kf[i]);
        for (int i = 0; i < NKV * SE_HKV * SE_DV; i++)
            b->vh[i] = quant_f32_to_fp16(b->vf[i]);
        k = b->kh;
        v = b->vh;
    }
    b->rp = (struct rope_params){
        .mode = neox ? ROPE_MODE_NEOX : ROPE_MODE_NORMAL,
        .n_rot = 32,
        .n_ctx_orig = 64,
        .freq_base = 10000.0f,
        .freq_scale = 1.0f,
        .attn_factor = 1.0f,
        .beta_fast = 32.0f,
        .beta_slow = 1.0f,
    };
    const enum ggml_type ty = f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
    b->a = (struct attn_args){
        .out = b->out,
        .q = b->q,
        .k = k,
        .v = v,
        .type_k = ty,
        .type_v = ty,
        .cell_pos = b->cell_pos,
        .cell_seq = b->cell_seq,
        .seq_words = SE_SW,
        .q_pos = b->q_pos,
        .q_seq = b->q_seq,
        .n_tok = n_tok,
        .n_kv = NKV,
        .n_head = SE_H,
        .n_head_kv = SE_HKV,
        .head_dim = SE_D,
        .head_dim_v = SE_DV,
        .scale = 1.0f / sqrtf((float)SE_D),
        .rope = &b->rp,
        .se_g = 1,
        .se_w = 1,
    };
}

static void se_batch_free(struct se_batch *b) {
    free(b->q);
    free(b->kf);
    free(b->vf);
    free(b->out);
    free(b->kh);
    free(b->vh);
}

// One attention call into out; plain: with cpu_attention_pin_plain(true),
// which the backend reads on its first attention call (so a backend is plain
// or not for its whole life, whichever way it is called later).
static void se_call(struct backend *be, bool plain, const struct attn_args *a0, float *out) {
    struct attn_args a = *a0;
    a.out = out;
    if (plain)
        cpu_attention_pin_plain(true);
    const int rc = be->ops->attention(be, &a);
    cpu_attention_pin_plain(false);
    cr_assert_eq(rc, 0, "%s", be->err.msg);
}

// Per-token (G, W) choices of the mixed calls, as q_se holds them, and what
// they read as (G < 1 -> 1, W < 1 -> 1). Set 0: G = 1 (also written as 0 and
// -2), and G = 4, 3, 2 with W = 16, 100 (above the lengths of sequences 1 and
// 70) and -3 (-> 1). Set 1: G = 1 .. 9, nine values, more distinct G than
// the far copies held at once (rounds).
struct se_choice {
    int g, w;   // in q_se
    int rg, rw; // as read
};
static const struct se_choice se_set0[] = {
    {1, 0, 1, 1}, {4, 16, 4, 16}, {3, 100, 3, 100}, {0, 7, 1, 7}, {2, -3, 2, 1}, {-2, 5, 1, 5},
};
static const struct se_choice se_set1[] = {
    {1, 1, 1, 1},   {2, 9, 2, 9},   {3, 13, 3, 13}, {4, 17, 4, 17}, {5, 21, 5, 21},
    {6, 25, 6, 25}, {7, 29, 7, 29}, {8, 33, 8, 33}, {9, 37, 9, 37},
};

// Mixed calls (every token its own (G, W) from a set, on 3 threads) against
// scalar ones (q_se NULL, se_g / se_w = one choice's values, on 1 thread) over
// the same batch: each token's rows are the scalar call's bit for bit; and
// the AVX2 kernels' bits are the plain ones'. F32 and F16 caches, normal and
// NeoX RoPE on 32 or 20 of the 36 dims, 1 to 64 tokens.
Test(cpu, attention_selfextend_per_token_equals_scalar) {
    struct backend *b1 = mk_backend(1), *b3 = mk_backend(3);
    struct backend *p1 = mk_backend(1), *p3 = mk_backend(3); // plain kernels
    const int ntoks[] = {1, 2, 7, 33, 64};
    const size_t row = (size_t)SE_H * SE_DV;
    float *mix = malloc(sizeof(float) * SE_MAXTOK * row),
          *ref = malloc(sizeof *ref * SE_MAXTOK * row);
    float *one = malloc(sizeof(float) * SE_MAXTOK * row);
    int n_far_rows = 0;
    for (int set = 0; set < 2; set++)
        for (int f16 = 0; f16 < 2; f16++)
            for (int ni = 0; ni < 5; ni++) {
                const struct se_choice *ch = set ? se_set1 : se_set0;
                const int n_ch = set ? 9 : 6, n = ntoks[ni];
                struct se_batch b;
                se_batch_make(&b, n, f16, (ni + set) % 2, 1000 + 100 * set + 10 * f16 + ni);
                b.rp.n_rot = set ? 20 : 32; // 10 pairs: the AVX2 rotation's plain tail
                int pick[SE_MAXTOK];
                for (int t = 0; t < n; t++) {
                    pick[t] = irand(0, n_ch - 1);
                    b.q_se[2 * t] = ch[pick[t]].g;
                    b.q_se[2 * t + 1] = ch[pick[t]].w;
                    n_far_rows += ch[pick[t]].rg > 1 && b.q_pos[t] >= ch[pick[t]].rw;
                }
                b.a.q_se = b.q_se;
                b.a.se_g = 5; // q_se replaces the scalars
                b.a.se_w = 3;
                se_call(b3, false, &b.a, mix);
                se_call(p3, true, &b.a, ref);
                cr_expect_arr_eq(mix, ref, sizeof(float) * n * row,
                                 "set %d f16 %d n_tok %d: AVX2 and plain differ", set, f16, n);
                struct attn_args s = b.a;
                s.q_se = NULL;
                for (int k = 0; k < n_ch; k++) {
                    s.se_g = ch[k].rg;
                    s.se_w = ch[k].rw;
                    for (int plain = 0; plain < 2; plain++) {
                        se_call(plain ? p1 : b1, plain, &s, one);
                        for (int t = 0; t < n; t++)
                            if (pick[t] == k)
                                cr_expect_arr_eq(mix + t * row, one + t * row, sizeof(float) * row,
                                                 "set %d f16 %d n_tok %d plain %d: token %d (G %d, "
                                                 "W %d, pos %d) differs from its scalar call",
                                                 set, f16, n, plain, t, ch[k].g, ch[k].w,
                                                 b.q_pos[t]);
                    }
                }
                se_batch_free(&b);
            }
    cr_log_info("self-extend per token: %d token rows with far keys compared", n_far_rows);
    cr_expect_gt(n_far_rows, 100, "the batches exercise far keys");
    free(mix);
    free(ref);
    free(one);
    backend_destroy(b1);
    backend_destroy(b3);
    backend_destroy(p1);
    backend_destroy(p3);
}

// q_se with every token at the scalars' (G, W) is the scalar call bit for
// bit (G = 4 and 3 with W below and above the sequences' lengths, and G = 1),
// also when the scalars say otherwise (q_se wins).
Test(cpu, attention_selfextend_uniform_q_se_equals_scalar) {
    struct backend *be = mk_backend(3);
    const int gw[4][2] = {{4, 16}, {3, 100}, {1, 1}, {2, 1}};
    const size_t row = (size_t)SE_H * SE_DV;
    float *want = malloc(sizeof(float) * SE_MAXTOK * row);
    for (int f16 = 0; f16 < 2; f16++)
        for (int k = 0; k < 4; k++) {
            struct se_batch b;
            se_batch_make(&b, 33, f16, k % 2, 2000 + 10 * f16 + k);
            b.a.se_g = gw[k][0];
            b.a.se_w = gw[k][1];
            se_call(be, false, &b.a, want);
            for (int t = 0; t < 33; t++) {
                b.q_se[2 * t] = gw[k][0];
                b.q_se[2 * t + 1] = gw[k][1];
            }
            b.a.q_se = b.q_se;
            b.a.se_g = gw[k][0] == 1 ? 4 : 1;
            b.a.se_w = 8;
            se_call(be, false, &b.a, b.out);
            cr_expect_arr_eq(b.out, want, sizeof(float) * 33 * row,
                             "f16 %d, G %d W %d: q_se differs from the scalars", f16, gw[k][0],
                             gw[k][1]);
            se_batch_free(&b);
        }
    free(want);
    backend_destroy(be);
}

// ---------------------------------------------------------------------------
// the decode path (calls of a few tokens: host/backend/cpu_attention.c, K and
// V read from the cache a tile at a time, the cells split into chunks
// between threads) against the item path (a batch of many tokens) over the
// same cells: a token's rows must be the same bits either way

enum { DP_NKV = 1700, DP_T = 24, DP_SW = 2, DP_MAXH = 9, DP_MAXD = 64 };

struct dp_case {
    int h, hkv, d, dv;  // heads, KV heads, head_dim, head_dim_v
    bool f16, shuffled; // F16 cache; cells shuffled (else runs in position order)
    int mode;           // 0: rotated cache, 1: with a window, 2: RoPE inside + q_se, 3: both
    float q[DP_T * DP_MAXH * DP_MAXD], *kf, *vf;
    uint16_t *kh, *vh;
    int32_t cell_pos[DP_NKV], q_pos[DP_T], q_seq[DP_T], q_se[2 * DP_T];
    uint64_t cell_seq[DP_NKV * DP_SW];
    struct rope_params rp;
    struct attn_args a;
};

// Sequences 0, 1 and 70 of 800, 500 and 250 cells at positions 0.., with 150
// empty cells: in runs (sequence 0, 50 empty, sequence 1, ...) or shuffled
// (holes in every range; some cells shared by two sequences). Tokens at
// random positions of random sequences (a few past the last cell), one of an
// unused sequence and one at position -1 (they see nothing).
static void dp_cells(struct dp_case *k) {
    const int seqs[3] = {0, 1, 70}, len[3] = {800, 500, 250};
    int c = 0;
    memset(k->cell_seq, 0, sizeof k->cell_seq);
    for (int s = 0; s < 3; s++) {
        for (int p = 0; p < len[s]; p++, c++) {
            k->cell_pos[c] = p;
            set_seq(k->cell_seq, DP_SW, c, seqs[s]);
        }
        for (int e = 0; e < 50; e++, c++)
            k->cell_pos[c] = -1;
    }
    for (int i = DP_NKV - 1; k->shuffled && i > 0; i--) {
        const int j = irand(0, i);
        const int32_t p = k->cell_pos[i];
        k->cell_pos[i] = k->cell_pos[j];
        k->cell_pos[j] = p;
        for (int w = 0; w < DP_SW; w++) {
            const uint64_t x = k->cell_seq[i * DP_SW + w];
            k->cell_seq[i * DP_SW + w] = k->cell_seq[j * DP_SW + w];
            k->cell_seq[j * DP_SW + w] = x;
        }
    }
    for (int i = 0; k->shuffled && i < 40; i++) { // shared cells
        const int j = irand(0, DP_NKV - 1);
        if (k->cell_pos[j] >= 0)
            set_seq(k->cell_seq, DP_SW, j, seqs[irand(0, 2)]);
    }
    for (int t = 0; t < DP_T; t++) {
        const int s = irand(0, 2);
        k->q_seq[t] = seqs[s];
        k->q_pos[t] = irand(0, len[s] + 4);
        const struct se_choice *ch = &se_set0[irand(0, 5)];
        k->q_se[2 * t] = ch->g;
        k->q_se[2 * t + 1] = ch->w;
    }
    k->q_seq[5] = 9;   // no cell holds it
    k->q_pos[11] = -1; // below every cell
}

static void dp_make(struct dp_case *k, uint64_t seed) {
    rng_seed(seed);
    const size_t nk = (size_t)DP_NKV * k->hkv * k->d, nv = (size_t)DP_NKV * k->hkv * k->dv;
    for (int i = 0; i < DP_T * k->h * k->d; i++)
        k->q[i] = frand();
    k->kf = frand_array(nk, 1.0f);
    k->vf = frand_array(nv, 1.0f);
    k->kh = malloc(nk * sizeof(uint16_t));
    k->vh = malloc(nv * sizeof(uint16_t));
    for (size_t i = 0; i < nk; i++)
        k->kh[i] = quant_f32_to_fp16(k->kf[i]);
    for (size_t i = 0; i < nv; i++)
        k->vh[i] = quant_f32_to_fp16(k->vf[i]);
    dp_cells(k);
    k->rp = (struct rope_params){.mode = ROPE_MODE_NEOX,
                                 .n_rot = 32,
                                 .n_ctx_orig = 64,
                                 .freq_base = 10000.0f,
                                 .freq_scale = 1.0f,
                                 .attn_factor = 1.0f,
                                 .beta_fast = 32.0f,
                                 .beta_slow = 1.0f};
    const enum ggml_type ty = k->f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
    k->a = (struct attn_args){
        .q = k->q,
        .k = k->f16 ? (const void *)k->kh : k->kf,
        .v = k->f16 ? (const void *)k->vh : k->vf,
        .type_k = ty,
        .type_v = ty,
        .cell_pos = k->cell_pos,
        .cell_seq = k->cell_seq,
        .seq_words = DP_SW,
        .q_pos = k->q_pos,
        .q_seq = k->q_seq,
        .n_tok = DP_T,
        .n_kv = DP_NKV,
        .window = k->mode % 2 ? 300 : 0,
        .n_head = k->h,
        .n_head_kv = k->hkv,
        .head_dim = k->d,
        .head_dim_v = k->dv,
        .scale = 1.0f / sqrtf((float)k->d),
        .rope = k->mode >= 2 ? &k->rp : NULL,
        .se_g = 1,
        .se_w = 1,
        .q_se = k->mode >= 2 ? k->q_se : NULL,
    };
}

// Tokens [t0, t0 + n) of k's batch as a call of their own into out.
static void dp_call(struct backend *be, bool plain, const struct dp_case *k, int t0, int n,
                    float *out) {
    struct attn_args s = k->a;
    s.q = k->q + (size_t)t0 * k->h * k->d;
    s.q_pos = k->q_pos + t0;
    s.q_seq = k->q_seq + t0;
    s.q_se = s.q_se ? k->q_se + 2 * t0 : NULL;
    s.n_tok = n;
    se_call(be, plain, &s, out);
}

// Every token alone (1 thread, AVX2 and plain) and in threes (3 threads):
// its rows are those of the batch of 24 (the item path) bit for bit; on the
// rotated cache without a window also within 1e-4 of the naive float64
// attention. Two shapes (6 heads over 2 of 36 / 40 dims, SmolLM2's 9 over 3
// of 64), F32 and F16 caches, cells in runs and shuffled, 4 chunks of cells.
Test(cpu, attention_decode_path_equals_batch) {
    struct backend *b1 = mk_backend(1), *b3 = mk_backend(3), *p1 = mk_backend(1);
    const int shapes[2][4] = {{6, 2, 36, 40}, {9, 3, 64, 64}};
    float *all = malloc(sizeof(float) * DP_T * DP_MAXH * DP_MAXD);
    float *one = malloc(sizeof(float) * 3 * DP_MAXH * DP_MAXD);
    double *want = malloc(sizeof(double) * DP_T * DP_MAXH * DP_MAXD);
    struct dp_case *k = calloc(1, sizeof *k);
    int n_cases = 0;
    for (int sh = 0; sh < 2; sh++)
        for (int cfg = 0; cfg < 16; cfg++) {
            *k = (struct dp_case){.h = shapes[sh][0],
                                  .hkv = shapes[sh][1],
                                  .d = shapes[sh][2],
                                  .dv = shapes[sh][3],
                                  .f16 = cfg & 1,
                                  .shuffled = (cfg >> 1) & 1,
                                  .mode = cfg >> 2};
            dp_make(k, 3000 + 16 * sh + cfg);
            const size_t row = (size_t)k->h * k->dv;
            dp_call(b3, false, k, 0, DP_T, all);
            if (k->mode == 0)
                naive_attention(want, &k->a);
            for (int t = 0; t < DP_T; t++)
                for (int plain = 0; plain < 2; plain++) {
                    dp_call(plain ? p1 : b1, plain, k, t, 1, one);
                    cr_expect_arr_eq(one, all + t * row, sizeof(float) * row,
                                     "shape %d cfg %d plain %d: token %d (pos %d) alone differs "
                                     "from the batch",
                                     sh, cfg, plain, t, k->q_pos[t]);
                    for (int i = 0; k->mode == 0 && i < (int)row; i++)
                        cr_expect(fabs(one[i] - want[t * row + i]) <= 1e-4,
                                  "shape %d cfg %d: token %d [%d] %.9g vs naive %.9g", sh, cfg, t,
                                  i, (double)one[i], want[t * row + i]);
                }
            for (int t = 0; t < DP_T; t += 3) {
                dp_call(b3, false, k, t, 3, one);
                cr_expect_arr_eq(one, all + t * row, sizeof(float) * 3 * row,
                                 "shape %d cfg %d: tokens %d..%d differ from the batch", sh, cfg, t,
                                 t + 2);
            }
            for (int i = 0; i < (int)row; i++)
                cr_expect(all[5 * row + i] == 0.0f && all[11 * row + i] == 0.0f,
                          "rows that see nothing are zeros");
            free(k->kf);
            free(k->vf);
            free(k->kh);
            free(k->vh);
            n_cases++;
        }
    cr_log_info("decode path vs batch: %d cases x %d tokens", n_cases, DP_T);
    free(k);
    free(all);
    free(one);
    free(want);
    backend_destroy(b1);
    backend_destroy(b3);
    backend_destroy(p1);
}

// Moves every cell of k (position, sequences, K and V rows in both types)
// from c to perm[c].
static void dp_permute(struct dp_case *k, const int *perm) {
    const size_t kr = (size_t)k->hkv * k->d, vr = (size_t)k->hkv * k->dv;
    int32_t *pos = malloc(sizeof(int32_t) * DP_NKV);
    uint64_t *seq = malloc(sizeof(uint64_t) * DP_NKV * DP_SW);
    float *kf = malloc(sizeof(float) * DP_NKV * kr), *vf = malloc(sizeof(float) * DP_NKV * vr);
    uint16_t *kh = malloc(2 * DP_NKV * kr), *vh = malloc(2 * DP_NKV * vr);
    for (int c = 0; c < DP_NKV; c++) {
        const size_t to = (size_t)perm[c];
        pos[to] = k->cell_pos[c];
        memcpy(seq + to * DP_SW, k->cell_seq + (size_t)c * DP_SW, sizeof(uint64_t) * DP_SW);
        memcpy(kf + to * kr, k->kf + c * kr, sizeof(float) * kr);
        memcpy(vf + to * vr, k->vf + c * vr, sizeof(float) * vr);
        memcpy(kh + to * kr, k->kh + c * kr, 2 * kr);
        memcpy(vh + to * vr, k->vh + c * vr, 2 * vr);
    }
    memcpy(k->cell_pos, pos, sizeof(int32_t) * DP_NKV);
    memcpy(k->cell_seq, seq, sizeof(uint64_t) * DP_NKV * DP_SW);
    memcpy(k->kf, kf, sizeof(float) * DP_NKV * kr);
    memcpy(k->vf, vf, sizeof(float) * DP_NKV * vr);
    memcpy(k->kh, kh, 2 * DP_NKV * kr);
    memcpy(k->vh, vh, 2 * DP_NKV * vr);
    free(pos);
    free(seq);
    free(kf);
    free(vf);
    free(kh);
    free(vh);
}

// Floats of got that differ from want (bits), and the worst |difference|.
static int dp_diff(const float *got, const float *want, size_t n, double *worst) {
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float))) {
            bad++;
            *worst = fmax(*worst, fabs((double)got[i] - want[i]));
        }
    return bad;
}

// Where a sequence's cells sit in the cache does not change its rows (a
// request alone has them in position order; beside others, kv_find_slot may
// put later tokens below earlier ones). Reference: the cases of
// attention_decode_path_equals_batch with each sequence's cells in position
// order, as a batch of 24 on 3 threads. The same cache with every cell moved
// (a rotation by 700 cells: sequence 0's tail wraps below its head; and a
// random shuffle): the batch, and each token alone (the decode path) with the
// AVX2 and the plain kernels, give the reference's bits. Also with positions
// 400 apart (mode 0), which a counting sort cannot span (the heapsort).
Test(cpu, attention_rows_do_not_depend_on_where_cells_sit) {
    struct backend *b1 = mk_backend(1), *b3 = mk_backend(3), *p1 = mk_backend(1);
    const int shapes[2][4] = {{6, 2, 36, 40}, {9, 3, 64, 64}};
    float *ref = malloc(sizeof(float) * DP_T * DP_MAXH * DP_MAXD);
    float *got = malloc(sizeof(float) * DP_T * DP_MAXH * DP_MAXD);
    int *perm = malloc(sizeof(int) * DP_NKV);
    struct dp_case *k = calloc(1, sizeof *k);
    int bad = 0, n_cases = 0;
    double worst = 0;
    for (int sh = 0; sh < 2; sh++)
        for (int cfg = 0; cfg < 20; cfg++) {
            const int mode = cfg < 16 ? (cfg >> 2) & 3 : 0, spread = cfg >= 16;
            *k = (struct dp_case){.h = shapes[sh][0],
                                  .hkv = shapes[sh][1],
                                  .d = shapes[sh][2],
                                  .dv = shapes[sh][3],
                                  .f16 = cfg & 1,
                                  .mode = mode};
            dp_make(k, 5000 + 20 * sh + cfg);
            for (int i = 0; spread && i < DP_NKV; i++)
                k->cell_pos[i] = k->cell_pos[i] < 0 ? -1 : 400 * k->cell_pos[i];
            for (int t = 0; spread && t < DP_T; t++)
                k->q_pos[t] = k->q_pos[t] < 0 ? -1 : 400 * k->q_pos[t] + 399;
            const size_t row = (size_t)k->h * k->dv;
            dp_call(b3, false, k, 0, DP_T, ref);
            for (int c = 0; c < DP_NKV; c++)
                perm[c] = (c + 700) % DP_NKV;
            for (int i = DP_NKV - 1; (cfg >> 1) & 1 && i > 0; i--) { // a shuffle
                const int j = irand(0, i), x = perm[i];
                perm[i] = perm[j];
                perm[j] = x;
            }
            dp_permute(k, perm);
            int b = 0;
            dp_call(b3, false, k, 0, DP_T, got);
            b += dp_diff(got, ref, DP_T * row, &worst);
            for (int t = 0; t < DP_T; t++)
                for (int plain = 0; plain < 2; plain++) {
                    dp_call(plain ? p1 : b1, plain, k, t, 1, got);
                    b += dp_diff(got, ref + t * row, row, &worst);
                }
            cr_expect_eq(b, 0, "shape %d cfg %d (mode %d, %s, %s): %d floats differ from the "
                         "cache in position order",
                         sh, cfg, mode, k->f16 ? "f16" : "f32",
                         (cfg >> 1) & 1 ? "shuffled" : "rotated", b);
            bad += b;
            free(k->kf);
            free(k->vf);
            free(k->kh);
            free(k->vh);
            n_cases++;
        }
    cr_log_info("cells moved: %d cases x %d tokens, %d floats differ (worst |difference| %g)",
                n_cases, DP_T, bad, worst);
    free(k);
    free(ref);
    free(got);
    free(perm);
    backend_destroy(b1);
    backend_destroy(b3);
    backend_destroy(p1);
}

// ---------------------------------------------------------------------------
// hadamard

// H[i][j] = (-1)^popcount(i & j) / sqrt(block), the matrix the op's contract names.
static double hadamard_entry(int i, int j, int block) {
    return (__builtin_popcount((unsigned)(i & j)) & 1 ? -1.0 : 1.0) / sqrt((double)block);
}

// The op against the float64 matrix product over random rows, for every
// block size from 2 to BACKEND_HADAMARD_MAX (one block a row and several),
// and its own inverse. Tolerance: each output is a sum of `block` terms
// |x| / sqrt(block) computed in log2(block) float additions and one
// multiplication, so its error is within (log2(block) + 2) * 2^-24 *
// sum|x| / sqrt(block) (summed in the test over the block's inputs).
Test(cpu, hadamard_is_the_matrix) {
    struct backend *be = mk_backend(2);
    enum { N_MAX = 2 * BACKEND_HADAMARD_MAX, ROWS = 5 };
    static float x[ROWS][N_MAX], y[ROWS][N_MAX];
    rng_seed(77);
    double worst = 0;
    for (int block = 2; block <= BACKEND_HADAMARD_MAX; block *= 2)
        for (int per = 1; per <= 2; per++) {
            const int n = block * per;
            for (int r = 0; r < ROWS; r++)
                for (int i = 0; i < n; i++)
                    x[r][i] = (&y[0][0])[(size_t)r * n + i] = 4.0f * frand(); // y: rows n apart
            cr_assert_eq(be->ops->hadamard(be, &y[0][0], ROWS, n, block), 0, "%s", be->err.msg);
            for (int r = 0; r < ROWS; r++)
                for (int b0 = 0; b0 < n; b0 += block) {
                    double abs_sum = 0;
                    for (int j = 0; j < block; j++)
                        abs_sum += fabs(x[r][b0 + j]);
                    const double tol = (log2(block) + 2) * 0x1p-24 * abs_sum / sqrt(block);
                    for (int i = 0; i < block; i++) {
                        double want = 0;
                        for (int j = 0; j < block; j++)
                            want += hadamard_entry(i, j, block) * x[r][b0 + j];
                        const float got = (&y[0][0])[(size_t)r * n + b0 + i];
                        const double e = fabs(got - want);
                        worst = fmax(worst, e / tol);
                        cr_assert_leq(e, tol, "block %d, n %d, row %d, value %d: %.9g, want %.9g",
                                      block, n, r, b0 + i, got, want);
                    }
                }
            // H H = I: the op applied twice gives x back. The first pass's
            // error e (each |e| <= t1 = (log2(block) + 2) 2^-24 4 sqrt(block),
            // |x| <= 4) comes through H as at most sqrt(block) t1 per value,
            // and the second pass adds its own t1.
            cr_assert_eq(be->ops->hadamard(be, &y[0][0], ROWS, n, block), 0);
            const double t1 = (log2(block) + 2) * 0x1p-24 * 4.0 * sqrt(block);
            for (int r = 0; r < ROWS; r++)
                for (int i = 0; i < n; i++)
                    cr_assert_leq(fabs((&y[0][0])[(size_t)r * n + i] - x[r][i]),
                                  (sqrt(block) + 1) * t1, "block %d: H H x != x at %d", block, i);
        }
    cr_log_info("hadamard: worst |op - float64 H x| / tolerance %.3g", worst);
    float z[8] = {0};
    const int bad[][2] = {{8, 3}, {8, 1}, {8, 16}, {12, 6}, {2048, 2048}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect_eq(be->ops->hadamard(be, z, 1, bad[i][0], bad[i][1]), VERR_RANGE,
                     "n %d, block %d refused", bad[i][0], bad[i][1]);
    cr_expect(strstr(be->err.msg, "power of two"), "%s", be->err.msg);
    backend_destroy(be);
}
