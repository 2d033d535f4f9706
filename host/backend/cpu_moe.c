#include "host/backend/cpu_moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/types.h"

// The floor of a renormalised weights' sum: llama.cpp clamps it there
// (build_moe_ffn) so that a row of underflowed probabilities does not
// divide by zero.
#define MOE_RENORM_MIN 6.103515625e-5f

// v = ggml's softmax of logit[0..n): float exps of logit - max, their sum
// in double, then one float factor (float)(1 / sum).
static void softmax_row(float *v, const float *logit, int n) {
    float mx = -INFINITY;
    for (int e = 0; e < n; e++)
        mx = logit[e] > mx ? logit[e] : mx;
    double sum = 0.0;
    for (int e = 0; e < n; e++) {
        v[e] = expf(logit[e] - mx);
        sum += (double)v[e];
    }
    const float inv = (float)(1.0 / sum);
    for (int e = 0; e < n; e++)
        v[e] *= inv;
}

// ids[0..k) the k largest of s[0..n), descending: k passes, each the largest
// untaken, the lower index first among equal values (the strict > keeps the
// first seen), NaN only where nothing else is left.
static void top_k(int32_t *ids /* [k] */, const float *s /* [n] */, int n, int k) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            bool taken = false;
            for (int i = 0; i < j && !taken; i++)
                taken = ids[i] == e;
            if (!taken && (best < 0 || s[e] > s[best] || (isnan(s[best]) && !isnan(s[e]))))
                best = e;
        }
        ids[j] = best;
    }
}

// One token's routing (backend_ops.moe_route). p [n_expert] is scratch.
static void route_row(int32_t *ids /* [k] */, float *w /* [k] */, float *p /* [n_expert] */,
                      const float *logit /* [n_expert] */, int n_expert, int k,
                      enum moe_gating gating) {
    if (gating == MOE_GATING_SOFTMAX_WEIGHT) {
        top_k(ids, logit, n_expert, k);
        for (int j = 0; j < k; j++)
            p[j] = logit[ids[j]];
        softmax_row(w, p, k);
        return;
    }
    softmax_row(p, logit, n_expert);
    top_k(ids, p, n_expert, k);
    for (int j = 0; j < k; j++)
        w[j] = p[ids[j]];
    if (gating == MOE_GATING_SOFTMAX_RENORM) {
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
    if (gating != MOE_GATING_SOFTMAX && gating != MOE_GATING_SOFTMAX_RENORM &&
        gating != MOE_GATING_SOFTMAX_WEIGHT)
        return verr_set(&be->err, VERR_RANGE,
                        "cpu moe_route: gating %d (softmax 0, softmax_renorm 1 or "
                        "softmax_weight 2)",
                        (int)gating);
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
                  n_expert, k, gating);
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
    if (a->act != MOE_ACT_SWIGLU && a->act != MOE_ACT_SWIGLU_OAI)
        return verr_set(&be->err, VERR_RANGE, "cpu moe_ffn: act %d (swiglu 0 or swiglu_oai 1)",
                        (int)a->act);
    for (int64_t i = 0; i < (int64_t)a->n_tok * a->k; i++)
        if (a->ids[i] < 0 || a->ids[i] >= a->n_expert)
            return verr_set(&be->err, VERR_RANGE,
                            "cpu moe_ffn: token %lld slot %lld: expert %d of %d",
                            (long long)(i / a->k), (long long)(i % a->k), a->ids[i], a->n_expert);
    return VERR_OK;
}

// ggml's swiglu_oai (ggml_compute_forward_swiglu_oai_f32), each step
// rounded to float as written.
static float swiglu_oai(float g, float u, float alpha, float limit) {
    const float x = limit < g ? limit : g; // std::min and std::clamp: NaN passes through
    const float y = u < -limit ? -limit : limit < u ? limit : u;
    const float glu = x / (1.0f + expf(alpha * (-x)));
    return glu * (y + 1.0f);
}

// h = act(gate_e x + gate_b[e], up_e x + up_b[e]) over m gathered rows xg;
// up_tmp [m][n_ff] is scratch. Plain SwiGLU without biases is the backend's
// matmul_swiglu itself.
static int expert_gated(struct backend *be, const struct moe_args *a, int e, float *h,
                        float *up_tmp, const float *xg, int m) {
    const int64_t n_ff = a->gate->n_out / a->n_expert;
    const struct backend_weight wg = expert_of(a->gate, a->n_expert, e);
    const struct backend_weight wu = expert_of(a->up, a->n_expert, e);
    if (a->act == MOE_ACT_SWIGLU && !a->gate_b && !a->up_b)
        return be->ops->matmul_swiglu(be, h, up_tmp, &wg, &wu, xg, m);
    const float *gb = a->gate_b ? a->gate_b + (size_t)e * n_ff : NULL;
    const float *ub = a->up_b ? a->up_b + (size_t)e * n_ff : NULL;
    int rc = be->ops->matmul(be, h, &wg, xg, gb, m);
    if (!rc)
        rc = be->ops->matmul(be, up_tmp, &wu, xg, ub, m);
    if (rc)
        return rc;
    if (a->act == MOE_ACT_SWIGLU)
        return be->ops->swiglu(be, h, h, up_tmp, (int64_t)m * n_ff);
    for (int64_t i = 0; i < (int64_t)m * n_ff; i++)
        h[i] = swiglu_oai(h[i], up_tmp[i], a->alpha, a->limit);
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
    const struct backend_weight wd = expert_of(a->down, a->n_expert, e);
    const float *db = a->down_b ? a->down_b + (size_t)e * n_embd : NULL;
    float *yg = xg; // the down projection's output reuses the gathered rows' space
    int rc = expert_gated(be, a, e, h, up_tmp, xg, m);
    if (!rc)
        rc = be->ops->matmul(be, yg, &wd, h, db, m);
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
