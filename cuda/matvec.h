// matvec.cu: the f32-activation mat-vec of decode batches, several weight
// matrices and an epilogue per launch (cuda/cuda_boundary.h: the contract of
// every entry point).
#ifndef VELA_CUDA_MATVEC_H
#define VELA_CUDA_MATVEC_H

#include "cuda/cuda_boundary.h"

VELA_CUDA_BEGIN

// Largest n_tok that matmul serves with the mat-vec kernels (weights read
// once, dequantized in registers, f32 activations). Larger batches go through
// a dense GEMM (cuda/matmul.h): F32 weights by an f32 cuBLAS GEMM, F16
// weights by cuBLAS with activations rounded to f16, BF16 with activations
// rounded to bf16, and the quantized types by dequantizing slices of rows to
// f16 first.
#define CUDA_MATVEC_MAX_TOK 8

// out[t][o] = sum_i W[o][i] * x[t][i] (+ bias[o]) for n_tok <= CUDA_MATVEC_MAX_TOK
// (a plain matmul is one CUDA_MV_STORE segment), for several weight matrices
// sharing one input and one launch (Q/K/V, gate/up): every segment has the
// same type and n_in (a multiple of the type's block size). Epilogues:
//   CUDA_MV_STORE:  seg.out[t][o]  = W x (+ bias)         (any number of segs)
//   CUDA_MV_ADD:    seg.out[t][o] += W x (+ bias)         (residual folded in)
//   CUDA_MV_SWIGLU: segs[0].out[t][o] = silu(W0 x) * (W1 x); exactly 2 segs
//                   with equal n_out, segs[1].out unused, no bias.
//   CUDA_MV_GEGLU:  the same with gelu (vela_gelu_mul, cuda_geglu_apply's).
// Per output the arithmetic is the one of a single STORE segment followed by
// cuda_add_apply / cuda_swiglu_apply, so fused and unfused results are
// bit-identical.
#define CUDA_MV_MAX_SEGS 3
enum cuda_mv_epilogue { CUDA_MV_STORE = 0, CUDA_MV_ADD = 1, CUDA_MV_SWIGLU = 2, CUDA_MV_GEGLU = 3 };
// The gated epilogues (one gate and one up row per output).
#define CUDA_MV_GATED(epi) ((epi) == CUDA_MV_SWIGLU || (epi) == CUDA_MV_GEGLU)
struct cuda_mv_seg {
    float *out;        // [n_tok][n_out]
    const void *w;     // [n_out] rows of the type, 16-byte aligned
    const float *bias; // [n_out] or NULL
    int64_t n_out;
};
int cuda_matvec_segs(const struct cuda_mv_seg *segs /* [n_seg], host memory */, int n_seg,
                     enum ggml_type type, int64_t n_in, const float *x /* [n_tok][n_in] */,
                     int n_tok, enum cuda_mv_epilogue epi, bool pdl, cudaStream_t stream,
                     struct verr *err);

// Expert mode (mixture of experts, cuda/moe.h): one launch computes, for
// every (token, slot) pair p in [0, n_pairs), the mat-vec of one token
// through the matrix of expert e = ids[p]: each segment's w is a stack of
// n_expert matrices of seg.n_out rows one after another (row r of expert e
// at row e * n_out + r), the input is row p / x_div of x (x_div = k: the
// token's own row; 1: a row per pair), the output row p of seg.out
// ([n_pairs][n_out]). Only the chosen experts' rows are read; ids stay in
// device memory (CUDA graphs replay with new ids), an id outside
// [0, n_expert) is clamped into it (the host checks ids before they get
// here: moe_route writes them). One segment (STORE or ADD) or two (gated);
// per pair the arithmetic is exactly the plain launch's with n_tok = 1.
struct cuda_mv_experts {
    const int32_t *ids; // [n_pairs], device memory
    int n_pairs;
    int n_expert;
    int x_div;
};
int cuda_matvec_experts(const struct cuda_mv_seg *segs /* [n_seg], host memory */, int n_seg,
                        enum ggml_type type, int64_t n_in, const float *x /* [*][n_in] */,
                        const struct cuda_mv_experts *ex /* host memory */,
                        enum cuda_mv_epilogue epi, cudaStream_t stream, struct verr *err);

// The streaming mat-vec of 2-byte plain weights (F16, BF16), a variant under
// test beside the kernel above (cuda_matvec_segs): a persistent grid of a few
// blocks per multiprocessor, each warp owning whole output rows (interleaved
// over the grid's warps) and streaming them with 16-byte loads issued one
// item ahead of use, every token's activations staged in shared memory once
// per block. plan picks it and spreads its work; a call it does not apply to
// (another type, n_in not a multiple of 8, x not 16-byte aligned, the
// activations over the shared memory a block may take) runs the kernel above.
// Its results are its own (each lane's terms in row order, then the warp's
// butterfly), the same for every plan; against the kernel above they differ
// by the order of f32 additions only.
enum cuda_mv_kernel {
    CUDA_MV_PASS = 0,   // cuda_matvec_segs' kernel, one warp per row
    CUDA_MV_STREAM = 1, // the streaming kernel where it applies
};
struct cuda_mv_plan {
    int kernel;         // enum cuda_mv_kernel
    int sm_count;       // multiprocessors (0: unknown, 1 assumed)
    int smem_per_sm;    // their shared memory in bytes (0: unknown)
    int smem_per_block; // the most one block may opt in to (0: unknown, 96 KiB assumed)
    int blocks_per_sm;  // blocks aimed at per multiprocessor, at most as many as
                        // fit in smem_per_sm; 0: CUDA_MV_STREAM_BLOCKS_PER_SM
};
#define CUDA_MV_STREAM_BLOCKS_PER_SM 4
// cuda_matvec_segs / cuda_matvec_experts under plan (NULL: as they are).
int cuda_matvec_plan_segs(const struct cuda_mv_seg *segs /* [n_seg], host memory */, int n_seg,
                          enum ggml_type type, int64_t n_in, const float *x /* [n_tok][n_in] */,
                          int n_tok, enum cuda_mv_epilogue epi,
                          const struct cuda_mv_plan *plan /* or NULL */, bool pdl,
                          cudaStream_t stream, struct verr *err);
int cuda_matvec_plan_experts(const struct cuda_mv_seg *segs /* [n_seg], host memory */, int n_seg,
                             enum ggml_type type, int64_t n_in, const float *x /* [*][n_in] */,
                             const struct cuda_mv_experts *ex /* host memory */,
                             enum cuda_mv_epilogue epi,
                             const struct cuda_mv_plan *plan /* or NULL */, cudaStream_t stream,
                             struct verr *err);
// The kernel (enum cuda_mv_kernel) cuda_matvec_plan_segs runs for these
// sizes under plan with 16-byte aligned x (CUDA_MV_PASS also for a call it
// would refuse).
int cuda_matvec_kernel(enum ggml_type type, int64_t n_in, int n_tok,
                       const struct cuda_mv_plan *plan /* or NULL */);

VELA_CUDA_END

#endif
