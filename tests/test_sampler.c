// The sampler's steps against hand-computed distributions, the chain's
// order, greedy, and determinism for a seed.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "host/backend/sampler.h"

static struct sampler_cand buf[16];

static struct sampler_cands cands_of(const float *logits, int n) {
    for (int i = 0; i < n; i++) {
        buf[i].id = i;
        buf[i].logit = logits[i];
        buf[i].p = 0;
    }
    return (struct sampler_cands){buf, (size_t)n, false};
}

// Probabilities are float32 softmax results: compared to 1e-6.
#define PTOL 1e-6

Test(sampler, softmax_hand_computed) {
    // logits ln(1), ln(2), ln(3), ln(4): p = 0.1, 0.2, 0.3, 0.4
    float l[4] = {0.0f, logf(2), logf(3), logf(4)};
    struct sampler_cands c = cands_of(l, 4);
    sampler_softmax(&c);
    cr_assert(c.sorted);
    cr_expect_eq(c.data[0].id, 3);
    cr_expect_float_eq(c.data[0].p, 0.4f, PTOL);
    cr_expect_float_eq(c.data[1].p, 0.3f, PTOL);
    cr_expect_float_eq(c.data[2].p, 0.2f, PTOL);
    cr_expect_float_eq(c.data[3].p, 0.1f, PTOL);
}

Test(sampler, top_k) {
    float l[6] = {1, 5, 3, 6, 2, 4};
    struct sampler_cands c = cands_of(l, 6);
    sampler_apply_top_k(&c, 3);
    cr_assert_eq(c.size, 3);
    cr_expect_eq(c.data[0].id, 3);
    cr_expect_eq(c.data[1].id, 1);
    cr_expect_eq(c.data[2].id, 5);
    c = cands_of(l, 6);
    sampler_apply_top_k(&c, 0);
    cr_expect_eq(c.size, 6, "k <= 0 keeps all");
    c = cands_of(l, 6);
    sampler_apply_top_k(&c, 100);
    cr_expect_eq(c.size, 6);
}

Test(sampler, top_p) {
    // p = 0.4, 0.3, 0.2, 0.1 (sorted)
    float l[4] = {0.0f, logf(2), logf(3), logf(4)};
    struct sampler_cands c = cands_of(l, 4);
    sampler_apply_top_p(&c, 0.65f, 1);
    // cumulative 0.4, 0.7 >= 0.65: keeps 2
    cr_expect_eq(c.size, 2);
    c = cands_of(l, 4);
    sampler_apply_top_p(&c, 0.7f + 1e-4f, 1);
    cr_expect_eq(c.size, 3, "0.4+0.3 < 0.7001: a third is needed");
    c = cands_of(l, 4);
    sampler_apply_top_p(&c, 0.1f, 1);
    cr_expect_eq(c.size, 1);
    c = cands_of(l, 4);
    sampler_apply_top_p(&c, 1.0f, 1);
    cr_expect_eq(c.size, 4, "1.0 is off");
}

Test(sampler, min_p) {
    // p = 0.4, 0.3, 0.2, 0.1: min_p 0.5 keeps p >= 0.2 -> 3 tokens
    float l[4] = {0.0f, logf(2), logf(3), logf(4)};
    struct sampler_cands c = cands_of(l, 4);
    sampler_apply_min_p(&c, 0.5f + 1e-4f, 1);
    cr_expect_eq(c.size, 2, "0.2 < 0.5001*0.4");
    c = cands_of(l, 4);
    sampler_apply_min_p(&c, 0.49f, 1);
    cr_expect_eq(c.size, 3);
    // order kept (unsorted input stays in id order)
    cr_expect_eq(c.data[0].id, 1);
    cr_expect_eq(c.data[2].id, 3);
    c = cands_of(l, 4);
    sampler_apply_min_p(&c, 0.0f, 1);
    cr_expect_eq(c.size, 4, "0 is off");
}

Test(sampler, temperature) {
    // logits 0, ln 3 at temp 0.5 -> 0, 2 ln 3: p = 1/10, 9/10
    float l[2] = {0.0f, logf(3)};
    struct sampler_cands c = cands_of(l, 2);
    sampler_apply_temp(&c, 0.5f);
    sampler_softmax(&c);
    cr_expect_float_eq(c.data[0].p, 0.9f, PTOL);
    cr_expect_float_eq(c.data[1].p, 0.1f, PTOL);
}

