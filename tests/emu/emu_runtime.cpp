// vela CUDA emulator (tests/emu): the CUDA runtime, cuBLAS's GemmEx and the
// kernel scheduler on the host.
//
// Memory: device memory is host memory (cudaMalloc = aligned malloc); every
// copy, memset and kernel runs synchronously when enqueued, so streams and
// events are trivially ordered. Stream capture records those operations into
// a graph that cudaGraphLaunch replays.
//
// Devices: VELA_EMU_DEVICES of them (default 1); allocations, streams,
// events, graphs and cuBLAS handles belong to one, and what would fail or
// fault on hardware across devices is reported (a kernel on another
// device's stream, a kernel or GEMM given another device's memory, copies of
// the wrong kind; tests/emu/README.md). The NCCL shim is emu_nccl.cpp.
//
// Kernels: blocks run one after another; the threads of a block are fibers
// on the calling OS thread (a hand-rolled x86-64 context switch, ucontext
// elsewhere). A fiber runs until it reaches a barrier (__syncthreads*, a
// warp intrinsic) or returns; when every fiber is parked the scheduler
// releases complete barriers. What a GPU would hang on or leave undefined is
// reported as a fault of the launch (kernel name, block, threads):
//   - threads of a block waiting at different __syncthreads, or some waiting
//     while others have returned (divergent barrier);
//   - lanes of a warp at different warp intrinsics, with different masks, or
//     a lane named in the mask that has returned or waits at __syncthreads;
//   - writes past the dynamic shared memory size (a red zone checked after
//     every block).
// A fault makes the rest of the launch skip and is returned, sticky, by
// every later synchronizing call (cudaStreamSynchronize, cudaMemcpy...), with
// the report as its error string. VELA_EMU_ABORT=1 aborts at the fault.
#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cuda_emu.h"
#include "cublas_v2.h"
#include "emu_internal.h"

__thread uint3 threadIdx;
__thread uint3 blockIdx;
__thread dim3 blockDim;
__thread dim3 gridDim;

// --- errors ------------------------------------------------------------------------

static std::mutex g_mu; // one kernel at a time, whichever OS thread launches it
static __thread cudaError_t t_last = cudaSuccess;
static cudaError_t g_sticky = cudaSuccess;
static char g_fault_msg[1024];

static void set_last(cudaError_t e) {
    if (e != cudaSuccess)
        t_last = e;
}

static cudaError_t ret(cudaError_t e) {
    set_last(e);
    return e;
}

// A synchronizing call: reports a fault raised inside an earlier kernel.
static cudaError_t sync_ret(void) {
    if (g_sticky != cudaSuccess)
        return ret(g_sticky);
    return cudaSuccess;
}

bool emu_faulted(void) { return g_sticky != cudaSuccess; }

// A fault outside a kernel body (a launch or GEMM touching another device's
// memory): sticky like a kernel fault; its report becomes the error string.
static void raise_sticky(cudaError_t e, const char *fmt, ...) {
    char msg[sizeof g_fault_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "vela-emu: %s\n", msg);
    if (g_sticky == cudaSuccess) {
        snprintf(g_fault_msg, sizeof g_fault_msg, "%s", msg);
        g_sticky = e;
    }
    set_last(e);
    const char *a = getenv("VELA_EMU_ABORT");
    if (a && *a == '1')
        abort();
}

extern "C" const char *cudaGetErrorString(cudaError_t e) {
    if (e != cudaSuccess && e == g_sticky && g_fault_msg[0])
        return g_fault_msg;
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorNotSupported: return "operation not supported (emulator)";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorLaunchFailure: return g_fault_msg[0] ? g_fault_msg : "unspecified launch failure";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    default: return "unknown error";
    }
}
extern "C" const char *cudaGetErrorName(cudaError_t e) {
    return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmu";
}
extern "C" cudaError_t cudaGetLastError(void) {
    cudaError_t e = t_last;
    t_last = cudaSuccess;
    return e != cudaSuccess ? e : g_sticky;
}
extern "C" cudaError_t cudaPeekAtLastError(void) {
    return t_last != cudaSuccess ? t_last : g_sticky;
}

// --- device ------------------------------------------------------------------------

static const size_t EMU_TOTAL_MEM = (size_t)141 << 30;
static const int EMU_SM = 132;
static __thread int t_device = 0;

// VELA_EMU_DEVICES emulated devices (default 1): each has its own memory
// account, default stream and properties (PCI bus id = ordinal); streams,
// events, allocations, graphs and cuBLAS handles remember their device.
int emu_devices(void) {
    static const int n = [] {
        const char *e = getenv("VELA_EMU_DEVICES");
        int v = e && *e ? atoi(e) : 1;
        if (v < 0)
            v = 0;
        if (v > EMU_MAX_DEVICES) {
            fprintf(stderr, "vela-emu: VELA_EMU_DEVICES=%d: at most %d devices\n", v,
                    EMU_MAX_DEVICES);
            v = EMU_MAX_DEVICES;
        }
        return v;
    }();
    return n;
}
static int emu_device_count(void) { return emu_devices(); }
int emu_current_device(void) { return t_device; }

extern "C" cudaError_t cudaGetDeviceCount(int *n) {
    *n = emu_device_count();
    return *n > 0 ? cudaSuccess : ret(cudaErrorNoDevice);
}
extern "C" cudaError_t cudaGetDevice(int *d) {
    *d = t_device;
    return cudaSuccess;
}
extern "C" cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= emu_device_count())
        return ret(cudaErrorInvalidDevice);
    t_device = d;
    return cudaSuccess;
}
extern "C" cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    if (d < 0 || d >= emu_device_count())
        return ret(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "vela CUDA emulator (H200-like)");
    p->totalGlobalMem = EMU_TOTAL_MEM;
    p->pciBusID = d;
    p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = EMU_SMEM_OPTIN;
    p->sharedMemPerMultiprocessor = 233472;
    p->regsPerBlock = 65536;
    p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->clockRate = 1980000;
    p->totalConstMem = 65536;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = EMU_SM;
    p->l2CacheSize = 50 * 1024 * 1024;
    p->memoryBusWidth = 6144;
    p->memoryClockRate = 2619000;
    p->maxThreadsPerMultiProcessor = 2048;
    return cudaSuccess;
}
extern "C" cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d) {
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, d);
    if (e)
        return e;
    switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrClockRate: *v = p.clockRate; break;
    case cudaDevAttrMultiProcessorCount: *v = p.multiProcessorCount; break;
    case cudaDevAttrMemoryClockRate: *v = p.memoryClockRate; break;
    case cudaDevAttrGlobalMemoryBusWidth: *v = p.memoryBusWidth; break;
    case cudaDevAttrL2CacheSize: *v = p.l2CacheSize; break;
    case cudaDevAttrComputeCapabilityMajor: *v = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *v = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)p.sharedMemPerBlockOptin; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = (int)p.sharedMemPerMultiprocessor; break;
    default: *v = 0; return ret(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}
