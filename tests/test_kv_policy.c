// KV policies (kv/policy.h) on bookkeeping-only caches: the context shift
// against hand-computed positions, stop ending the sequence with nothing
// changed, self-extend equal to driving kv_selfextend by hand, when cells
// may move (prompt sharing), and bad parameters refused with the policy
// untouched.
#include <criterion/criterion.h>

#include <string.h>

#include "kv/kv.h"
#include "kv/policy.h"
#include "kv/selfextend.h"

// A cache of n_ctx cells (no backend) with seq 0 at positions 0..n-1.
static void filled(struct kv_cache *kv, int n_ctx, int n) {
    struct kv_config cfg = {.n_ctx = n_ctx,
                            .n_layer = 1,
                            .n_head_kv = 1,
                            .head_dim = 2,
                            .head_dim_v = 2,
                            .type_k = GGML_TYPE_F32,
                            .type_v = GGML_TYPE_F32,
                            .n_seq_max = 4};
    struct verr err = {0};
    cr_assert_eq(kv_init(kv, &cfg, NULL, &err), 0, "%s", err.msg);
    int32_t pos[256], seq[256], cells[256];
    cr_assert_leq(n, 256);
    for (int t = 0; t < n; t++) {
        pos[t] = t;
        seq[t] = 0;
    }
    cr_assert_eq(kv_find_slot(kv, pos, seq, n, cells, &err), 0, "%s", err.msg);
}

Test(kv_policy, shift_keeps_n_keep_and_moves_the_second_half_down) {
    struct kv_cache kv;
    filled(&kv, 16, 15);
    struct kv_policy_params pp;
    kv_policy_params_default(&pp);
    pp.n_keep = 4;
    struct kv_policy pol;
    struct verr err = {0};
    cr_assert_eq(kv_policy_init(&pol, &pp, &kv, 0, 16, &err), 0, "%s", err.msg);
    cr_assert_eq(pol.kind, KV_POLICY_SHIFT);
    int32_t n_past = 15, nd = -1;
    int n_cells = 15;
    // n_past + 1 = 16 is not below 16: full, so shift. By hand: n_discard =
    // (15 - 4) / 2 = 5; positions 4..8 go, 9..14 become 4..9.
    cr_assert_eq(kv_policy_make_room(&pol, &kv, &n_past, &n_cells, &nd, &err), 0, "%s", err.msg);
    cr_expect_eq(nd, 5);
    cr_expect_eq(n_past, 10);
    cr_expect_eq(n_cells, 10);
    const int32_t want[16] = {0, 1, 2, 3, -1, -1, -1, -1, -1, 4, 5, 6, 7, 8, 9, -1};
    for (int c = 0; c < 16; c++)
        cr_expect_eq(kv_cell_pos(&kv, c), want[c], "cell %d: pos %d, want %d", c,
                     kv_cell_pos(&kv, c), want[c]);
    // Not full any more: nothing happens.
    cr_assert_eq(kv_policy_make_room(&pol, &kv, &n_past, &n_cells, &nd, &err), 0);
    cr_expect_eq(nd, 0);
    cr_expect_eq(n_past, 10);
    kv_free(&kv);
}

Test(kv_policy, stop_ends_the_sequence_and_changes_nothing) {
    struct kv_cache kv;
    filled(&kv, 16, 16);
    struct kv_policy_params pp;
    kv_policy_params_default(&pp);
    pp.ctx_shift = false;
    struct kv_policy pol;
    struct verr err = {0};
    cr_assert_eq(kv_policy_init(&pol, &pp, &kv, 0, 16, &err), 0, "%s", err.msg);
    cr_assert_eq(pol.kind, KV_POLICY_STOP);
    int32_t n_past = 14, nd = -1;
    int n_cells = 14;
    cr_expect_eq(kv_policy_make_room(&pol, &kv, &n_past, &n_cells, &nd, &err), 0, "fits");
    n_past = 15;
    cr_expect_eq(kv_policy_make_room(&pol, &kv, &n_past, &n_cells, &nd, &err), 1, "full");
    cr_expect_eq(n_past, 15);
    cr_expect_eq(nd, 0);
    for (int c = 0; c < 16; c++)
        cr_expect_eq(kv_cell_pos(&kv, c), c);
    cr_expect_eq(kv_policy_before_batch(&pol, &kv, &n_past, &err), 0);
    cr_expect_eq(n_past, 15, "stop moves nothing before a batch");
    kv_free(&kv);
}