Test(sampler, penalties) {
    float l[5] = {2.0f, -2.0f, 1.0f, 0.5f, 3.0f};
    int32_t last[4] = {0, 1, 0, 3};
    struct sampler_cands c = cands_of(l, 5);
    // repeat 2: positive logits halve, negative double; freq 0.1 per count; presence 0.25
    sampler_apply_penalties(&c, last, 4, 2.0f, 0.1f, 0.25f);
    cr_expect_float_eq(c.data[0].logit, 2.0f / 2 - 2 * 0.1f - 0.25f, 1e-6); // count 2
    cr_expect_float_eq(c.data[1].logit, -2.0f * 2 - 0.1f - 0.25f, 1e-6);    // count 1
    cr_expect_float_eq(c.data[2].logit, 1.0f, 0, "not in the window");
    cr_expect_float_eq(c.data[3].logit, 0.5f / 2 - 0.1f - 0.25f, 1e-6);
    cr_expect_float_eq(c.data[4].logit, 3.0f, 0);
}

Test(sampler, rng_deterministic_and_uniform) {
    struct sampler_rng a, b;
    sampler_rng_seed(&a, 42);
    sampler_rng_seed(&b, 42);
    double sum = 0;
    for (int i = 0; i < 10000; i++) {
        double u = sampler_rng_uniform(&a);
        cr_assert(u >= 0 && u < 1);
        cr_assert_eq(u, sampler_rng_uniform(&b));
        sum += u;
    }
    // mean of 10000 uniforms: sd 0.29/100 = 0.0029; 5 sd
    cr_expect(fabs(sum / 10000 - 0.5) < 0.015, "mean %g", sum / 10000);
}

Test(sampler, dist_frequencies) {
    // p = 0.1, 0.2, 0.3, 0.4: 20000 draws, each frequency within 5 sd
    float l[4] = {0.0f, logf(2), logf(3), logf(4)};
    struct sampler_rng r;
    sampler_rng_seed(&r, 7);
    int counts[4] = {0};
    const int n = 20000;
    for (int i = 0; i < n; i++) {
        struct sampler_cands c = cands_of(l, 4);
        counts[sampler_dist(&c, &r)]++;
    }
    for (int i = 0; i < 4; i++) {
        double p = 0.1 * (i + 1), f = (double)counts[i] / n, sd = sqrt(p * (1 - p) / n);
        cr_expect(fabs(f - p) < 5 * sd, "token %d: frequency %g, expected %g", i, f, p);
    }
}

Test(sampler, chain_greedy_and_seeded) {
    float l[8] = {0.1f, 2.0f, 1.9f, -1.0f, 0.5f, 1.0f, 0.0f, 1.95f};
    struct sampler_params p;
    sampler_params_default(&p);
    cr_expect_float_eq(p.temp, 0.8f, 0);
    cr_expect_eq(p.top_k, 40);
    cr_expect_float_eq(p.top_p, 0.95f, 0);
    cr_expect_float_eq(p.min_p, 0.05f, 0);
    cr_expect_eq(p.repeat_last_n, 64);
    cr_expect_eq(p.seed, SAMPLER_SEED_RANDOM);

    p.temp = 0;
    struct sampler *s;
    struct verr err = {0};
    cr_assert_eq(sampler_create(&s, &p, 8, &err), 0, "%s", err.msg);
    cr_expect_eq(sampler_sample(s, l), 1, "greedy");
    sampler_free(s);

    // greedy with a repeat penalty: token 1 was seen, 2.0/2 = 1.0 loses to 1.95
    p.repeat_penalty = 2.0f;
    cr_assert_eq(sampler_create(&s, &p, 8, &err), 0, "%s", err.msg);
    sampler_accept(s, 1);
    cr_expect_eq(sampler_sample(s, l), 7);
    sampler_free(s);

    // top_k 1 makes any temperature greedy
    sampler_params_default(&p);
    p.top_k = 1;
    p.seed = 3;
    cr_assert_eq(sampler_create(&s, &p, 8, &err), 0, "%s", err.msg);
    for (int i = 0; i < 20; i++)
        cr_expect_eq(sampler_sample(s, l), 1);
    sampler_free(s);

    // same seed, same tokens; the reported seed is the one given
    sampler_params_default(&p);
    p.temp = 1.5f;
    p.seed = 1234;
    struct sampler *s1, *s2;
    cr_assert_eq(sampler_create(&s1, &p, 8, &err), 0, "%s", err.msg);
    cr_assert_eq(sampler_create(&s2, &p, 8, &err), 0, "%s", err.msg);
    cr_expect_eq(sampler_seed(s1), 1234);
    int differs_from_greedy = 0;
    for (int i = 0; i < 50; i++) {
        int32_t a = sampler_sample(s1, l), b = sampler_sample(s2, l);
        cr_expect_eq(a, b);
        differs_from_greedy |= a != 1;
        // softmax of the raw logits: the 6 best sum to 0.951 >= 0.95, so
        // top_p drops tokens 6 (p 0.036) and 3 (p 0.013)
        cr_expect(a != 3 && a != 6, "token %d should have been cut by top_p", a);
    }
    cr_expect(differs_from_greedy, "temperature 1.5 samples more than the top token");
    // reset replays
    sampler_reset(s1);
    sampler_reset(s2);
    cr_expect_eq(sampler_sample(s1, l), sampler_sample(s2, l));
    sampler_free(s1);
    sampler_free(s2);

    // a random seed is reported and is not the sentinel
    sampler_params_default(&p);
    cr_assert_eq(sampler_create(&s, &p, 8, &err), 0, "%s", err.msg);
    cr_expect_neq(sampler_seed(s), SAMPLER_SEED_RANDOM);
    sampler_free(s);
}

