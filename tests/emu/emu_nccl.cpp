// vela CUDA emulator (tests/emu): NCCL's point-to-point API in one process
// (include/nccl.h), over the emulated devices.
//
// Semantics kept from NCCL: a communicator is one rank on one device; sends
// and receives between two ranks match in the order they were posted, per
// (sender, receiver) pair; a matched pair must agree on count and datatype
// (else ncclInvalidUsage, as NCCL's "message truncated"); the stream must
// belong to the communicator's device and the buffer must lie inside one
// allocation of that device (else ncclInvalidArgument); ncclCommInitAll
// refuses a device listed twice ("Duplicate GPU detected"), so does
// ncclCommInitRank when two ranks of one id sit on one device.
//
// Ordering. The emulated streams run their work when it is enqueued, so a
// transfer happens when its group is complete: ncclGroupEnd (or the call
// itself outside a group) posts every operation of the group, then matches
// posted sends with posted receives. A send's bytes are read when it is
// posted: everything enqueued on its stream before has run. A receive's
// bytes are written when it is matched, before ncclGroupEnd returns, so work
// enqueued on its stream afterwards sees them; within a group a receive may
// precede its send. ncclGroupEnd returns once every operation of the group
// has been matched: a peer posted by another host thread completes it; an
// operation still unmatched after VELA_EMU_NCCL_TIMEOUT_MS (default 2000)
// fails with ncclInvalidUsage and a message (NCCL would hang there, e.g. one
// thread posting a receive in a group of its own before the send). Blocking
// the host until the peer posts is stricter than NCCL, whose ncclGroupEnd
// returns and lets the GPU wait.
//
// Not emulated: collectives, communicators across processes (mpirun:
// ncclCommInitRank only joins ranks of this process), stream capture of
// NCCL calls (ncclInvalidUsage), non-blocking communicators, ncclConfig.
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "emu_internal.h"
#include "nccl.h"

namespace {

struct op_state {
    bool done = false;
    ncclResult_t r = ncclSuccess;
};

struct clique;

struct pending {
    bool send;
    int rank, peer;
    void *buf;
    size_t count;
    ncclDataType_t type;
    std::vector<char> data; // a send's bytes, read when posted
    std::shared_ptr<op_state> st;
};

struct clique {
    std::string id;
    int nranks;
    std::vector<ncclComm *> ranks; // [nranks], NULL until joined
    int live = 0;
    // (sender, receiver) -> operations in posting order
    std::map<std::pair<int, int>, std::deque<pending>> sends, recvs;
};

struct call {
    bool send;
    ncclComm *comm;
    int peer;
    void *buf;
    size_t count;
    ncclDataType_t type;
};

std::mutex g_mu;
std::condition_variable g_cv;
std::map<std::string, clique *> g_cliques;
std::set<const ncclComm *> g_live;
char g_last[1024];
uint64_t g_id_counter;
unsigned long long g_delivered;

thread_local int t_depth;
thread_local std::vector<call> t_calls;
thread_local ncclResult_t t_group_err = ncclSuccess;

} // namespace

struct ncclComm {
    clique *cq;
    int rank;
    int device;
};

