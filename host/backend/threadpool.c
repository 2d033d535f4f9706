#define _GNU_SOURCE // sched_getaffinity, CPU_COUNT
#include "host/backend/threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// One job at a time. The caller publishes (fn, ctx, n, chunk), then a new
// `ticket`: the job's generation (bits 32..63), its number of chunks (16..31)
// and the next unclaimed chunk (0..15, starting at 0). Every thread claims
// chunks by compare-and-swap on the ticket, and only while the ticket's own
// generation and chunk count say one is left (so a thread that wakes late can
// never take a chunk of a later job), and counts each chunk it finishes in
// `n_done`. The job is complete when n_done reaches n_chunks, not when every
// worker has checked in.
//
// That is what keeps a busy machine usable. When other processes take cores,
// a worker may sleep in the scheduler for a whole time slice (milliseconds);
// a decode step is hundreds of jobs, and a pool that waits for every worker at
// every job then runs at the pace of the preempted one: SmolLM2 at 2 threads
// beside two busy loops at nice 5 fell from about 200 to 3 tokens/s. Here
// the caller and whichever workers are running take all the chunks; a late
// worker finds none and goes back to waiting. Only a chunk already claimed by
// a preempted worker is waited for (about a quarter of a thread's share).
//
// Why a late worker cannot run a stale job's fields: it reads them after its
// acquire load of a ticket of generation g, which the caller stored (release)
// after writing g's fields; and it runs a chunk only if its compare-and-swap
// (acq_rel) still finds generation g with a chunk left, which orders its
// reads before the last claim of g, before the caller sees g complete, before
// the caller writes the next job's fields. The "chunk left" test must use the
// count inside the ticket: a count read from the fields may already be the
// next job's (tests/test_ops_cpu.c caught exactly that: a late worker ran a
// chunk twice when the next job had more chunks).
//
// Solo spells. Still, a worker the scheduler puts aside while it holds a
// chunk makes the caller wait for a time slice (milliseconds, where a job
// takes microseconds); on a machine with more runnable threads than cores
// that happens again and again, and 2 threads ran at half the speed of 1.
// A stall is a wait for the others of more than POOL_STALL_NS and more than
// 4 times what the caller's own share took (uneven chunks cost at most about
// one chunk, a quarter of a share). Two stalls within POOL_STALL_PAIR_NS and
// the caller runs the jobs of the next solo_ns alone, then tries the workers
// again. One stall is not enough: an idle virtual machine stalls too, about
// once a second (a 1-3 ms wait at SmolLM2's 40 us jobs), and a spell for
// each cost 4% of idle decode speed; an overloaded one stalls every few
// milliseconds. VELA_POOL_SOLO_MS sets the spell (0: never solo).
//
// Chaos (VELA_POOL_CHAOS=seed, for tests): the pool is made to run as on a
// busy machine, reproducibly in kind if not in timing. A worker sleeps
// before a quarter of the chunks it claims (30 us to 2 ms, as a preempted
// thread holding its chunk), the caller holds back in a quarter of the jobs
// until a worker has claimed a chunk (at most 200 us: else it would take
// every chunk of a short job before a worker wakes), and one job in 64
// starts a solo spell of up to 1 ms (a decode step's jobs take tens of
// microseconds: some in spells, most not). Which thread runs which chunk, and whether a
// job runs alone, then change from run to run; results must not.
//
// Waiting spins first, then sleeps: a decode step is hundreds of short jobs
// (tens of microseconds each), and a futex wake-up per job costs about as
// much as the job. So a worker polls `ticket` for up to spin_ns after its
// last job before it sleeps on `start_cv`, and the caller polls `n_done` for
// as long before it sleeps on `done_cv`. Between requests (an idle server)
// the workers sleep and use no CPU. VELA_SPIN_US sets the budget (0: always
// sleep at once).
struct threadpool {
    int size;           // threads that run work, caller included
    pthread_t *threads; // [size - 1] workers
    int n_started;      // workers actually running (for cleanup)
    int64_t spin_ns;    // how long a waiting thread polls before it sleeps
    int64_t solo_ns;    // how long the caller works alone after a stall
    int64_t solo_until; // caller only: pool_now_ns() before which it works alone
    int64_t last_stall; // caller only: when its last stall ended

