// The layer split plan (host/split/plan.h) with made-up sizes: proportions as
// llama.cpp assigns them, contiguity, the first / last stage's extras, the
// free-memory check and its message, rebalancing by free memory, and the
// parsers of --tensor-split and --devices. Integer arithmetic only: every
// check is exact.
#include <criterion/criterion.h>
#include <string.h>

#include "host/split/plan.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

static size_t layers[256];

static struct plan_input input(int n_layer, int n_dev, const size_t *free_b, const float *split) {
    for (int i = 0; i < n_layer; i++)
        layers[i] = 100 * MiB;
    struct plan_input in = {
        .n_layer = n_layer,
        .layer_bytes = layers,
        .kv_bytes_per_layer = 10 * MiB,
        .embed_bytes = 50 * MiB,
        .head_bytes = 60 * MiB,
        .scratch_bytes = 5 * MiB,
        .head_scratch_bytes = 7 * MiB,
        .n_devices = n_dev,
        .free_bytes = free_b,
        .split = split,
    };
    return in;
}

static void assert_contiguous(const struct plan *p, int n_layer) {
    cr_assert_gt(p->n_stages, 0);
    cr_assert_eq(p->stage[0].l0, 0);
    for (int s = 0; s < p->n_stages; s++) {
        cr_assert_lt(p->stage[s].l0, p->stage[s].l1, "stage %d is empty", s);
        if (s > 0)
            cr_assert_eq(p->stage[s].l0, p->stage[s - 1].l1, "gap before stage %d", s);
    }
    cr_assert_eq(p->stage[p->n_stages - 1].l1, n_layer);
}

Test(plan, equal_split_of_unlimited_devices) {
    size_t fr[2] = {BACKEND_MEM_UNLIMITED, BACKEND_MEM_UNLIMITED};
    struct plan_input in = input(32, 2, fr, NULL);
    struct plan p;
    struct verr err = {0};
    cr_assert_eq(plan_make(&p, &in, &err), 0, "%s", err.msg);
    cr_assert_eq(p.n_stages, 2);
    assert_contiguous(&p, 32);
    cr_assert_eq(p.stage[0].l1, 16);
    // Stage 0: 16 layers + embedding; stage 1: 16 layers + head + logits.
    cr_assert_eq(p.stage[0].weight_bytes, 16 * 100 * MiB + 50 * MiB);
    cr_assert_eq(p.stage[1].weight_bytes, 16 * 100 * MiB + 60 * MiB);
    cr_assert_eq(p.stage[0].kv_bytes, 16 * 10 * MiB);
    cr_assert_eq(p.stage[0].scratch_bytes, 5 * MiB);
    cr_assert_eq(p.stage[1].scratch_bytes, 12 * MiB);
    cr_assert_eq(p.stage[1].total_bytes, 16 * 110 * MiB + 60 * MiB + 12 * MiB);
}

Test(plan, proportions_like_llama_cpp) {
    // 3:1 over 32 layers: layer il goes to device 0 while il/32 < 0.75.
    float split[2] = {3, 1};
    struct plan_input in = input(32, 2, NULL, split);
    struct plan p;
    struct verr err = {0};
    cr_assert_eq(plan_make(&p, &in, &err), 0, "%s", err.msg);
    cr_assert_eq(p.stage[0].l1, 24);
    cr_assert_eq(p.stage[1].l0, 24);

    // Three devices 1:2:1 over 10 layers: cumulative 0.25, 0.75, 1 ->
    // layers 0-2 (0, .1, .2 < .25), 3-7 (< .75), 8-9.
    float s3[3] = {1, 2, 1};
    in = input(10, 3, NULL, s3);
    cr_assert_eq(plan_make(&p, &in, &err), 0, "%s", err.msg);
    cr_assert_eq(p.n_stages, 3);
    cr_assert_eq(p.stage[0].l1, 3);
    cr_assert_eq(p.stage[1].l1, 8);
    cr_assert_eq(p.stage[2].l1, 10);
}

Test(plan, zero_proportion_drops_the_device) {
    float split[3] = {1, 0, 1};
    struct plan_input in = input(8, 3, NULL, split);
    struct plan p;
    struct verr err = {0};
    cr_assert_eq(plan_make(&p, &in, &err), 0, "%s", err.msg);
    cr_assert_eq(p.n_stages, 2);
    cr_assert_eq(p.stage[0].device, 0);
    cr_assert_eq(p.stage[1].device, 2);
    assert_contiguous(&p, 8);
    // "1,0": everything on device 0, one stage with both the embedding and the head.
    float one[2] = {1, 0};
    in = input(8, 2, NULL, one);
    cr_assert_eq(plan_make(&p, &in, &err), 0, "%s", err.msg);
    cr_assert_eq(p.n_stages, 1);
    cr_assert_eq(p.stage[0].weight_bytes, 8 * 100 * MiB + 50 * MiB + 60 * MiB);
}

