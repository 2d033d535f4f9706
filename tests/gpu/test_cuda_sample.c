// The CUDA sample op against the CPU sample op (which tests/test_sample_op.c
// ties to host/backend/sampler.c): the same logits, parameters and draws u go to both
// backends and the picked ids must be identical, row by row, on both of the
// CUDA op's paths (top_k <= CUDA_SAMPLE_MAX_K: one block per row; top_k off or
// larger: whole rows sorted first) and for greedy rows.
//
// The one allowed difference, and why: the two backends compute the same
// probabilities with the same float operations in the same order except
// for exp (glibc's expf on the host, a double exp rounded to float on the
// device: both are correctly rounded in all but rare cases, where they differ
// by one ulp) and the order in which the double sums (the softmax
// normalizer, dist's running sum) are added. So the cumulative sums agree to a few parts in 1e7,
// not bit for bit, and where u lies that close to the boundary between two
// candidates either may be picked; likewise top_p's float running sum within
// rounding of top_p can keep one candidate more or fewer. within_rounding()
// recomputes the CPU chain step by step and accepts a mismatch only then;
// such mismatches must stay rare (at most 1% of the rows of a call, plus 2),
// and every one is logged. Without a usable CUDA device every test skips.
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/sample.h" // CUDA_SAMPLE_MAX_K: which path a row takes
#include "host/ops/backend.h"
#include "host/backend/sampler.h"
#include "tests/gpu/gpu_fixture.h"
#include "tests/rng_splitmix.h"

// u within TOL_U of a cumulative sum: the sums agree to a few 1e-7 (each
// probability to 1-2 float ulps, the total to < 1 relative ulp); 1e-6 leaves
// a margin of several times that.
#define TOL_U 1e-6
// top_p within TOL_P of the float running sum at its cut: one probability
// that differs by an ulp makes the two running sums round apart, by up to
// half an ulp of the sum per later addition: 1e-4 covers a thousand of them.
#define TOL_P 1e-4

TestSuite(cuda_sample, .init = setup, .fini = teardown, .timeout = 900);

// Normal logits of some scale; rounded to a grid (many exact ties, the order
// then rests on ids); a tenth masked to -inf; a few integers only; one
// peaked row; a quarter exact zeros of both signs (-0 ties +0 on the host).
static void random_logits(float *l, int n) {
    const int kind = irand(0, 5);
    const float scale = (float)(0.5 + 6 * urand());
    for (int i = 0; i < n; i++) {
        float x = nrand() * scale;
        if (kind == 1)
            x = roundf(x * 2) / 2;
        if (kind == 2 && irand(0, 9) == 0)
            x = -INFINITY;
        if (kind == 3)
            x = (float)irand(-3, 3);
        if (kind == 5 && irand(0, 3) == 0)
            x = irand(0, 1) ? 0.0f : -0.0f;
        l[i] = x;
    }
    if (kind == 4)
        l[irand(0, n - 1)] += 12.0f;
    if (kind == 2)
        l[irand(0, n - 1)] = 1.0f; // at least one finite logit
}

static const float temps[] = {0.0f, 0.25f, 0.7f, 0.8f, 1.0f, 1.5f, 3.0f, 7.0f};
static const float top_ps[] = {1.0f, 0.95f, 0.9f, 0.5f, 0.1f, 0.0f, 0.999f};
static const float min_ps[] = {0.0f, 0.05f, 0.1f, 0.5f, 1.0f, 1.5f};
#define PICK(a) (a)[irand(0, (int)(sizeof(a) / sizeof((a)[0])) - 1)]

// Row parameters for one path: top_k in [1, CUDA_SAMPLE_MAX_K] (block path)
// or off / larger (sort path).
static struct sample_params random_params(bool block_path, int n_vocab) {
    int k;
    if (block_path) {
        const int ks[] = {1, 2, 5, 40, 100, CUDA_SAMPLE_MAX_K, irand(1, CUDA_SAMPLE_MAX_K)};
        k = PICK(ks);
    } else {
        const int ks[] = {0, -1, CUDA_SAMPLE_MAX_K + 1, 5000, n_vocab, 1 << 30};
        k = PICK(ks);
    }
    struct sample_params p = {PICK(temps), k, PICK(top_ps), PICK(min_ps), urand()};
    if (irand(0, 7) == 0)
        p.u = 1.0 - 1.0 / 9007199254740992.0; // the largest draw: the tail
    return p;
}

