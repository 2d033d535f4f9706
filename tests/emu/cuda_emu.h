// vela CUDA emulator (tests/emu): force-included (-include) into every
// cuda/*.cu after tests/emu/cu2cpp.py has rewritten its kernel launches into
// emu_launch(...) calls, so the .cu compiles as host C++17. Kernels run on
// the CPU: the threads of a block are cooperative fibers on one OS thread
// (tests/emu/emu_runtime.cpp); __syncthreads and the warp intrinsics are
// barriers that also check that every thread reaches the same one.
#ifndef VELA_EMU_CUDA_EMU_H
#define VELA_EMU_CUDA_EMU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_runtime_api.h"
#include "cuda_emu_types.h"

// Device code is compiled as such: __CUDA_ARCH__ selects the device paths
// (e.g. __fmul_rn in cuda/dequant.cuh), as nvcc's device pass would.
#define __CUDA_ARCH__ 900
#define __CUDACC__ 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __constant__ static
#define __managed__
// Static shared memory in converted files is rewritten by cu2cpp.py into
// emu_shared_var (below). What is left (a __shared__ in a header the .cu
// includes): one instance per kernel (blocks run one at a time), in a
// section that the runtime fills with 0xff bytes (NaN floats, -1 ints)
// before every block, not watched by racecheck; GCC ignores the section in
// function templates.
#define __shared__ static __attribute__((section("emu_shared"), aligned(16)))

// --- builtin variables ----------------------------------------------------------
extern __thread uint3 threadIdx;
extern __thread uint3 blockIdx;
extern __thread dim3 blockDim;
extern __thread dim3 gridDim;
static const int warpSize = 32;

// --- block / warp operations (emu_runtime.cpp) ------------------------------------
enum emu_op {
    EMU_SYNC = 1,   // __syncthreads family
    EMU_SYNC_OR,
    EMU_SYNC_AND,
    EMU_SYNC_COUNT,
    EMU_W_SYNC = 16, // warp ops from here
    EMU_W_SHFL,
    EMU_W_SHFL_UP,
    EMU_W_SHFL_DOWN,
    EMU_W_SHFL_XOR,
    EMU_W_BALLOT,
    EMU_W_ANY,
    EMU_W_ALL,
    EMU_W_MATCH_ANY,
};
// Waits until every thread of the block (warp ops: every lane of `mask`)
// arrives, returns this thread's result. `what` names the call in reports.
uint64_t emu_barrier(int op, uint64_t val, int param, int width, unsigned mask, const char *what,
                     const void *site);
unsigned emu_activemask(void);
void *emu_dynamic_smem(void);
// Static shared memory (cu2cpp.py rewrites `__shared__ T x[N];`): the place
// of the declaration `key` in the running launch's static shared memory,
// the same for every thread of a block, refilled with 0xff before a block.
void *emu_static_smem(const void *key, size_t size, size_t align);
template <typename T, size_t A, typename K> static inline T &emu_shared_var(K) {
    static const char key = 0; // one per declaration (K: its lambda) and template instance
    return *(T *)emu_static_smem(&key, sizeof(T), A > alignof(T) ? A : alignof(T));
}
[[noreturn]] void emu_trap(const char *what);

#define EMU_STR2(x) #x
#define EMU_STR(x) EMU_STR2(x)
#define EMU_SITE(op) op " at " __FILE__ ":" EMU_STR(__LINE__)
// Block barriers name their call site: threads waiting at two different
// __syncthreads of one kernel are reported as a divergent barrier.
#define __syncthreads() (void)emu_barrier(EMU_SYNC, 0, 0, 0, 0, EMU_SITE("__syncthreads"), nullptr)
#define __syncthreads_or(p) (int)emu_barrier(EMU_SYNC_OR, (p) != 0, 0, 0, 0, EMU_SITE("__syncthreads_or"), nullptr)
#define __syncthreads_and(p) (int)emu_barrier(EMU_SYNC_AND, (p) != 0, 0, 0, 0, EMU_SITE("__syncthreads_and"), nullptr)
#define __syncthreads_count(p) (int)emu_barrier(EMU_SYNC_COUNT, (p) != 0, 0, 0, 0, EMU_SITE("__syncthreads_count"), nullptr)
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    (void)emu_barrier(EMU_W_SYNC, 0, 0, 32, mask, "__syncwarp", nullptr);
}
static inline unsigned __activemask(void) { return emu_activemask(); }
static inline void __threadfence(void) {}
static inline void __threadfence_block(void) {}
static inline void __trap(void) { emu_trap("__trap"); }

