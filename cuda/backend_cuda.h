// The CUDA backend's kernel variants under test: settings that benchmarks
// (bench/kernels) and tests (tests/gpu, tests/emu) pass to a backend made by
// backend_cuda_create (host/ops/backend.h), to time or check a variant
// beside the default before the default moves. Not product settings: the
// forward pass and the vela command never call these, and a backend starts
// with the defaults unless the environment's VELA_PDL, VELA_MATVEC_Q8 or
// VELA_MATVEC_F16 (read by backend_cuda_create, for `vela bench` runs that
// time a variant end to end) names another. Each returns 0, or VERR_RANGE with err filled (not a
// CUDA backend, or a value the kernels cannot take; nothing changed then).
// Call between ops, not while a graph is recorded: graphs recorded before
// keep the variant they were recorded with.
#ifndef VELA_CUDA_BACKEND_CUDA_H
#define VELA_CUDA_BACKEND_CUDA_H

#include <stdbool.h>

#include "gguf/verr.h"

struct backend;

// Decode attention's split-K plan (struct cuda_attn, cuda/attention.h):
// aim at blocks_per_sm blocks per multiprocessor (1..64), each split at
// least min_cells cells (8..65536, a multiple of 8); 0, 0: the defaults
// (CUDA_ATTN_DEC_* for attn_dec_kernel, CUDA_ATTN_SPLIT_* for attn_kernel).
int backend_cuda_set_attn_split(struct backend *be, int blocks_per_sm, int min_cells,
                                struct verr *err);

// Decode attention's kernel (struct cuda_attn.decode, cuda/attention.h):
// CUDA_ATTN_DECODE_AUTO (0, the default), CUDA_ATTN_DECODE_SPLITK (1, the
// split-K attn_kernel) or CUDA_ATTN_DECODE_DEC (2, attn_dec_kernel where it
// applies). The split plan above applies to whichever runs.
int backend_cuda_set_attn_decode(struct backend *be, int kernel, struct verr *err);

// The dp4a mat-vec's kernel (enum cuda_mvq_kernel, cuda/matvec_q8.h):
// CUDA_MVQ_PASS (the one-pass kernel, the default; blocks_per_sm 0),
// CUDA_MVQ_PIPE or CUDA_MVQ_STREAM (each aiming at blocks_per_sm blocks per
// multiprocessor, 1..64; 0: their default).
int backend_cuda_set_matvec_q8(struct backend *be, int kernel, int blocks_per_sm, struct verr *err);

// The f32-activation mat-vec's kernel for F16/BF16 weights (enum
// cuda_mv_kernel, cuda/matvec.h): CUDA_MV_PASS (one warp per row, the
// default; blocks_per_sm 0) or CUDA_MV_STREAM (the streaming kernel where it
// applies, aiming at blocks_per_sm blocks per multiprocessor, 1..64; 0: its
// default).
int backend_cuda_set_matvec_f16(struct backend *be, int kernel, int blocks_per_sm,
                                struct verr *err);

// A mat-vec kernel by name, as vela-bench-kernels' --matvec-q8 /
// --matvec-f16 and the environment's VELA_MATVEC_Q8 / VELA_MATVEC_F16 give
// it: "pass", "stream" or "stream:B", and for the dp4a mat-vec (q8) also
// "pipe" or "pipe:B" (B blocks per multiprocessor, 1..64; none: the
// kernel's default) into the setters' kernel and blocks_per_sm. -1 for
// anything else. backend_cuda_create applies VELA_MATVEC_Q8 and
// VELA_MATVEC_F16 (unset or empty: the default kernels; a bad value is
// refused with VERR_RANGE) so that `vela bench` can time the variants.
int backend_cuda_parse_matvec(const char *s, bool q8, int *kernel, int *blocks_per_sm);

// Programmatic dependent launch (cuda/launch.cuh) for the decode chain's
// kernels (norm, q8_1 quantize, mat-vecs, RoPE/KV store, argmax): 1 on, 0
// off (the default). On needs compute capability 9.0 (else
// VERR_UNSUPPORTED). Unlike the settings above, the environment sets it
// too, for `vela bench`: backend_cuda_create reads VELA_PDL ("0" or "1";
// any other value is refused with VERR_RANGE; "1" on a device below 9.0
// is ignored with one line on stderr).
int backend_cuda_set_pdl(struct backend *be, int on, struct verr *err);

#endif