// True when the CPU's and GPU's picks a_id and b_id of one row can differ by
// rounding (see the top of the file): the CPU chain is recomputed with the
// sampler's steps and the row is accepted when top_p is within TOL_P of the
// running sum at its cut, or when u is within TOL_U of every cumulative sum
// from the earlier of the two picks to the one before the later.
static bool within_rounding(const float *l, int n_vocab, const struct sample_params *sp,
                            int32_t a_id, int32_t b_id, char *why, size_t cap) {
    snprintf(why, cap, "not explained by rounding");
    if (sp->temp <= 0 || b_id < 0 || b_id >= n_vocab)
        return false; // greedy is exact
    struct sampler_cand *cd = malloc((size_t)n_vocab * sizeof *cd);
    cr_assert(cd);
    for (int i = 0; i < n_vocab; i++)
        cd[i] = (struct sampler_cand){i, l[i], 0.0f};
    struct sampler_cands c = {cd, (size_t)n_vocab, false};
    bool ok = false;
    sampler_apply_top_k(&c, sp->top_k);
    if (!(sp->top_p >= 1.0f)) { // sampler_apply_top_p, watching its running sum
        sampler_softmax(&c);
        float cum = 0.0f, prev = 0.0f;
        size_t cut = c.size;
        for (size_t i = 0; i < c.size; i++) {
            prev = cum;
            cum += c.data[i].p;
            if (cum >= sp->top_p) {
                cut = i + 1;
                break;
            }
        }
        if (fabsf(cum - sp->top_p) <= TOL_P || (cut > 1 && fabsf(prev - sp->top_p) <= TOL_P)) {
            snprintf(why, cap, "top_p %g within %g of the running sum %.9g at the cut %zu",
                     (double)sp->top_p, TOL_P, (double)cum, cut);
            ok = true;
        }
        c.size = cut;
    }
    if (!ok) {
        sampler_apply_min_p(&c, sp->min_p, 1);
        sampler_apply_temp(&c, sp->temp);
        sampler_softmax(&c);
        long pa = -1, pb = -1;
        for (size_t i = 0; i < c.size; i++) {
            if (c.data[i].id == a_id)
                pa = (long)i;
            if (c.data[i].id == b_id)
                pb = (long)i;
        }
        if (pa >= 0 && pb >= 0) {
            const long lo = pa < pb ? pa : pb, hi = pa < pb ? pb : pa;
            double cum = 0, c_lo = 0, c_hi1 = 0;
            for (long i = 0; i < hi; i++) {
                cum += c.data[i].p;
                if (i == lo)
                    c_lo = cum;
                if (i == hi - 1)
                    c_hi1 = cum;
            }
            ok = fabs(sp->u - c_lo) <= TOL_U && fabs(sp->u - c_hi1) <= TOL_U;
            snprintf(why, cap,
                     "u %.17g vs cumulative sums %.17g (position %ld) .. %.17g (position %ld): %s",
                     sp->u, c_lo, lo, c_hi1, hi - 1, ok ? "within rounding" : "too far");
        } else {
            snprintf(why, cap, "pick not among the CPU's final candidates (positions %ld, %ld)", pa,
                     pb);
        }
    }
    free(cd);
    return ok;
}

