#include "kv/selfextend.h"

#include <stdio.h>

static int check(const struct kv_cache *kv, int ga_n, int ga_w, int seq, struct verr *err) {
    if (ga_n < 1)
        return verr_set(err, VERR_RANGE, "self-extend: ga_n %d must be >= 1", ga_n);
    if (ga_w < 1)
        return verr_set(err, VERR_RANGE, "self-extend: ga_w %d must be >= 1", ga_w);
    if (ga_w % ga_n != 0)
        return verr_set(err, VERR_RANGE, "self-extend: ga_w %d must be a multiple of ga_n %d",
                        ga_w, ga_n);
    if (ga_w > kv->cfg.n_ctx)
        return verr_set(err, VERR_RANGE, "self-extend: ga_w %d must be <= n_ctx %d", ga_w,
                        kv->cfg.n_ctx);
    if (seq < 0 || seq >= kv->cfg.n_seq_max)
        return verr_set(err, VERR_RANGE, "self-extend: sequence id %d outside [0, %d)", seq,
                        kv->cfg.n_seq_max);
    return 0;
}

int kv_selfextend_init(struct kv_selfextend *se, const struct kv_cache *kv, int ga_n, int ga_w,
                       int seq, struct verr *err) {
    int rc = check(kv, ga_n, ga_w, seq, err);
    if (rc)
        return rc;
    *se = (struct kv_selfextend){.ga_n = ga_n, .ga_w = ga_w, .ga_i = 0, .seq = seq};
    return 0;
}

static void log_line(const struct kv_selfextend *se, const char *op, int a0, int a1,
                     const char *sym, int arg, int b0, int b1) {
    if (!se->log)
        return;
    char line[128];
    // op is padded to 6 columns: "shift:" and "div:  " line up as in llama-cli.
    snprintf(line, sizeof line, "%-6s [%6d, %6d] %s %6d -> [%6d, %6d]", op, a0, a1, sym, arg, b0,
             b1);
    se->log(se->log_user, line);
}

int kv_selfextend_apply(struct kv_selfextend *se, struct kv_cache *kv, int32_t *n_past,
                        struct verr *err) {
    int rc = check(kv, se->ga_n, se->ga_w, se->seq, err);
    if (rc)
        return rc;
    if (se->ga_i < 0)
        return verr_set(err, VERR_RANGE, "self-extend: ga_i %d is negative", se->ga_i);
    const int ga_n = se->ga_n, ga_w = se->ga_w, s = se->seq;
    if (ga_n == 1)
        return 0; // llama-cli skips the block: nothing to group
    int32_t np = *n_past;
    int ga_i = se->ga_i;
    while (np >= ga_i + ga_w) {
        const int ib = (ga_n * ga_i) / ga_w;
        const int bd = (ga_w / ga_n) * (ga_n - 1);
        const int dd = (ga_w / ga_n) - ib * bd - ga_w;
        const int a = ga_i + ib * bd; // start of the window being divided

        // Each line is logged right before its op (llama-cli logs the three
        // first; the text is the same), so a log callback sees the cache as
        // the previous op left it.
        log_line(se, "shift:", ga_i, np, "+", ib * bd, a, np + ib * bd);
        if ((rc = kv_seq_add(kv, s, ga_i, np, ib * bd, err)))
            goto fail;
        log_line(se, "div:", a, a + ga_w, "/", ga_n, a / ga_n, (a + ga_w) / ga_n);
        if ((rc = kv_seq_div(kv, s, a, a + ga_w, ga_n, err)))
            goto fail;
        log_line(se, "shift:", a + ga_w, np + ib * bd, "+", dd, a + ga_w + dd, np + ib * bd + dd);
        if ((rc = kv_seq_add(kv, s, a + ga_w, np + ib * bd, dd, err)))
            goto fail;
        np -= bd;
        ga_i += ga_w / ga_n;
    }
    se->ga_i = ga_i;
    *n_past = np;
    return 0;

fail:
    // Only an int32 overflow of positions gets here (seq was checked); the
    // round is left half done, so report where.
    se->ga_i = ga_i;
    *n_past = np;
    return verr_wrap(err, "self-extend round at ga_i %d, n_past %d", ga_i, np);
}
