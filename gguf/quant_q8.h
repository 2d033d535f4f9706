// 8-bit activations for integer mat-vec products (the q8_1 path): the
// activation vector is quantized to blocks of 32 int8 with one f16 scale, and
// a weight row is dotted with it using integer sums within each 32-element
// sub-block (what the GPU does with __dp4a, cuda/matvec_q8.cu). This file is
// the CPU reference both sides must match: the quantizer bit for bit, the dot
// product term by term (only the order in which the per-sub-block float terms
// are added may differ).
//
// q8_1 block, 36 bytes, byte-compatible with ggml's block_q8_1:
//   d  @0  f16  scale: x ~ q * d
//   s  @2  f16  d * sum(q) (ggml's CPU convention), see below
//   qs @4  int8[32]
// Blocks follow each other with no padding; a row of n elements is n / 32
// blocks (36 * n / 32 bytes), so blocks are 4-byte aligned when the row is.
//
// Quantization of one block (quant_q8_1_row; cuda_quantize_q8_1 is
// bit-identical): amax = max |x| (fmaxf, NaN ignored), d = amax / 127 in
// float, D = f16(d) (round to nearest even). If D == 0 (amax < ~3.8e-6) the
// block is all zeros (d = s = 0, q = 0): every value would dequantize to 0
// anyway, and it keeps 1/d finite. Otherwise id = 1 / d (float, unrounded d,
// as ggml), q = roundf(x * id) -- round half AWAY from zero, e.g. x*id = 2.5
// gives 3 and -2.5 gives -3 -- clamped to [-127, 127] with fmaxf/fminf (a NaN
// product becomes -127: non-finite inputs give a meaningless but
// deterministic block), s = f16(d * sum(q)).
//
// Why s = d * sum(q) and not the sum of the float inputs: s then describes the
// quantized values (it is the sum of the dequantized block, up to f16
// rounding), so a consumer that uses it stays consistent with the integer
// products. vela's own dot (below, and the GPU kernel) does not read s at all:
// it recomputes sum(q) exactly in integers, because an f16 s carries a
// relative error of 2^-12, and multiplied by a weight block's min (Q4_1,
// Q5_1, K-quants) that would exceed the float rounding of everything else.
//
// Dot product (quant_dot_q8_1), per 32-element sub-block j of the row, with
// dx = f16 d of activation block j, qw the integer weight quants, qx the
// activation quants, sumi = sum(qw * qx), sumq = sum(qx) (exact int32):
//   Q4_0, Q5_0, Q8_0: term = (dw * dx) * sumi           qw signed (nibble - 8,
//                                                       5 bits - 16, int8)
//   Q4_1, Q5_1:       term = (dw * dx) * sumi + (m * dx) * sumq   qw unsigned
//   Q4_K, Q5_K:       term = (d * dx) * (sc_j * sumi) - (dmin * dx) * (m_j * sumq)
//                     (sc_j, m_j the 6-bit scale and min of group j)
//   Q6_K, Q3_K:       term = (d * dx) * (sc_a * sumi_a + sc_b * sumi_b)
//                     (the two 16-element groups of the sub-block, a: elements
//                     0..15, b: 16..31; qw = q - 32, Q3_K's signed -4..3)
//   Q2_K:             term = (d * dx) * (sc_a * sumi_a + sc_b * sumi_b)
//                            - (dmin * dx) * (m_a * sumq_a + m_b * sumq_b)
//                     (4-bit scales and mins of the two groups, qw 0..3)
//   IQ4_NL:           term = (d * dx) * sumi             qw = level[nibble] (-127..113)
//   IQ4_XS:           term = (d * dx) * (sc_j * sumi)    the same levels; sc_j the
//                     group's scale in [-32, 31]
//   MXFP4:            term = (d * dx) * sumi             d = 2^(e-128), qw = the doubled
//                     E2M1 level of the nibble (-12..12), ggml's vec_dot_mxfp4_q8_0 term
// Each parenthesized product and the integer converted to float is one float
// rounding, evaluated left to right without FMA contraction; the integer
// factors are exact (all below 2^24 in magnitude). The reference adds the
// terms in double in row order and rounds once; the GPU adds the same float
// terms in float in its own order.
#ifndef VELA_GGUF_QUANT_Q8_H
#define VELA_GGUF_QUANT_Q8_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf/types.h"
#include "gguf/verr.h"

#define QUANT_Q8_1_BLOCK 32       // elements per block
#define QUANT_Q8_1_BLOCK_BYTES 36 // bytes per block

// Bytes of a q8_1 row of n elements (n a multiple of 32), 0 otherwise.
int64_t quant_q8_1_row_bytes(int64_t n);

// x [n] -> out [n / 32] blocks. Returns 0, or VERR_RANGE (n negative or not
// a multiple of 32, NULL buffers).
int quant_q8_1_row(const float *x, int64_t n, void *out, struct verr *err);

// out[i] = q[i] * d (the values the dot product sees). Same contract.
int quant_q8_1_dequantize_row(const void *xq, int64_t n, float *out, struct verr *err);

// Weight types quant_dot_q8_1 takes: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K,
// Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4.
bool quant_q8_1_dot_supported(enum ggml_type wtype);

// *out = dot of one weight row (n elements of wtype) with the q8_1 row xq,
// as documented above. n must be a multiple of the weight block size (and so
// of 32). Returns 0, VERR_UNSUPPORTED (type) or VERR_RANGE (n, NULL buffers).
int quant_dot_q8_1(enum ggml_type wtype, const void *wrow, const void *xq, int64_t n, float *out,
                   struct verr *err);

#endif
