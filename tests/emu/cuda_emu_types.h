// vela CUDA emulator (tests/emu): device types (vector types, __half,
// __nv_bfloat16) and their conversions, bit-exact with IEEE round to nearest
// even as the CUDA intrinsics are. C++ only.
#ifndef VELA_EMU_TYPES_H
#define VELA_EMU_TYPES_H

#include <stdint.h>
#include <string.h>

#include <cmath>

struct uint3 { unsigned int x, y, z; };
struct int3 { int x, y, z; };
struct __attribute__((aligned(8))) float2 { float x, y; };
struct float3 { float x, y, z; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(8))) int2 { int x, y; };
struct __attribute__((aligned(16))) int4 { int x, y, z, w; };
struct __attribute__((aligned(8))) uint2 { unsigned int x, y; };
struct __attribute__((aligned(16))) uint4 { unsigned int x, y, z, w; };
struct __attribute__((aligned(16))) double2 { double x, y; };
struct __attribute__((aligned(2))) ushort2_ { unsigned short x, y; };
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline int2 make_int2(int x, int y) { return {x, y}; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

static inline uint32_t emu_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float emu_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

// float -> binary16, round to nearest even; NaN -> 0x7fff (as __float2half_rn).
static inline uint16_t emu_f32_to_f16(float f) {
    const uint32_t x = emu_f2u(f);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return 0x7fffu;
    if (ax >= 0x477ff000u) // >= 65520 rounds to inf
        return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) // normal half
        return (uint16_t)(sign | ((ax - 0x38000000u + 0xfffu + ((ax >> 13) & 1u)) >> 13));
    if (ax <= 0x33000000u) // <= 2^-25: zero (the tie rounds to even 0)
        return (uint16_t)sign;
    const uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
    const int shift = 126 - (int)e; // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u)))
        r++;
    return (uint16_t)(sign | r);
}

static inline float emu_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        const float v = (float)m * 5.9604644775390625e-8f; // m * 2^-24, exact
        return emu_u2f(emu_f2u(v) | sign);
    }
    if (e == 31)
        return emu_u2f(sign | 0x7f800000u | (m << 13));
    return emu_u2f(sign | ((e + 112) << 23) | (m << 13));
}

static inline uint16_t emu_f32_to_bf16(float f) {
    const uint32_t x = emu_f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return 0x7fffu;
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
static inline float emu_bf16_to_f32(uint16_t h) { return emu_u2f((uint32_t)h << 16); }

struct __attribute__((aligned(2))) __half {
    uint16_t __x;
};
struct __attribute__((aligned(4))) __half2 {
    __half x, y;
};
struct __attribute__((aligned(2))) __nv_bfloat16 {
    uint16_t __x;
};
struct __attribute__((aligned(4))) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
typedef __half half;
typedef __half2 half2;
typedef __nv_bfloat16 nv_bfloat16;

static inline float __half2float(__half h) { return emu_f16_to_f32(h.__x); }
static inline __half __float2half_rn(float f) { return __half{emu_f32_to_f16(f)}; }
static inline __half __float2half(float f) { return __float2half_rn(f); }
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
static inline short __half_as_short(__half h) { return (short)h.__x; }
static inline __half2 __floats2half2_rn(float a, float b) {
    return __half2{__float2half_rn(a), __float2half_rn(b)};
}
static inline __half2 __float2half2_rn(float a) { return __floats2half2_rn(a, a); }
static inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
static inline float __low2float(__half2 h) { return __half2float(h.x); }
static inline float __high2float(__half2 h) { return __half2float(h.y); }
static inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }

static inline float __bfloat162float(__nv_bfloat16 h) { return emu_bf16_to_f32(h.__x); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{emu_f32_to_bf16(f)}; }
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16{u}; }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}

#endif