template <typename T> static inline uint64_t emu_bits(T v) {
    static_assert(sizeof(T) <= 8, "warp shuffles of at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    return b;
}
template <typename T> static inline T emu_from_bits(uint64_t b) {
    T v;
    memcpy(&v, &b, sizeof(T));
    return v;
}
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return emu_from_bits<T>(emu_barrier(EMU_W_SHFL, emu_bits(v), src, width, mask, "__shfl_sync", nullptr));
}
template <typename T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    return emu_from_bits<T>(emu_barrier(EMU_W_SHFL_UP, emu_bits(v), (int)d, width, mask, "__shfl_up_sync", nullptr));
}
template <typename T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    return emu_from_bits<T>(emu_barrier(EMU_W_SHFL_DOWN, emu_bits(v), (int)d, width, mask, "__shfl_down_sync", nullptr));
}
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
    return emu_from_bits<T>(emu_barrier(EMU_W_SHFL_XOR, emu_bits(v), m, width, mask, "__shfl_xor_sync", nullptr));
}
static inline unsigned __ballot_sync(unsigned mask, int p) {
    return (unsigned)emu_barrier(EMU_W_BALLOT, p != 0, 0, 32, mask, "__ballot_sync", nullptr);
}
static inline int __any_sync(unsigned mask, int p) {
    return (int)emu_barrier(EMU_W_ANY, p != 0, 0, 32, mask, "__any_sync", nullptr);
}
static inline int __all_sync(unsigned mask, int p) {
    return (int)emu_barrier(EMU_W_ALL, p != 0, 0, 32, mask, "__all_sync", nullptr);
}
template <typename T> static inline unsigned __match_any_sync(unsigned mask, T v) {
    return (unsigned)emu_barrier(EMU_W_MATCH_ANY, emu_bits(v), 0, 32, mask, "__match_any_sync", nullptr);
}

// --- memory checks (emu_check.cpp) ----------------------------------------------------
// Loads and stores of the converted code reach the checks through GCC's
// -fsanitize=thread instrumentation; what the emulator does on the
// kernel's behalf (atomics, cp.async, the cub shim) reports itself here.
// site: the return address inside the kernel, for the report's source line.
void emu_chk_access(const void *p, size_t n, int write, int atomic, const void *site);
// A cp.async with zero-fill (zfill > 0) whose whole `window` bytes from src
// do not lie inside src's allocation: compute-sanitizer on the H200 reported
// these as out-of-bounds reads (matmul_tc's last chunk, the first GPU run),
// though PTX reads only window - zfill bytes; reported the same way here.
void emu_chk_cp_async_window(const void *src, size_t window, size_t zfill, const void *site);
// Outside kernels (locks the runtime): bytes now written; a read of device
// memory that must have been written (else a sticky fault naming `what`).
void emu_mark_written(const void *p, size_t n);
void emu_check_written(const void *p, size_t n, const char *what);

// --- atomics (one OS thread runs every device thread: plain read-modify-write) ---
// Not instrumented (no_sanitize) but checked as an atomic (initcheck,
// bounds; never a race); not inlined, so its return address is the
// kernel's line.
template <typename T, typename F>
static __attribute__((no_sanitize_thread, noinline)) T emu_atomic(T *p, F f) {
    emu_chk_access(p, sizeof(T), 1, 1, __builtin_return_address(0));
    const T o = *p;
    *p = f(o);
    return o;
}
#define EMU_ATOMIC(name, expr)                                                                     \
    template <typename T, typename U> static inline T name(T *p, U v) {                            \
        return emu_atomic(p, [v](T o) { return (T)(expr); });                                      \
    }
// clang-format off (it reads "o & (T)v" as a declaration)
EMU_ATOMIC(atomicAdd, o + (T)v)
EMU_ATOMIC(atomicSub, o - (T)v)
EMU_ATOMIC(atomicMax, (T)v > o ? (T)v : o)
EMU_ATOMIC(atomicMin, (T)v < o ? (T)v : o)
EMU_ATOMIC(atomicExch, v)
EMU_ATOMIC(atomicOr, o | (T)v)
EMU_ATOMIC(atomicAnd, o &(T)v)
EMU_ATOMIC(atomicXor, o ^ (T)v)
// clang-format on
template <typename T, typename U, typename V> static inline T atomicCAS(T *p, U cmp, V v) {
    return emu_atomic(p, [cmp, v](T o) { return o == (T)cmp ? (T)v : o; });
}
#define atomicAdd_block atomicAdd
#define atomicMax_block atomicMax
#define atomicMin_block atomicMin

