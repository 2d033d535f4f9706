// The CPU backend's mixture-of-experts ops (struct backend_ops.moe_route,
// .moe_ffn and .add_sigmoid_scaled, contracts in host/ops/backend.h). The routed feed-forward is a
// composition of the backend's own matmul ops, expert by expert over the
// tokens routed to it, so each product rounds as the dense feed-forward's
// (act_q8 included) and a token's result does not depend on its batch.
#ifndef VELA_HOST_CPU_MOE_H
#define VELA_HOST_CPU_MOE_H

#include <stdbool.h>
#include <stdint.h>

#include "host/ops/backend.h"

int cpu_moe_route(struct backend *be, int32_t *ids /* [n_tok][k] */,
                  float *weights /* [n_tok][k] */, const float *logits /* [n_tok][n_expert] */,
                  int n_tok, int n_expert, int k, enum moe_gating gating);

int cpu_moe_ffn(struct backend *be, const struct moe_args *a);

int cpu_add_sigmoid_scaled(struct backend *be, float *y /* [n_tok][n] */,
                           const float *s /* [n_tok][n] */, const float *g /* [n_tok] */, int n_tok,
                           int n);

#endif
