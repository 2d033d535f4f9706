// `vela bench` end to end through the built binary (VELA_BIN, set by ctest)
// on a tiny model and the CPU backend, so the benchmark code runs in every CI
// build: JSON that parses with sane fields, the table, flag errors and exit
// codes. Numbers are not checked against anything but > 0: CI machines are
// shared and slow. A layer split runs as two stages on the CPU (--devices
// cpu,cpu): the layout must be the plan's, the per-stage figures must add
// up, and --split-compare must report one ratio per test.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "gguf/gguf.h"
#include "host/split/pipeline.h"
#include "tests/args_config.h"
#include "tests/file_helpers.h"
#include "tools/args.h"
#include "tools/mkmodel/mkmodel.h"

static char dir[256];
static char model_path[300];

static const char *vela_bin(void) {
    const char *b = getenv("VELA_BIN");
    return b ? b : "./vela";
}

// Runs `vela ARGS`, capturing stdout and stderr (NUL-terminated, malloc'd).
static int run_vela(const char *args, char **out, char **errs) {
    char o[300], e[300], cmd[4096];
    snprintf(o, sizeof o, "%s/out", dir);
    snprintf(e, sizeof e, "%s/err", dir);
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s", vela_bin(), args, o, e);
    int st = system(cmd);
    *out = test_read_text(o);
    *errs = test_read_text(e);
    unlink(o);
    unlink(e);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void setup(void) {
    snprintf(dir, sizeof dir, "/tmp/vela_test_bench_%d", (int)getpid());
    mkdir(dir, 0700);
    snprintf(model_path, sizeof model_path, "%s/tiny.gguf", dir);
    struct mkmodel_config c;
    mkmodel_config_default(&c); // the tiny shape, F32: 256 x 4 layers, 8/4 heads
    c.n_threads = 2;
    struct verr err = {0};
    cr_assert_eq(mkmodel_write(&c, model_path, &err), 0, "mkmodel_write: %s", err.msg);
}

static void teardown(void) {
    unlink(model_path);
    rmdir(dir);
}

TestSuite(bench, .init = setup, .fini = teardown, .timeout = 60);

static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    cr_assert(cJSON_IsNumber(v), "field '%s' is missing or not a number", key);
    return v->valuedouble;
}

static const char *str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    cr_assert(cJSON_IsString(v), "field '%s' is missing or not a string", key);
    return v->valuestring;
}

static void check_test(const cJSON *t, const char *name, const char *kind, int n_parallel,
                       double n_tokens, int reps) {
    cr_assert_str_eq(str(t, "test"), name);
    cr_assert_str_eq(str(t, "kind"), kind);
    cr_assert_eq((int)num(t, "n_parallel"), n_parallel, "%s: n_parallel", name);
    cr_assert_eq(num(t, "n_tokens"), n_tokens, "%s: n_tokens", name);
    const double ts = num(t, "avg_ts");
    cr_assert(ts > 0 && isfinite(ts), "%s: avg_ts %g", name, ts);
    cr_assert(num(t, "stddev_ts") >= 0, "%s: stddev_ts", name);
    cr_assert(num(t, "avg_ms") > 0, "%s: avg_ms", name);
    cr_assert(num(t, "bytes_per_run") > 0, "%s: bytes_per_run", name);
    cr_assert(num(t, "bw_gbs") > 0, "%s: bw_gbs", name);
    cr_assert(num(t, "tflops") > 0, "%s: tflops", name);
    // CPU: no peak bandwidth, so no fraction of it
    cr_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(t, "bw_frac")), "%s: bw_frac", name);
    const cJSON *samples = cJSON_GetObjectItemCaseSensitive(t, "samples_ts");
    cr_assert(cJSON_IsArray(samples));
    cr_assert_eq(cJSON_GetArraySize(samples), reps, "%s: one sample per repetition", name);
    double sum = 0;
    const cJSON *s;
    cJSON_ArrayForEach(s, samples) {
        cr_assert(cJSON_IsNumber(s) && s->valuedouble > 0);
        sum += s->valuedouble;
    }
    // avg_ts is the mean of the samples (printed with 17 digits, so 1e-9 is plenty)
    cr_assert(fabs(sum / reps - ts) <= 1e-9 * ts, "%s: avg_ts %g != mean of samples %g", name, ts,
              sum / reps);
}

