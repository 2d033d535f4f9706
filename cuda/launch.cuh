// Kernel launches with or without programmatic dependent launch (PDL, sm_90).
//
// cuda_launch(pdl, kernel, grid, block, smem, stream, args...) launches like
// kernel<<<grid, block, smem, stream>>>(args...); with pdl, the launch carries
// cudaLaunchAttributeProgrammaticStreamSerialization, so its blocks may start
// (and run what comes before cuda_pdl_wait) while the kernel before it on
// the stream is still running. That holds inside stream capture too: the
// graph keeps the edge as a programmatic one.
//
// Contract of a kernel launched with pdl: every thread calls cuda_pdl_wait()
// before it reads anything an earlier launch wrote (activations, the KV
// cache, positions), before it writes anything, and before it returns; only
// what no kernel writes (weights, constants) may be read before it.
// cudaGridDependencySynchronize waits for the whole previous grid to complete
// and its writes to be visible, and the previous grid got there only after
// its own wait: so a kernel reading the output of two launches back is safe
// as well. A kernel launched without pdl (attention, MoE routing, copies)
// waits for everything before it as usual, so launches with and without
// pdl mix freely on one stream.
//
// pdl is a request: the caller (cuda/backend_cuda.c) turns it on only on
// devices of compute capability 9.0 and up. On the device, cuda_pdl_wait
// compiles to nothing below sm_90, where no launch carries the attribute.
#ifndef VELA_CUDA_LAUNCH_CUH
#define VELA_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>

#include <atomic>
#include <stdint.h>
#include <utility>

#include "cuda/cuda_common.cuh"

// Every thread of a kernel cuda_launch may launch with pdl, before its first
// read of an earlier kernel's output (contract above). Then it lets the next
// pdl launch start: that one's blocks wait in their own cuda_pdl_wait for
// this grid to complete.
static __device__ __forceinline__ void cuda_pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion();
#endif
}

// The launch's error, also left for cudaGetLastError (VELA_CHECK_LAUNCH).
template <typename... P, typename... A>
static inline cudaError_t cuda_launch(bool pdl, void (*kernel)(P...), dim3 grid, dim3 block,
                                      size_t smem, cudaStream_t stream, A &&...args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

// --- persistent (streaming) grids ---------------------------------------------

// Blocks of a persistent grid whose warps stream n items each (the mat-vecs'
// streaming kernels): sm_count * blocks_per_sm blocks at most (no more per
// multiprocessor than its shared memory holds at once with smem per block, 1
// KiB of it reserved per block; shared by the n_y blocks of an expert
// launch's y), so k = ceil(n / their warps) items per warp (at most k_max
// where > 0), and just enough blocks that every warp gets k items, the last
// ones k - 1: the warps end together. sm_count or smem_per_sm <= 0: unknown
// (1 multiprocessor, no shared-memory cap).
static inline unsigned int cuda_stream_blocks(int sm_count, int64_t smem_per_sm,
                                              int64_t blocks_per_sm, int64_t n, unsigned int n_y,
                                              size_t smem, int warps_per_block, int64_t k_max) {
    int64_t bps = blocks_per_sm;
    const int64_t fit = smem_per_sm > 0 ? smem_per_sm / (int64_t)(smem + 1024) : bps;
    if (bps > fit)
        bps = fit > 0 ? fit : 1;
    int64_t blocks = (sm_count > 0 ? sm_count : 1) * bps / (n_y > 0 ? n_y : 1);
    if (blocks < 1)
        blocks = 1;
    int64_t k = (n + blocks * warps_per_block - 1) / (blocks * warps_per_block);
    if (k_max > 0 && k > k_max)
        k = k_max;
    if (k < 1)
        k = 1;
    const int64_t warps = (n + k - 1) / k;
    return (unsigned int)((warps + warps_per_block - 1) / warps_per_block);
}

// Raises kernel's dynamic shared memory limit to limit bytes on the current
// device when a launch takes smem > 47 KiB, once per device and value
// reached (raised[d]: the limit set on device d; devices >= 64 set it every
// time).
template <typename K>
static int cuda_raise_smem(K kernel, std::atomic<int> *raised, size_t smem, size_t limit,
                           struct verr *err) {
    if (smem <= 47 * 1024)
        return VERR_OK;
    int dev = 0;
    VELA_CUDA_CALL(err, cudaGetDevice(&dev));
    if (dev < 64 && raised[dev].load() >= (int)limit)
        return VERR_OK;
    VELA_CUDA_CALL(
        err, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)limit));
    if (dev < 64)
        raised[dev].store((int)limit);
    return VERR_OK;
}

#endif
