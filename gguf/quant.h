// Quantized weight formats: conversion between float32 and every supported
// ggml block type, bit-exact with llama.cpp's reference (de)quantizers.
//
// Contract: n must be a multiple of the type's block size; src/dst are rows of
// n elements ([n] float32 on one side, ggml_row_bytes(type, n) bytes on the
// other). Returns 0, or VERR_UNSUPPORTED / VERR_RANGE with a message.
//
// Quantizing (quant_can_quantize): F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1
// bit-exact with ggml's quantize_row_*_ref; Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
// IQ4_NL, IQ4_XS with vela's own least-squares scale search (see quant.c); MXFP4 bit-exact with
// quantize_row_mxfp4_ref (but for blocks below 2^-125, quant.c). Block types refuse
// non-finite input and |x| large enough to overflow an f16 scale (VERR_RANGE); F16/BF16 store
// inf/NaN as they are and F16 overflows to inf. Dequantizing (quant_can_dequantize): the above,
// bit-exact with ggml's dequantize_row_*.
#ifndef VELA_GGUF_QUANT_H
#define VELA_GGUF_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include <string.h>

#include "gguf/types.h"
#include "gguf/verr.h"

float quant_fp16_to_f32(uint16_t h);
uint16_t quant_f32_to_fp16(float f); // round to nearest even, as the F16C instruction
float quant_bf16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f); // round to nearest even; NaN stays NaN

bool quant_can_dequantize(enum ggml_type type);
bool quant_can_quantize(enum ggml_type type);
// The weight types vela runs (CPU reference and CUDA backend): F32, F16, BF16,
// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS.
// A subset of quant_can_dequantize.
bool quant_type_supported(enum ggml_type type);

// Q3_K's 16 signed 6-bit group scales in its 12-byte scales field: the low
// nibble of scale g in byte g % 8 (the high nibble for g >= 8), its top 2
// bits at bit 2(g/4) of byte 8 + g % 4, stored + 32. Scale g, and the
// inverse (sc[g] in [-32, 31]).
int quant_q3_k_scale(const uint8_t s[12], int g);
void quant_q3_k_pack_scales(uint8_t s[12], const int sc[16]);

// IQ4_NL's and IQ4_XS's 16 levels (a value is scale * level[nibble]).
extern const int8_t quant_iq4_levels[16];
// IQ4_XS group g's (0..7) scale in [-32, 31], of the block at b: a 6-bit
// code stored + 32, its low 4 bits in nibble g % 2 of scales_l[g / 2] (byte
// 4 + g / 2), its top 2 bits at bit 2g of the u16 scales_h (bytes 2..3).
// Inline: the CPU q8 kernels read it per group. quant_iq4_xs_pack_scales is
// the inverse (sc[g] in [-32, 31]; writes bytes 2..7).
static inline int quant_iq4_xs_scale(const uint8_t *b, int g) {
    const unsigned sh = (unsigned)(b[2] | (b[3] << 8));
    return (int)(((b[4 + g / 2] >> 4 * (g % 2)) & 0x0fu) | (((sh >> 2 * g) & 3u) << 4)) - 32;
}
void quant_iq4_xs_pack_scales(uint8_t *b, const int sc[8]);

// MXFP4 (17 bytes per 32: the E8M0 byte e, then qs[16] as IQ4_NL's): element
// l is level[nibble] * 2^(e - 128), the levels being E2M1's values doubled
// (0, +-1, 2, 3, 4, 6, 8, 12; nibble 8 is -0 and decodes to 0). The scale is
// ggml's ggml_e8m0_to_fp32_half, bit for bit: 2^(e-128) for every e, the
// float subnormals 2^-128 and 2^-127 for e = 0 and 1, and 2^127 for e = 255
// (E8M0's NaN code; quant_validate_row refuses it, as ggml does).
extern const int8_t quant_mxfp4_levels[16];
static inline float quant_e8m0_half_to_f32(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

int quant_dequantize_row(enum ggml_type type, const void *src, float *dst, int64_t n,
                         struct verr *err);
int quant_quantize_row(enum ggml_type type, const float *src, void *dst, int64_t n,
                       struct verr *err);

// Dot product of one stored row with a float32 vector, accumulated in float32
// over the dequantized values (the CPU reference's matmul inner loop).
// Precondition: quant_can_dequantize(type), n a multiple of the block size.
// (Added: a call that breaks the precondition returns NaN rather than abort.)
float quant_dot_row(enum ggml_type type, const void *row, const float *x, int64_t n);

// Added: checks a stored row (n elements) before it is used: F32/F16/BF16
// elements and every block's f16 scale fields must be finite (as llama.cpp's
// ggml_validate_row_data). Returns 0, VERR_FORMAT naming the element or block,
// or VERR_UNSUPPORTED / VERR_RANGE as the row functions.
int quant_validate_row(enum ggml_type type, const void *src, int64_t n, struct verr *err);

#endif
