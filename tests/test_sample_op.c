// The CPU backend's sample op against host/backend/sampler.c: for random logits and
// random chain parameters the op, given the draw u, must pick exactly the
// token sampler_sample picks when its RNG makes that same draw. Integer ids
// are compared for equality: there is no tolerance, the op runs the
// sampler's own code. Also: hand-computed inverse-CDF picks, the engine's
// pattern (sampler_next_params + op), thread-count independence, and the
// argument checks.
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "host/ops/backend.h"
#include "host/backend/sampler.h"
#include "tests/rng_splitmix.h"

// Logits of several shapes: plain normal of some scale, rounded to a grid
// (many exact ties), a few -inf (masked tokens), one peaked row.
static void random_logits(float *l, int n) {
    const int kind = irand(0, 4);
    const float scale = (float)(0.5 + 6 * urand());
    for (int i = 0; i < n; i++) {
        float x = nrand() * scale;
        if (kind == 1)
            x = roundf(x * 2) / 2;
        if (kind == 2 && irand(0, 9) == 0)
            x = -INFINITY;
        if (kind == 3)
            x = (float)irand(-3, 3);
        l[i] = x;
    }
    if (kind == 4)
        l[irand(0, n - 1)] += 12.0f;
    if (kind == 2)
        l[irand(0, n - 1)] = 1.0f; // at least one finite logit
}

static const float temps[] = {0.0f, -1.0f, 0.25f, 0.8f, 1.0f, 1.5f, 3.0f, 7.0f};
static const int top_ks[] = {0, -1, 1, 2, 5, 40, 100, 1000, 1025, 5000, 1 << 30};
static const float top_ps[] = {1.0f, 1.5f, 0.95f, 0.9f, 0.5f, 0.1f, 0.0f, 0.999f};
static const float min_ps[] = {0.0f, -1.0f, 0.05f, 0.1f, 0.5f, 1.0f, 1.5f};
#define PICK(a) (a)[irand(0, (int)(sizeof(a) / sizeof((a)[0])) - 1)]

static struct sampler_params random_params(void) {
    struct sampler_params p;
    sampler_params_default(&p);
    p.temp = PICK(temps);
    p.top_k = PICK(top_ks);
    p.top_p = PICK(top_ps);
    p.min_p = PICK(min_ps);
    p.repeat_last_n = 0;
    p.seed = (uint32_t)rng_u64();
    if (p.seed == SAMPLER_SEED_RANDOM)
        p.seed = 1;
    return p;
}

static struct backend *cpu;

static void setup(void) {
    struct verr err = {0};
    cr_assert_eq(backend_cpu_create(&cpu, 4, &err), 0, "backend_cpu_create: %s", err.msg);
}

static void teardown(void) {
    backend_destroy(cpu);
    cpu = NULL;
}

TestSuite(sample_op, .init = setup, .fini = teardown, .timeout = 600);

#define OK(be, call) cr_assert_eq((call), 0, "%s: %s", (be)->ops->name, (be)->err.msg)