// --- math intrinsics (the emulator is compiled with -ffp-contract=off) -----------
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
// glibc declares these names itself: macros, not functions.
#define __expf(x) expf(x)
#define __exp10f(x) exp10f(x)
#define __logf(x) logf(x)
#define __log2f(x) log2f(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __tanf(x) tanf(x)
#define __powf(a, b) powf(a, b)
#define __sincosf(x, s, c) sincosf_emu(x, s, c)
static inline void sincosf_emu(float x, float *s, float *c) { *s = sinf(x); *c = cosf(x); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
static inline float __int2float_rn(int x) { return (float)x; }
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline int __float2int_rd(float x) { return (int)floorf(x); }
static inline unsigned int __float_as_uint(float x) { return emu_f2u(x); }
static inline float __uint_as_float(unsigned int x) { return emu_u2f(x); }
static inline int __float_as_int(float x) { return (int)emu_f2u(x); }
static inline float __int_as_float(int x) { return emu_u2f((uint32_t)x); }
static inline long long __double_as_longlong(double x) { long long r; memcpy(&r, &x, 8); return r; }
static inline double __longlong_as_double(long long x) { double r; memcpy(&r, &x, 8); return r; }
static inline int __popc(unsigned int x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline unsigned int __brev(unsigned int x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
    return (x >> 16) | (x << 16);
}
static inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
    const uint64_t v = ((uint64_t)y << 32) | x;
    unsigned int r = 0;
    for (int i = 0; i < 4; i++)
        r |= (unsigned int)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++)
        c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
template <typename T> static inline T __ldg(const T *p) { return *p; }
template <typename T> static inline T __ldcs(const T *p) { return *p; }
template <typename T> static inline T __ldcg(const T *p) { return *p; }
template <typename T> static inline void __stcs(T *p, T v) { *p = v; }
template <typename A, typename B>
static inline typename std::common_type<A, B>::type min(A a, B b) {
    typedef typename std::common_type<A, B>::type C;
    return (C)a < (C)b ? (C)a : (C)b;
}
template <typename A, typename B>
static inline typename std::common_type<A, B>::type max(A a, B b) {
    typedef typename std::common_type<A, B>::type C;
    return (C)a > (C)b ? (C)a : (C)b;
}
static inline long long clock64(void) { return 0; }

// --- launches ---------------------------------------------------------------------
// Runs body once per thread of every block (or records it while `s` is being
// captured into a graph); checks the launch configuration first, as the
// driver does, and reports bad ones through cudaGetLastError.
void emu_run_kernel(const char *name, const void *fn, dim3 grid, dim3 block, size_t shmem,
                    cudaStream_t s, std::function<void()> body);
// Multi-device checks of a launch (emu_runtime.cpp): the stream belongs to
// the current device and no pointer argument points into another device's
// allocation; false (a sticky fault) when one fails.
bool emu_check_launch(const char *name, cudaStream_t s, const void *const *ptrs, int n_ptrs);
template <typename T> static inline void emu_ptr_arg(const void **out, int *n, const T &v) {
    if constexpr (std::is_pointer<T>::value)
        out[(*n)++] = (const void *)v;
}

template <typename... P, typename... A>
static inline void emu_launch(const char *name, void (*k)(P...), dim3 grid, dim3 block,
                              size_t shmem, cudaStream_t s, A &&...args) {
    static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
    auto params = std::make_shared<std::tuple<typename std::decay<P>::type...>>(
        std::forward<A>(args)...);
    const void *ptrs[sizeof...(P) + 1];
    int n_ptrs = 0;
    std::apply([&](const auto &...a) { (emu_ptr_arg(ptrs, &n_ptrs, a), ...); }, *params);
    if (!emu_check_launch(name, s, ptrs, n_ptrs))
        return;
    emu_run_kernel(name, (const void *)k, grid, block, shmem, s,
                   [k, params]() { std::apply(k, *params); });
}

// --- cudaLaunchKernelEx and programmatic dependent launch -----------------------------
// Kernels run one after another here, so a launch's programmatic stream
// serialization (cuda/launch.cuh) overlaps nothing and the device calls
// that go with it are no-ops. The attributes are still checked as the
// driver would (an unknown one, or attrs NULL with numAttrs > 0:
// cudaErrorInvalidValue) and the PDL launches counted (emu_pdl_launches).
// emu_launch_ex_check is emu_runtime.cpp's.
cudaError_t emu_launch_ex_check(const cudaLaunchConfig_t *cfg);
// cu2cpp rewrites cuda_launch(args) in a .cu file as
// emu_named_launch("kernel<T>", [&] { return cuda_launch(args); }), so that
// the launch carries the kernel's name in reports, as a <<<>>> launch does.
inline thread_local const char *emu_launch_name;
template <typename F> static inline cudaError_t emu_named_launch(const char *name, F launch) {
    emu_launch_name = name;
    const cudaError_t e = launch();
    emu_launch_name = nullptr;
    return e;
}
template <typename... P, typename... A>
static inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *cfg, void (*k)(P...),
                                             A &&...args) {
    const cudaError_t e = emu_launch_ex_check(cfg);
    if (e != cudaSuccess)
        return e;
    emu_launch(emu_launch_name ? emu_launch_name : "cudaLaunchKernelEx", k, cfg->gridDim,
               cfg->blockDim, cfg->dynamicSmemBytes, cfg->stream, std::forward<A>(args)...);
    return cudaPeekAtLastError();
}
static inline void cudaGridDependencySynchronize(void) {}
static inline void cudaTriggerProgrammaticLaunchCompletion(void) {}