extern "C" cudaError_t cudaDriverGetVersion(int *v) { *v = 12040; return cudaSuccess; }
extern "C" cudaError_t cudaRuntimeGetVersion(int *v) { *v = 12040; return cudaSuccess; }
extern "C" cudaError_t cudaDeviceSynchronize(void) { return sync_ret(); }
extern "C" cudaError_t cudaDeviceReset(void) { return cudaSuccess; }

// --- memory --------------------------------------------------------------------------

struct emu_alloc {
    size_t bytes;
    int device;
};
static std::map<const char *, emu_alloc> g_dev; // base -> allocation (cudaMalloc)
static std::map<const char *, size_t> g_pinned;  // base -> bytes (host, page-locked)
static size_t g_dev_bytes[EMU_MAX_DEVICES];

// The device allocation containing [p, p + n) (n 0: just p), or NULL.
// Caller holds g_mu.
static const std::pair<const char *const, emu_alloc> *find_alloc_locked(const void *p, size_t n) {
    const char *c = (const char *)p;
    auto it = g_dev.upper_bound(c);
    if (it == g_dev.begin())
        return nullptr;
    --it;
    if (c >= it->first && c < it->first + std::max<size_t>(it->second.bytes, 1) &&
        c + n <= it->first + it->second.bytes)
        return &*it;
    return nullptr;
}

int emu_ptr_device(const void *p, size_t n) {
    std::lock_guard<std::mutex> lk(g_mu);
    auto *a = find_alloc_locked(p, n);
    return a ? a->second.device : -1;
}
int emu_ptr_owner(const void *p) { return emu_ptr_device(p, 0); }

enum { EMU_NONE, EMU_DEV, EMU_PINNED };
static int ptr_kind(const void *p, size_t n) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (find_alloc_locked(p, n))
        return EMU_DEV;
    const char *c = (const char *)p;
    auto it = g_pinned.upper_bound(c);
    if (it != g_pinned.begin()) {
        --it;
        if (c >= it->first && c + n <= it->first + it->second)
            return EMU_PINNED;
    }
    return EMU_NONE;
}

static cudaError_t alloc_on(void **p, size_t bytes, int dev) {
    *p = NULL;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        if (bytes > EMU_TOTAL_MEM - g_dev_bytes[dev])
            return ret(cudaErrorMemoryAllocation);
    }
    void *raw = NULL;
    if (posix_memalign(&raw, 256, bytes + 2 * EMU_ALLOC_RZ))
        return ret(cudaErrorMemoryAllocation);
    // Fresh device memory is not zero on a GPU either (and initcheck
    // reports a kernel reading it before anything wrote it).
    memset(raw, 0xa5, bytes + 2 * EMU_ALLOC_RZ);
    void *q = (char *)raw + EMU_ALLOC_RZ;
    std::lock_guard<std::mutex> lk(g_mu);
    g_dev[(const char *)q] = emu_alloc{bytes, dev};
    emu_chk_alloc(q, bytes);
    g_dev_bytes[dev] += bytes;
    *p = q;
    return cudaSuccess;
}

static bool release_alloc(void *p) {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_dev.find((const char *)p);
    if (it == g_dev.end())
        return false;
    g_dev_bytes[it->second.device] -= it->second.bytes;
    g_dev.erase(it);
    emu_chk_free(p);
    return true;
}

static void free_alloc(void *p) {
    free((char *)p - EMU_ALLOC_RZ);
}

// Bytes written outside kernels: initialised for initcheck.
void emu_mark_written(const void *p, size_t n) {
    std::lock_guard<std::mutex> lk(g_mu);
    emu_chk_host_write(p, n);
}

// A copy (or a shim) reading device memory that must have been written.
void emu_check_written(const void *p, size_t n, const char *what) {
    char msg[600];
    bool ok;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        ok = emu_chk_host_read(p, n, msg, sizeof msg);
    }
    if (!ok)
        raise_sticky(cudaErrorLaunchFailure, "%s: %s", what, msg);
}

extern "C" cudaError_t cudaMalloc(void **p, size_t bytes) { return alloc_on(p, bytes, t_device); }
extern "C" cudaError_t cudaFree(void *p) {
    if (!p)
        return cudaSuccess;
    if (!release_alloc(p))
        return ret(cudaErrorInvalidValue);
    free_alloc(p);
    return sync_ret();
}

// --- streams, capture and graphs ---------------------------------------------------------

struct emu_graph {
    int device;
    std::vector<std::function<void()>> ops;
};
struct emu_graph_exec {
    int device;
    std::vector<std::function<void()>> ops;
};
struct emu_stream {
    int device = 0;
    bool capturing = false;
    bool invalid = false; // an unsafe call during capture
    emu_graph *graph = nullptr;
};
struct emu_event {
    int device;
};
// The legacy default stream of each device.
static emu_stream g_default_stream[EMU_MAX_DEVICES];

static emu_stream *stream_of(cudaStream_t s) {
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread) {
        emu_stream *d = &g_default_stream[t_device];
        d->device = t_device;
        return d;
    }
    return s;
}

int emu_stream_device(cudaStream_t s) { return stream_of(s)->device; }
bool emu_stream_capturing(cudaStream_t s) { return stream_of(s)->capturing; }

// Runs op now, or records it while s is capturing.
static cudaError_t enqueue(cudaStream_t s, std::function<void()> op) {
    emu_stream *st = stream_of(s);
    if (st->capturing) {
        st->graph->ops.push_back(std::move(op));
        return cudaSuccess;
    }
    op();
    return cudaSuccess;
}

