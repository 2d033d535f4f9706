#include "host/backend/cpu_moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/types.h"

// The floor of a renormalised weights' sum: llama.cpp clamps it there
// (build_moe_ffn) so that a row of underflowed probabilities does not
// divide by zero.
#define MOE_RENORM_MIN 6.103515625e-5f

// One token's routing: softmax as ggml's (float exps, double sum, one
// float scale), then a selection of the k largest.
static void route_row(int32_t *ids /* [k] */, float *w /* [k] */, float *p /* [n_expert] */,
                      const float *logit /* [n_expert] */, int n_expert, int k, bool renorm) {
    float mx = -INFINITY;
    for (int e = 0; e < n_expert; e++)
        mx = logit[e] > mx ? logit[e] : mx;
    double sum = 0.0;
    for (int e = 0; e < n_expert; e++) {
        p[e] = expf(logit[e] - mx);
        sum += (double)p[e];
    }
    const float inv = (float)(1.0 / sum);
    for (int e = 0; e < n_expert; e++)
        p[e] *= inv;
    // k passes over the experts: the largest remaining, the lower index
    // first among equal p (the strict > keeps the first seen).
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n_expert; e++) {
            bool taken = false;
            for (int i = 0; i < j && !taken; i++)
                taken = ids[i] == e;
            if (!taken && (best < 0 || p[e] > p[best]))
                best = e;
        }
        ids[j] = best;
        w[j] = p[best];
    }
    if (renorm) {
        float s = 0.0f;
        for (int j = 0; j < k; j++)
            s += w[j];
        s = s > MOE_RENORM_MIN ? s : MOE_RENORM_MIN;
        for (int j = 0; j < k; j++)
            w[j] /= s;
    }
}

int cpu_moe_route(struct backend *be, int32_t *ids, float *weights, const float *logits, int n_tok,
                  int n_expert, int k, enum moe_gating gating) {
    if (gating != MOE_GATING_SOFTMAX && gating != MOE_GATING_SOFTMAX_RENORM)
        return verr_set(&be->err, VERR_UNSUPPORTED, "cpu moe_route: gating %d", (int)gating);
    const bool renorm = gating == MOE_GATING_SOFTMAX_RENORM;
    if (n_tok < 0 || n_expert < 1 || k < 1 || k > n_expert)
        return verr_set(&be->err, VERR_RANGE,
                        "cpu moe_route: %d tokens, %d experts, k %d (need 1 <= k <= n_expert)",
                        n_tok, n_expert, k);
    if (n_tok == 0)
        return VERR_OK;
    if (!ids || !weights || !logits)
        return verr_set(&be->err, VERR_RANGE, "cpu moe_route: NULL pointer");
    float *p = malloc((size_t)n_expert * sizeof(float));
    if (!p)
        return verr_set(&be->err, VERR_NOMEM, "cpu moe_route: out of memory");
    for (int t = 0; t < n_tok; t++)
        route_row(ids + (size_t)t * k, weights + (size_t)t * k, p, logits + (size_t)t * n_expert,
                  n_expert, k, renorm);
    free(p);
    return VERR_OK;
}

// Expert e's matrix of a stack of n_expert (struct moe_args).
static struct backend_weight expert_of(const struct backend_weight *stack, int n_expert, int e) {
    const int64_t rows = stack->n_out / n_expert;
    struct backend_weight w = *stack;
    w.n_out = rows;
    w.data = (const char *)stack->data +
             (size_t)e * (size_t)rows * ggml_row_bytes(stack->type, stack->n_in);
    return w;
}

static int check_ffn(struct backend *be, const struct moe_args *a) {
    if (!a || a->n_tok < 0 || a->n_expert < 1 || a->k < 1)
        return verr_set(&be->err, VERR_RANGE, "cpu moe_ffn: bad shape");
    if (!a->gate || !a->up || !a->down)
        return verr_set(&be->err, VERR_RANGE, "cpu moe_ffn: NULL expert stack");
    const struct backend_weight *g = a->gate, *u = a->up, *d = a->down;
    if (g->n_out % a->n_expert || d->n_out % a->n_expert || g->n_in != u->n_in ||
        g->n_out != u->n_out || g->type != u->type || d->n_in != g->n_out / a->n_expert ||
        d->n_out / a->n_expert != g->n_in)
        return verr_set(&be->err, VERR_RANGE,
                        "cpu moe_ffn: expert stacks gate %lld x %lld, up %lld x %lld, down %lld x "
                        "%lld do not fit %d experts",
                        (long long)g->n_out, (long long)g->n_in, (long long)u->n_out,
                        (long long)u->n_in, (long long)d->n_out, (long long)d->n_in, a->n_expert);
    if (a->n_tok > 0 && (!a->out || !a->x || !a->ids || !a->weights || !a->tmp))
        return verr_set(&be->err, VERR_RANGE, "cpu moe_ffn: NULL pointer");
    for (int64_t i = 0; i < (int64_t)a->n_tok * a->k; i++)
        if (a->ids[i] < 0 || a->ids[i] >= a->n_expert)
            return verr_set(&be->err, VERR_RANGE,
                            "cpu moe_ffn: token %lld slot %lld: expert %d of %d",
                            (long long)(i / a->k), (long long)(i % a->k), a->ids[i], a->n_expert);
    return VERR_OK;
}

