// KV policies (see policy.h).
#include "kv/policy.h"

#include <string.h>

void kv_policy_params_default(struct kv_policy_params *p) {
    memset(p, 0, sizeof *p);
    p->ctx_shift = true;
    p->ga_n = 1;
    p->ga_w = 512;
    p->se_g = 1;
    p->se_w = 512;
}

const char *kv_policy_name(enum kv_policy_kind k) {
    switch (k) {
    case KV_POLICY_SHIFT:
        return "context shift";
    case KV_POLICY_SELFEXTEND:
        return "self-extend";
    case KV_POLICY_EXACT_SE:
        return "exact self-extend";
    case KV_POLICY_STOP:
        break;
    }
    return "stop";
}

static int exact_se_check(const struct kv_policy_params *p, const struct kv_cache *kv, int seq,
                          int n_ctx, struct verr *err) {
    if (p->se_g < 1 || p->se_w < 1)
        return verr_set(err, VERR_RANGE,
                        "kv policy: exact self-extend G = %d and W = %d must be >= 1", p->se_g,
                        p->se_w);
    if (p->ga_n != 1)
        return verr_set(err, VERR_RANGE,
                        "kv policy: exact self-extend (G %d) and grouped attention (ga_n %d) "
                        "exclude each other",
                        p->se_g, p->ga_n);
    if (p->se_w >= n_ctx)
        return verr_set(err, VERR_RANGE,
                        "kv policy: exact self-extend window W = %d must be below the share of "
                        "%d cells",
                        p->se_w, n_ctx);
    if (seq < 0 || seq >= kv->cfg.n_seq_max)
        return verr_set(err, VERR_RANGE, "kv policy: sequence id %d outside [0, %d)", seq,
                        kv->cfg.n_seq_max);
    return 0;
}

int kv_policy_init(struct kv_policy *pol, const struct kv_policy_params *p,
                   const struct kv_cache *kv, int seq, int n_ctx, struct verr *err) {
    if (n_ctx < 1 || n_ctx > kv->cfg.n_ctx)
        return verr_set(err, VERR_RANGE, "kv policy: a share of %d cells (the cache has %d)", n_ctx,
                        kv->cfg.n_ctx);
    if (p->n_keep < 0)
        return verr_set(err, VERR_RANGE, "kv policy: n_keep %d must be >= 0", p->n_keep);
    struct kv_policy out = {.kind = KV_POLICY_STOP, .seq = seq, .n_ctx = n_ctx};
    if (p->se_g > 1 || p->se_g < 0) { // 0 and 1: off (a zeroed struct is off too)
        int rc = exact_se_check(p, kv, seq, n_ctx, err);
        if (rc)
            return rc;
        out.kind = KV_POLICY_EXACT_SE;
        out.se_g = p->se_g;
        out.se_w = p->se_w;
    } else if (p->ga_n != 1) {
        int rc = kv_selfextend_init(&out.se, kv, p->ga_n, p->ga_w, seq, err);
        if (rc)
            return rc;
        out.kind = KV_POLICY_SELFEXTEND;
    } else if (seq < 0 || seq >= kv->cfg.n_seq_max) {
        return verr_set(err, VERR_RANGE, "kv policy: sequence id %d outside [0, %d)", seq,
                        kv->cfg.n_seq_max);
    } else if (p->ctx_shift) {
        out.kind = KV_POLICY_SHIFT;
        out.n_keep = p->n_keep;
    }
    *pol = out;
    return 0;
}

int kv_policy_before_batch(struct kv_policy *pol, struct kv_cache *kv, int32_t *n_past,
                           struct verr *err) {
    if (pol->kind != KV_POLICY_SELFEXTEND)
        return 0;
    return kv_selfextend_apply(&pol->se, kv, n_past, err);
}

int kv_policy_make_room(struct kv_policy *pol, struct kv_cache *kv, int32_t *n_past, int *n_cells,
                        int32_t *n_discard, struct verr *err) {
    *n_discard = 0;
    // Self-extend keeps positions low: its share is full when its cells are.
    // The others count positions, as llama-cli does (n_past + 1 >= n_ctx).
    const bool by_cells = pol->kind == KV_POLICY_SELFEXTEND || pol->kind == KV_POLICY_EXACT_SE;
    const bool full = by_cells ? *n_cells + 1 > pol->n_ctx : *n_past + 1 >= pol->n_ctx;
    if (!full)
        return 0;
    if (pol->kind != KV_POLICY_SHIFT)
        return 1;
    int32_t nd = 0;
    int rc = kv_context_shift(kv, pol->seq, pol->n_keep, *n_past, &nd, err);
    if (rc)
        return rc;
    if (nd <= 0)
        return 1;
    *n_past -= nd;
    *n_cells -= nd;
    *n_discard = nd;
    return *n_past + 1 >= pol->n_ctx ? 1 : 0;
}

bool kv_policy_may_move(const struct kv_policy *pol, int64_t n_positions) {
    switch (pol->kind) {
    case KV_POLICY_SELFEXTEND:
        return true;
    case KV_POLICY_SHIFT:
        return n_positions >= pol->n_ctx;
    case KV_POLICY_EXACT_SE: // positions never move; attention groups them
    case KV_POLICY_STOP:
        break;
    }
    return false;
}