extern "C" cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s) {
    if (stream_of(s)->capturing) {
        stream_of(s)->invalid = true;
        return ret(cudaErrorStreamCaptureUnsupported);
    }
    return alloc_on(p, bytes, stream_of(s)->device); // the stream's device's pool
}
extern "C" cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
    if (stream_of(s)->capturing) {
        stream_of(s)->invalid = true;
        return ret(cudaErrorStreamCaptureUnsupported);
    }
    const int pd = emu_ptr_owner(p);
    if (pd >= 0 && pd != stream_of(s)->device) {
        fprintf(stderr, "vela-emu: cudaFreeAsync(%p) of device %d memory on a stream of device "
                        "%d\n", p, pd, stream_of(s)->device);
        return ret(cudaErrorInvalidValue);
    }
    if (!release_alloc(p))
        return ret(cudaErrorInvalidValue);
    free_alloc(p);
    return cudaSuccess;
}
extern "C" cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags) {
    (void)flags;
    *p = NULL;
    void *q = NULL;
    if (posix_memalign(&q, 4096, bytes ? bytes : 1))
        return ret(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> lk(g_mu);
    g_pinned[(const char *)q] = bytes;
    *p = q;
    return cudaSuccess;
}
extern "C" cudaError_t cudaMallocHost(void **p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }
extern "C" cudaError_t cudaFreeHost(void *p) {
    if (!p)
        return cudaSuccess;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        auto it = g_pinned.find((const char *)p);
        if (it == g_pinned.end())
            return ret(cudaErrorInvalidValue);
        g_pinned.erase(it);
    }
    free(p);
    return cudaSuccess;
}
extern "C" cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned int flags) {
    (void)flags;
    std::lock_guard<std::mutex> lk(g_mu);
    g_pinned[(const char *)p] = bytes;
    return cudaSuccess;
}
extern "C" cudaError_t cudaHostUnregister(void *p) {
    std::lock_guard<std::mutex> lk(g_mu);
    g_pinned.erase((const char *)p);
    return cudaSuccess;
}
// The current device's memory.
extern "C" cudaError_t cudaMemGetInfo(size_t *fr, size_t *total) {
    std::lock_guard<std::mutex> lk(g_mu);
    *total = EMU_TOTAL_MEM;
    *fr = EMU_TOTAL_MEM - g_dev_bytes[t_device];
    return cudaSuccess;
}
extern "C" cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
    memset(a, 0, sizeof *a);
    const int k = ptr_kind(p, 1);
    a->type = k == EMU_DEV ? cudaMemoryTypeDevice : k == EMU_PINNED ? cudaMemoryTypeHost
                                                                    : cudaMemoryTypeUnregistered;
    a->device = k == EMU_DEV ? emu_ptr_owner(p) : t_device;
    a->devicePointer = k == EMU_DEV ? (void *)p : NULL;
    a->hostPointer = k != EMU_DEV ? (void *)p : NULL;
    return cudaSuccess;
}

static const char *kind_name(enum cudaMemcpyKind k) {
    switch (k) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    default: return "cudaMemcpyDefault";
    }
}

// Copies check that the device side of the copy lies inside one allocation,
// that the host side is not device memory (a wrong kind), and that a
// device-to-device copy stays on one device: vela enables no peer access,
// so memory of another device is reached with cudaMemcpyPeer(Async) only
// (stricter than UVA hardware, which would stage such a copy silently).
static cudaError_t check_copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k) {
    if (n == 0 || k == cudaMemcpyDefault)
        return cudaSuccess;
    const bool dst_dev = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
    const bool src_dev = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
    if ((dst_dev && ptr_kind(dst, n) != EMU_DEV) || (src_dev && ptr_kind(src, n) != EMU_DEV)) {
        fprintf(stderr, "vela-emu: %s of %zu bytes %p -> %p outside a device allocation\n",
                kind_name(k), n, src, dst);
        return cudaErrorInvalidValue;
    }
    const int dd = emu_ptr_owner(dst), sd = emu_ptr_owner(src);
    if ((!dst_dev && dd >= 0) || (!src_dev && sd >= 0)) {
        fprintf(stderr, "vela-emu: %s of %zu bytes %p -> %p: the %s side is memory of device %d "
                        "(wrong kind)\n", kind_name(k), n, src, dst, !dst_dev && dd >= 0 ? "host "
                        "destination" : "host source", !dst_dev && dd >= 0 ? dd : sd);
        return cudaErrorInvalidValue;
    }
    if (k == cudaMemcpyDeviceToDevice && dd != sd) {
        fprintf(stderr, "vela-emu: cudaMemcpyDeviceToDevice of %zu bytes from device %d memory "
                        "(%p) to device %d memory (%p): peer access is not enabled; use "
                        "cudaMemcpyPeer\n", n, sd, src, dd, dst);
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

// A copy as the copy engine makes it: reading device memory never written
// is an initcheck finding (sticky), the destination is written.
static void copy_checked(void *dst, const void *src, size_t n, const char *what) {
    if (g_sticky)
        return;
    emu_check_written(src, n, what);
    memmove(dst, src, n);
    emu_mark_written(dst, n);
}

extern "C" cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k) {
    cudaError_t e = check_copy(dst, src, n, k);
    if (e)
        return ret(e);
    if (g_sticky)
        return sync_ret();
    copy_checked(dst, src, n, "cudaMemcpy");
    return sync_ret();
}
extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n,
                                       enum cudaMemcpyKind k, cudaStream_t s) {
    cudaError_t e = check_copy(dst, src, n, k);
    if (e)
        return ret(e);
    if (stream_of(s)->capturing && k != cudaMemcpyDeviceToDevice &&
        ptr_kind(k == cudaMemcpyHostToDevice ? src : dst, n) != EMU_PINNED) {
        // Pageable memory cannot be captured.
        stream_of(s)->invalid = true;
        return ret(cudaErrorStreamCaptureUnsupported);
    }
    return enqueue(s, [=]() { copy_checked(dst, src, n, "cudaMemcpyAsync"); });
}
extern "C" cudaError_t cudaMemcpyPeerAsync(void *dst, int dd, const void *src, int sd, size_t n,
                                           cudaStream_t s) {
    if (n == 0)
        return cudaSuccess;
    if (dd < 0 || dd >= emu_device_count() || sd < 0 || sd >= emu_device_count())
        return ret(cudaErrorInvalidDevice);
    if (emu_ptr_device(dst, n) != dd || emu_ptr_device(src, n) != sd) {
        fprintf(stderr, "vela-emu: cudaMemcpyPeerAsync of %zu bytes: %p is not device %d memory "
                        "or %p not device %d memory\n", n, dst, dd, src, sd);
        return ret(cudaErrorInvalidValue);
    }
    return enqueue(s, [=]() { copy_checked(dst, src, n, "cudaMemcpyPeerAsync"); });
}
// A memset runs on a device: its memory must be that device's.
static cudaError_t check_memset(void *dst, size_t n, int dev, const char *what) {
    if (n && ptr_kind(dst, n) != EMU_DEV) {
        fprintf(stderr, "vela-emu: %s of %zu bytes at %p outside a device allocation\n", what, n,
                dst);
        return cudaErrorInvalidValue;
    }
    const int pd = emu_ptr_owner(dst);
    if (n && pd != dev) {
        fprintf(stderr, "vela-emu: %s of %zu bytes at %p: memory of device %d, run on device %d "
                        "(peer access is not enabled)\n", what, n, dst, pd, dev);
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}
extern "C" cudaError_t cudaMemset(void *dst, int v, size_t n) {
    cudaError_t e = check_memset(dst, n, t_device, "cudaMemset");
    if (e)
        return ret(e);
    if (g_sticky)
        return sync_ret();
    memset(dst, v, n);
    emu_mark_written(dst, n);
    return cudaSuccess;
}
extern "C" cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s) {
    cudaError_t e = check_memset(dst, n, stream_of(s)->device, "cudaMemsetAsync");
    if (e)
        return ret(e);
    return enqueue(s, [=]() {
        memset(dst, v, n);
        emu_mark_written(dst, n);
    });
}