    pthread_mutex_t mu; // guards the sleeping side: start_cv, done_cv, quit
    pthread_cond_t start_cv;
    pthread_cond_t done_cv;
    _Atomic uint64_t ticket;  // generation << 32 | n_chunks << 16 | next unclaimed chunk
    _Atomic uint32_t n_done;  // chunks of the current job finished
    _Atomic int quit;

    // The job, written by the caller before it publishes the ticket (atomic
    // only because a late worker may read them while the next job is being
    // written; it then discards what it read, see above).
    _Atomic(threadpool_fn) fn;
    _Atomic(void *) ctx;
    _Atomic int64_t n, chunk;

    uint64_t chaos_seed;          // VELA_POOL_CHAOS; 0: off
    _Atomic uint64_t chaos_draws; // draws taken (each thread's are distinct)
};

#define POOL_MAX_CHUNKS 0xffffu     // the ticket's chunk fields are 16 bits
#define POOL_STALL_NS 1000000       // a wait for others this long may be a preempted worker
#define POOL_STALL_PAIR_NS 25000000 // two stalls this close: the machine is overloaded

// The ticket's fields (see above).
static uint64_t ticket_make(uint32_t gen, uint32_t n_chunks) {
    return (uint64_t)gen << 32 | (uint64_t)n_chunks << 16;
}
static uint32_t ticket_gen(uint64_t t) {
    return (uint32_t)(t >> 32);
}
static uint32_t ticket_n_chunks(uint64_t t) {
    return (uint32_t)(t >> 16) & POOL_MAX_CHUNKS;
}
static uint32_t ticket_next(uint64_t t) {
    return (uint32_t)t & POOL_MAX_CHUNKS;
}

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