// Expert e over the (token, slot) pairs routed to it: their x rows gathered,
// the expert's FFN, each result written to y at its pair's row.
static int run_expert(struct backend *be, const struct moe_args *a, int e,
                      float *y /* [n][n_embd] */, float *xg, float *h, float *up_tmp) {
    const int64_t n_embd = a->gate->n_in, n_pairs = (int64_t)a->n_tok * a->k;
    int m = 0;
    for (int64_t i = 0; i < n_pairs; i++)
        if (a->ids[i] == e)
            memcpy(xg + (size_t)m++ * n_embd, a->x + (size_t)(i / a->k) * n_embd,
                   (size_t)n_embd * sizeof(float));
    if (m == 0)
        return VERR_OK;
    const struct backend_weight wg = expert_of(a->gate, a->n_expert, e);
    const struct backend_weight wu = expert_of(a->up, a->n_expert, e);
    const struct backend_weight wd = expert_of(a->down, a->n_expert, e);
    float *yg = xg; // the down projection's output reuses the gathered rows' space
    int rc = be->ops->matmul_swiglu(be, h, up_tmp, &wg, &wu, xg, m);
    if (!rc)
        rc = be->ops->matmul(be, yg, &wd, h, NULL, m);
    if (rc)
        return rc;
    m = 0;
    for (int64_t i = 0; i < n_pairs; i++)
        if (a->ids[i] == e)
            memcpy(y + (size_t)i * n_embd, yg + (size_t)m++ * n_embd,
                   (size_t)n_embd * sizeof(float));
    return VERR_OK;
}

int cpu_moe_ffn(struct backend *be, const struct moe_args *a) {
    if (a && (a->gate_b || a->up_b || a->down_b || a->act != MOE_ACT_SWIGLU))
        return verr_set(&be->err, VERR_UNSUPPORTED, "cpu moe_ffn: expert biases, swiglu_oai");
    int rc = check_ffn(be, a);
    if (rc || a->n_tok == 0)
        return rc;
    const int64_t n_embd = a->gate->n_in, n_ff = a->gate->n_out / a->n_expert;
    const size_t n_pairs = (size_t)a->n_tok * (size_t)a->k;
    // tmp (BACKEND_MOE_TMP): y [n_pairs][n_embd], the gathered rows [n_pairs][n_embd],
    // h and up_tmp [n_pairs][n_ff] each.
    float *y = a->tmp;
    float *xg = y + n_pairs * (size_t)n_embd;
    float *h = xg + n_pairs * (size_t)n_embd;
    float *up_tmp = h + n_pairs * (size_t)n_ff;
    if (a->out == a->x || a->out == a->tmp)
        return verr_set(&be->err, VERR_RANGE, "cpu moe_ffn: out aliases x or tmp");
    for (int e = 0; e < a->n_expert; e++)
        if ((rc = run_expert(be, a, e, y, xg, h, up_tmp)))
            return rc;
    // llama.cpp's order: each expert's output times its weight, then the sum
    // over the slots in order.
    for (int t = 0; t < a->n_tok; t++) {
        float *o = a->out + (size_t)t * n_embd;
        const float *w = a->weights + (size_t)t * a->k;
        const float *yt = y + (size_t)t * a->k * n_embd;
        for (int64_t i = 0; i < n_embd; i++)
            o[i] = yt[i] * w[0];
        for (int j = 1; j < a->k; j++)
            for (int64_t i = 0; i < n_embd; i++)
                o[i] += yt[(size_t)j * n_embd + i] * w[j];
    }
    return VERR_OK;
}

// sig(g) of add_sigmoid_scaled: llama.cpp's silu(g) / g, each step in float.
static float shexp_sigmoid(float g) {
    if (g == 0.0f)
        return 0.5f;
    const float silu = g / (1.0f + expf(-g));
    return silu / g;
}

int cpu_add_sigmoid_scaled(struct backend *be, float *y, const float *s, const float *g, int n_tok,
                           int n) {
    const int rc = backend_check_add_sigmoid_scaled(be, "cpu", y, s, g, n_tok, n);
    if (rc || n_tok == 0 || n == 0)
        return rc;
    for (int t = 0; t < n_tok; t++) {
        const float sig = shexp_sigmoid(g[t]);
        float *yt = y + (size_t)t * n;
        const float *st = s + (size_t)t * n;
        for (int i = 0; i < n; i++)
            yt[i] += st[i] * sig;
    }
    return VERR_OK;
}
