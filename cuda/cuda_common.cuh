// Helpers shared by the kernel files: launch/error checks and warp reductions.
// Everything here is static (internal to each translation unit).
#ifndef VELA_CUDA_COMMON_CUH
#define VELA_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "cuda/cuda_boundary.h"

// After every kernel launch: launch-configuration errors (bad grid, too much
// shared memory, no kernel image for this GPU) surface here; faults inside
// the kernel surface at the next synchronizing call.
#define VELA_CHECK_LAUNCH(err, what)                                                               \
    do {                                                                                           \
        cudaError_t e_ = cudaGetLastError();                                                       \
        if (e_ != cudaSuccess)                                                                     \
            return verr_set((err), VERR_BACKEND, "%s: %s (%s:%d)", (what), cudaGetErrorString(e_), \
                            __FILE__, __LINE__);                                                   \
    } while (0)

// Any CUDA runtime call returning cudaError_t.
#define VELA_CUDA_CALL(err, stmt)                                                                  \
    do {                                                                                           \
        cudaError_t e_ = (stmt);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return verr_set((err), VERR_BACKEND, "%s: %s (%s:%d)", #stmt, cudaGetErrorString(e_),  \
                            __FILE__, __LINE__);                                                   \
    } while (0)

#define VELA_WARP 32
#define VELA_FULL_MASK 0xffffffffu

// Butterfly reductions: every lane ends with the result.
static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(VELA_FULL_MASK, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(VELA_FULL_MASK, v, o));
    return v;
}

static __host__ __device__ __forceinline__ float f16_bits_to_f32(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}

static __host__ __device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) {
#ifdef __CUDA_ARCH__
    return __uint_as_float((uint32_t)h << 16);
#else
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

// silu(g) * u, the one expression of the swiglu op (elementwise.cu) and of
// the fused gate/up mat-vec (matvec.cu), so fused and unfused agree bit for bit.
static __device__ __forceinline__ float vela_silu_mul(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

// gelu(g) * u, the one expression of the geglu op (elementwise.cu) and of
// the fused gate/up mat-vecs: the CPU backend's gelu_f16 (host/ops/backend.h,
// geglu: ggml's f16-table GELU), with every operation rounded as written
// (no contraction into FMAs) as in the CPU's C.
static __device__ __forceinline__ float vela_gelu_f16(float g) {
    if (g <= -10.0f)
        return 0.0f;
    if (g >= 10.0f)
        return g;
    const float x = __half2float(__float2half_rn(g));
    const float inner =
        __fmul_rn(__fmul_rn(0.79788456080286535587989211986876f, x),
                  __fadd_rn(1.0f, __fmul_rn(__fmul_rn(0.044715f, x), x)));
    const float y = __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner)));
    return __half2float(__float2half_rn(y));
}
static __device__ __forceinline__ float vela_gelu_mul(float g, float u) {
    return vela_gelu_f16(g) * u;
}

static inline unsigned int ceil_div_u(int64_t a, int64_t b) {
    return (unsigned int)((a + b - 1) / b);
}

#endif