namespace {

size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

const char *type_name(ncclDataType_t t) {
    static const char *names[] = {"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32",
                                  "ncclInt64", "ncclUint64", "ncclFloat16", "ncclFloat32",
                                  "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3",
                                  "ncclFloat8e5m2"};
    return (int)t >= 0 && t < ncclNumTypes ? names[t] : "invalid datatype";
}

// Records the details of an error (ncclGetLastError) and prints them, as
// NCCL_DEBUG=WARN would. Caller holds g_mu.
ncclResult_t fail_locked(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t fail_locked(ncclResult_t r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last, sizeof g_last, fmt, ap);
    va_end(ap);
    fprintf(stderr, "vela-emu: NCCL WARN %s\n", g_last);
    return r;
}

#define FAIL(...) fail_locked(__VA_ARGS__)

int timeout_ms(void) {
    const char *e = getenv("VELA_EMU_NCCL_TIMEOUT_MS");
    return e && *e ? atoi(e) : 2000;
}

// Matches posted sends with posted receives, in order per (sender,
// receiver); copies the bytes of each matched pair. Caller holds g_mu.
void match_locked(clique *cq) {
    for (auto &kv : cq->sends) {
        auto &sq = kv.second;
        auto rit = cq->recvs.find(kv.first);
        if (rit == cq->recvs.end())
            continue;
        auto &rq = rit->second;
        while (!sq.empty() && !rq.empty()) {
            pending s = std::move(sq.front());
            pending r = std::move(rq.front());
            sq.pop_front();
            rq.pop_front();
            ncclResult_t res = ncclSuccess;
            if (s.count != r.count || s.type != r.type) {
                res = FAIL(ncclInvalidUsage,
                           "ncclSend rank %d -> %d of %zu x %s matched with ncclRecv of %zu x %s "
                           "(count and datatype must match; NCCL: message truncated)",
                           s.rank, s.peer, s.count, type_name(s.type), r.count,
                           type_name(r.type));
            } else if (!emu_faulted() && !s.data.empty()) {
                memcpy(r.buf, s.data.data(), s.data.size());
                emu_mark_written(r.buf, s.data.size()); // initialised for initcheck
                g_delivered += s.data.size();
            }
            s.st->r = r.st->r = res;
            s.st->done = r.st->done = true;
        }
    }
    g_cv.notify_all();
}

// Drops the unmatched operation whose state is st. Caller holds g_mu.
void unpost_locked(clique *cq, const std::shared_ptr<op_state> &st) {
    for (auto *qs : {&cq->sends, &cq->recvs})
        for (auto &kv : *qs)
            for (auto it = kv.second.begin(); it != kv.second.end(); ++it)
                if (it->st == st) {
                    kv.second.erase(it);
                    return;
                }
}

ncclResult_t check_call(const call &c, const char *what) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (!c.comm || !g_live.count(c.comm))
        return FAIL(ncclInvalidArgument, "%s: invalid or destroyed communicator %p", what,
                    (void *)c.comm);
    const ncclComm *cm = c.comm;
    if (type_size(c.type) == 0)
        return FAIL(ncclInvalidArgument, "%s: invalid datatype %d", what, (int)c.type);
    if (c.peer < 0 || c.peer >= cm->cq->nranks)
        return FAIL(ncclInvalidArgument, "%s: peer %d outside [0, %d)", what, c.peer,
                    cm->cq->nranks);
    return ncclSuccess;
}

ncclResult_t check_buffers(const call &c, cudaStream_t stream, const char *what) {
    const ncclComm *cm = c.comm;
    const int sd = emu_stream_device(stream);
    std::lock_guard<std::mutex> lk(g_mu);
    if (sd != cm->device)
        return FAIL(ncclInvalidArgument, "%s (rank %d, device %d): the stream belongs to device "
                    "%d", what, cm->rank, cm->device, sd);
    if (emu_stream_capturing(stream))
        return FAIL(ncclInvalidUsage, "%s (rank %d): the stream is being captured; NCCL calls in "
                    "CUDA graphs are not emulated", what, cm->rank);
    const size_t bytes = c.count * type_size(c.type);
    if (bytes == 0)
        return ncclSuccess;
    if (emu_ptr_device(c.buf, bytes) != cm->device) {
        const int owner = emu_ptr_owner(c.buf);
        if (owner >= 0 && owner != cm->device)
            return FAIL(ncclInvalidArgument, "%s (rank %d, device %d): buffer %p is memory of "
                        "device %d", what, cm->rank, cm->device, c.buf, owner);
        return FAIL(ncclInvalidArgument, "%s (rank %d, device %d): %zu bytes at %p do not lie "
                    "inside one device allocation", what, cm->rank, cm->device, bytes, c.buf);
    }
    return ncclSuccess;
}