// --- asynchronous copies (cuda_pipeline_primitives.h: cp.async) ---------------------
// __pipeline_memcpy_async queues the copy for the calling thread; it lands
// (size - zfill bytes copied, zfill zero bytes after them) when that thread
// waits for its group with __pipeline_wait_prior(n), which completes every
// copy of the groups older than the n most recently committed ones, as
// cp.async.wait_group n does; copies not yet committed are not waited for.
// So a read of the destination before the issuing thread's wait (and, for
// other threads, the barrier after it) sees the old bytes, as it may on a
// GPU. Sizes 4, 8, 16 with both pointers aligned to the size, zfill <= size
// (else a kernel fault). The queue is per thread of the running block; a
// block's copies still queued when it ends are dropped (on hardware they
// land unobserved).
struct emu_cp_async_copy {
    void *dst;
    const void *src;
    size_t n, zfill;
    uint64_t group;
};
struct emu_cp_async_thread {
    emu_cp_async_copy q[64];
    int n_q = 0;
    uint64_t committed = 0;
    uint3 block = {~0u, ~0u, ~0u};
    const void *grid_id = nullptr;
};
inline thread_local emu_cp_async_thread emu_cp_async_threads[1024];
static inline emu_cp_async_thread &emu_cp_async_self(void) {
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    emu_cp_async_thread &s = emu_cp_async_threads[t & 1023];
    const void *gid = emu_dynamic_smem();
    if (s.block.x != blockIdx.x || s.block.y != blockIdx.y || s.block.z != blockIdx.z ||
        s.grid_id != gid) {
        s.n_q = 0;
        s.committed = 0;
        s.block = blockIdx;
        s.grid_id = gid;
    }
    return s;
}
static inline void emu_cp_async_land(const emu_cp_async_copy &c) {
    emu_chk_access(c.src, c.n - c.zfill, 0, 0, __builtin_return_address(0));
    emu_chk_access(c.dst, c.n, 1, 0, __builtin_return_address(0));
    memcpy(c.dst, c.src, c.n - c.zfill);
    memset((char *)c.dst + (c.n - c.zfill), 0, c.zfill);
}
// Not inlined: its return address is the kernel's line, for the reports.
__attribute__((noinline, unused)) static void
__pipeline_memcpy_async(void *dst, const void *src, size_t size_and_align, size_t zfill = 0) {
    if ((size_and_align != 4 && size_and_align != 8 && size_and_align != 16) ||
        zfill > size_and_align || ((uintptr_t)dst | (uintptr_t)src) % size_and_align != 0)
        emu_trap("__pipeline_memcpy_async: size must be 4, 8 or 16, both pointers aligned to it, "
                 "zfill <= size");
    emu_chk_cp_async_window(src, size_and_align, zfill, __builtin_return_address(0));
    emu_cp_async_thread &s = emu_cp_async_self();
    if (s.n_q == 64) { // a long queue: land the oldest (completion order is the GPU's choice)
        emu_cp_async_land(s.q[0]);
        memmove(s.q, s.q + 1, sizeof s.q[0] * 63);
        s.n_q = 63;
    }
    s.q[s.n_q++] = emu_cp_async_copy{dst, src, size_and_align, zfill, s.committed};
}
static inline void __pipeline_commit(void) { emu_cp_async_self().committed++; }
static inline void __pipeline_wait_prior(size_t n) {
    emu_cp_async_thread &s = emu_cp_async_self();
    int kept = 0;
    for (int i = 0; i < s.n_q; i++) {
        if (s.q[i].group + n < s.committed)
            emu_cp_async_land(s.q[i]);
        else
            s.q[kept++] = s.q[i];
    }
    s.n_q = kept;
}

#endif