Test(bench, cpu_json) {
    char args[1024], *out, *errs;
    snprintf(args, sizeof args, "bench -m %s --backend cpu -p 16 -n 8 -r 2 --json", model_path);
    int rc = run_vela(args, &out, &errs);
    cr_assert_eq(rc, 0, "exit %d, stderr: %s", rc, errs);
    cJSON *root = cJSON_Parse(out);
    cr_assert_not_null(root, "stdout is not JSON: %s", out);
    cr_assert_str_eq(str(root, "backend"), "cpu");
    cr_assert(strlen(str(root, "commit")) > 0);
    cr_assert_eq(strlen(str(root, "date")), 20, "ISO 8601 UTC date: %s", str(root, "date"));

    const cJSON *dev = cJSON_GetObjectItemCaseSensitive(root, "device");
    cr_assert(cJSON_IsObject(dev));
    cr_assert(strlen(str(dev, "name")) > 0);
    cr_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(dev, "peak_bw_gbs")));

    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
    cr_assert(cJSON_IsObject(m));
    cr_assert_eq((int)num(m, "n_embd"), 256);
    cr_assert_eq((int)num(m, "n_layer"), 4);
    cr_assert_eq((int)num(m, "n_head"), 8);
    cr_assert_eq((int)num(m, "n_head_kv"), 4);
    cr_assert_eq((int)num(m, "n_ff"), 768);
    cr_assert(num(m, "n_vocab") > 0);
    cr_assert(num(m, "n_params") > 3e6 && num(m, "n_params") < 4e6, "tiny has ~3.45M params");
    cr_assert_str_eq(str(m, "weight_type"), "f32");
    cr_assert_str_eq(str(m, "ftype"), "all F32"); // llama.cpp's name for general.file_type 0
    const cJSON *wt = cJSON_GetObjectItemCaseSensitive(m, "weight_types");
    cr_assert(cJSON_IsObject(wt));
    cr_assert(num(wt, "f32") > 0);

    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "params");
    cr_assert_eq((int)num(p, "repetitions"), 2);
    cr_assert(num(p, "n_threads") >= 1);

    const cJSON *tests = cJSON_GetObjectItemCaseSensitive(root, "tests");
    cr_assert(cJSON_IsArray(tests));
    cr_assert_eq(cJSON_GetArraySize(tests), 2);
    check_test(cJSON_GetArrayItem(tests, 0), "pp16", "pp", 1, 16, 2);
    check_test(cJSON_GetArrayItem(tests, 1), "tg8", "tg", 1, 8, 2);
    cr_assert_eq((int)num(cJSON_GetArrayItem(tests, 0), "n_prompt"), 16);
    cr_assert_eq((int)num(cJSON_GetArrayItem(tests, 1), "n_gen"), 8);
    // one device: no split anywhere
    cr_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(root, "split")));
    cr_assert(
        cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(tests, 0), "split")));
    cr_assert_null(cJSON_GetObjectItemCaseSensitive(root, "scaling"), "no --split-compare");
    cJSON_Delete(root);
    free(out);
    free(errs);
}

Test(bench, cpu_parallel_json) {
    char args[1024], *out, *errs;
    snprintf(args, sizeof args,
             "bench -m %s --backend cpu -t 1 -p 0 -n 4 -r 1 --parallel 1,3 --full-logits --json",
             model_path);
    int rc = run_vela(args, &out, &errs);
    cr_assert_eq(rc, 0, "exit %d, stderr: %s", rc, errs);
    cJSON *root = cJSON_Parse(out);
    cr_assert_not_null(root, "stdout is not JSON: %s", out);
    const cJSON *tests = cJSON_GetObjectItemCaseSensitive(root, "tests");
    cr_assert_eq(cJSON_GetArraySize(tests), 2, "-p 0 skips pp");
    check_test(cJSON_GetArrayItem(tests, 0), "tg4", "tg", 1, 4, 1);
    // 3 sequences x 4 steps
    check_test(cJSON_GetArrayItem(tests, 1), "tg4 x3", "tg", 3, 12, 1);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "params");
    cr_assert_eq((int)num(p, "n_threads"), 1);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "full_logits")));
    cJSON_Delete(root);
    free(out);
    free(errs);
}

