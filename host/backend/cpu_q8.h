// The CPU backend's fast path for act_q8 matmuls: the q8_1 dot product of
// gguf/quant_q8.h (the reference, quant_dot_q8_1) computed with SIMD integer
// dots, for a whole batch of tokens at once.
//
// What it computes is the reference's, term for term: the activations are
// quantized by quant_q8_1_row itself (bit-identical blocks), each 32-element
// sub-block's integer sums are exact, and each sub-block's float term is the
// same expression with the same roundings (quant_q8.h's table). Only the
// order in which the float terms are added differs (eight running sums, then
// a fixed pairwise tree), which quant_q8.h allows. tests/test_cpu_q8.c
// compares it with quant_dot_q8_1 for every type.
//
// Why it is fast: a group of 256 weights (8 sub-blocks) of a row is unpacked
// once to unsigned bytes and then dotted with up to CPU_Q8_TILE tokens, so the
// nibble and bit unpacking is paid once per tile instead of once per token
// (llama.cpp's CPU mat-mul unpacks per row and column); the per-sub-block
// integer sums of 8 sub-blocks are reduced together (horizontal adds), and
// their terms are evaluated 8 at a time in float vectors.
//
// Batch invariance: an output's arithmetic depends only on its weight row and
// its token, never on the batch size, the tile or the thread, so a token's
// logits are identical alone or in a batch of any size.
#ifndef VELA_HOST_CPU_Q8_H
#define VELA_HOST_CPU_Q8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/types.h"
#include "gguf/verr.h"

#define CPU_Q8_GROUP 256 // weights unpacked at once: 8 sub-blocks of 32
#define CPU_Q8_TILE 16   // tokens dotted with one unpacked group

// Activations prepared for the kernels: each token's q8_1 blocks split into
// arrays, padded with zero blocks up to a whole number of groups. The quants
// of a group (8 sub-blocks k of 32) are stored transposed by 4-byte words:
// byte 32m + 4k + b of the group is element 4m + b of sub-block k, so that
// a 32-byte load m holds word m of every sub-block and a byte-dot (4 products
// into one int32 lane) accumulates each sub-block in its own lane. The
// kernels unpack the weights into the same layout.
struct cpu_q8_x {
    int8_t *qs;     // [n_tok][n_pad] the quants, transposed within each group
    float *dx;      // [n_tok][nb_pad] f32 value of each block's f16 scale
    int32_t *sq;    // [n_tok][nb_pad] sum of the block's 32 quants
    int32_t *sqh;   // [n_tok][nb_pad] sum of its last 16 quants (Q6_K's halves)
    int64_t n_pad;  // n_in rounded up to CPU_Q8_GROUP
    int64_t nb_pad; // n_pad / 32
    int n_tok;
};

// Which SIMD kernels this CPU runs (probed once).
enum cpu_q8_isa {
    CPU_Q8_ISA_NONE = 0,    // no fast path: the caller uses quant_dot_q8_1
    CPU_Q8_ISA_AVX2 = 1,    // AVX2 + FMA + F16C
    CPU_Q8_ISA_AVXVNNI = 2, // AVX2 with AVX-VNNI's vpdpbusd
};
// The kernels this CPU runs, at most the pinned ones (cpu_q8_pin).
enum cpu_q8_isa cpu_q8_isa(void);
// Kernel experiments (tests and benchmarks compare the paths on one
// machine): caps what cpu_q8_isa() reports, and so the kernels of every CPU
// backend created afterwards (each probes once, when it is created).
// CPU_Q8_ISA_NONE: the reference dots; CPU_Q8_ISA_AVX2: the AVX2 kernels on
// an AVX-VNNI CPU; CPU_Q8_ISA_AVXVNNI (the default): no cap. Never raises
// the CPU's own level. The product never calls it.
void cpu_q8_pin(enum cpu_q8_isa max);
const char *cpu_q8_isa_name(enum cpu_q8_isa isa);

// Bytes of the buffer cpu_q8_x_init lays out for n_tok tokens of n_in
// elements (n_in a multiple of 32), 0 when n_in is not.
size_t cpu_q8_x_bytes(int64_t n_in, int n_tok);

// Points x's arrays into buf (64-byte aligned, cpu_q8_x_bytes long).
void cpu_q8_x_init(struct cpu_q8_x *x, void *buf, int64_t n_in, int n_tok);

// Quantizes token t's row xt [n_in] into x: the same blocks as
// quant_q8_1_row, bit for bit. isa NONE goes through quant_q8_1_row itself
// (tmp holds quant_q8_1_row_bytes(n_in) bytes); the SIMD versions write the
// layout directly (tmp unused). Returns 0 or VERR_RANGE.
int cpu_q8_x_fill(enum cpu_q8_isa isa, struct cpu_q8_x *x, int t, const float *xt, int64_t n_in,
                  void *tmp, struct verr *err);

// One matmul: out[t][o] = dot(W[o], x_t) (+ bias[o]), or out += that.
struct cpu_q8_job {
    const uint8_t *w;     // [n_out][row_bytes] weight rows, type wtype
    enum ggml_type wtype; // quant_q8_1_dot_supported
    size_t row_bytes;
    int64_t n_in; // multiple of the type's block size
    int64_t n_out;
    const struct cpu_q8_x *x;
    float *out;        // [x->n_tok][n_out]
    const float *bias; // [n_out] or NULL
    bool accumulate;
};

// Rows [o0, o1) of the job, every token, with the kernels of `isa`
// (not CPU_Q8_ISA_NONE). Disjoint row ranges may run on different threads.
void cpu_q8_rows(enum cpu_q8_isa isa, const struct cpu_q8_job *j, int64_t o0, int64_t o1);

// The two instantiations of cpu_q8_simd.h (one per ISA, each its own
// translation unit compiled for that ISA).
void cpu_q8_rows_avx2(const struct cpu_q8_job *j, int64_t o0, int64_t o1);
void cpu_q8_rows_avxvnni(const struct cpu_q8_job *j, int64_t o0, int64_t o1);
void cpu_q8_x_fill_avx2(struct cpu_q8_x *x, int t, const float *xt, int64_t n_in);
void cpu_q8_x_fill_avxvnni(struct cpu_q8_x *x, int t, const float *xt, int64_t n_in);

#endif