extern "C" cudaError_t cudaStreamCreate(cudaStream_t *s) {
    *s = new emu_stream;
    (*s)->device = t_device;
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    (void)flags;
    return cudaStreamCreate(s);
}
extern "C" cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (s && s != cudaStreamLegacy && s != cudaStreamPerThread) {
        delete s->graph;
        delete s;
    }
    return cudaSuccess;
}
// Any device's stream may be synchronised from any current device.
extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (stream_of(s)->capturing) {
        stream_of(s)->invalid = true;
        return ret(cudaErrorStreamCaptureUnsupported);
    }
    return sync_ret();
}
extern "C" cudaError_t cudaStreamQuery(cudaStream_t s) { return cudaStreamSynchronize(s); }
// Waiting on another device's event is allowed (CUDA's stream/event rules).
extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int f) {
    (void)s;
    (void)f;
    if (!e)
        return ret(cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = new emu_event{t_device};
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int f) {
    (void)f;
    return cudaEventCreate(e);
}
extern "C" cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
// As on hardware: an event is recorded only on a stream of its own device.
extern "C" cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e)
        return ret(cudaErrorInvalidResourceHandle);
    if (e->device != stream_of(s)->device) {
        fprintf(stderr, "vela-emu: cudaEventRecord: event of device %d on a stream of device %d\n",
                e->device, stream_of(s)->device);
        return ret(cudaErrorInvalidResourceHandle);
    }
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    (void)e;
    return sync_ret();
}
extern "C" cudaError_t cudaEventQuery(cudaEvent_t e) { return cudaEventSynchronize(e); }
extern "C" cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = 0.0f;
    if (!a || !b)
        return ret(cudaErrorInvalidResourceHandle);
    if (a->device != b->device) {
        fprintf(stderr, "vela-emu: cudaEventElapsedTime: events of devices %d and %d\n", a->device,
                b->device);
        return ret(cudaErrorInvalidResourceHandle);
    }
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode m) {
    (void)m;
    emu_stream *st = stream_of(s);
    if (st->capturing || (st >= g_default_stream && st < g_default_stream + EMU_MAX_DEVICES))
        return ret(cudaErrorInvalidValue);
    st->capturing = true;
    st->invalid = false;
    st->graph = new emu_graph;
    st->graph->device = st->device;
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
    emu_stream *st = stream_of(s);
    *g = NULL;
    if (!st->capturing)
        return ret(cudaErrorInvalidValue);
    st->capturing = false;
    emu_graph *gr = st->graph;
    st->graph = nullptr;
    if (st->invalid) {
        delete gr;
        return ret(cudaErrorStreamCaptureInvalidated);
    }
    *g = gr;
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st) {
    *st = stream_of(s)->capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
extern "C" cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *m) {
    (void)m;
    return cudaSuccess;
}
extern "C" cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete g;
    return cudaSuccess;
}
extern "C" cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g,
                                            unsigned long long f) {
    (void)f;
    if (!g)
        return ret(cudaErrorInvalidValue);
    *e = new emu_graph_exec{g->device, g->ops};
    return cudaSuccess;
}
extern "C" cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *e, cudaGraph_t g,
                                                     unsigned long long f) {
    return cudaGraphInstantiate(e, g, f);
}
// A graph's kernels belong to the device it was captured on.
extern "C" cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
    if (!e)
        return ret(cudaErrorInvalidValue);
    if (e->device != stream_of(s)->device) {
        fprintf(stderr, "vela-emu: cudaGraphLaunch: a graph of device %d launched on a stream of "
                        "device %d\n", e->device, stream_of(s)->device);
        return ret(cudaErrorInvalidValue);
    }
    if (stream_of(s)->capturing) { // a graph launched into a capture: record its ops
        for (auto &op : e->ops)
            stream_of(s)->graph->ops.push_back(op);
        return cudaSuccess;
    }
    for (auto &op : e->ops)
        op();
    return cudaSuccess;
}
extern "C" cudaError_t cudaGraphUpload(cudaGraphExec_t e, cudaStream_t s) {
    (void)e;
    (void)s;
    return cudaSuccess;
}
extern "C" cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
    delete e;
    return cudaSuccess;
}

// --- kernels: fibers ---------------------------------------------------------------

#define EMU_STACK (256 * 1024)
#define EMU_MAX_THREADS 1024

