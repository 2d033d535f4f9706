// RoPE arithmetic on the device, shared by rope.cu (rotate, store, shift)
// and attention.cu (the unrotated cache mode rotates q and K inside
// attention, host/ops/selfextend.h): the angle of pair i formed exactly as
// the CPU reference forms it (see rope.cu's top comment).
#ifndef VELA_CUDA_ROPE_CUH
#define VELA_CUDA_ROPE_CUH

#include "cuda/cuda_common.cuh"
#include "cuda/rope.h"

static __device__ __forceinline__ float rope_ramp(float lo, float hi, int i) {
    const float d = 0.001f > __fsub_rn(hi, lo) ? 0.001f : __fsub_rn(hi, lo);
    const float y = __fsub_rn((float)i, lo) / d;
    const float c = 0.0f > y ? 0.0f : y;
    return __fsub_rn(1.0f, 1.0f < c ? 1.0f : c);
}

// The running product of pair i at position pos: pos * theta_scale^i as i
// float multiplications in a row. Pair i + 1's is __fmul_rn(it, theta_scale):
// a loop over consecutive pairs walks it with one multiplication a pair.
static __device__ __forceinline__ float rope_theta(const struct cuda_rope &c, float pos, int i) {
    float theta = pos;
    for (int j = 0; j < i; j++)
        theta = __fmul_rn(theta, c.theta_scale);
    return theta;
}

// cos/sin (times mscale) of pair i whose running product is theta (rope_theta).
static __device__ __forceinline__ void rope_cos_sin_theta(const struct cuda_rope &c, float theta,
                                                          int i, float *cs, float *sn) {
    const float theta_extrap = c.freq_factors ? theta / c.freq_factors[i] : theta;
    const float theta_interp = __fmul_rn(c.freq_scale, theta_extrap);
    float t = theta_interp;
    if (c.ext_factor != 0.0f) {
        const float mix = __fmul_rn(rope_ramp(c.corr_lo, c.corr_hi, i), c.ext_factor);
        t = __fadd_rn(__fmul_rn(theta_interp, __fsub_rn(1.0f, mix)), __fmul_rn(theta_extrap, mix));
    }
    *cs = __fmul_rn(cosf(t), c.mscale);
    *sn = __fmul_rn(sinf(t), c.mscale);
}

// cos/sin (times mscale) of pair i at position pos.
static __device__ __forceinline__ void rope_cos_sin(const struct cuda_rope &c, float pos, int i,
                                                    float *cs, float *sn) {
    rope_cos_sin_theta(c, rope_theta(c, pos, i), i, cs, sn);
}

static __device__ __forceinline__ void rope_rotate(float x0, float x1, float cs, float sn,
                                                   float *y0, float *y1) {
    *y0 = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
    *y1 = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs));
}

// Element offsets of pair i inside a head.
static __device__ __forceinline__ void rope_pair(int mode, int n_rot, int i, int *e0, int *e1) {
    if (mode == 2) { // NeoX
        *e0 = i;
        *e1 = i + n_rot / 2;
    } else {
        *e0 = 2 * i;
        *e1 = 2 * i + 1;
    }
}

#endif