Test(plan, every_device_with_a_share_gets_a_layer) {
    // 0.9 / 0.05 / 0.05 over 4 layers: llama.cpp's rule gives devices 1 and 2
    // nothing; the plan takes layers from the largest stage instead.
    float split[3] = {0.9f, 0.05f, 0.05f};
    struct plan_input in = input(4, 3, NULL, split);
    struct plan p;
    struct verr err = {0};
    cr_assert_eq(plan_make(&p, &in, &err), 0, "%s", err.msg);
    cr_assert_eq(p.n_stages, 3);
    assert_contiguous(&p, 4);
    cr_assert_eq(p.stage[0].l1, 2);
    cr_assert_eq(p.stage[1].l1 - p.stage[1].l0, 1);
    cr_assert_eq(p.stage[2].l1 - p.stage[2].l0, 1);
}

Test(plan, by_free_memory) {
    // No --tensor-split: proportions are the free memory, 3 GiB : 1 GiB.
    size_t fr[2] = {3 * GiB, 1 * GiB};
    struct plan_input in = input(8, 2, fr, NULL);
    struct plan p;
    struct verr err = {0};
    cr_assert_eq(plan_make(&p, &in, &err), 0, "%s", err.msg);
    cr_assert_eq(p.stage[0].l1, 6);
    cr_assert_eq(p.stage[1].free_bytes, 1 * GiB);
}

Test(plan, rebalances_by_free_memory_when_the_head_does_not_fit) {
    // Equal free memory; the last stage's head (1 GiB) pushes it over, so
    // a boundary layer slides to stage 0.
    size_t fr[2] = {2 * GiB, 2 * GiB};
    struct plan_input in = input(20, 2, fr, NULL);
    in.head_bytes = 1 * GiB;
    struct plan p;
    struct verr err = {0};
    cr_assert_eq(plan_make(&p, &in, &err), 0, "%s", err.msg);
    assert_contiguous(&p, 20);
    cr_assert_gt(p.stage[0].l1, 10, "stage 0 took layers from the last stage");
    for (int s = 0; s < 2; s++)
        cr_assert_leq(p.stage[s].total_bytes, p.stage[s].free_bytes);
}

Test(plan, refuses_what_does_not_fit) {
    float split[2] = {1, 1};
    size_t fr[2] = {8 * GiB, 1 * GiB};
    struct plan_input in = input(32, 2, fr, split);
    in.device_names = (const char *const[]){"cuda:0", "cuda:1"};
    struct plan p;
    struct verr err = {0};
    // 16 layers of 110 MiB + head on cuda:1 > 1 GiB, and the user fixed the proportions.
    cr_assert_eq(plan_make(&p, &in, &err), VERR_NOMEM);
    cr_assert(strstr(err.msg, "stage 1 on cuda:1"), "%s", err.msg);
    cr_assert(strstr(err.msg, "layers 16-31"), "%s", err.msg);
    cr_assert(strstr(err.msg, "--tensor-split"), "%s", err.msg);
    cr_assert_eq(p.n_stages, 0);

    // The whole model is larger than all free memory together.
    size_t small[2] = {1 * GiB, 1 * GiB};
    in = input(32, 2, small, NULL);
    cr_assert_eq(plan_make(&p, &in, &err), VERR_NOMEM);
    cr_assert(strstr(err.msg, "does not fit in the free memory"), "%s", err.msg);

    // The reserve counts: a stage that fits exactly fails with 1 MiB reserved.
    size_t exact[1];
    in = input(4, 1, NULL, NULL);
    exact[0] = 4 * 110 * MiB + 50 * MiB + 60 * MiB + 12 * MiB;
    in.free_bytes = exact;
    cr_assert_eq(plan_make(&p, &in, &err), 0, "%s", err.msg);
    in.reserve_bytes = MiB;
    cr_assert_eq(plan_make(&p, &in, &err), VERR_NOMEM);
}