// Self-extend through the policy equals driving kv_selfextend by hand on a
// twin cache, round for round; its share is full by cells, not positions.
Test(kv_policy, selfextend_equals_the_driver) {
    struct kv_cache a, b;
    filled(&a, 64, 40);
    filled(&b, 64, 40);
    struct kv_policy_params pp;
    kv_policy_params_default(&pp);
    pp.ga_n = 4;
    pp.ga_w = 16;
    struct kv_policy pol;
    struct kv_selfextend se;
    struct verr err = {0};
    cr_assert_eq(kv_policy_init(&pol, &pp, &a, 0, 48, &err), 0, "%s", err.msg);
    cr_assert_eq(pol.kind, KV_POLICY_SELFEXTEND);
    cr_assert_eq(kv_selfextend_init(&se, &b, 4, 16, 0, &err), 0, "%s", err.msg);
    int32_t pa = 40, pb = 40;
    cr_assert_eq(kv_policy_before_batch(&pol, &a, &pa, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_selfextend_apply(&se, &b, &pb, &err), 0, "%s", err.msg);
    cr_expect_eq(pa, pb);
    cr_expect_lt(pa, 40, "positions were regrouped");
    for (int c = 0; c < 64; c++) {
        cr_expect_eq(kv_cell_pos(&a, c), kv_cell_pos(&b, c), "cell %d", c);
        cr_expect_eq(kv_cell_delta(&a, c), kv_cell_delta(&b, c), "cell %d delta", c);
    }
    // 47 cells of a 48-cell share: one more fits; 48: full, and self-extend
    // has no way to make room.
    int n_cells = 47;
    int32_t nd = -1;
    cr_expect_eq(kv_policy_make_room(&pol, &a, &pa, &n_cells, &nd, &err), 0);
    n_cells = 48;
    cr_expect_eq(kv_policy_make_room(&pol, &a, &pa, &n_cells, &nd, &err), 1);
    kv_free(&a);
    kv_free(&b);
}

Test(kv_policy, which_sequences_may_move_their_cells) {
    struct kv_cache kv;
    filled(&kv, 32, 0);
    struct kv_policy_params pp;
    kv_policy_params_default(&pp);
    struct kv_policy pol;
    struct verr err = {0};
    cr_assert_eq(kv_policy_init(&pol, &pp, &kv, 1, 16, &err), 0, "%s", err.msg);
    cr_expect(!kv_policy_may_move(&pol, 15), "a shift needs 16 positions");
    cr_expect(kv_policy_may_move(&pol, 16));
    pp.ctx_shift = false;
    cr_assert_eq(kv_policy_init(&pol, &pp, &kv, 1, 16, &err), 0);
    cr_expect(!kv_policy_may_move(&pol, 1000), "stop never moves cells");
    pp.ga_n = 2;
    pp.ga_w = 8;
    cr_assert_eq(kv_policy_init(&pol, &pp, &kv, 1, 16, &err), 0);
    cr_expect(kv_policy_may_move(&pol, 1), "self-extend regroups positions");
    kv_free(&kv);
}

Test(kv_policy, bad_values_are_refused_and_the_policy_is_untouched) {
    struct kv_cache kv;
    filled(&kv, 32, 0);
    struct kv_policy pol, before;
    memset(&pol, 0x5A, sizeof pol);
    before = pol;
    struct kv_policy_params pp;
    struct verr err = {0};
    const struct {
        int ga_n, ga_w, n_keep, seq, n_ctx;
        const char *want;
    } cases[] = {
        {2, 7, 0, 0, 16, "multiple of ga_n"},
        {0, 8, 0, 0, 16, "ga_n 0"},
        {2, 64, 0, 0, 16, "ga_w 64 must be <= n_ctx"},
        {1, 8, -1, 0, 16, "n_keep -1"},
        {1, 8, 0, 9, 16, "sequence id 9"},
        {1, 8, 0, 0, 33, "a share of 33 cells"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kv_policy_params_default(&pp);
        pp.ga_n = cases[i].ga_n;
        pp.ga_w = cases[i].ga_w;
        pp.n_keep = cases[i].n_keep;
        err.msg[0] = '\0';
        cr_expect_eq(kv_policy_init(&pol, &pp, &kv, cases[i].seq, cases[i].n_ctx, &err), VERR_RANGE,
                     "case %zu", i);
        cr_expect(strstr(err.msg, cases[i].want), "case %zu: '%s' lacks '%s'", i, err.msg,
                  cases[i].want);
        cr_expect(!memcmp(&pol, &before, sizeof pol), "case %zu changed the policy", i);
    }
    kv_free(&kv);
}
