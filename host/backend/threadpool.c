#include "host/backend/threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// One job at a time: the caller publishes (fn, ctx, n, chunk), then bumps
// `generation` (release); every thread claims chunks from the atomic `next`
// until the range is exhausted; each worker decrements `active` when done.
//
// Waiting spins first, then sleeps: a decode step is hundreds of short jobs
// (tens of microseconds each), and a futex wake-up per job costs about as
// much as the job. So a worker polls `generation` for up to spin_ns after
// its last job before it sleeps on `start_cv`, and the caller polls `active`
// for as long before it sleeps on `done_cv`. Between requests (an idle
// server) the workers sleep and use no CPU. VELA_SPIN_US sets the budget
// (0: always sleep at once, the old behaviour).
struct threadpool {
    int size;           // threads that run work, caller included
    pthread_t *threads; // [size - 1] workers
    int n_started;      // workers actually running (for cleanup)
    int64_t spin_ns;    // how long a waiting thread polls before it sleeps

    pthread_mutex_t mu; // guards the sleeping side: start_cv, done_cv, quit
    pthread_cond_t start_cv;
    pthread_cond_t done_cv;
    _Atomic uint64_t generation; // bumped once per job
    _Atomic int active;          // workers still inside the current job
    _Atomic int quit;

    threadpool_fn fn;
    void *ctx;
    int64_t n;
    int64_t chunk;
    _Atomic int64_t next; // first unclaimed index
};

static int64_t pool_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// One poll interval: a few pause instructions, and every 16th time a
// sched_yield, so that a thread this one waits for (or any other) gets the
// core when the machine has more runnable threads than cores; without it a
// spinning caller can hold the core its worker needs for the whole budget.
static inline void pool_cpu_relax(unsigned i) {
    if ((i & 15) == 0) {
        sched_yield();
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

// Polls until *flag != value or spin_ns pass; true when it changed.
static bool pool_spin_u64(const _Atomic uint64_t *flag, uint64_t value, int64_t spin_ns) {
    if (spin_ns <= 0)
        return atomic_load_explicit(flag, memory_order_acquire) != value;
    const int64_t until = pool_now_ns() + spin_ns;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(flag, memory_order_acquire) != value)
            return true;
        pool_cpu_relax(i);
        if ((i & 63) == 0 && pool_now_ns() > until)
            return false;
    }
}

static bool pool_spin_zero(const _Atomic int *flag, int64_t spin_ns) {
    const int64_t until = spin_ns > 0 ? pool_now_ns() + spin_ns : 0;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(flag, memory_order_acquire) == 0)
            return true;
        if (spin_ns <= 0)
            return false;
        pool_cpu_relax(i);
        if ((i & 63) == 0 && pool_now_ns() > until)
            return false;
    }
}

struct worker_arg {
    struct threadpool *tp;
    int thread;
};

static void pool_run_chunks(struct threadpool *tp, int thread) {
    for (;;) {
        int64_t begin = atomic_fetch_add_explicit(&tp->next, tp->chunk, memory_order_relaxed);
        if (begin >= tp->n)
            break;
        int64_t end = begin + tp->chunk < tp->n ? begin + tp->chunk : tp->n;
        tp->fn(tp->ctx, begin, end, thread);
    }
}

static void *pool_worker_main(void *p) {
    struct worker_arg arg = *(struct worker_arg *)p;
    free(p);
    struct threadpool *tp = arg.tp;
    uint64_t seen = 0;
    for (;;) {
        if (!pool_spin_u64(&tp->generation, seen, tp->spin_ns)) {
            pthread_mutex_lock(&tp->mu);
            while (atomic_load(&tp->generation) == seen && !atomic_load(&tp->quit))
                pthread_cond_wait(&tp->start_cv, &tp->mu);
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load(&tp->quit))
            break;
        seen = atomic_load_explicit(&tp->generation, memory_order_acquire);

        pool_run_chunks(tp, arg.thread);

        if (atomic_fetch_sub_explicit(&tp->active, 1, memory_order_acq_rel) == 1) {
            // The last one out wakes a caller that stopped spinning (under
            // the mutex, so the wake cannot fall between its check and wait).
            pthread_mutex_lock(&tp->mu);
            pthread_cond_signal(&tp->done_cv);
            pthread_mutex_unlock(&tp->mu);
        }
    }
    return NULL;
}

static int pool_online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        return 1;
    return n > 1024 ? 1024 : (int)n;
}