// -d: every test again on top of a filled cache, in llama-bench's order and
// names; the JSON's n_depth says which, and the bytes a run reads grow with
// the cells it sees. The -v lines show the prefix filled once per test.
Test(bench, cpu_depth_json) {
    char args[1024], *out, *errs;
    snprintf(args, sizeof args,
             "bench -m %s --backend cpu -t 1 -p 8 -n 4 -b 4 -r 2 --parallel 1,2 -d 0,20 --json -v",
             model_path);
    int rc = run_vela(args, &out, &errs);
    cr_assert_eq(rc, 0, "exit %d, stderr: %s", rc, errs);
    cJSON *root = cJSON_Parse(out);
    cr_assert_not_null(root, "stdout is not JSON: %s", out);
    const cJSON *tests = cJSON_GetObjectItemCaseSensitive(root, "tests");
    cr_assert_eq(cJSON_GetArraySize(tests), 6, "3 tests x 2 depths");
    const struct {
        const char *name, *kind;
        int par, depth;
        double tokens;
    } want[] = {{"pp8", "pp", 1, 0, 8},        {"tg4", "tg", 1, 0, 4},
                {"tg4 x2", "tg", 2, 0, 8},     {"pp8 @ d20", "pp", 1, 20, 8},
                {"tg4 @ d20", "tg", 1, 20, 4}, {"tg4 x2 @ d20", "tg", 2, 20, 8}};
    for (int i = 0; i < 6; i++) {
        const cJSON *t = cJSON_GetArrayItem(tests, i);
        check_test(t, want[i].name, want[i].kind, want[i].par, want[i].tokens, 2);
        cr_assert_eq((int)num(t, "n_depth"), want[i].depth, "%s: n_depth", want[i].name);
        if (i >= 3) // the same test over 20 more cells reads more
            cr_assert(num(t, "bytes_per_run") >
                          num(cJSON_GetArrayItem(tests, i - 3), "bytes_per_run"),
                      "%s: bytes_per_run", want[i].name);
    }
    cr_assert_not_null(strstr(errs, "pp8 @ d20: depth 20 filled"), "%s", errs);
    cr_assert_not_null(strstr(errs, "tg4 x2 @ d20: depth 20 filled"), "%s", errs);
    cr_assert_null(strstr(errs, "tg4 x2: depth"), "no fill at depth 0: %s", errs);
    cJSON_Delete(root);
    free(out);
    free(errs);
}