// Posts the calls of a complete group, matches, and waits for each of them.
ncclResult_t run_group(std::vector<call> &calls) {
    std::unique_lock<std::mutex> lk(g_mu);
    std::vector<std::pair<clique *, std::shared_ptr<op_state>>> mine;
    std::set<clique *> touched;
    for (const call &c : calls)
        if (!g_live.count(c.comm))
            return FAIL(ncclInvalidArgument, "ncclGroupEnd: communicator %p destroyed inside the "
                        "group", (void *)c.comm);
    for (const call &c : calls) {
        pending p;
        p.send = c.send;
        p.rank = c.comm->rank;
        p.peer = c.peer;
        p.buf = c.buf;
        p.count = c.count;
        p.type = c.type;
        p.st = std::make_shared<op_state>();
        const size_t bytes = c.count * type_size(c.type);
        if (c.send && bytes) {
            emu_check_written(c.buf, bytes, "ncclSend");
            p.data.assign((const char *)c.buf, (const char *)c.buf + bytes);
        }
        clique *cq = c.comm->cq;
        mine.emplace_back(cq, p.st);
        touched.insert(cq);
        if (c.send)
            cq->sends[{p.rank, p.peer}].push_back(std::move(p));
        else
            cq->recvs[{p.peer, p.rank}].push_back(std::move(p));
    }
    for (clique *cq : touched)
        match_locked(cq);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms());
    ncclResult_t res = ncclSuccess;
    for (size_t i = 0; i < mine.size(); i++) {
        auto &st = mine[i].second;
        g_cv.wait_until(lk, deadline, [&] { return st->done; });
        if (!st->done) {
            const call &c = calls[i];
            unpost_locked(mine[i].first, st);
            st->done = true;
            st->r = FAIL(ncclInvalidUsage,
                         "%s of %zu x %s, rank %d %s rank %d: no matching %s after %d ms (NCCL "
                         "would hang here: post both halves in one group, or from the peer's "
                         "thread)", c.send ? "ncclSend" : "ncclRecv", c.count, type_name(c.type),
                         c.comm->rank, c.send ? "->" : "<-", c.peer,
                         c.send ? "ncclRecv" : "ncclSend", timeout_ms());
        }
        if (res == ncclSuccess)
            res = st->r;
    }
    return res;
}

ncclResult_t enqueue_call(const call &c, cudaStream_t stream, const char *what) {
    ncclResult_t r = check_call(c, what);
    if (r == ncclSuccess)
        r = check_buffers(c, stream, what);
    if (r != ncclSuccess) {
        if (t_depth > 0 && t_group_err == ncclSuccess)
            t_group_err = r; // the group fails as a whole, as in NCCL
        return r;
    }
    if (t_depth > 0) {
        t_calls.push_back(c);
        return ncclSuccess;
    }
    std::vector<call> one{c};
    return run_group(one);
}

} // namespace

extern "C" const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

extern "C" unsigned long long emu_nccl_bytes_delivered(void) {
    std::lock_guard<std::mutex> lk(g_mu);
    return g_delivered;
}

extern "C" const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return g_last;
}

