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

#include <utility>

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

#endif