Test(bench, cpu_table) {
    char args[1024], *out, *errs;
    snprintf(args, sizeof args, "bench -m %s --backend cpu -p 8 -n 4 -b 4 -r 1", model_path);
    int rc = run_vela(args, &out, &errs);
    cr_assert_eq(rc, 0, "exit %d, stderr: %s", rc, errs);
    const char *want[] = {"| model",          "t/s", "threads", "| pp8 ", "| tg4 ",
                          "llama 3M all F32", "cpu"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_assert_not_null(strstr(out, want[i]), "'%s' not in:\n%s", want[i], out);
    free(out);
    free(errs);
}

// The layer ranges the pipeline plans for `--devices cpu,cpu` on the tiny
// model: both stages on one CPU see the same free memory, so the plan's
// proportions are equal whatever that memory is.
static void expected_plan(struct plan *pl) {
    struct args_model a;
    args_model_default(&a);
    a.backend = LOAD_BACKEND_CPU;
    a.devices = "cpu,cpu";
    struct verr err = {0};
    struct gguf_file *f = NULL;
    cr_assert_eq(gguf_open(&f, model_path, &err), 0, "%s", err.msg);
    struct backend_device devs[PLAN_MAX_DEVICES];
    int n = 0;
    cr_assert_eq(pipeline_resolve_devices(lc_of(&a), devs, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, 2);
    const size_t free_bytes[2] = {(size_t)1 << 30, (size_t)1 << 30};
    cr_assert_eq(
        pipeline_plan(lc_of(&a), ctx_of(&a, 16), f, devs, n, free_bytes, pl, NULL, 0, &err), 0,
        "%s", err.msg);
    gguf_close(f);
    cr_assert_eq(pl->n_stages, 2);
}

static void check_stages(const cJSON *split, const struct plan *pl, bool timed, const char *what) {
    cr_assert(cJSON_IsObject(split), "%s: no split object", what);
    cr_assert_str_eq(str(split, "mode"), "layer");
    const cJSON *stages = cJSON_GetObjectItemCaseSensitive(split, "stages");
    cr_assert(cJSON_IsArray(stages));
    cr_assert_eq(cJSON_GetArraySize(stages), pl->n_stages, "%s: stages", what);
    double frac = 0;
    for (int s = 0; s < pl->n_stages; s++) {
        const cJSON *st = cJSON_GetArrayItem(stages, s);
        cr_assert_str_eq(str(st, "device"), "cpu");
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(st, "layers");
        cr_assert(cJSON_IsArray(l) && cJSON_GetArraySize(l) == 2, "%s: layers", what);
        cr_assert_eq(cJSON_GetArrayItem(l, 0)->valueint, pl->stage[s].l0, "%s: stage %d", what, s);
        cr_assert_eq(cJSON_GetArrayItem(l, 1)->valueint, pl->stage[s].l1, "%s: stage %d", what, s);
        if (!timed)
            continue;
        const double ms = num(st, "ms");
        cr_assert(ms > 0 && isfinite(ms), "%s: stage %d: ms %g", what, s, ms);
        frac += num(st, "frac");
    }
    if (timed) {
        // Each fraction is ms / the stages' sum: they add up to 1 but for rounding.
        cr_assert(fabs(frac - 1.0) < 1e-9, "%s: fractions add up to %.12f", what, frac);
        cr_assert(num(split, "xfer_ms") >= 0, "%s: xfer_ms", what);
        cr_assert(num(split, "run_ms") > 0, "%s: run_ms", what);
    }
}

Test(bench, cpu_split_json) {
    struct plan pl;
    expected_plan(&pl);
    // the tiny model's 4 layers over two equal devices
    cr_assert(pl.stage[0].l0 == 0 && pl.stage[0].l1 == 2 && pl.stage[1].l1 == 4);

    char args[1024], *out, *errs;
    snprintf(args, sizeof args,
             "bench -m %s --backend cpu --devices cpu,cpu -p 16 -n 8 -r 2 --json", model_path);
    int rc = run_vela(args, &out, &errs);
    cr_assert_eq(rc, 0, "exit %d, stderr: %s", rc, errs);
    cJSON *root = cJSON_Parse(out);
    cr_assert_not_null(root, "stdout is not JSON: %s", out);
    const cJSON *split = cJSON_GetObjectItemCaseSensitive(root, "split");
    check_stages(split, &pl, false, "plan");
    cr_assert_eq((int)num(split, "n_stages"), 2);
    cr_assert(strlen(str(split, "transport")) > 0);
    cr_assert_not_null(strstr(str(split, "stage_times"), "extra run"), "how stage times are taken");
    // the whole model's size, not stage 0's
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
    cr_assert(num(m, "n_params") > 3e6 && num(m, "n_params") < 4e6, "tiny has ~3.45M params");

    const cJSON *tests = cJSON_GetObjectItemCaseSensitive(root, "tests");
    cr_assert_eq(cJSON_GetArraySize(tests), 2);
    // the timing run is not among the samples: still -r of them
    check_test(cJSON_GetArrayItem(tests, 0), "pp16", "pp", 1, 16, 2);
    check_test(cJSON_GetArrayItem(tests, 1), "tg8", "tg", 1, 8, 2);
    for (int k = 0; k < 2; k++) {
        const cJSON *t = cJSON_GetArrayItem(tests, k);
        check_stages(cJSON_GetObjectItemCaseSensitive(t, "split"), &pl, true, str(t, "test"));
    }
    cr_assert_null(cJSON_GetObjectItemCaseSensitive(root, "scaling"), "no --split-compare");
    cJSON_Delete(root);
    free(out);
    free(errs);
}

Test(bench, cpu_split_compare_json) {
    char args[1024], *out, *errs;
    snprintf(args, sizeof args,
             "bench -m %s --backend cpu --devices cpu,cpu -p 8 -n 4 -r 1 --split-compare "
             "--no-stage-times --json",
             model_path);
    int rc = run_vela(args, &out, &errs);
    cr_assert_eq(rc, 0, "exit %d, stderr: %s", rc, errs);
    cJSON *root = cJSON_Parse(out);
    cr_assert_not_null(root, "stdout is not JSON: %s", out);
    const cJSON *split = cJSON_GetObjectItemCaseSensitive(root, "split");
    cr_assert(cJSON_IsObject(split));
    cr_assert_str_eq(str(split, "stage_times"), "off");
    const cJSON *tests = cJSON_GetObjectItemCaseSensitive(root, "tests");
    const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(root, "scaling");
    cr_assert(cJSON_IsArray(scaling), "no scaling rows: %s", out);
    cr_assert_eq(cJSON_GetArraySize(scaling), 2, "one row per test");
    for (int k = 0; k < 2; k++) {
        const cJSON *t = cJSON_GetArrayItem(tests, k), *r = cJSON_GetArrayItem(scaling, k);
        cr_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(t, "split")),
                  "--no-stage-times: no per-test stage times");
        cr_assert_str_eq(str(r, "test"), str(t, "test"));
        cr_assert_str_eq(str(r, "single_device"), "cpu");
        cr_assert_eq((int)num(r, "n_stages"), 2);
        const double one = num(r, "single_ts"), sp = num(r, "split_ts");
        cr_assert(one > 0 && isfinite(one), "%s: single_ts %g", str(r, "test"), one);
        // the split figure is the test's own t/s; the ratio is of the two as printed
        cr_assert_eq(sp, num(t, "avg_ts"));
        cr_assert(fabs(num(r, "ratio") - sp / one) <= 1e-9 * (sp / one), "%s: ratio",
                  str(r, "test"));
    }
    cJSON_Delete(root);
    free(out);
    free(errs);
}