extern "C" ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id)
        return ncclInvalidArgument;
    std::lock_guard<std::mutex> lk(g_mu);
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "vela-emu-nccl pid %ld id %llu",
             (long)getpid(), (unsigned long long)++g_id_counter);
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    if (!comm)
        return ncclInvalidArgument;
    *comm = NULL;
    const int dev = emu_current_device();
    std::lock_guard<std::mutex> lk(g_mu);
    if (emu_devices() < 1)
        return FAIL(ncclUnhandledCudaError, "ncclCommInitRank: no CUDA device");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return FAIL(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d", rank, nranks);
    const std::string key(id.internal, sizeof id.internal);
    if (strncmp(id.internal, "vela-emu-nccl", 13) != 0)
        return FAIL(ncclInvalidArgument, "ncclCommInitRank: not a unique id from ncclGetUniqueId "
                    "of this process (the emulator joins ranks of one process only)");
    clique *&cq = g_cliques[key];
    if (!cq) {
        cq = new clique;
        cq->id = key;
        cq->nranks = nranks;
        cq->ranks.assign((size_t)nranks, nullptr);
    }
    if (cq->nranks != nranks)
        return FAIL(ncclInvalidArgument, "ncclCommInitRank: %d ranks, the id's communicator has "
                    "%d", nranks, cq->nranks);
    if (cq->ranks[(size_t)rank])
        return FAIL(ncclInvalidUsage, "ncclCommInitRank: rank %d joined twice", rank);
    for (int r = 0; r < nranks; r++)
        if (cq->ranks[(size_t)r] && cq->ranks[(size_t)r]->device == dev)
            return FAIL(ncclInvalidUsage, "Duplicate GPU detected: rank %d and rank %d both on "
                        "CUDA device %d", rank, r, dev);
    ncclComm *c = new ncclComm{cq, rank, dev};
    cq->ranks[(size_t)rank] = c;
    cq->live++;
    g_live.insert(c);
    *comm = c;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
    if (!comms || ndev < 1) {
        std::lock_guard<std::mutex> lk(g_mu);
        return FAIL(ncclInvalidArgument, "ncclCommInitAll: %d devices", ndev);
    }
    for (int i = 0; i < ndev; i++)
        comms[i] = NULL;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        for (int i = 0; i < ndev; i++) {
            const int d = devlist ? devlist[i] : i;
            if (d < 0 || d >= emu_devices())
                return FAIL(ncclUnhandledCudaError, "ncclCommInitAll: cudaSetDevice(%d): invalid "
                            "device ordinal (%d devices)", d, emu_devices());
            for (int j = 0; j < i; j++)
                if ((devlist ? devlist[j] : j) == d)
                    return FAIL(ncclInvalidUsage, "Duplicate GPU detected: rank %d and rank %d "
                                "both on CUDA device %d", i, j, d);
        }
    }
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    int prev = 0;
    cudaGetDevice(&prev);
    for (int i = 0; i < ndev; i++) {
        cudaSetDevice(devlist ? devlist[i] : i);
        ncclResult_t r = ncclCommInitRank(&comms[i], ndev, id, i);
        if (r != ncclSuccess) {
            for (int j = 0; j < i; j++)
                ncclCommDestroy(comms[j]);
            cudaSetDevice(prev);
            return r;
        }
    }
    cudaSetDevice(prev);
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm)
        return ncclSuccess;
    std::lock_guard<std::mutex> lk(g_mu);
    if (!g_live.erase(comm))
        return FAIL(ncclInvalidArgument, "ncclCommDestroy: invalid or destroyed communicator %p",
                    (void *)comm);
    clique *cq = comm->cq;
    // Operations still waiting for this rank can never complete.
    for (auto *qs : {&cq->sends, &cq->recvs})
        for (auto &kv : *qs)
            for (auto it = kv.second.begin(); it != kv.second.end();) {
                if (it->rank == comm->rank || it->peer == comm->rank) {
                    it->st->r = FAIL(ncclInvalidUsage, "rank %d destroyed with an operation "
                                     "pending (rank %d -> %d)", comm->rank, kv.first.first,
                                     kv.first.second);
                    it->st->done = true;
                    it = kv.second.erase(it);
                } else {
                    ++it;
                }
            }
    g_cv.notify_all();
    cq->ranks[(size_t)comm->rank] = nullptr;
    delete comm;
    if (--cq->live == 0) {
        g_cliques.erase(cq->id);
        delete cq;
    }
    return ncclSuccess;
}

extern "C" ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type, int peer,
                                 ncclComm_t comm, cudaStream_t stream) {
    return enqueue_call(call{true, comm, peer, (void *)buf, count, type}, stream, "ncclSend");
}

extern "C" ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer,
                                 ncclComm_t comm, cudaStream_t stream) {
    return enqueue_call(call{false, comm, peer, buf, count, type}, stream, "ncclRecv");
}

extern "C" ncclResult_t ncclGroupStart(void) {
    if (t_depth++ == 0) {
        t_calls.clear();
        t_group_err = ncclSuccess;
    }
    return ncclSuccess;
}

extern "C" ncclResult_t ncclGroupEnd(void) {
    if (t_depth == 0) {
        std::lock_guard<std::mutex> lk(g_mu);
        return FAIL(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    }
    if (--t_depth > 0)
        return ncclSuccess;
    std::vector<call> calls;
    calls.swap(t_calls);
    if (t_group_err != ncclSuccess) {
        ncclResult_t r = t_group_err;
        t_group_err = ncclSuccess;
        return r;
    }
    return calls.empty() ? ncclSuccess : run_group(calls);
}