int threadpool_create(struct threadpool **out, int n_threads, struct verr *err) {
    *out = NULL;
    if (n_threads <= 0)
        n_threads = pool_online_cpus();
    if (n_threads > 4096)
        return verr_set(err, VERR_RANGE, "threadpool: %d threads requested, at most 4096",
                        n_threads);
    struct threadpool *tp = calloc(1, sizeof *tp);
    if (!tp)
        return verr_set(err, VERR_NOMEM, "threadpool: out of memory");
    tp->size = n_threads;
    tp->spin_ns = 200 * 1000; // 200 us
    const char *spin = getenv("VELA_SPIN_US");
    if (spin && *spin) {
        char *end;
        const long us = strtol(spin, &end, 10);
        if (*end == '\0' && us >= 0 && us <= 1000000)
            tp->spin_ns = (int64_t)us * 1000;
    }
    atomic_init(&tp->next, 0);
    atomic_init(&tp->generation, 0);
    atomic_init(&tp->active, 0);
    atomic_init(&tp->quit, 0);
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->start_cv, NULL);
    pthread_cond_init(&tp->done_cv, NULL);
    if (n_threads > 1) {
        tp->threads = calloc((size_t)n_threads - 1, sizeof *tp->threads);
        if (!tp->threads) {
            threadpool_free(tp);
            return verr_set(err, VERR_NOMEM, "threadpool: out of memory");
        }
        for (int i = 1; i < n_threads; i++) {
            struct worker_arg *arg = malloc(sizeof *arg);
            if (!arg) {
                threadpool_free(tp);
                return verr_set(err, VERR_NOMEM, "threadpool: out of memory");
            }
            arg->tp = tp;
            arg->thread = i;
            int rc = pthread_create(&tp->threads[i - 1], NULL, pool_worker_main, arg);
            if (rc != 0) {
                free(arg);
                threadpool_free(tp);
                return verr_set(err, rc == EAGAIN ? VERR_NOMEM : VERR_BACKEND,
                                "threadpool: pthread_create failed for thread %d of %d: %s", i,
                                n_threads, strerror(rc));
            }
            tp->n_started++;
        }
    }
    *out = tp;
    return VERR_OK;
}

void threadpool_free(struct threadpool *tp) {
    if (!tp)
        return;
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->quit, 1);
    atomic_fetch_add(&tp->generation, 1); // ends the spinning of every worker
    pthread_cond_broadcast(&tp->start_cv);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 0; i < tp->n_started; i++)
        pthread_join(tp->threads[i], NULL);
    pthread_cond_destroy(&tp->done_cv);
    pthread_cond_destroy(&tp->start_cv);
    pthread_mutex_destroy(&tp->mu);
    free(tp->threads);
    free(tp);
}

int threadpool_size(const struct threadpool *tp) {
    return tp ? tp->size : 1;
}

void threadpool_parallel_for(struct threadpool *tp, int64_t n, int64_t grain, threadpool_fn fn,
                             void *ctx) {
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    if (!tp || tp->size == 1 || n < 2 * grain) {
        fn(ctx, 0, n, 0);
        return;
    }
    // About four chunks per thread balances uneven chunks (masked attention
    // rows, skipped KV cells) without paying for many atomic claims.
    int64_t chunk = (n + (int64_t)tp->size * 4 - 1) / ((int64_t)tp->size * 4);
    if (chunk < grain)
        chunk = grain;

    tp->fn = fn;
    tp->ctx = ctx;
    tp->n = n;
    tp->chunk = chunk;
    atomic_store_explicit(&tp->next, 0, memory_order_relaxed);
    atomic_store_explicit(&tp->active, tp->size - 1, memory_order_relaxed);
    // Publishing: the job's fields above happen before this release; a
    // spinning worker's acquire load of generation sees them. A sleeping
    // one is woken under the mutex (it checks generation under it).
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add_explicit(&tp->generation, 1, memory_order_release);
    pthread_cond_broadcast(&tp->start_cv);
    pthread_mutex_unlock(&tp->mu);

    pool_run_chunks(tp, 0);

    if (!pool_spin_zero(&tp->active, tp->spin_ns)) {
        pthread_mutex_lock(&tp->mu);
        while (atomic_load_explicit(&tp->active, memory_order_acquire) > 0)
            pthread_cond_wait(&tp->done_cv, &tp->mu);
        pthread_mutex_unlock(&tp->mu);
    }
}