// n_rows rows, each with its own parameters and sampler; every step the op
// (u mirrored from a twin of the sampler's RNG) and sampler_sample must agree.
static void op_vs_sampler(int n_vocab, int n_rows, int steps, uint64_t seed) {
    rng_seed(seed);
    float *logits = malloc((size_t)n_rows * n_vocab * sizeof(float));
    struct sample_params *sp = malloc((size_t)n_rows * sizeof *sp);
    int32_t *ids = malloc((size_t)n_rows * sizeof *ids);
    struct sampler **smp = calloc((size_t)n_rows, sizeof *smp);
    struct sampler_rng *twin = malloc((size_t)n_rows * sizeof *twin);
    struct sampler_params *pp = malloc((size_t)n_rows * sizeof *pp);
    cr_assert(logits && sp && ids && smp && twin && pp);
    struct verr err = {0};
    for (int r = 0; r < n_rows; r++) {
        pp[r] = random_params();
        cr_assert_eq(sampler_create(&smp[r], &pp[r], n_vocab, &err), 0, "%s", err.msg);
        sampler_rng_seed(&twin[r], pp[r].seed);
    }
    long checked = 0, not_top = 0;
    for (int step = 0; step < steps; step++) {
        for (int r = 0; r < n_rows; r++) {
            random_logits(logits + (size_t)r * n_vocab, n_vocab);
            sp[r] = (struct sample_params){pp[r].temp, pp[r].top_k, pp[r].top_p, pp[r].min_p,
                                           pp[r].temp <= 0 ? 0.0 : sampler_rng_uniform(&twin[r])};
        }
        OK(cpu, cpu->ops->sample(cpu, ids, logits, n_rows, n_vocab, sp));
        for (int r = 0; r < n_rows; r++) {
            const float *l = logits + (size_t)r * n_vocab;
            const int32_t want = sampler_sample(smp[r], l);
            cr_assert_eq(ids[r], want,
                         "n_vocab %d row %d step %d (temp %g top_k %d top_p %g min_p %g u %.17g): "
                         "op %d, sampler %d",
                         n_vocab, r, step, (double)sp[r].temp, sp[r].top_k, (double)sp[r].top_p,
                         (double)sp[r].min_p, sp[r].u, ids[r], want);
            cr_assert(ids[r] >= 0 && ids[r] < n_vocab);
            int amax = 0;
            for (int i = 1; i < n_vocab; i++)
                if (l[i] > l[amax])
                    amax = i;
            not_top += ids[r] != amax;
            checked++;
        }
    }
    // The parameter mix must exercise real sampling, not only greedy picks.
    if (n_vocab > 1)
        cr_expect(not_top > checked / 50, "only %ld of %ld picks differ from the argmax", not_top,
                  checked);
    cr_log_info("n_vocab %d: %ld picks identical, %ld not the argmax", n_vocab, checked, not_top);
    for (int r = 0; r < n_rows; r++)
        sampler_free(smp[r]);
    free(logits);
    free(sp);
    free(ids);
    free(smp);
    free(twin);
    free(pp);
}

Test(sample_op, matches_sampler_tiny_vocab) {
    op_vs_sampler(1, 4, 20, 1);
    op_vs_sampler(2, 16, 200, 2);
    op_vs_sampler(7, 16, 200, 3);
}

Test(sample_op, matches_sampler_small_vocab) {
    op_vs_sampler(100, 32, 100, 4);
    op_vs_sampler(1000, 32, 40, 5);
}

Test(sample_op, matches_sampler_large_vocab) {
    op_vs_sampler(5000, 16, 20, 6);
    op_vs_sampler(32000, 8, 4, 7);
}

// p = 0.4, 0.3, 0.2, 0.1 for ids 3, 2, 1, 0: the cumulative sums 0.4, 0.7, 0.9
// and 1.0 split [0, 1); u picks the interval it falls in.
Test(sample_op, inverse_cdf_hand_computed) {
    const float l[4] = {0.0f, logf(2), logf(3), logf(4)};
    const double us[] = {0.0, 0.39, 0.41, 0.69, 0.71, 0.89, 0.91, 0.999999};
    const int32_t want[] = {3, 3, 2, 2, 1, 1, 0, 0};
    const int n = (int)(sizeof us / sizeof us[0]);
    float logits[8 * 4];
    struct sample_params sp[8];
    int32_t ids[8];
    for (int r = 0; r < n; r++) {
        memcpy(logits + r * 4, l, sizeof l);
        sp[r] = (struct sample_params){1.0f, 0, 1.0f, 0.0f, us[r]};
    }
    OK(cpu, cpu->ops->sample(cpu, ids, logits, n, 4, sp));
    for (int r = 0; r < n; r++)
        cr_expect_eq(ids[r], want[r], "u %g: %d, expected %d", us[r], ids[r], want[r]);

    // top_k 2 keeps ids 3, 2 with p 4/7, 3/7
    for (int r = 0; r < n; r++)
        sp[r].top_k = 2;
    OK(cpu, cpu->ops->sample(cpu, ids, logits, n, 4, sp));
    for (int r = 0; r < n; r++)
        cr_expect_eq(ids[r], us[r] < 4.0 / 7 ? 3 : 2, "top_k 2, u %g: %d", us[r], ids[r]);

    // min_p 0.6 keeps p >= 0.24: ids 3, 2 again; greedy ignores u
    for (int r = 0; r < n; r++)
        sp[r] = (struct sample_params){1.0f, 0, 1.0f, 0.6f, us[r]};
    OK(cpu, cpu->ops->sample(cpu, ids, logits, n, 4, sp));
    for (int r = 0; r < n; r++)
        cr_expect_eq(ids[r], us[r] < 4.0 / 7 ? 3 : 2, "min_p 0.6, u %g: %d", us[r], ids[r]);
    for (int r = 0; r < n; r++)
        sp[r].temp = 0.0f;
    OK(cpu, cpu->ops->sample(cpu, ids, logits, n, 4, sp));
    for (int r = 0; r < n; r++)
        cr_expect_eq(ids[r], 3, "greedy");
}

