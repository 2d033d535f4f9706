// moe.cu: mixture of experts, the kernels around the expert mat-vecs and
// GEMMs (cuda/cuda_boundary.h: the contract of every entry point). The
// experts' matrices themselves go through the dense kernels in expert mode:
// cuda_matvec_experts / cuda_matvec_q8_experts (decode) and
// cuda_matmul_q_tc_grouped (prompt batches); cuda/backend_cuda.c puts the
// steps together (moe_ffn).
#ifndef VELA_CUDA_MOE_H
#define VELA_CUDA_MOE_H

#include "cuda/cuda_boundary.h"

VELA_CUDA_BEGIN

// Most experts the routing and grouping kernels take (their per-expert
// arrays live in shared memory).
#define CUDA_MOE_MAX_EXPERT 4096

// The router's gating and the experts' activation: the values of enum
// moe_gating and enum moe_act (host/ops/backend.h).
enum cuda_moe_gating {
    CUDA_MOE_SOFTMAX = 0,
    CUDA_MOE_SOFTMAX_RENORM = 1,
    CUDA_MOE_SOFTMAX_WEIGHT = 2,
};
enum cuda_moe_act { CUDA_MOE_SWIGLU = 0, CUDA_MOE_SWIGLU_OAI = 1 };

// The router (backend_ops.moe_route, host/ops/backend.h): per token, one
// warp. Softmax as the CPU backend computes it: float exps of logit - max,
// their sum in double, one float factor (float)(1 / sum). SOFTMAX(_RENORM):
// p = softmax(logits[t]); ids[t][0..k) the k largest p, descending, the
// lower index first among equal p (NaN last); weights[t][j] = p[ids[t][j]],
// with _RENORM divided by max(sum_j weights[t][j] summed in float in j
// order, 2^-14). SOFTMAX_WEIGHT: ids[t] the k largest logits in the same
// order, weights[t] the softmax of those k logits (j ascending).
// 1 <= k <= n_expert <= CUDA_MOE_MAX_EXPERT.
int cuda_moe_route(int32_t *ids /* [n_tok][k] */, float *weights /* [n_tok][k] */,
                   const float *logits /* [n_tok][n_expert] */, int n_tok, int n_expert, int k,
                   int gating, cudaStream_t stream, struct verr *err);

// The (token, slot) pairs p = t * k + j grouped by expert on the device
// (a counting sort, stable: ascending p inside each expert's group):
// order[offsets[e] .. offsets[e + 1]) are the pairs routed to expert e;
// tiles[i] = {e, first} for the i-th chunk of at most tpb pairs of a group
// (experts ascending, chunks in order), tiles past the last chunk {-1, 0}.
// n_tiles must be at least cuda_moe_max_tiles(n_pairs, n_expert, tpb).
// ids outside [0, n_expert) are clamped into it (as the expert mat-vecs do).
int cuda_moe_group(int32_t *order /* [n_pairs] */, int32_t *offsets /* [n_expert + 1] */,
                   int32_t *tiles /* [n_tiles][2] */, const int32_t *ids /* [n_pairs] */,
                   int n_pairs, int n_expert, int tpb, int n_tiles, cudaStream_t stream,
                   struct verr *err);
// Chunks of at most tpb pairs that n_pairs pairs of n_expert groups can
// need: every non-empty group one partial chunk at most.
int cuda_moe_max_tiles(int n_pairs, int n_expert, int tpb);

// The experts' activation over the (token, slot) pairs, e = ids[p]:
//   h[p][f] = act(gate[p][f] + gate_b[e][f], up[p][f] + up_b[e][f])
// with act swiglu (cuda_swiglu_apply's expression) or swiglu_oai(alpha,
// limit), each bias NULL or added (one float add) before act reads it; h
// may be gate. ids outside [0, n_expert) are clamped into it.
int cuda_moe_glu(float *h /* [n_pairs][n_ff] */, const float *gate /* [n_pairs][n_ff] */,
                 const float *up /* [n_pairs][n_ff] */, const float *gate_b /* [n_expert][n_ff] */,
                 const float *up_b /* [n_expert][n_ff] */, const int32_t *ids /* [n_pairs] */,
                 int n_pairs, int n_expert, int64_t n_ff, int act, float alpha, float limit,
                 cudaStream_t stream, struct verr *err);

// out[t][o] = ((y'[t][0][o] * w[t][0] + y'[t][1][o] * w[t][1]) + ...) +
// y'[t][k-1][o] * w[t][k-1] with y' = y + bias[ids[t][j]][o] (bias NULL: y'
// = y): each slot's output, plus its expert's bias, times its weight,
// summed in slot order (the CPU backend's expression, no contraction).
// ids (clamped into [0, n_expert)) are read only with a bias.
int cuda_moe_combine(float *out /* [n_tok][n] */, const float *y /* [n_tok][k][n] */,
                     const float *weights /* [n_tok][k] */, const float *bias /* [n_expert][n] */,
                     const int32_t *ids /* [n_tok][k] */, int n_tok, int k, int64_t n, int n_expert,
                     cudaStream_t stream, struct verr *err);

VELA_CUDA_END

#endif