Test(bench, cpu_split_table) {
    char args[1024], *out, *errs;
    snprintf(args, sizeof args,
             "bench -m %s --backend cpu --devices cpu,cpu -ub 2 -p 8 -n 4 -r 1 --split-compare",
             model_path);
    int rc = run_vela(args, &out, &errs);
    cr_assert_eq(rc, 0, "exit %d, stderr: %s", rc, errs);
    const char *want[] = {"| pp8 ",
                          "| tg4 ",
                          "split: --split-mode layer, 2 stages",
                          "micro-batch 2 tokens",
                          "stage 0: cpu",
                          "stage 1: cpu",
                          "serialising",
                          " xfer |",
                          "layers 0-1",
                          "scaling: 2 stages vs one device (cpu",
                          "ratio"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_assert_not_null(strstr(out, want[i]), "'%s' not in:\n%s", want[i], out);
    free(out);
    free(errs);
}

Test(bench, help) {
    char *out, *errs;
    cr_assert_eq(run_vela("bench --help", &out, &errs), 0);
    const char *flags[] = {"-m,",           "--n-prompt",      "--n-gen",          "--batch-size",
                           "--parallel",    "--repetitions",   "--backend",        "--threads",
                           "--json",        "--split-compare", "--no-stage-times", "--devices",
                           "--tensor-split"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        cr_assert_not_null(strstr(out, flags[i]), "'%s' not in help", flags[i]);
    free(out);
    free(errs);
}

Test(bench, errors) {
    char args[1024], *out, *errs;
    const struct {
        const char *fmt; // %s: the model path
        int status;
        const char *msg;
    } cases[] = {
        {"bench -m %s --bogus", 2, "unknown option"},
        {"bench -m %s -p abc", 2, "-p"},
        {"bench -m %s -r 0", 2, "-r"},
        {"bench -m %s --parallel 1,x", 2, "--parallel"},
        {"bench -m %s --parallel 0", 2, "--parallel"},
        {"bench -m %s -d -1", 2, "-d: -1 is out of range"},
        {"bench -m %s -d 0,x", 2, "-d: '0,x' is not a list of numbers"},
        // depth + test beyond the model's context (2048), and beyond -c too
        {"bench -m %s --backend cpu -d 2000 -p 64 -n 0 -r 1", 2,
         "-d 2000 with -p 64 / -n 0 need a context of 2064 tokens, beyond the model's 2048 (its "
         "context_length): pass -c 2064"},
        {"bench -m %s --backend cpu -d 100,2040 -p 0 -n 4 --parallel 1,3 -c 2050 -r 1", 2,
         "-d 2040 with -p 0 / -n 4 need a context of 2052 tokens, beyond the model's 2048 (its "
         "context_length) and -c 2050: pass -c 2052"},
        {"bench -m %s --backend tpu", 2, "--backend"},
        {"bench -m %s -p 0 -n 0", 2, "nothing to measure"},
        // beyond the model's context (2048) only when -c asks for it
        {"bench -m %s --backend cpu -p 100000 -r 1", 2,
         "-p 100000 / -n 128 need a context of 100000 tokens, beyond the model's 2048 (its "
         "context_length): pass -c 100000"},
        {"bench -m %s --backend cpu -p 0 -n 300 --parallel 8 -r 1", 2, "context of 2400 tokens"},
        {"bench", 2, "no model"},
        {"bench -m %s.missing --backend cpu", 1, "missing"},
        // split flags: the parser's, the device resolution's and the plan's
        {"bench -m %s --backend cpu --split-mode diag", 2, "--split-mode"},
        {"bench -m %s --backend cpu --split-mode row", 2, "--split-mode row is not supported"},
        {"bench -m %s --backend cpu --devices gpu9", 2, "--devices"},
        {"bench -m %s --backend cpu --devices cpu,cpu -ts 1,2,3", 2, "--tensor-split"},
        {"bench -m %s --backend cpu --devices cpu,cpu --split-mode none -mg 2", 2, "--main-gpu"},
        {"bench -m %s --backend cpu --devices cpu,cpu,cpu,cpu,cpu", 2, "5 stages"},
        {"bench -m %s --backend cpu --split-compare", 2, "--split-compare needs"},
        {"bench -m %s --backend cpu --devices cpu,cpu --split-compare -ts 1,0", 2, "one device"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, cases[i].fmt, model_path);
        int rc = run_vela(args, &out, &errs);
        cr_assert_eq(rc, cases[i].status, "'%s': exit %d, want %d (stderr: %s)", args, rc,
                     cases[i].status, errs);
        cr_assert_not_null(strstr(errs, cases[i].msg), "'%s': stderr lacks '%s': %s", args,
                           cases[i].msg, errs);
        free(out);
        free(errs);
    }
}

// -c asks for a context beyond the model's: then it runs (a model of 32
// tokens of context, so that the run is short).
Test(bench, beyond_context_with_c) {
    char path[400], args[1024], *out, *errs;
    snprintf(path, sizeof path, "%s/ctx32.gguf", dir);
    struct mkmodel_config c;
    mkmodel_config_default(&c);
    c.n_ctx = 32;
    struct verr err = {0};
    cr_assert_eq(mkmodel_write(&c, path, &err), 0, "mkmodel_write: %s", err.msg);
    snprintf(args, sizeof args, "bench -m %s --backend cpu -p 40 -n 0 -r 1", path);
    cr_expect_eq(run_vela(args, &out, &errs), 2, "%s", errs);
    cr_expect_not_null(strstr(errs, "beyond the model's 32"), "%s", errs);
    free(out);
    free(errs);
    snprintf(args, sizeof args, "bench -m %s --backend cpu -p 40 -n 0 -c 40 -r 1", path);
    int rc = run_vela(args, &out, &errs);
    cr_expect_eq(rc, 0, "exit %d, stderr: %s", rc, errs);
    cr_expect_not_null(strstr(out, "| pp40 "), "%s", out);
    free(out);
    free(errs);
    unlink(path);
}

// --draft: a row per --parallel value, and the speculating run's tokens
// equal to the plain run's (the tool fails otherwise); the speculative
// flags without --draft, and --draft with --json or -p, are usage errors.
Test(bench, draft_table) {
    char *out, *err, args[600];
    snprintf(args, sizeof args, "bench --draft -m %s -n 24 -r 1 -np 1,2 -t 2 --draft-max 4",
             model_path);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    int rows = 0;
    for (const char *p = out; (p = strstr(p, "| ngram  |       4 |")); p++)
        rows++;
    cr_expect_eq(rows, 2, "one row per -np value:\n%s", out);
    cr_expect(strstr(out, "|   1 |   24 |") && strstr(out, "|   2 |   24 |"), "%s", out);
    cr_expect(!strstr(out, "| NO"), "speculation changed the output:\n%s", out);
    free(out);
    free(err);
    snprintf(args, sizeof args, "bench -m %s --spec-type ngram", model_path);
    cr_expect_eq(run_vela(args, &out, &err), 2);
    cr_expect(strstr(err, "need --draft"), "%s", err);
    free(out);
    free(err);
    const char *const refused[] = {"--json", "-p 64"};
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "bench -m %s --draft %s", model_path, refused[i]);
        cr_expect_eq(run_vela(args, &out, &err), 2, "--draft %s", refused[i]);
        cr_expect(strstr(err, "(no -p, --json, --split-compare)"), "%s", err);
        free(out);
        free(err);
    }
}