Test(plan, errors) {
    struct plan p;
    struct verr err = {0};
    struct plan_input in = input(2, 3, NULL, NULL);
    cr_assert_eq(plan_make(&p, &in, &err), VERR_RANGE);
    cr_assert(strstr(err.msg, "3 stages for a model of 2 layers"), "%s", err.msg);

    float zeros[2] = {0, 0};
    in = input(8, 2, NULL, zeros);
    cr_assert_eq(plan_make(&p, &in, &err), VERR_RANGE);
    cr_assert(strstr(err.msg, "every proportion is 0"), "%s", err.msg);

    float neg[2] = {1, -1};
    in = input(8, 2, NULL, neg);
    cr_assert_eq(plan_make(&p, &in, &err), VERR_RANGE);

    in = input(8, 0, NULL, NULL);
    cr_assert_eq(plan_make(&p, &in, &err), VERR_RANGE);
    in = input(0, 1, NULL, NULL);
    cr_assert_eq(plan_make(&p, &in, &err), VERR_RANGE);
}

Test(plan, format_names_every_stage) {
    float split[2] = {1, 1};
    struct plan_input in = input(4, 2, NULL, split);
    const char *names[2] = {"cpu", "cuda:1"};
    in.device_names = names;
    struct plan p;
    struct verr err = {0};
    cr_assert_eq(plan_make(&p, &in, &err), 0, "%s", err.msg);
    char buf[1024];
    plan_format(&p, names, buf, sizeof buf);
    cr_assert(strstr(buf, "stage 0: cpu"), "%s", buf);
    cr_assert(strstr(buf, "layers 0-1 (2) +embed"), "%s", buf);
    cr_assert(strstr(buf, "stage 1: cuda:1"), "%s", buf);
    cr_assert(strstr(buf, "layers 2-3 (2) +head"), "%s", buf);
}

Test(plan, parse_split) {
    float v[8];
    int n = 0;
    struct verr err = {0};
    cr_assert_eq(plan_parse_split("3,1", v, 8, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, 2);
    cr_assert_float_eq(v[0], 3.0f, 0);
    cr_assert_eq(plan_parse_split("0.6/0.4/0", v, 8, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, 3);
    cr_assert_float_eq(v[1], 0.4f, 0);
    const char *bad[] = {"", "a,b", "1,,2", "1,-2", "1,2,", "0,0", "nan,1", "1;2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(plan_parse_split(bad[i], v, 8, &n, &err), VERR_RANGE, "'%s' accepted", bad[i]);
        cr_assert(strstr(err.msg, "--tensor-split"), "%s", err.msg);
    }
    cr_assert_eq(plan_parse_split("1,1,1", v, 2, &n, &err), VERR_RANGE);
}

Test(plan, parse_devices) {
    struct backend_device d[8];
    int n = 0;
    struct verr err = {0};
    cr_assert_eq(plan_parse_devices("0,1,cuda2,CUDA3,cuda:4,cpu", d, 8, &n, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(n, 6);
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(d[i].kind, BACKEND_DEVICE_CUDA);
        cr_assert_eq(d[i].ordinal, i);
    }
    cr_assert_eq(d[5].kind, BACKEND_DEVICE_CPU);
    cr_assert_eq(plan_parse_devices("cpu,cpu", d, 8, &n, &err), 0);
    cr_assert_eq(n, 2);
    const char *bad[] = {"", "gpu0", "0,,1", "-1", "cuda", "1x", "0,"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(plan_parse_devices(bad[i], d, 8, &n, &err), VERR_RANGE, "'%s' accepted",
                     bad[i]);
        cr_assert(strstr(err.msg, "--devices"), "%s", err.msg);
    }

    // Existence: two GPUs visible, cuda:2 is not one of them.
    struct backend_device three[2] = {{BACKEND_DEVICE_CUDA, 1}, {BACKEND_DEVICE_CUDA, 2}};
    cr_assert_eq(plan_check_devices(three, 2, 2, true, &err), VERR_NOTFOUND);
    cr_assert(strstr(err.msg, "CUDA device 2 does not exist (2 visible devices"), "%s", err.msg);
    cr_assert_eq(plan_check_devices(three, 1, 2, true, &err), 0);
    cr_assert_eq(plan_check_devices(three, 1, 0, false, &err), VERR_UNSUPPORTED);
    cr_assert(strstr(err.msg, "built without CUDA"), "%s", err.msg);
    struct backend_device cpu = {BACKEND_DEVICE_CPU, 0};
    cr_assert_eq(plan_check_devices(&cpu, 1, 0, false, &err), 0);
}