// Both backends sample the rows; returns how many picks differed within
// rounding (any other difference fails the test).
static int compare_rows(const float *logits /* [n_rows][n_vocab] */, int n_rows, int n_vocab,
                        const struct sample_params *sp /* [n_rows] */, const char *what) {
    int32_t *want = malloc((size_t)n_rows * sizeof *want);
    int32_t *got = malloc((size_t)n_rows * sizeof *got);
    cr_assert(want && got);
    OK(cpu, cpu->ops->sample(cpu, want, logits, n_rows, n_vocab, sp));

    const size_t bytes = (size_t)n_rows * n_vocab * sizeof(float);
    void *d_logits = NULL, *d_out = NULL;
    OK(gpu, gpu->ops->alloc(gpu, bytes, &d_logits));
    OK(gpu, gpu->ops->alloc(gpu, (size_t)n_rows * sizeof(int32_t), &d_out));
    OK(gpu, gpu->ops->upload(gpu, d_logits, logits, bytes));
    OK(gpu, gpu->ops->memset_zero(gpu, d_out, (size_t)n_rows * sizeof(int32_t)));
    OK(gpu, gpu->ops->sample(gpu, d_out, d_logits, n_rows, n_vocab, sp));
    OK(gpu, gpu->ops->download(gpu, got, d_out, (size_t)n_rows * sizeof(int32_t)));
    OK(gpu, gpu->ops->sync(gpu));
    gpu->ops->free(gpu, d_logits);
    gpu->ops->free(gpu, d_out);

    int explained = 0;
    char why[256];
    for (int r = 0; r < n_rows; r++) {
        if (got[r] == want[r])
            continue;
        const float *l = logits + (size_t)r * n_vocab;
        const bool ok = within_rounding(l, n_vocab, &sp[r], want[r], got[r], why, sizeof why);
        cr_assert(ok,
                  "%s: n_vocab %d row %d (temp %g top_k %d top_p %g min_p %g u %.17g): cuda %d, "
                  "cpu %d; %s",
                  what, n_vocab, r, (double)sp[r].temp, sp[r].top_k, (double)sp[r].top_p,
                  (double)sp[r].min_p, sp[r].u, got[r], want[r], why);
        cr_log_info("%s: row %d: cuda %d, cpu %d: %s", what, r, got[r], want[r], why);
        explained++;
    }
    cr_expect(explained <= n_rows / 100 + 2, "%s: %d of %d rows differ within rounding: too many",
              what, explained, n_rows);
    cr_log_info("%s: n_vocab %d, %d rows: %d identical, %d within rounding", what, n_vocab, n_rows,
                n_rows - explained, explained);
    free(want);
    free(got);
    return explained;
}

// n_logits distinct rows, each sampled with `per` different parameter sets
// and draws.
static void random_case(int n_vocab, int n_logits, int per, bool block_path, uint64_t seed,
                        const char *what) {
    rng_seed(seed);
    const int n_rows = n_logits * per;
    float *logits = malloc((size_t)n_rows * n_vocab * sizeof(float));
    struct sample_params *sp = malloc((size_t)n_rows * sizeof *sp);
    cr_assert(logits && sp);
    for (int i = 0; i < n_logits; i++) {
        float *l = logits + (size_t)i * per * n_vocab;
        random_logits(l, n_vocab);
        for (int j = 0; j < per; j++) {
            if (j > 0)
                memcpy(l + (size_t)j * n_vocab, l, (size_t)n_vocab * sizeof(float));
            sp[i * per + j] = random_params(block_path, n_vocab);
        }
    }
    compare_rows(logits, n_rows, n_vocab, sp, what);
    free(logits);
    free(sp);
}

Test(cuda_sample, block_path_random) {
    REQUIRE_GPU();
    random_case(1000, 32, 4, true, 1, "block path");
    random_case(32000, 16, 4, true, 2, "block path");
    random_case(151936, 8, 4, true, 3, "block path");
    random_case(3, 16, 8, true, 4, "block path, n_vocab < top_k");
    // the first stage's chunks of 4096 logits: a last chunk of one logit,
    // of fewer logits than top_k, and exactly whole chunks
    random_case(4097, 8, 4, true, 11, "block path, a chunk of one");
    random_case(8192 + 700, 8, 4, true, 12, "block path, a short last chunk");
    random_case(3 * 4096, 8, 4, true, 13, "block path, whole chunks");
}

Test(cuda_sample, sort_path_random) {
    REQUIRE_GPU();
    random_case(50, 16, 8, false, 5, "sort path");
    random_case(5000, 16, 4, false, 6, "sort path");
    random_case(32000, 8, 4, false, 7, "sort path");
    random_case(151936, 4, 2, false, 8, "sort path");
}

// More sort-path rows than one sort takes (SAMPLE_SORT_ITEMS / n_vocab = 131
// at this size), so the rows go in two chunks.
Test(cuda_sample, sort_path_chunks) {
    REQUIRE_GPU();
    random_case(32000, 50, 4, false, 9, "sort path, two chunks");
}

