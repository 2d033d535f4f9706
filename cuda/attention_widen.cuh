// 16 bytes of K/V cache elements widened to float (exact for f16): the tile
// loads of attention.cu's attn_kernel and the register loads of
// attention_decode.cu's attn_dec_kernel. The second argument picks the type.
#ifndef VELA_CUDA_ATTENTION_WIDEN_CUH
#define VELA_CUDA_ATTENTION_WIDEN_CUH

#include "cuda/cuda_common.cuh"

static __device__ __forceinline__ void attn_widen(const uint4 &u, const float *, float *f) {
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
}
static __device__ __forceinline__ void attn_widen(const uint4 &u, const __half *, float *f) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 p = __half22float2(*(const __half2 *)&w[i]);
        f[2 * i] = p.x;
        f[2 * i + 1] = p.y;
    }
}

#endif