// With top_k and top_p off, dist sorts after the temperature: two logits one
// ulp apart can become equal when divided, and then the lower id comes first.
// id 1 has the larger logit, but at temp 3 both give the same quotient: with
// top_k and top_p off id 0 comes first (p 1/2 each, u 0.1 picks it); with
// top_k on, the sort came before the division and id 1 comes first.
Test(sample_op, ties_made_by_temperature) {
    float logits[2 * 3];
    logits[0] = nextafterf(1.9f, 2.0f);
    logits[1] = nextafterf(logits[0], 2.0f);
    logits[2] = -40.0f;
    memcpy(logits + 3, logits, 3 * sizeof(float));
    volatile float t = 3.0f; // divided at run time, as the op does
    cr_assert_eq(logits[0] / t, logits[1] / t, "the test needs the two quotients equal");
    struct sample_params sp[2] = {{3.0f, 0, 1.0f, 0.0f, 0.1}, {3.0f, 3, 1.0f, 0.0f, 0.1}};
    int32_t ids[2];
    OK(cpu, cpu->ops->sample(cpu, ids, logits, 2, 3, sp));
    cr_expect_eq(ids[0], 0, "tie after temp: the lower id first");
    cr_expect_eq(ids[1], 1, "sorted by top_k before temp");
}

// What the engine does: sampler_next_params + the op + sampler_accept gives
// the tokens a twin sampler gives with sampler_sample, greedy rows included.
Test(sample_op, engine_pattern_next_params) {
    rng_seed(11);
    const int n_vocab = 300, n_rows = 12, steps = 60;
    float *logits = malloc((size_t)n_rows * n_vocab * sizeof(float));
    struct sample_params sp[12];
    int32_t ids[12];
    struct sampler *a[12], *b[12];
    struct verr err = {0};
    for (int r = 0; r < n_rows; r++) {
        struct sampler_params p = random_params();
        if (r % 4 == 0)
            p.temp = 0.0f;
        p.repeat_last_n = 16; // penalties neutral: still off
        cr_assert_eq(sampler_create(&a[r], &p, n_vocab, &err), 0, "%s", err.msg);
        cr_assert_eq(sampler_create(&b[r], &p, n_vocab, &err), 0, "%s", err.msg);
        cr_expect(sampler_penalties_off(a[r]));
    }
    for (int step = 0; step < steps; step++) {
        for (int r = 0; r < n_rows; r++) {
            random_logits(logits + (size_t)r * n_vocab, n_vocab);
            sampler_next_params(a[r], &sp[r]);
        }
        OK(cpu, cpu->ops->sample(cpu, ids, logits, n_rows, n_vocab, sp));
        for (int r = 0; r < n_rows; r++) {
            const int32_t want = sampler_sample(b[r], logits + (size_t)r * n_vocab);
            cr_assert_eq(ids[r], want, "row %d step %d: op %d, sampler %d", r, step, ids[r], want);
            sampler_accept(a[r], ids[r]);
            sampler_accept(b[r], want);
        }
    }
    for (int r = 0; r < n_rows; r++) {
        sampler_free(a[r]);
        sampler_free(b[r]);
    }
    free(logits);

    struct sampler_params p;
    sampler_params_default(&p);
    p.seed = 5;
    p.repeat_penalty = 1.1f;
    struct sampler *s;
    cr_assert_eq(sampler_create(&s, &p, 10, &err), 0, "%s", err.msg);
    cr_expect(!sampler_penalties_off(s), "a repeat penalty must stay on the host");
    sampler_free(s);
    p.repeat_last_n = 0;
    cr_assert_eq(sampler_create(&s, &p, 10, &err), 0, "%s", err.msg);
    cr_expect(sampler_penalties_off(s), "an empty window penalizes nothing");
    sampler_free(s);
}

