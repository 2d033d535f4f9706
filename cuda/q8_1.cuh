// The q8_1 activation quantizer as a warp-level device function, shared by
// matvec_q8.cu (cuda_quantize_q8_1) and norm.cu (rms_norm that also writes
// its output as q8_1 for the next mat-vec). The arithmetic of gguf/quant_q8.c's
// quant_q8_1_row, operation for operation, so every caller is bit-identical
// to the CPU reference (fmaxf ignores NaN in both; the max and the integer
// sum are exact in any order). Block layout: gguf/quant_q8.h.
#ifndef VELA_CUDA_Q8_1_CUH
#define VELA_CUDA_Q8_1_CUH

#include "cuda/cuda_common.cuh"

#define Q8_1_BLOCK_BYTES 36 // QUANT_Q8_1_BLOCK_BYTES

// Lane l of a full warp holds element l of one 32-element block; the warp
// writes the block to blk (4-byte aligned). Every lane must call it.
static __device__ __forceinline__ void q8_1_store_warp(uint8_t *blk, float v, int lane) {
    const float amax = warp_max(fmaxf(0.0f, fabsf(v)));
    const float d = amax / 127.0f;
    const uint32_t d16 = __half_as_ushort(__float2half_rn(d));
    int q = 0;
    uint32_t s16 = 0;
    if ((d16 & 0x7fffu) != 0) { // uniform across the warp
        const float id = 1.0f / d;
        q = (int)fminf(fmaxf(roundf(v * id), -127.0f), 127.0f);
        int sum = q;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            sum += __shfl_xor_sync(VELA_FULL_MASK, sum, o);
        s16 = __half_as_ushort(__float2half_rn(d * (float)sum));
    }
    blk[4 + lane] = (uint8_t)(int8_t)q;
    if (lane == 0)
        *(uint32_t *)blk = d16 | (s16 << 16); // d16 == 0 exactly for a zero block (d >= 0)
}

#endif