// A uniform draw in [0, n) of the chaos sequence (splitmix64 of a counter:
// any thread may draw).
static uint64_t pool_chaos_draw(struct threadpool *tp, uint64_t n) {
    uint64_t z = tp->chaos_seed +
                 0x9e3779b97f4a7c15ull *
                     (atomic_fetch_add_explicit(&tp->chaos_draws, 1, memory_order_relaxed) + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (z ^ (z >> 31)) % n;
}

static void pool_sleep_ns(int64_t ns) {
    struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
    nanosleep(&ts, NULL);
}

// Chaos: the caller waits (at most 200 us) until a worker has claimed a
// chunk of job gen.
static void pool_chaos_hold(struct threadpool *tp, uint32_t gen) {
    const int64_t until = pool_now_ns() + 200000;
    for (unsigned i = 1; pool_now_ns() < until; i++) {
        const uint64_t t = atomic_load_explicit(&tp->ticket, memory_order_relaxed);
        if (ticket_gen(t) != gen || ticket_next(t) > 0)
            return;
        pool_cpu_relax(i);
    }
}

// What a waiting thread polls for: a worker, a job after generation v (the
// ticket's acquire load makes the job's fields visible); the caller, all v
// chunks of its job done.
static bool pool_new_job(struct threadpool *tp, uint32_t v) {
    return ticket_gen(atomic_load_explicit(&tp->ticket, memory_order_acquire)) != v;
}
static bool pool_job_done(struct threadpool *tp, uint32_t v) {
    return atomic_load_explicit(&tp->n_done, memory_order_acquire) == v;
}

// Polls ready(tp, v) for up to spin_ns; true once it holds.
static bool pool_spin(struct threadpool *tp, bool (*ready)(struct threadpool *, uint32_t),
                      uint32_t v) {
    const int64_t until = tp->spin_ns > 0 ? pool_now_ns() + tp->spin_ns : 0;
    for (unsigned i = 1;; i++) {
        if (ready(tp, v))
            return true;
        if (tp->spin_ns <= 0)
            return false;
        pool_cpu_relax(i);
        if ((i & 63) == 0 && pool_now_ns() > until)
            return false;
    }
}

// Claims and runs chunks of job `gen` until none is left (or a later job has
// replaced it). The job's fields are read by the caller of the job (thread 0)
// as it wrote them, by a worker after its acquire load of the ticket.
static void pool_run_chunks(struct threadpool *tp, uint32_t gen, int thread) {
    const threadpool_fn fn = atomic_load_explicit(&tp->fn, memory_order_relaxed);
    void *ctx = atomic_load_explicit(&tp->ctx, memory_order_relaxed);
    const int64_t n = atomic_load_explicit(&tp->n, memory_order_relaxed);
    const int64_t chunk = atomic_load_explicit(&tp->chunk, memory_order_relaxed);
    uint64_t t = atomic_load_explicit(&tp->ticket, memory_order_relaxed);
    for (;;) {
        if (ticket_gen(t) != gen || ticket_next(t) >= ticket_n_chunks(t))
            return;
        if (!atomic_compare_exchange_weak_explicit(&tp->ticket, &t, t + 1, memory_order_acq_rel,
                                                   memory_order_relaxed))
            continue; // t now holds the current ticket
        // t is the ticket this thread claimed from: job gen's.
        const uint32_t n_chunks = ticket_n_chunks(t);
        if (tp->chaos_seed && thread != 0 && pool_chaos_draw(tp, 4) == 0)
            pool_sleep_ns(30000 + (int64_t)pool_chaos_draw(tp, 1970000));
        const int64_t begin = (int64_t)ticket_next(t) * chunk;
        fn(ctx, begin, begin + chunk < n ? begin + chunk : n, thread);
        t++;
        if (atomic_fetch_add_explicit(&tp->n_done, 1, memory_order_acq_rel) + 1 == n_chunks &&
            thread != 0) {
            // The last chunk done wakes a caller that stopped spinning (under
            // the mutex, so the wake cannot fall between its check and wait).
            pthread_mutex_lock(&tp->mu);
            pthread_cond_signal(&tp->done_cv);
            pthread_mutex_unlock(&tp->mu);
        }
    }
}

struct worker_arg {
    struct threadpool *tp;
    int thread;
};

static void *pool_worker_main(void *p) {
    struct worker_arg arg = *(struct worker_arg *)p;
    free(p);
    struct threadpool *tp = arg.tp;
    uint32_t seen = 0;
    for (;;) {
        if (!pool_spin(tp, pool_new_job, seen)) {
            pthread_mutex_lock(&tp->mu);
            while (ticket_gen(atomic_load(&tp->ticket)) == seen && !atomic_load(&tp->quit))
                pthread_cond_wait(&tp->start_cv, &tp->mu);
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load(&tp->quit))
            break;
        seen = ticket_gen(atomic_load_explicit(&tp->ticket, memory_order_acquire));
        pool_run_chunks(tp, seen, arg.thread);
    }
    return NULL;
}

static int pool_online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        return 1;
    return n > 1024 ? 1024 : (int)n;
}

// An integer from a one-line sysfs file, or -1.
static int pool_read_int(const char *path) {
    FILE *f = fopen(path, "r");
    int v = -1;
    if (f) {
        if (fscanf(f, "%d", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

// The default thread count, as llama.cpp's: one thread per physical core
// this process may run on. The affinity mask counts (taskset, a container's
// cpuset: online CPUs outside it would only add threads that take turns on
// the same cores), and SMT siblings share a core's load units, so a second
// thread per core slows decode down. Falls back to the allowed CPUs, then
// the online ones, where topology or affinity cannot be read.
int threadpool_default_threads(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) < 1)
        return pool_online_cpus();
    // Distinct (package, core) pairs among the allowed CPUs.
    int pkg_of[CPU_SETSIZE], core_of[CPU_SETSIZE]; // 8 KiB
    int n_cores = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &set))
            continue;
        char path[96];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/physical_package_id",
                 cpu);
        const int pkg = pool_read_int(path);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
        const int core = pool_read_int(path);
        if (pkg < 0 || core < 0)
            return CPU_COUNT(&set);
        bool seen = false;
        for (int i = 0; i < n_cores && !seen; i++)
            seen = pkg_of[i] == pkg && core_of[i] == core;
        if (!seen) {
            pkg_of[n_cores] = pkg;
            core_of[n_cores] = core;
            n_cores++;
        }
    }
    return n_cores > 0 ? n_cores : CPU_COUNT(&set);
}