// Greedy, block and sort rows in one call; llama.cpp's defaults among them.
Test(cuda_sample, mixed_rows) {
    REQUIRE_GPU();
    rng_seed(10);
    const int n_vocab = 151936, n_rows = 48;
    float *logits = malloc((size_t)n_rows * n_vocab * sizeof(float));
    struct sample_params sp[48];
    cr_assert(logits);
    for (int r = 0; r < n_rows; r++) {
        random_logits(logits + (size_t)r * n_vocab, n_vocab);
        switch (r % 4) {
        case 0:
            sp[r] = (struct sample_params){0.0f, 40, 0.95f, 0.05f, 0.0};
            break;
        case 1:
            sp[r] = (struct sample_params){0.8f, 40, 0.95f, 0.05f, urand()};
            break;
        case 2:
            sp[r] = (struct sample_params){1.0f, 0, 1.0f, 0.05f, urand()}; // min_p alone
            break;
        default:
            sp[r] = random_params(irand(0, 1), n_vocab);
        }
    }
    compare_rows(logits, n_rows, n_vocab, sp, "mixed rows");
    free(logits);
}

// One row, u swept over [0, 1): every boundary of the inverse CDF is crossed.
Test(cuda_sample, u_sweep) {
    REQUIRE_GPU();
    rng_seed(11);
    const int n_vocab = 4096, n_rows = 1024;
    float *logits = malloc((size_t)n_rows * n_vocab * sizeof(float));
    struct sample_params *sp = malloc((size_t)n_rows * sizeof *sp);
    cr_assert(logits && sp);
    for (int i = 0; i < n_vocab; i++)
        logits[i] = nrand() * 2.0f;
    for (int r = 1; r < n_rows; r++)
        memcpy(logits + (size_t)r * n_vocab, logits, (size_t)n_vocab * sizeof(float));
    const struct sample_params settings[3] = {
        {1.0f, 64, 1.0f, 0.0f, 0},
        {0.7f, 0, 0.9f, 0.0f, 0},
        {1.3f, 0, 1.0f, 0.02f, 0},
    };
    for (int s = 0; s < 3; s++) {
        for (int r = 0; r < n_rows; r++) {
            sp[r] = settings[s];
            sp[r].u = (r + 0.5) / n_rows;
        }
        compare_rows(logits, n_rows, n_vocab, sp, "u sweep");
    }
    free(logits);
    free(sp);
}

// p = 0.4, 0.3, 0.2, 0.1 for ids 3, 2, 1, 0 on both paths; and two logits
// made equal by the temperature, where the path decides the order (see
// tests/test_sample_op.c: ties_made_by_temperature).
Test(cuda_sample, hand_computed) {
    REQUIRE_GPU();
    const float l[4] = {0.0f, logf(2), logf(3), logf(4)};
    const double us[] = {0.0, 0.39, 0.41, 0.69, 0.71, 0.89, 0.91, 0.999999};
    const int32_t want[] = {3, 3, 2, 2, 1, 1, 0, 0};
    float logits[16 * 4];
    struct sample_params sp[16];
    for (int r = 0; r < 16; r++) {
        memcpy(logits + r * 4, l, sizeof l);
        // top_k 4: the block path; top_k 0: the sort path
        sp[r] = (struct sample_params){1.0f, r < 8 ? 4 : 0, 1.0f, 0.0f, us[r % 8]};
    }
    void *d_logits, *d_out;
    int32_t got[16];
    OK(gpu, gpu->ops->alloc(gpu, sizeof logits, &d_logits));
    OK(gpu, gpu->ops->alloc(gpu, sizeof got, &d_out));
    OK(gpu, gpu->ops->upload(gpu, d_logits, logits, sizeof logits));
    OK(gpu, gpu->ops->sample(gpu, d_out, d_logits, 16, 4, sp));
    OK(gpu, gpu->ops->download(gpu, got, d_out, sizeof got));
    OK(gpu, gpu->ops->sync(gpu));
    for (int r = 0; r < 16; r++)
        cr_expect_eq(got[r], want[r % 8], "row %d (u %g): %d, expected %d", r, us[r % 8], got[r],
                     want[r % 8]);

    float t[2 * 3];
    t[0] = nextafterf(1.9f, 2.0f);
    t[1] = nextafterf(t[0], 2.0f);
    t[2] = -40.0f;
    memcpy(t + 3, t, 3 * sizeof(float));
    struct sample_params tp[2] = {{3.0f, 0, 1.0f, 0.0f, 0.1}, {3.0f, 3, 1.0f, 0.0f, 0.1}};
    OK(gpu, gpu->ops->upload(gpu, d_logits, t, sizeof t));
    OK(gpu, gpu->ops->sample(gpu, d_out, d_logits, 2, 3, tp));
    OK(gpu, gpu->ops->download(gpu, got, d_out, 2 * sizeof(int32_t)));
    OK(gpu, gpu->ops->sync(gpu));
    cr_expect_eq(got[0], 0, "tie made by temp, sort path: the lower id first");
    cr_expect_eq(got[1], 1, "block path: sorted before temp");
    gpu->ops->free(gpu, d_logits);
    gpu->ops->free(gpu, d_out);
}