Test(sampler, chain_order_top_k_before_top_p) {
    // With top_k 2 first, top_p 0.5 acts on the renormalized pair.
    // logits ln 4, ln 3, ln 2, ln 1: after top_k(2): p = 4/7, 3/7 -> top_p 0.5 keeps 1.
    float l[4] = {logf(4), logf(3), logf(2), 0.0f};
    struct sampler_cands c = cands_of(l, 4);
    sampler_apply_top_k(&c, 2);
    sampler_apply_top_p(&c, 0.5f, 1);
    cr_expect_eq(c.size, 1);
    cr_expect_eq(c.data[0].id, 0);
    // without top_k, p = 0.4 first: top_p 0.5 needs two
    c = cands_of(l, 4);
    sampler_apply_top_p(&c, 0.5f, 1);
    cr_expect_eq(c.size, 2);
}

// logit_bias comes first (llama.cpp's order): it changes which token the
// penalties and the chain see; entries of one token add up; -inf bans it;
// a bias makes the sampler one whose rows the backend's sample op cannot
// take (the op has no bias). sampler_create copies the entries and refuses
// tokens outside the vocabulary and biases that are NaN or +inf.
Test(sampler, logit_bias) {
    float l[4] = {1.0f, 2.0f, 3.0f, 0.5f};
    struct sampler_params p;
    sampler_params_default(&p);
    p.temp = 0;
    struct sampler *s;
    struct verr err = {0};
    struct sampler_bias b[3] = {{0, 5.0f}, {2, -INFINITY}, {1, 0.0f}};
    p.bias = b;
    p.n_bias = 2;
    cr_assert_eq(sampler_create(&s, &p, 4, &err), 0, "%s", err.msg);
    b[0].bias = -100; // the sampler holds its own copy
    cr_expect_eq(sampler_sample(s, l), 0, "1 + 5 = 6 beats 3");
    cr_expect(!sampler_penalties_off(s), "a bias: rows come to the host");
    float x[4] = {0.0f, 0.0f, 9.0f, 0.0f};
    cr_expect_neq(sampler_sample(s, x), 2, "banned, whatever its logit");
    sampler_free(s);

    // entries of one token add up: 2 + 0.6 + 0.6 = 3.2 > 3
    struct sampler_bias twice[2] = {{1, 0.6f}, {1, 0.6f}};
    p.bias = twice;
    p.n_bias = 2;
    cr_assert_eq(sampler_create(&s, &p, 4, &err), 0, "%s", err.msg);
    cr_expect_eq(sampler_sample(s, l), 1);
    sampler_free(s);
    p.n_bias = 1;
    cr_assert_eq(sampler_create(&s, &p, 4, &err), 0, "%s", err.msg);
    cr_expect_eq(sampler_sample(s, l), 2, "2.6 < 3");
    sampler_free(s);

    // sampling from {0: 1, 1: 2, 3: 0.5} with 2 banned never draws 2
    sampler_params_default(&p);
    p.seed = 11;
    struct sampler_bias ban = {2, -INFINITY};
    p.bias = &ban;
    p.n_bias = 1;
    cr_assert_eq(sampler_create(&s, &p, 4, &err), 0, "%s", err.msg);
    for (int i = 0; i < 200; i++)
        cr_expect_neq(sampler_sample(s, l), 2);
    sampler_free(s);

    struct sampler_bias bad[3] = {{4, 1.0f}, {-1, 1.0f}, {0, NAN}};
    for (int i = 0; i < 3; i++) {
        p.bias = &bad[i];
        cr_expect_eq(sampler_create(&s, &p, 4, &err), VERR_RANGE, "entry %d", i);
        cr_expect_null(s);
    }
    struct sampler_bias inf = {0, INFINITY};
    p.bias = &inf;
    cr_expect_eq(sampler_create(&s, &p, 4, &err), VERR_RANGE, "+inf is refused");
}