// A whole number in [0, 1000000] from the environment, else def.
static int64_t pool_env_int(const char *name, int64_t def) {
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    char *end;
    const long x = strtol(v, &end, 10);
    return *end == '\0' && x >= 0 && x <= 1000000 ? x : def;
}

int threadpool_create(struct threadpool **out, int n_threads, struct verr *err) {
    *out = NULL;
    if (n_threads <= 0)
        n_threads = threadpool_default_threads();
    if (n_threads > 4096)
        return verr_set(err, VERR_RANGE, "threadpool: %d threads requested, at most 4096",
                        n_threads);
    struct threadpool *tp = calloc(1, sizeof *tp);
    if (!tp)
        return verr_set(err, VERR_NOMEM, "threadpool: out of memory");
    tp->size = n_threads;
    tp->spin_ns = pool_env_int("VELA_SPIN_US", 200) * 1000;
    tp->solo_ns = pool_env_int("VELA_POOL_SOLO_MS", 100) * 1000 * 1000;
    tp->chaos_seed = (uint64_t)pool_env_int("VELA_POOL_CHAOS", 0);
    atomic_init(&tp->chaos_draws, 0);
    atomic_init(&tp->ticket, 0);
    atomic_init(&tp->n_done, 0);
    atomic_init(&tp->quit, 0);
    atomic_init(&tp->fn, NULL);
    atomic_init(&tp->ctx, NULL);
    atomic_init(&tp->n, 0);
    atomic_init(&tp->chunk, 1);
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
    atomic_fetch_add(&tp->ticket, (uint64_t)1 << 32); // ends the spinning of every worker
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

    const uint32_t n_chunks = (uint32_t)((n + chunk - 1) / chunk); // <= 4 * size
    _Static_assert(4 * 4096 <= POOL_MAX_CHUNKS, "n_chunks <= 4 * size must fit the ticket");
    if (tp->chaos_seed && pool_chaos_draw(tp, 64) == 0)
        tp->solo_until = pool_now_ns() + (int64_t)pool_chaos_draw(tp, 1000000);
    const int64_t t0 = pool_now_ns();
    if (t0 < tp->solo_until) {
        // The same chunks as a parallel run, so results cannot differ.
        for (int64_t b = 0; b < n; b += chunk)
            fn(ctx, b, b + chunk < n ? b + chunk : n, 0);
        return;
    }
    atomic_store_explicit(&tp->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&tp->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&tp->n, n, memory_order_relaxed);
    atomic_store_explicit(&tp->chunk, chunk, memory_order_relaxed);
    atomic_store_explicit(&tp->n_done, 0, memory_order_relaxed);
    // Publishing: the job's fields above happen before this release; a
    // spinning worker's acquire load of the ticket sees them. A sleeping one
    // is woken under the mutex (it checks the ticket under it).
    const uint32_t gen = ticket_gen(atomic_load_explicit(&tp->ticket, memory_order_relaxed)) + 1;
    pthread_mutex_lock(&tp->mu);
    atomic_store_explicit(&tp->ticket, ticket_make(gen, n_chunks), memory_order_release);
    pthread_cond_broadcast(&tp->start_cv);
    pthread_mutex_unlock(&tp->mu);

    if (tp->chaos_seed && pool_chaos_draw(tp, 4) == 0)
        pool_chaos_hold(tp, gen);
    pool_run_chunks(tp, gen, 0);
    const int64_t t1 = pool_now_ns();

    if (!pool_spin(tp, pool_job_done, n_chunks)) {
        pthread_mutex_lock(&tp->mu);
        while (atomic_load_explicit(&tp->n_done, memory_order_acquire) < n_chunks)
            pthread_cond_wait(&tp->done_cv, &tp->mu);
        pthread_mutex_unlock(&tp->mu);
    }
    const int64_t t2 = pool_now_ns();
    if (tp->solo_ns > 0 && t2 - t1 > POOL_STALL_NS && t2 - t1 > 4 * (t1 - t0)) {
        if (tp->last_stall > 0 && t2 - tp->last_stall < POOL_STALL_PAIR_NS)
            tp->solo_until = t2 + tp->solo_ns;
        tp->last_stall = t2;
    }
}
