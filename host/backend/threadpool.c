#include "host/backend/threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// One job at a time: the caller publishes (fn, ctx, n, chunk) under `mu`,
// bumps `generation` and wakes the workers; every thread claims chunks from
// the atomic `next` until the range is exhausted; the last worker to finish
// signals `done_cv`. Workers sleep on `start_cv` between jobs.
struct threadpool {
    int size;                 // threads that run work, caller included
    pthread_t *threads;       // [size - 1] workers
    int n_started;            // workers actually running (for cleanup)

    pthread_mutex_t mu;
    pthread_cond_t start_cv;
    pthread_cond_t done_cv;
    uint64_t generation;      // bumped once per job
    int active;               // workers still inside the current job
    int quit;

    threadpool_fn fn;
    void *ctx;
    int64_t n;
    int64_t chunk;
    _Atomic int64_t next;     // first unclaimed index
};

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
    pthread_mutex_lock(&tp->mu);
    for (;;) {
        while (tp->generation == seen && !tp->quit)
            pthread_cond_wait(&tp->start_cv, &tp->mu);
        if (tp->quit)
            break;
        seen = tp->generation;
        pthread_mutex_unlock(&tp->mu);

        pool_run_chunks(tp, arg.thread);

        pthread_mutex_lock(&tp->mu);
        if (--tp->active == 0)
            pthread_cond_signal(&tp->done_cv);
    }
    pthread_mutex_unlock(&tp->mu);
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
    atomic_init(&tp->next, 0);
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
    tp->quit = 1;
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

    pthread_mutex_lock(&tp->mu);
    tp->fn = fn;
    tp->ctx = ctx;
    tp->n = n;
    tp->chunk = chunk;
    atomic_store_explicit(&tp->next, 0, memory_order_relaxed);
    tp->active = tp->size - 1;
    tp->generation++;
    pthread_cond_broadcast(&tp->start_cv);
    pthread_mutex_unlock(&tp->mu);

    pool_run_chunks(tp, 0);

    pthread_mutex_lock(&tp->mu);
    while (tp->active > 0)
        pthread_cond_wait(&tp->done_cv, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
}