// Greedy rows give the argmax op's ids.
Test(cuda_sample, greedy_is_argmax) {
    REQUIRE_GPU();
    rng_seed(12);
    const int n_vocab = 32000, n_rows = 16;
    float *logits = malloc((size_t)n_rows * n_vocab * sizeof(float));
    struct sample_params sp[16];
    for (int r = 0; r < n_rows; r++) {
        random_logits(logits + (size_t)r * n_vocab, n_vocab);
        sp[r] = (struct sample_params){r % 2 ? 0.0f : -1.0f, irand(-1, 2000), 0.9f, 0.1f, urand()};
    }
    void *d_logits, *d_a, *d_b;
    int32_t a[16], b[16];
    OK(gpu, gpu->ops->alloc(gpu, (size_t)n_rows * n_vocab * sizeof(float), &d_logits));
    OK(gpu, gpu->ops->alloc(gpu, sizeof a, &d_a));
    OK(gpu, gpu->ops->alloc(gpu, sizeof b, &d_b));
    OK(gpu, gpu->ops->upload(gpu, d_logits, logits, (size_t)n_rows * n_vocab * sizeof(float)));
    OK(gpu, gpu->ops->sample(gpu, d_a, d_logits, n_rows, n_vocab, sp));
    OK(gpu, gpu->ops->argmax(gpu, d_b, d_logits, n_rows, n_vocab));
    OK(gpu, gpu->ops->download(gpu, a, d_a, sizeof a));
    OK(gpu, gpu->ops->download(gpu, b, d_b, sizeof b));
    OK(gpu, gpu->ops->sync(gpu));
    cr_expect_arr_eq(a, b, sizeof a);
    gpu->ops->free(gpu, d_logits);
    gpu->ops->free(gpu, d_a);
    gpu->ops->free(gpu, d_b);
    free(logits);
}

Test(cuda_sample, argument_checks) {
    REQUIRE_GPU();
    void *d_logits, *d_out;
    OK(gpu, gpu->ops->alloc(gpu, 16, &d_logits));
    OK(gpu, gpu->ops->alloc(gpu, 16, &d_out));
    struct sample_params sp = {1.0f, 0, 1.0f, 0.0f, 1.0};
    cr_expect_eq(gpu->ops->sample(gpu, d_out, d_logits, 1, 3, &sp), VERR_RANGE, "u = 1");
    sp.u = NAN;
    cr_expect_eq(gpu->ops->sample(gpu, d_out, d_logits, 1, 3, &sp), VERR_RANGE, "u NaN");
    sp.u = 0.5;
    cr_expect_eq(gpu->ops->sample(gpu, d_out, d_logits, 1, 0, &sp), VERR_RANGE, "n_vocab 0");
    cr_expect_eq(gpu->ops->sample(gpu, d_out, d_logits, 1, 3, NULL), VERR_RANGE, "no params");
    cr_expect_eq(gpu->ops->sample(gpu, d_out, d_logits, 0, 3, &sp), 0, "no rows");
    OK(gpu, gpu->ops->sync(gpu));
    gpu->ops->free(gpu, d_logits);
    gpu->ops->free(gpu, d_out);
}
