// threadpool: a small persistent pool of pthreads with one operation, a
// parallel-for over an index range. The CPU backend creates one pool and runs
// its heavy ops (matmul, attention, rope, kv_shift, ...) through it.
//
// Contract:
// - threadpool_parallel_for runs fn on disjoint chunks [begin, end) that
//   together cover [0, n) exactly once, and returns when all chunks are done.
//   The calling thread takes part as thread 0; workers are 1..size-1, so
//   `thread` may index per-thread scratch of `threadpool_size` entries.
// - Which thread runs which chunk is not fixed; fn must make each index's
//   result independent of that (then results are identical for any n_threads).
// - One parallel_for at a time per pool: no nesting, no concurrent callers.
// - On a busy machine the caller may run a job's chunks alone (threadpool.c,
//   "Solo spells"): the same chunks, all with thread 0.
// - VELA_POOL_CHAOS=seed (tests) delays workers and starts solo spells at
//   random (threadpool.c, "Chaos"), so that a test on an idle machine sees
//   the schedules of a busy one.
#ifndef VELA_HOST_THREADPOOL_H
#define VELA_HOST_THREADPOOL_H

#include <stdint.h>

#include "gguf/verr.h"

struct threadpool;

typedef void (*threadpool_fn)(void *ctx, int64_t begin, int64_t end, int thread);

// n_threads <= 0: threadpool_default_threads(). n_threads == 1 starts no
// thread.
int threadpool_create(struct threadpool **out, int n_threads, struct verr *err);
void threadpool_free(struct threadpool *tp);
// The physical cores this thread may run on (its affinity mask; SMT
// siblings count once), at least 1.
int threadpool_default_threads(void);
// Threads that run work, the caller included (>= 1).
int threadpool_size(const struct threadpool *tp);

// Runs fn over [0, n) in chunks of at least `grain` indices (grain <= 0: 1).
// Work of fewer than 2 * grain indices runs on the calling thread only.
void threadpool_parallel_for(struct threadpool *tp, int64_t n, int64_t grain, threadpool_fn fn,
                             void *ctx);

#endif