#if defined(__x86_64__)
// emu_switch(&save_sp, new_sp): saves the callee-saved registers on the
// current stack, stores its sp, loads new_sp and restores from there.
extern "C" void emu_switch(void **save, void *to);
asm(R"(
    .text
    .globl emu_switch
    .type emu_switch,@function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch,.-emu_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");
#define EMU_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

enum { F_READY, F_WAIT, F_DONE };

struct fiber {
#if EMU_ASM_SWITCH
    void *sp;
#else
    ucontext_t uc;
#endif
    char *stack;
    int state;
    int op;
    uint64_t val, result;
    int param, width;
    unsigned mask;
    const char *what;
    uint3 tid;
};

static fiber g_fib[EMU_MAX_THREADS];
static char *g_stacks;
static int g_nthreads, g_cur;
#if EMU_ASM_SWITCH
static void *g_sched_sp;
#else
static ucontext_t g_sched_uc;
#endif
static const std::function<void()> *g_body;
static const char *g_kernel;
static char *g_dyn_smem;
static size_t g_dyn_bytes;
static bool g_block_fault;

extern "C" char __start_emu_shared[] __attribute__((weak));
extern "C" char __stop_emu_shared[] __attribute__((weak));

static void to_sched(void) {
#if EMU_ASM_SWITCH
    emu_switch(&g_fib[g_cur].sp, g_sched_sp);
#else
    swapcontext(&g_fib[g_cur].uc, &g_sched_uc);
#endif
}

static void fiber_main(void) {
    (*g_body)();
    g_fib[g_cur].state = F_DONE;
    to_sched();
    abort(); // a finished fiber is never resumed
}

static void fiber_init(int i) {
    fiber &f = g_fib[i];
    f.stack = g_stacks + (size_t)i * (EMU_STACK + 4096) + 4096; // guard page below
#if EMU_ASM_SWITCH
    uint64_t *top = (uint64_t *)(f.stack + EMU_STACK);
    *--top = 0;                        // fiber_main's return address (never used)
    *--top = (uint64_t)&fiber_main;    // emu_switch returns here
    for (int r = 0; r < 6; r++)
        *--top = 0;                    // rbp rbx r12..r15
    f.sp = top;
#else
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.stack;
    f.uc.uc_stack.ss_size = EMU_STACK;
    f.uc.uc_link = NULL;
    makecontext(&f.uc, fiber_main, 0);
#endif
    f.state = F_READY;
    f.op = 0;
}

static void resume(int i) {
    g_cur = i;
    threadIdx = g_fib[i].tid;
#if EMU_ASM_SWITCH
    emu_switch(&g_sched_sp, g_fib[i].sp);
#else
    swapcontext(&g_sched_uc, &g_fib[i].uc);
#endif
}

static void fault(const char *fmt, ...) {
    if (g_block_fault)
        return;
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(g_fault_msg, sizeof g_fault_msg, "emulated kernel fault in %s, block (%u,%u,%u): %s",
             g_kernel, blockIdx.x, blockIdx.y, blockIdx.z, msg);
    fprintf(stderr, "vela-emu: %s\n", g_fault_msg);
    g_block_fault = true;
    g_sticky = cudaErrorLaunchFailure;
    const char *a = getenv("VELA_EMU_ABORT");
    if (a && *a == '1')
        abort();
}

extern "C++" [[noreturn]] void emu_trap(const char *what) {
    fault("%s by thread (%u,%u,%u)", what, g_fib[g_cur].tid.x, g_fib[g_cur].tid.y,
          g_fib[g_cur].tid.z);
    g_fib[g_cur].state = F_DONE;
    to_sched();
    abort();
}

uint64_t emu_barrier(int op, uint64_t val, int param, int width, unsigned mask, const char *what,
                     const void *site) {
    (void)site;
    fiber &f = g_fib[g_cur];
    f.state = F_WAIT;
    f.op = op;
    f.val = val;
    f.param = param;
    f.width = width;
    f.mask = mask;
    f.what = what;
    to_sched();
    return g_fib[g_cur].result;
}

unsigned emu_activemask(void) {
    const int base = g_cur & ~31;
    unsigned m = 0;
    for (int l = 0; l < 32 && base + l < g_nthreads; l++)
        if (g_fib[base + l].state != F_DONE)
            m |= 1u << l;
    return m;
}

void *emu_dynamic_smem(void) { return g_dyn_smem; }

// Static shared memory of the running launch: each declaration (key) gets
// its place when a thread first reaches it; 48 KiB as on hardware.
#define EMU_STATIC_SMEM (48 * 1024)
static char g_static_smem[EMU_STATIC_SMEM] __attribute__((aligned(128)));
static size_t g_static_used;
struct static_var {
    const void *key;
    size_t off;
};
static std::vector<static_var> g_static_vars;

void *emu_static_smem(const void *key, size_t size, size_t align) {
    for (const static_var &v : g_static_vars)
        if (v.key == key)
            return g_static_smem + v.off;
    const size_t off = (g_static_used + align - 1) / align * align;
    if (off + size > EMU_STATIC_SMEM) {
        emu_trap("more than 48 KiB of static shared memory");
    }
    g_static_vars.push_back(static_var{key, off});
    g_static_used = off + size;
    memset(g_static_smem + off, 0xff, size); // as the rest, before this block
    return g_static_smem + off;
}

static const char *state_name(const fiber &f) {
    return f.state == F_DONE ? "returned" : f.state == F_READY ? "running" : f.what;
}

// Releases the warp barrier of warp w when complete; returns true if released.
static bool resolve_warp(int w) {
    const int base = w * 32, n = std::min(32, g_nthreads - base);
    int first = -1;
    for (int l = 0; l < n; l++)
        if (g_fib[base + l].state == F_WAIT && g_fib[base + l].op >= EMU_W_SYNC) {
            first = l;
            break;
        }
    if (first < 0)
        return false;
    const fiber &f0 = g_fib[base + first];
    const unsigned present = n == 32 ? 0xffffffffu : ((1u << n) - 1);
    const unsigned mask = f0.mask & present;
    if (!(f0.mask >> first & 1u)) {
        fault("lane %d of warp %d calls %s with mask 0x%08x, which does not name it", first, w,
              f0.what, f0.mask);
        return false;
    }
    if ((f0.mask & ~present) != 0) {
        fault("warp %d: %s with mask 0x%08x names lanes beyond the block (%d threads)", w,
              f0.what, f0.mask, g_nthreads);
        return false;
    }
    for (int l = 0; l < n; l++) {
        if (!(mask >> l & 1u))
            continue;
        const fiber &f = g_fib[base + l];
        if (f.state == F_WAIT && f.op == f0.op && f.mask == f0.mask && f.width == f0.width)
            continue;
        if (f.state == F_WAIT && f.op < EMU_W_SYNC) {
            // lane l is parked at __syncthreads: a divergence (warp ops cannot
            // complete before it arrives, and it cannot leave before they do)
            fault("warp %d: lane %d waits in %s while lane %d waits in %s (divergent warp "
                  "intrinsic)", w, l, f.what, first, f0.what);
            return false;
        }
        if (f.state == F_DONE) {
            fault("warp %d: lane %d has returned while lane %d waits in %s naming it in mask "
                  "0x%08x", w, l, first, f0.what, f0.mask);
            return false;
        }
        if (f.state == F_WAIT) {
            fault("warp %d: lane %d in %s (mask 0x%08x, width %d) and lane %d in %s (mask 0x%08x, "
                  "width %d)", w, first, f0.what, f0.mask, f0.width, l, f.what, f.mask, f.width);
            return false;
        }
        return false; // still running (cannot happen after a full pass)
    }
    const int width = f0.width > 0 ? f0.width : 32;
    if (f0.op >= EMU_W_SHFL && f0.op <= EMU_W_SHFL_XOR && (width & (width - 1)) != 0) {
        fault("warp %d: %s with width %d (not a power of two)", w, f0.what, width);
        return false;
    }
    unsigned ballot = 0;
    for (int l = 0; l < n; l++)
        if ((mask >> l & 1u) && g_fib[base + l].val)
            ballot |= 1u << l;
    for (int l = 0; l < n; l++) {
        if (!(mask >> l & 1u))
            continue;
        fiber &f = g_fib[base + l];
        const int seg = l & ~(width - 1);
        int src = l;
        switch (f0.op) {
        case EMU_W_SHFL: src = seg + (f.param & (width - 1)); break;
        case EMU_W_SHFL_UP: src = l - f.param >= seg ? l - f.param : l; break;
        case EMU_W_SHFL_DOWN: src = l + f.param < seg + width ? l + f.param : l; break;
        case EMU_W_SHFL_XOR: src = l ^ f.param; if (src >= seg + width) src = l; break;
        default: break;
        }
        switch (f0.op) {
        case EMU_W_SYNC: f.result = 0; break;
        case EMU_W_SHFL:
        case EMU_W_SHFL_UP:
        case EMU_W_SHFL_DOWN:
        case EMU_W_SHFL_XOR:
            if (src >= n || !(mask >> src & 1u)) {
                fault("warp %d: lane %d reads lane %d in %s, which is not in mask 0x%08x", w, l,
                      src, f0.what, f0.mask);
                return false;
            }
            f.result = g_fib[base + src].val;
            break;
        case EMU_W_BALLOT: f.result = ballot; break;
        case EMU_W_ANY: f.result = ballot != 0; break;
        case EMU_W_ALL: f.result = ballot == mask; break;
        case EMU_W_MATCH_ANY: {
            unsigned m = 0;
            for (int j = 0; j < n; j++)
                if ((mask >> j & 1u) && g_fib[base + j].val == f.val)
                    m |= 1u << j;
            f.result = m;
            break;
        }
        }
    }
    for (int l = 0; l < n; l++)
        if (mask >> l & 1u)
            g_fib[base + l].state = F_READY;
    emu_chk_warp_barrier(w, mask, present);
    return true;
}

static bool resolve_block(void) {
    int first = -1, n_done = 0;
    for (int i = 0; i < g_nthreads; i++) {
        const fiber &f = g_fib[i];
        if (f.state == F_DONE) {
            n_done++;
            continue;
        }
        if (f.state != F_WAIT || f.op >= EMU_W_SYNC)
            return false;
        if (first < 0)
            first = i;
    }
    if (first < 0)
        return false;
    const fiber &f0 = g_fib[first];
    for (int i = 0; i < g_nthreads; i++) {
        const fiber &f = g_fib[i];
        if (f.state == F_WAIT && (f.op != f0.op || strcmp(f.what, f0.what) != 0)) {
            fault("divergent barrier: thread %d waits in %s, thread %d in %s", first, f0.what, i,
                  f.what);
            return false;
        }
    }
    if (n_done) {
        int d = 0;
        while (g_fib[d].state != F_DONE)
            d++;
        fault("divergent barrier: %d of %d threads (first: thread %d) have returned while thread "
              "%d waits in %s", n_done, g_nthreads, d, first, f0.what);
        return false;
    }
    uint64_t cnt = 0;
    for (int i = 0; i < g_nthreads; i++)
        cnt += g_fib[i].val != 0;
    uint64_t r = 0;
    switch (f0.op) {
    case EMU_SYNC_OR: r = cnt != 0; break;
    case EMU_SYNC_AND: r = cnt == (uint64_t)g_nthreads; break;
    case EMU_SYNC_COUNT: r = cnt; break;
    default: break;
    }
    for (int i = 0; i < g_nthreads; i++) {
        g_fib[i].result = r;
        g_fib[i].state = F_READY;
    }
    emu_chk_block_barrier();
    return true;
}

static void report_stuck(void) {
    std::string s;
    for (int i = 0; i < g_nthreads && s.size() < 400; i++) {
        if (g_fib[i].state == F_DONE)
            continue;
        char b[160];
        snprintf(b, sizeof b, "%sthread %d in %s", s.empty() ? "" : "; ", i,
                 state_name(g_fib[i]));
        s += b;
    }
    fault("deadlock: no barrier can complete (%s)", s.c_str());
}

#define EMU_REDZONE 256

// The schedule (VELA_EMU_SCHEDULE): forward (the default), reverse (also
// VELA_EMU_REVERSE=1: threads and blocks in descending order) or
// random:SEED (a seeded random order of the blocks, of the threads in every
// pass between barriers, and a switch to another thread after about one
// memory access in eight).
enum { SCHED_FORWARD, SCHED_REVERSE, SCHED_RANDOM };
static int g_sched = -1;
static uint64_t g_rng;
static int schedule(void) {
    if (g_sched >= 0)
        return g_sched;
    const char *r = getenv("VELA_EMU_REVERSE"), *e = getenv("VELA_EMU_SCHEDULE");
    g_sched = r && *r == '1' ? SCHED_REVERSE : SCHED_FORWARD;
    if (e && strcmp(e, "reverse") == 0)
        g_sched = SCHED_REVERSE;
    else if (e && strncmp(e, "random", 6) == 0) {
        g_sched = SCHED_RANDOM;
        g_rng = (e[6] == ':' ? strtoull(e + 7, NULL, 0) : 1) * 0x9e3779b97f4a7c15ull + 1;
        fprintf(stderr, "vela-emu: random schedule, seed %s\n", e[6] == ':' ? e + 7 : "1");
    } else if (e && *e && strcmp(e, "forward") != 0)
        fprintf(stderr, "vela-emu: VELA_EMU_SCHEDULE=%s: not forward, reverse or random:SEED\n", e);
    return g_sched;
}
uint64_t emu_rand(void) { // splitmix64
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
// Lets the scheduler run other threads before this one goes on.
void emu_yield(void) {
    g_fib[g_cur].state = F_READY;
    to_sched();
}
int emu_cur_thread(void) {
    return g_cur;
}
void emu_kernel_fault(const char *msg) {
    fault("%s", msg);
}

static void run_block(void) {
    const int n = g_nthreads;
    const size_t sh_bytes = (size_t)(__stop_emu_shared - __start_emu_shared);
    if (__start_emu_shared && sh_bytes)
        memset(__start_emu_shared, 0xff, sh_bytes);
    memset(g_static_smem, 0xff, g_static_used);
    if (g_dyn_smem)
        memset(g_dyn_smem, 0xff, g_dyn_bytes + EMU_REDZONE);
    for (int i = 0; i < n; i++)
        fiber_init(i);
    // VELA_EMU_REVERSE=1 runs threads (and blocks) in descending order: a
    // kernel whose result changes with the order has a race (a read of
    // shared or global memory that another thread writes without a barrier
    // in between, or a dependency between blocks). The random schedule
    // shuffles the threads on every pass.
    const int sched = schedule();
    static int order[EMU_MAX_THREADS];
    for (int k = 0; k < n; k++)
        order[k] = sched == SCHED_REVERSE ? n - 1 - k : k;
    for (;;) {
        bool all_done = true, running = false;
        if (sched == SCHED_RANDOM)
            for (int k = n - 1; k > 0; k--)
                std::swap(order[k], order[emu_rand() % (uint64_t)(k + 1)]);
        for (int k = 0; k < n; k++) {
            const int i = order[k];
            if (g_fib[i].state == F_READY)
                resume(i);
            if (g_block_fault)
                return;
        }
        for (int i = 0; i < n; i++) {
            all_done &= g_fib[i].state == F_DONE;
            running |= g_fib[i].state == F_READY; // yielded between accesses
        }
        if (all_done)
            break;
        bool released = false;
        for (int w = 0; w * 32 < n && !g_block_fault; w++)
            released |= resolve_warp(w);
        if (g_block_fault)
            return;
        if (!released && !running)
            released = resolve_block();
        if (g_block_fault)
            return;
        if (!released && !running) {
            report_stuck();
            return;
        }
    }
    if (g_dyn_smem) {
        for (size_t i = 0; i < EMU_REDZONE; i++)
            if ((unsigned char)g_dyn_smem[g_dyn_bytes + i] != 0xff) {
                fault("write past the end of dynamic shared memory (%zu bytes): byte +%zu",
                      g_dyn_bytes, i);
                return;
            }
    }
}

static std::map<const void *, int> g_fn_smem; // cudaFuncAttributeMaxDynamicSharedMemorySize

extern "C" cudaError_t emu_func_set_attribute(const void *fn, enum cudaFuncAttribute a, int v) {
    if (a == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (v < 0 || v > EMU_SMEM_OPTIN)
            return ret(cudaErrorInvalidValue);
        std::lock_guard<std::mutex> lk(g_mu);
        g_fn_smem[fn] = v;
    }
    return cudaSuccess;
}

static std::atomic<unsigned long long> g_pdl_launches;

cudaError_t emu_launch_ex_check(const cudaLaunchConfig_t *cfg) {
    if (!cfg || (cfg->numAttrs > 0 && !cfg->attrs))
        return ret(cudaErrorInvalidValue);
    bool pdl = false;
    for (unsigned int i = 0; i < cfg->numAttrs; i++) {
        if (cfg->attrs[i].id != cudaLaunchAttributeProgrammaticStreamSerialization) {
            fprintf(stderr, "vela-emu: cudaLaunchKernelEx: launch attribute %d is not emulated\n",
                    (int)cfg->attrs[i].id);
            return ret(cudaErrorInvalidValue);
        }
        pdl = pdl || cfg->attrs[i].val.programmaticStreamSerializationAllowed != 0;
    }
    if (pdl)
        g_pdl_launches++;
    return cudaSuccess;
}

extern "C" unsigned long long emu_pdl_launches(void) {
    return g_pdl_launches.load();
}

// Runs per kernel name (emu_kernel_runs), under g_mu.
static std::map<std::string, unsigned long long> g_runs;

extern "C" unsigned long long emu_kernel_runs(const char *prefix) {
    std::lock_guard<std::mutex> lk(g_mu);
    unsigned long long n = 0;
    const size_t len = strlen(prefix);
    for (const auto &kv : g_runs)
        if (!kv.first.compare(0, len, prefix))
            n += kv.second;
    return n;
}

static void run_kernel_now(const char *name, const void *fn, dim3 grid, dim3 block, size_t shmem,
                           const std::function<void()> &body) {
    std::lock_guard<std::mutex> lk(g_mu);
    g_runs[name ? name : ""]++;
    if (!g_stacks) {
        const size_t per = EMU_STACK + 4096;
        g_stacks = (char *)mmap(NULL, per * EMU_MAX_THREADS, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (g_stacks == MAP_FAILED) {
            perror("vela-emu: mmap of the fiber stacks");
            abort();
        }
        for (int i = 0; i < EMU_MAX_THREADS; i++)
            mprotect(g_stacks + (size_t)i * per, 4096, PROT_NONE);
    }
    g_kernel = name;
    g_body = &body;
    g_nthreads = (int)(block.x * block.y * block.z);
    std::vector<char> dyn;
    if (shmem) {
        // 128-byte aligned like a GPU's dynamic shared memory (wmma pointers
        // must be 32-byte aligned; kernels may rely on the base being so).
        dyn.resize(shmem + EMU_REDZONE + 128);
        g_dyn_smem = (char *)(((uintptr_t)dyn.data() + 127) & ~(uintptr_t)127);
        g_dyn_bytes = shmem;
    } else {
        g_dyn_smem = NULL;
        g_dyn_bytes = 0;
    }
    gridDim = grid;
    blockDim = block;
    for (int i = 0; i < g_nthreads; i++) {
        g_fib[i].tid.x = (unsigned)i % block.x;
        g_fib[i].tid.y = (unsigned)i / block.x % block.y;
        g_fib[i].tid.z = (unsigned)i / (block.x * block.y);
    }
    g_block_fault = false;
    const int sched = schedule();
    const uint64_t n_blocks = (uint64_t)grid.x * grid.y * grid.z;
    g_static_used = 0; // the launch's kernel places its __shared__ variables anew
    g_static_vars.clear();
    emu_chk_launch_begin(name, fn, grid, block, g_stacks,
                         (size_t)(EMU_STACK + 4096) * EMU_MAX_THREADS, g_static_smem,
                         EMU_STATIC_SMEM, g_dyn_smem, g_dyn_bytes, EMU_REDZONE,
                         sched == SCHED_RANDOM);
    std::vector<uint64_t> perm;
    if (sched == SCHED_RANDOM) { // every block once, in a random order
        perm.resize(n_blocks);
        for (uint64_t b = 0; b < n_blocks; b++)
            perm[b] = b;
        for (uint64_t b = n_blocks - 1; b > 0; b--)
            std::swap(perm[b], perm[emu_rand() % (b + 1)]);
    }
    // VELA_EMU_SAMPLE_BLOCKS=N: n_run of the blocks, the j-th of them block
    // j * (n_blocks - 1) / (n_run - 1) in the order above (first and last
    // always; evenly spaced, so a homogeneous grid's per-block traffic scales).
    const uint64_t sample = emu_sample_blocks();
    const uint64_t n_run = sample && n_blocks > sample ? sample : n_blocks;
    for (uint64_t j = 0; j < n_run && !g_block_fault; j++) {
        const uint64_t k =
            n_run == n_blocks ? j : (uint64_t)((unsigned __int128)j * (n_blocks - 1) / (n_run - 1));
        const uint64_t b = sched == SCHED_RANDOM    ? perm[k]
                           : sched == SCHED_REVERSE ? n_blocks - 1 - k
                                                    : k;
        blockIdx.x = (unsigned)(b % grid.x);
        blockIdx.y = (unsigned)(b / grid.x % grid.y);
        blockIdx.z = (unsigned)(b / ((uint64_t)grid.x * grid.y));
        emu_chk_block_begin(b);
        run_block();
    }
    emu_chk_launch_blocks(n_run, n_blocks);
    emu_chk_launch_end();
    g_dyn_smem = NULL;
}

// A kernel runs on the device of its stream, which must be the current one
// (hardware refuses the launch: "invalid resource handle"); a pointer
// argument into another device's allocation would fault on hardware when
// dereferenced (no peer access is enabled), so it is reported at the launch,
// whether or not the kernel would touch it. Both are sticky here: a test
// cannot miss them. Pointers inside struct arguments are not scanned.
bool emu_check_launch(const char *name, cudaStream_t s, const void *const *ptrs, int n_ptrs) {
    const int sd = stream_of(s)->device;
    if (sd != t_device) {
        raise_sticky(cudaErrorInvalidResourceHandle,
                     "kernel %s launched on a stream of device %d while device %d is current "
                     "(a missing cudaSetDevice)", name, sd, t_device);
        return false;
    }
    std::lock_guard<std::mutex> lk(g_mu);
    for (int i = 0; i < n_ptrs; i++) {
        auto *a = find_alloc_locked(ptrs[i], 0);
        if (a && a->second.device != sd) {
            raise_sticky(cudaErrorIllegalAddress,
                         "kernel %s on device %d: pointer argument %d (%p) points into an "
                         "allocation of device %d (%p, %zu bytes); peer access is not enabled",
                         name, sd, i, ptrs[i], a->second.device, (const void *)a->first,
                         a->second.bytes);
            return false;
        }
    }
    return true;
}

void emu_run_kernel(const char *name, const void *fn, dim3 grid, dim3 block, size_t shmem,
                    cudaStream_t s, std::function<void()> body) {
    const uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (threads == 0 || threads > EMU_MAX_THREADS || block.z > 64 || grid.x == 0 ||
        grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
        fprintf(stderr, "vela-emu: %s: invalid launch configuration grid (%u,%u,%u) block "
                        "(%u,%u,%u)\n", name, grid.x, grid.y, grid.z, block.x, block.y, block.z);
        set_last(cudaErrorInvalidConfiguration);
        return;
    }
    int allowed = 48 * 1024;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        auto it = g_fn_smem.find(fn);
        if (it != g_fn_smem.end() && it->second > allowed)
            allowed = it->second;
    }
    if (shmem > (size_t)allowed) {
        fprintf(stderr, "vela-emu: %s: %zu bytes of dynamic shared memory, %d allowed (raise "
                        "cudaFuncAttributeMaxDynamicSharedMemorySize)\n", name, shmem, allowed);
        set_last(cudaErrorInvalidValue);
        return;
    }
    static const char *trace = getenv("VELA_EMU_TRACE");
    if (trace && *trace == '1')
        fprintf(stderr, "vela-emu: launch %s grid (%u,%u,%u) block (%u,%u,%u) shmem %zu%s\n", name,
                grid.x, grid.y, grid.z, block.x, block.y, block.z, shmem,
                stream_of(s)->capturing ? " (captured)" : "");
    std::string nm = name;
    enqueue(s, [nm, fn, grid, block, shmem, body]() {
        if (g_sticky)
            return; // a faulted context runs nothing more
        run_kernel_now(nm.c_str(), fn, grid, block, shmem, body);
    });
}

// --- cuBLAS ----------------------------------------------------------------------------

// A handle belongs to the device current at cublasCreate.
struct emu_cublas {
    cudaStream_t stream;
    int device;
};

extern "C" cublasStatus_t cublasCreate(cublasHandle_t *h) {
    *h = new emu_cublas{NULL, t_device};
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasDestroy(cublasHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (stream_of(s)->device != h->device) {
        fprintf(stderr, "vela-emu: cublasSetStream: a stream of device %d for a handle of device "
                        "%d\n", stream_of(s)->device, h->device);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m) {
    (void)h;
    (void)m;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t b) {
    (void)h;
    (void)ws;
    (void)b;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_EXECUTION_FAILED";
    }
}

static double load_elem(const void *p, cudaDataType_t t, size_t i) {
    switch (t) {
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_64F: return ((const double *)p)[i];
    case CUDA_R_16F: return emu_f16_to_f32(((const uint16_t *)p)[i]);
    case CUDA_R_16BF: return emu_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return NAN;
    }
}

// Column-major C[m x n] = alpha op(A)[m x k] op(B)[k x n] + beta C, in double,
// rounded once to f32: the exact result up to one rounding (cuBLAS's f32
// accumulation is within the tests' stated tolerance of it).
extern "C" cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta,
                                       cublasOperation_t tb, int m, int n, int k,
                                       const void *alpha, const void *A, cudaDataType_t at,
                                       int lda, const void *B, cudaDataType_t bt, int ldb,
                                       const void *beta, void *C, cudaDataType_t ct, int ldc,
                                       cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    (void)algo;
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (m < 0 || n < 0 || k < 0 || ct != CUDA_R_32F ||
        (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC &&
         compute != CUBLAS_COMPUTE_32F_FAST_TF32) ||
        (at == CUDA_R_32F) != (bt == CUDA_R_32F))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (lda < std::max(1, ta == CUBLAS_OP_N ? m : k) || ldb < std::max(1, tb == CUBLAS_OP_N ? k : n) ||
        ldc < std::max(1, m))
        return CUBLAS_STATUS_INVALID_VALUE;
    const size_t esz_a = at == CUDA_R_32F ? 4 : at == CUDA_R_64F ? 8 : 2;
    const size_t esz_b = bt == CUDA_R_32F ? 4 : bt == CUDA_R_64F ? 8 : 2;
    // The operands must lie inside device allocations.
    const size_t a_elems = ta == CUBLAS_OP_N ? (size_t)lda * (k - 1) + m : (size_t)lda * (m - 1) + k;
    const size_t b_elems = tb == CUBLAS_OP_N ? (size_t)ldb * (n - 1) + k : (size_t)ldb * (k - 1) + n;
    if (m && n && k &&
        (ptr_kind(A, a_elems * esz_a) != EMU_DEV || ptr_kind(B, b_elems * esz_b) != EMU_DEV ||
         ptr_kind(C, ((size_t)ldc * (n - 1) + m) * 4) != EMU_DEV)) {
        fprintf(stderr, "vela-emu: cublasGemmEx operand outside a device allocation\n");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    // The handle's device must be current, and its operands that device's.
    if (t_device != h->device) {
        raise_sticky(cudaErrorInvalidResourceHandle, "cublasGemmEx: a handle of device %d used "
                     "while device %d is current", h->device, t_device);
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    if (m && n && k) {
        const void *ops[3] = {A, B, C};
        for (int i = 0; i < 3; i++) {
            const int d = emu_ptr_owner(ops[i]);
            if (d != h->device) {
                raise_sticky(cudaErrorIllegalAddress, "cublasGemmEx on device %d: operand %c "
                             "(%p) is memory of device %d; peer access is not enabled",
                             h->device, "ABC"[i], ops[i], d);
                return CUBLAS_STATUS_EXECUTION_FAILED;
            }
        }
    }
    const float al = *(const float *)alpha, be = *(const float *)beta;
    enqueue(h->stream, [=]() {
        if (g_sticky)
            return;
        std::vector<double> arow(k);
        for (int i = 0; i < m; i++) {
            for (int l = 0; l < k; l++)
                arow[l] = load_elem(A, at, ta == CUBLAS_OP_N ? (size_t)l * lda + i
                                                             : (size_t)i * lda + l);
            for (int j = 0; j < n; j++) {
                double s = 0.0;
                if (tb == CUBLAS_OP_N) {
                    for (int l = 0; l < k; l++)
                        s += arow[l] * load_elem(B, bt, (size_t)j * ldb + l);
                } else {
                    for (int l = 0; l < k; l++)
                        s += arow[l] * load_elem(B, bt, (size_t)l * ldb + j);
                }
                float *c = (float *)C + (size_t)j * ldc + i;
                const double prev = be != 0.0f ? (double)*c * be : 0.0;
                *c = (float)(al * s + prev);
            }
        }
        for (int j = 0; j < n; j++)
            emu_mark_written((float *)C + (size_t)j * ldc, (size_t)m * sizeof(float));
    });
    return CUBLAS_STATUS_SUCCESS;
}