// The result is the same with one thread and with several.
Test(sample_op, thread_count_independent) {
    rng_seed(21);
    const int n_vocab = 2000, n_rows = 24;
    float *logits = malloc((size_t)n_rows * n_vocab * sizeof(float));
    struct sample_params sp[24];
    int32_t a[24], b[24];
    for (int r = 0; r < n_rows; r++) {
        random_logits(logits + (size_t)r * n_vocab, n_vocab);
        struct sampler_params p = random_params();
        sp[r] = (struct sample_params){p.temp, p.top_k, p.top_p, p.min_p, urand()};
    }
    struct backend *one;
    struct verr err = {0};
    cr_assert_eq(backend_cpu_create(&one, 1, &err), 0, "%s", err.msg);
    OK(cpu, cpu->ops->sample(cpu, a, logits, n_rows, n_vocab, sp));
    OK(one, one->ops->sample(one, b, logits, n_rows, n_vocab, sp));
    cr_expect_arr_eq(a, b, sizeof a);
    backend_destroy(one);
    free(logits);
}

Test(sample_op, greedy_is_argmax) {
    rng_seed(31);
    const int n_vocab = 777, n_rows = 9;
    float logits[9 * 777];
    struct sample_params sp[9];
    int32_t ids[9], am[9];
    for (int r = 0; r < n_rows; r++) {
        random_logits(logits + r * n_vocab, n_vocab);
        sp[r] = (struct sample_params){r % 2 ? 0.0f : -0.5f, irand(0, 50), 0.9f, 0.1f, urand()};
    }
    OK(cpu, cpu->ops->sample(cpu, ids, logits, n_rows, n_vocab, sp));
    OK(cpu, cpu->ops->argmax(cpu, am, logits, n_rows, n_vocab));
    cr_expect_arr_eq(ids, am, sizeof ids);
}

Test(sample_op, argument_checks) {
    float l[3] = {1, 2, 3};
    int32_t id = -1;
    struct sample_params sp = {1.0f, 0, 1.0f, 0.0f, 1.0};
    cr_expect_eq(cpu->ops->sample(cpu, &id, l, 1, 3, &sp), VERR_RANGE, "u = 1 is outside [0, 1)");
    sp.u = -0.25;
    cr_expect_eq(cpu->ops->sample(cpu, &id, l, 1, 3, &sp), VERR_RANGE);
    sp.u = NAN;
    cr_expect_eq(cpu->ops->sample(cpu, &id, l, 1, 3, &sp), VERR_RANGE);
    sp.u = 0.5;
    cr_expect_eq(cpu->ops->sample(cpu, &id, l, 1, 0, &sp), VERR_RANGE, "n_vocab 0");
    cr_expect_eq(cpu->ops->sample(cpu, &id, l, -1, 3, &sp), VERR_RANGE);
    cr_expect_eq(cpu->ops->sample(cpu, &id, l, 0, 3, &sp), 0, "no rows: nothing to do");
    cr_expect_eq(cpu->ops->sample(cpu, &id, l, 1, 3, NULL), VERR_RANGE);
    cr_expect_eq(id, -1, "nothing written on failure");
    OK(cpu, cpu->ops->sample(cpu, &id, l, 1, 3, &sp));
    cr_expect(id >= 0 && id < 3);
}
