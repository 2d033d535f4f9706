// `vela run` and `vela eval` end to end through the built binary (VELA_BIN,
// set by ctest): flags, errors and exit codes, streaming output, and eval's
// logits file against the float64 reference of tests/tiny_model.h.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "file_helpers.h"
#include "host/ops/backend.h"
#include "tiny_model.h"
#include "tools/args.h"

static char model_path[128];
static struct tiny_cfg model_cfg;
static struct tiny_weights model_w;

static const char *vela_bin(void) {
    const char *b = getenv("VELA_BIN");
    return b ? b : "./vela";
}

// Every run is bounded: one that does not end by itself (the runaway
// generation of issue #31) fails with status 124 instead of hanging.
#define RUN_TIMEOUT "timeout -k 5 300"

// Runs `vela ARGS REDIRECTIONS` under RUN_TIMEOUT; its exit status.
static int run_shell(const char *args, const char *redirections) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, RUN_TIMEOUT " %s %s %s", vela_bin(), args, redirections);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// Runs `vela ARGS`, capturing stdout and stderr (NUL-terminated, malloc'd).
static int run_vela(const char *args, char **out, char **errs) {
    char o[64], e[64], redir[160];
    tiny_temp_path(o, sizeof o, "out");
    tiny_temp_path(e, sizeof e, "err");
    snprintf(redir, sizeof redir, ">%s 2>%s", o, e);
    int st = run_shell(args, redir);
    *out = test_read_text(o);
    *errs = test_read_text(e);
    unlink(o);
    unlink(e);
    return st;
}

// The same with stdout and stderr in one stream, in the order they were
// written.
static int run_vela_merged(const char *args, char **all) {
    char o[64], redir[96];
    tiny_temp_path(o, sizeof o, "all");
    snprintf(redir, sizeof redir, ">%s 2>&1", o);
    int st = run_shell(args, redir);
    *all = test_read_text(o);
    unlink(o);
    return st;
}

static void setup_model(void) {
    tiny_cfg_default(&model_cfg, "llama");
    model_cfg.vocab = true;
    model_cfg.n_vocab = 300; // 3 specials + 256 bytes + 41 pieces
    model_cfg.n_ctx_train = 64;
    tiny_temp_path(model_path, sizeof model_path, "cli");
    struct verr err = {0};
    cr_assert_eq(tiny_write(&model_cfg, model_path, &model_w, &err), 0, "%s", err.msg);
}

static void teardown_model(void) {
    tiny_weights_free(&model_w);
    unlink(model_path);
}

TestSuite(cli, .init = setup_model, .fini = teardown_model);

Test(cli, run_help_lists_flags) {
    char *out, *err;
    cr_assert_eq(run_vela("run --help", &out, &err), 0);
    const char *flags[] = {"-m,",
                           "--prompt",
                           "--file",
                           "--n-predict",
                           "--ctx-size",
                           "--batch-size",
                           "--backend",
                           "--threads",
                           "--temp",
                           "--top-k",
                           "--top-p",
                           "--min-p",
                           "--repeat-penalty",
                           "--repeat-last-n",
                           "--presence-penalty",
                           "--frequency-penalty",
                           "--seed",
                           "--rope-scaling",
                           "--rope-scale",
                           "--rope-freq-base",
                           "--rope-freq-scale",
                           "--yarn-orig-ctx",
                           "--yarn-ext-factor",
                           "--yarn-attn-factor",
                           "--yarn-beta-fast",
                           "--yarn-beta-slow",
                           "--cache-type-k",
                           "--cache-type-v",
                           "--no-display-prompt",
                           "--verbose",
                           "--parallel",
                           "--grp-attn-n",
                           "--grp-attn-w",
                           "--keep",
                           "--context-shift"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        cr_expect(strstr(out, flags[i]), "run --help does not mention %s", flags[i]);
    free(out);
    free(err);
    cr_assert_eq(run_vela("eval --help", &out, &err), 0);
    cr_expect(strstr(out, "--tokens") && strstr(out, "--logits-out") &&
              strstr(out, "--rope-scaling"));
    free(out);
    free(err);
}

Test(cli, usage_errors) {
    char *out, *err, args[512];
    cr_expect_eq(run_vela("run --bogus", &out, &err), 2);
    cr_expect(strstr(err, "unknown option '--bogus'"), "%s", err);
    free(out);
    free(err);
    snprintf(args, sizeof args, "run -m %s --temp abc", model_path);
    cr_expect_eq(run_vela(args, &out, &err), 2);
    cr_expect(strstr(err, "--temp: 'abc' is not a number"), "%s", err);
    free(out);
    free(err);
    cr_expect_eq(run_vela("run -m x.gguf -n", &out, &err), 2);
    cr_expect(strstr(err, "-n: missing value"), "%s", err);
    free(out);
    free(err);
    // No -m and no default model in the cache (an empty one here).
    setenv("VELA_CACHE", "/nonexistent/vela-cache", 1);
    cr_expect_eq(run_vela("run -p hi", &out, &err), 2);
    cr_expect(strstr(err, "vela mkmodel"), "no -m should suggest vela mkmodel: %s", err);
    cr_expect(strstr(err, "/nonexistent/vela-cache/SmolLM2-135M-Instruct.Q4_1.gguf") &&
                  strstr(err, "bash tools/model_cache.sh"),
              "no -m should say how to fetch the default model: %s", err);
    free(out);
    free(err);
    cr_expect_eq(run_vela("eval -m x.gguf --tokens 1,a", &out, &err), 2);
    cr_expect(strstr(err, "--tokens"), "%s", err);
    free(out);
    free(err);
    cr_expect_eq(run_vela("run -m x.gguf --rope-scaling cubic", &out, &err), 2);
    cr_expect(strstr(err, "--rope-scaling: 'cubic'"), "%s", err);
    free(out);
    free(err);
    cr_expect_eq(run_vela("run -m x.gguf --cache-type-k q4_K", &out, &err), 2);
    cr_expect(strstr(err, "--cache-type-k: 'q4_K' is not a cache type (f32, f16, bf16, q8_0, "
                          "q4_0, q4_1, q5_0, q5_1, iq4_nl)"),
              "%s", err);
    free(out);
    free(err);
    // Speculative decoding's flags that cannot go together.
    static const char *const spec_bad[][2] = {
        {"run -m x.gguf --spec-type draft", "--spec-type draft needs a draft model (-md FILE)"},
        {"run -m x.gguf -md d.gguf --spec-type ngram", "the draft model would go unused"},
        {"run -m x.gguf --draft-min 5 --draft-max 4", "--draft-min 5 is above --draft-max 4"},
        {"serve -m x.gguf --spec-type eagle", "--spec-type: 'eagle'"},
        {"run -m x.gguf --draft-max 65", "--draft-max"},
        {"run -m x.gguf --draft-p-min 1.5", "--draft-p-min"},
    };
    for (size_t i = 0; i < sizeof spec_bad / sizeof spec_bad[0]; i++) {
        cr_expect_eq(run_vela(spec_bad[i][0], &out, &err), 2, "%s", spec_bad[i][0]);
        cr_expect(strstr(err, spec_bad[i][1]), "%s: %s", spec_bad[i][0], err);
        free(out);
        free(err);
    }
    cr_expect_eq(run_vela("run -m x.gguf --matvec-act q4", &out, &err), 2);
    cr_expect(strstr(err, "--matvec-act: 'q4' is not an activation type (q8, f32)"), "%s", err);
    free(out);
    free(err);
    cr_expect_eq(run_vela("quantize in.gguf out.gguf", &out, &err), 2);
    cr_expect(strstr(err, "need INPUT.gguf OUTPUT.gguf TYPE"), "%s", err);
    free(out);
    free(err);
    cr_expect_eq(run_vela("quantize in.gguf out.gguf q9_z", &out, &err), 2);
    cr_expect(strstr(err, "unknown file type 'q9_z'") && strstr(err, "Q4_K_M"), "%s", err);
    free(out);
    free(err);
    cr_expect_eq(run_vela("quantize --leave-output-tensor --output-tensor-type q8_0 in.gguf "
                          "out.gguf q4_k_m",
                          &out, &err),
                 2);
    cr_expect(strstr(err, "give one of them"), "%s", err);
    free(out);
    free(err);
}

// `vela quantize SRC DST TYPE`, its summary on stderr holding every string
// of want (NULL-terminated), then `vela run` on DST.
static void quantize_then_run(const char *dst, const char *type, const char *const *want) {
    char *out, *err, args[512];
    snprintf(args, sizeof args, "quantize %s %s %s", model_path, dst, type);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    for (; *want; want++)
        cr_expect(strstr(err, *want), "%s summary: no '%s' in %s", type, *want, err);
    free(out);
    free(err);
    snprintf(args, sizeof args, "run -m %s -p hello -n 4 --temp 0 --backend cpu", dst);
    cr_expect_eq(run_vela(args, &out, &err), 0, "%s", err);
    free(out);
    free(err);
}

// vela quantize on the suite's model: files vela runs, and a refusal with
// exit status 1 (tools/quantize.h; tests/test_quantize.c checks the bytes).
Test(cli, quantize_writes_a_model_vela_runs) {
    char *out, *err, args[512], q[160];
    snprintf(q, sizeof q, "%s.q8_0.gguf", model_path);
    quantize_then_run(q, "q8_0", (const char *const[]){"converted", "(Q8_0)", "types: f32", NULL});
    snprintf(args, sizeof args, "quantize %s %s.again q4_0", q, q);
    cr_expect_eq(run_vela(args, &out, &err), 1);
    cr_expect(strstr(err, "--allow-requantize"), "%s", err);
    free(out);
    free(err);
    // A file type with rules: IQ4_XS (rows of 64 fall back to IQ4_NL, the
    // head to Q8_0), which the CPU then runs.
    quantize_then_run(q, "IQ4_XS", (const char *const[]){"(IQ4_XS)", "iq4_nl", "q8_0", NULL});
    unlink(q);
}

Test(cli, run_generates_deterministically) {
    char *out1, *err1, *out2, *err2, args[512];
    snprintf(args, sizeof args,
             "run -m %s -p 'hello world' -n 12 --seed 7 --temp 1.0 --backend cpu -t 1", model_path);
    cr_assert_eq(run_vela(args, &out1, &err1), 0, "%s", err1);
    cr_assert_eq(run_vela(args, &out2, &err2), 0, "%s", err2);
    cr_expect(!strncmp(out1, "hello world", 11), "the prompt is displayed first: %s", out1);
    cr_expect_str_eq(out1, out2, "same seed, same text");
    cr_expect(strstr(err1, "load time") && strstr(err1, "prompt eval") &&
                  strstr(err1, "generation") && strstr(err1, "tokens/s"),
              "%s", err1);
    cr_expect(strstr(err1, "sampler seed: 7"), "%s", err1);
    cr_expect(strstr(err1, "/    12 tokens"), "12 tokens generated: %s", err1);
    free(out1);
    free(err1);
    free(out2);
    free(err2);

    snprintf(args, sizeof args, "run -m %s -p 'hello' -n 4 --temp 0 --no-display-prompt -b 2",
             model_path);
    cr_assert_eq(run_vela(args, &out1, &err1), 0, "%s", err1);
    cr_expect(strncmp(out1, "hello", 5), "--no-display-prompt: %s", out1);
    free(out1);
    free(err1);
}

Test(cli, run_parallel_and_context_full) {
    char *out, *err, args[512];
    snprintf(args, sizeof args, "run -m %s -p 'ab' -n 5 --parallel 3 --seed 1", model_path);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "[sequence 0]") && strstr(out, "[sequence 2]"), "%s", out);
    cr_expect(strstr(err, "/    15 tokens"), "3 x 5 tokens: %s", err);
    free(out);
    free(err);
    // -c 16, no -n and no context shift: runs until the context is full, then says so
    snprintf(args, sizeof args,
             "run -m %s -p 'ab' -c 16 --temp 0 --repeat-penalty 1.1 --no-context-shift",
             model_path);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    cr_expect(strstr(err, "context full"), "%s", err);
    free(out);
    free(err);
    // --context-shift keeps going past the context
    snprintf(args, sizeof args, "run -m %s -p 'ab' -c 16 -n 40 --context-shift --keep 1 --temp 0",
             model_path);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    // (greedy may still meet </s> before -n 40; the shifts are what is checked)
    cr_expect(strstr(err, "context shifts:"), "%s", err);
    free(out);
    free(err);
    // self-extend: positions grouped by 2 in windows of 8
    snprintf(args, sizeof args, "run -m %s -p 'abcdefghij' -c 48 -n 20 -gan 2 -gaw 8 --temp 0 -v",
             model_path);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    cr_expect(strstr(err, "div"), "self-extend rounds are logged with -v: %s", err);
    free(out);
    free(err);
}

Test(cli, run_errors) {
    char *out, *err, args[512];
    snprintf(args, sizeof args, "run -m %s -c 8 -p 'a long prompt that does not fit'", model_path);
    cr_expect_eq(run_vela(args, &out, &err), 1);
    cr_expect(strstr(err, "prompt is too long (") && strstr(err, "tokens, max 4)"), "%s", err);
    free(out);
    free(err);
    cr_expect_eq(run_vela("run -m /nonexistent/model.gguf -p hi", &out, &err), 1);
    cr_expect(strstr(err, "/nonexistent/model.gguf"), "%s", err);
    free(out);
    free(err);
    if (backend_cuda_device_count() == 0) {
        snprintf(args, sizeof args, "run -m %s -p hi --backend cuda", model_path);
        cr_expect_eq(run_vela(args, &out, &err), 1);
        cr_expect(strstr(err, "cuda") || strstr(err, "CUDA"), "%s", err);
        free(out);
        free(err);
    }
}

Test(cli, model_errors) {
    struct tiny_cfg c;
    struct tiny_weights w;
    char path[128], args[512], *out, *err;
    struct verr verr = {0};
    tiny_temp_path(path, sizeof path, "bad");

    tiny_cfg_default(&c, "mamba");
    cr_assert_eq(tiny_write(&c, path, &w, &verr), 0, "%s", verr.msg);
    tiny_weights_free(&w);
    snprintf(args, sizeof args, "eval -m %s --tokens 1,2", path);
    cr_expect_eq(run_vela(args, &out, &err), 1);
    cr_expect(strstr(err, "unknown model architecture: 'mamba'"), "%s", err);
    free(out);
    free(err);

    tiny_cfg_default(&c, "qwen2");
    c.skip_tensor = "blk.0.attn_q.bias";
    cr_assert_eq(tiny_write(&c, path, &w, &verr), 0, "%s", verr.msg);
    tiny_weights_free(&w);
    cr_expect_eq(run_vela(args, &out, &err), 1);
    cr_expect(strstr(err, "missing tensor 'blk.0.attn_q.bias'"), "%s", err);
    free(out);
    free(err);

    tiny_cfg_default(&c, "llama");
    c.bad_tensor = "blk.1.attn_v.weight";
    c.bad_ne1 = 48;
    cr_assert_eq(tiny_write(&c, path, &w, &verr), 0, "%s", verr.msg);
    tiny_weights_free(&w);
    cr_expect_eq(run_vela(args, &out, &err), 1);
    cr_expect(strstr(err, "blk.1.attn_v.weight: expected shape [64, 32], found [64, 48]"), "%s",
              err);
    free(out);
    free(err);
    unlink(path);
}

// eval's logits file against the float64 reference. Tolerances as in
// test_forward.c: 3e-3 (f16 KV cache, the default) and 1e-5 (f32), relative
// to the largest |logit|.
static void check_eval(const char *extra, double tol) {
    const int n = 13, V = model_cfg.n_vocab;
    int32_t tok[13], pos[13];
    char list[256] = "";
    for (int t = 0; t < n; t++) {
        tok[t] = (t * 37 + 5) % V;
        pos[t] = t;
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", t ? "," : "", tok[t]);
    }
    char lpath[128], args[1024], *out, *err;
    tiny_temp_path(lpath, sizeof lpath, "logits");
    snprintf(args, sizeof args, "eval -m %s --tokens %s -b 5 --logits-out %s %s", model_path, list,
             lpath, extra);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "n_tokens: 13") && strstr(out, "n_vocab: 300"), "%s", out);
    struct stat sb;
    cr_assert_eq(stat(lpath, &sb), 0);
    cr_assert_eq((size_t)sb.st_size, sizeof(float) * n * V);
    float *got = malloc(sizeof(float) * n * V);
    FILE *f = fopen(lpath, "rb");
    cr_assert_eq(fread(got, sizeof(float), (size_t)n * V, f), (size_t)n * V);
    fclose(f);
    double *ref = malloc(sizeof(double) * n * V);
    struct tiny_rope r = {
        0, model_cfg.n_rot, model_cfg.n_ctx_train, model_cfg.freq_base, 1, 0, 1, 32, 1, NULL};
    tiny_reference(&model_cfg, &model_w, &r, tok, pos, n, ref);
    double scale = 1, worst = 0;
    int best = 0;
    for (int i = 0; i < n * V; i++) {
        scale = fmax(scale, fabs(ref[i]));
        worst = fmax(worst, fabs(got[i] - ref[i]));
    }
    for (int v = 1; v < V; v++)
        if (ref[(size_t)(n - 1) * V + v] > ref[(size_t)(n - 1) * V + best])
            best = v;
    char want[64];
    snprintf(want, sizeof want, "top1_last: %d ", best);
    cr_expect(strstr(out, want), "expected '%s' in %s", want, out);
    printf("vela eval %-40s worst relative logit error %.3g\n", extra, worst / scale);
    cr_expect_lt(worst / scale, tol, "%s: worst relative error %g", extra, worst / scale);
    free(got);
    free(ref);
    free(out);
    free(err);
    unlink(lpath);
}

Test(cli, eval_logits_match_reference) {
    check_eval("", 3e-3);
    check_eval("--cache-type-k f32 --cache-type-v f32 -t 2", 1e-5);
}

Test(cli, eval_prompt_and_errors) {
    char *out, *err, args[512];
    snprintf(args, sizeof args, "eval -m %s -p 'hello there'", model_path);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    // BOS + 11 byte tokens (the pieces of this vocabulary are "\xe2\x96\x81" + 2 letters)
    cr_expect(strstr(out, "n_tokens: "), "%s", out);
    free(out);
    free(err);
    snprintf(args, sizeof args, "eval -m %s --tokens 1,2,999", model_path);
    cr_expect_eq(run_vela(args, &out, &err), 1);
    cr_expect(strstr(err, "token id 999 is out of range (n_vocab 300)"), "%s", err);
    free(out);
    free(err);
    snprintf(args, sizeof args, "eval -m %s --tokens 1,2,3 -c 2", model_path);
    cr_expect_eq(run_vela(args, &out, &err), 1);
    cr_expect(strstr(err, "3 tokens do not fit in the context of 2"), "%s", err);
    free(out);
    free(err);
}

// Without -m, vela run takes the default model from $VELA_CACHE and says so;
// a file of the wrong size there (a partial copy) is refused with the sizes.
Test(cli, run_default_model) {
    char dir[] = "/tmp/vela_test_cache_XXXXXX", path[256], *out, *err;
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);
    FILE *f = fopen(path, "wb");
    fputs("short", f);
    fclose(f);
    setenv("VELA_CACHE", dir, 1);
    cr_expect_eq(run_vela("run -p hi -n 1", &out, &err), 2);
    cr_expect(strstr(err, "has 5 bytes, expected 98362432") && strstr(err, "model_cache.sh"), "%s",
              err);
    free(out);
    free(err);
    // The right size (sparse, not a model): used, and named.
    cr_assert_eq(truncate(path, 98362432), 0);
    cr_expect_eq(run_vela("run -p hi -n 1", &out, &err), 1);
    cr_expect(strstr(err, "no -m given: using the default model ") && strstr(err, path), "%s", err);
    free(out);
    free(err);
    unlink(path);
    rmdir(dir);
}

// --chat: the prompt becomes a user message in the model's template (this
// vocabulary has no template: chatml, llama.cpp's default), only the reply
// is printed; the template can be named, and a wrong name lists them.
Test(cli, run_chat) {
    char *out, *err, args[512];
    snprintf(args, sizeof args, "run -m %s --chat -p hello -n 6 --temp 0 -v", model_path);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    cr_expect(!strstr(out, "im_start") && strncmp(out, "hello", 5), "the reply alone: %s", out);
    cr_expect(strstr(err, "chat template chatml (default (no tokenizer.chat_template"), "%s", err);
    free(out);
    free(err);
    snprintf(args, sizeof args, "run -m %s --chat --chat-template nope -p hi", model_path);
    cr_expect_eq(run_vela(args, &out, &err), 1);
    cr_expect(strstr(err, "unknown chat template 'nope'; built in: chatml, llama2"), "%s", err);
    free(out);
    free(err);
    snprintf(args, sizeof args, "run -m %s --chat --chat-template phi3 --system b -p hi -n 2 -v",
             model_path);
    cr_expect_eq(run_vela(args, &out, &err), 0, "%s", err);
    cr_expect(strstr(err, "chat template phi3 (--chat-template)"), "%s", err);
    free(out);
    free(err);
    snprintf(args, sizeof args, "run -m %s --system x -p hi", model_path);
    cr_expect_eq(run_vela(args, &out, &err), 2);
    cr_expect(strstr(err, "go with --chat"), "%s", err);
    free(out);
    free(err);
    snprintf(args, sizeof args, "run -m %s --chat --parallel 2 -p hi", model_path);
    cr_expect_eq(run_vela(args, &out, &err), 2);
    free(out);
    free(err);
}

// A model written by vela mkmodel (random weights) is named as such.
Test(cli, run_says_synthetic) {
    char path[128], args[512], *out, *err;
    tiny_temp_path(path, sizeof path, "synthetic");
    snprintf(args, sizeof args, "mkmodel --preset tiny -o %s", path);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    free(out);
    free(err);
    snprintf(args, sizeof args, "run -m %s -p hi -n 2", path);
    cr_expect_eq(run_vela(args, &out, &err), 0, "%s", err);
    cr_expect(strstr(err, "is a synthetic model with random weights"), "%s", err);
    free(out);
    free(err);
    // The test vocabulary model of this suite is no mkmodel output: no note.
    snprintf(args, sizeof args, "run -m %s -p hi -n 2", model_path);
    cr_expect_eq(run_vela(args, &out, &err), 0, "%s", err);
    cr_expect(!strstr(err, "synthetic"), "%s", err);
    free(out);
    free(err);
    unlink(path);
}

// A flag's variable gives its value (the command line wins), a bad one is a
// usage error naming the variable, and docs/environment.md lists every
// variable of the flag table.
Test(cli, flag_environment) {
    char *out, *err, args[512];
    setenv("VELA_ARG_THREADS", "abc", 1);
    cr_expect_eq(run_vela("run -m x.gguf", &out, &err), 2);
    cr_expect(strstr(err, "VELA_ARG_THREADS: 'abc' is not an integer"), "%s", err);
    free(out);
    free(err);
    unsetenv("VELA_ARG_THREADS");
    setenv("VELA_ARG_MODEL", model_path, 1);
    setenv("VELA_ARG_N_PREDICT", "3", 1);
    cr_expect_eq(run_vela("run -p hi --temp 0 --backend cpu -t 1 -n 2", &out, &err), 0, "%s", err);
    cr_expect(strstr(err, "/     2 tokens"), "-n wins over VELA_ARG_N_PREDICT: %s", err);
    free(out);
    free(err);
    unsetenv("VELA_ARG_MODEL");
    unsetenv("VELA_ARG_N_PREDICT");
    snprintf(args, sizeof args, "%s/docs/environment.md", VELA_SOURCE_DIR);
    char *doc = test_read_text(args);
    for (size_t k = 0; k < cli_flags.n_rows; k++) {
        const char *env = cli_flags.rows[k].env;
        if (env) {
            snprintf(args, sizeof args, "`%s`", env);
            cr_expect(strstr(doc, args), "docs/environment.md does not list %s", env);
        }
    }
    free(doc);
}

// -c 0 is the model's context: --help says so.
Test(cli, help_says_what_c0_means) {
    char *out, *err;
    cr_assert_eq(run_vela("run --help", &out, &err), 0);
    cr_expect(strstr(out, "0 = the model's training context"), "%s", out);
    free(out);
    free(err);
}

// The first line `cmd` prints, without its newline, into out; -1 if the
// command fails or prints nothing.
static int first_line(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    out[0] = '\0';
    const bool got = fgets(out, (int)cap, p) != NULL;
    const int st = pclose(p);
    out[strcspn(out, "\n")] = '\0';
    return got && WIFEXITED(st) && WEXITSTATUS(st) == 0 && out[0] ? 0 : -1;
}

// `vela --version` names the commit the binary was built from (written at
// every build by cmake/vela_commit.cmake, not at configure time, which went
// stale after each new commit), with "-dirty" exactly when tracked files
// differ from it.
Test(cli, version_names_the_commit_built) {
    char head[64], want[80], cmd[512];
    snprintf(cmd, sizeof cmd, "git -C '%s' rev-parse --short=12 HEAD 2>/dev/null", VELA_SOURCE_DIR);
    if (first_line(cmd, head, sizeof head))
        cr_skip_test("the source tree is not a git checkout");
    snprintf(cmd, sizeof cmd, "git -C '%s' diff --quiet HEAD -- 2>/dev/null", VELA_SOURCE_DIR);
    const int st = system(cmd);
    const bool dirty = WIFEXITED(st) && WEXITSTATUS(st) == 1;
    snprintf(want, sizeof want, "vela %s%s\n", head, dirty ? "-dirty" : "");
    char *out, *err;
    cr_assert_eq(run_vela("--version", &out, &err), 0, "%s", err);
    cr_expect_str_eq(out, want, "vela --version printed \"%s\", the tree is at %s%s", out, head,
                     dirty ? " with local changes" : "");
    free(out);
    free(err);
}

// vela serve without -m: the default model too, or how to fetch it (the
// server itself is tested in tests/serve/).
Test(cli, serve_without_model) {
    char *out, *err;
    setenv("VELA_CACHE", "/nonexistent/vela-cache", 1);
    cr_expect_eq(run_vela("serve --port 0", &out, &err), 2);
    cr_expect(strstr(err, "vela serve: no model given (-m MODEL.gguf) and the default model is "
                          "not in the cache") &&
                  strstr(err, "bash tools/model_cache.sh"),
              "%s", err);
    free(out);
    free(err);
}

// One-shot --chat without -n is bounded: no context shift unless asked, so
// a reply that never meets the end of its turn (--ignore-eos; this
// vocabulary has no end-of-turn token) stops when the context is full.
// Before, it shifted the context and went on until run_vela's timeout.
Test(cli, run_chat_is_bounded) {
    char *out, *err, args[512];
    snprintf(args, sizeof args, "run -m %s --chat -p hi -c 64 --ignore-eos --temp 1", model_path);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    cr_expect(strstr(err, "no -n: generation ends when the context (64 tokens) is full"), "%s",
              err);
    cr_expect(strstr(err, "context full (64 tokens); --chat does not shift the context"), "%s",
              err);
    free(out);
    free(err);
    // --context-shift still asks for the shift (bounded here by -n).
    snprintf(args, sizeof args,
             "run -m %s --chat -p hi -c 64 --ignore-eos --context-shift -n 40 --temp 1",
             model_path);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    cr_expect(strstr(err, "context shifts:"), "%s", err);
    free(out);
    free(err);
}

// Without -n, plain run says what ends it, and that the context shift may
// not (the runaway of issue #31 gave no hint).
Test(cli, run_says_what_bounds_it) {
    char *out, *err, args[512];
    snprintf(args, sizeof args, "run -m %s -p hi -c 16 --no-context-shift --temp 0", model_path);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    cr_expect(strstr(err, "no -n: generation ends at an end-of-generation token or when the "
                          "context (16 tokens) is full"),
              "%s", err);
    free(out);
    free(err);
    snprintf(args, sizeof args, "run -m %s -p hi -c 16 --temp 0 --repeat-penalty 1.2 -n 0",
             model_path);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    cr_expect(!strstr(err, "no -n"), "-n given: %s", err);
    free(out);
    free(err);
}

// The seed is on stderr before the first generated byte, in a form that
// replays: pasting it back gives the same text.
Test(cli, run_prints_seed_first) {
    char *all, args[512];
    snprintf(args, sizeof args, "run -m %s --chat -p hi -n 8 --temp 1.5 --ignore-eos", model_path);
    cr_assert_eq(run_vela_merged(args, &all), 0, "%s", all);
    const char *seed = strstr(all, "sampler seed: ");
    cr_assert_not_null(seed, "%s", all);
    unsigned long s = strtoul(seed + 14, NULL, 10);
    char want[64];
    snprintf(want, sizeof want, "(replay: --seed %lu)", s);
    cr_expect(strstr(seed, want), "%s", all);
    // The same seed pasted back gives the same reply, and in the merged
    // stream that reply comes after the seed line.
    char *out1, *err1;
    snprintf(args, sizeof args, "run -m %s --chat -p hi -n 8 --temp 1.5 --ignore-eos --seed %lu",
             model_path, s);
    cr_assert_eq(run_vela(args, &out1, &err1), 0, "%s", err1);
    cr_assert_gt(strlen(out1), 1, "8 tokens of reply: '%s'", out1);
    const char *reply = strstr(all, out1);
    cr_expect(reply && reply > seed, "the replayed reply, after the seed line: %s", all);
    free(all);
    free(out1);
    free(err1);
}

// One exit-status convention for every subcommand (README, "Exit status"):
// a model that cannot be opened is a runtime error, 1, whichever command
// meets it (chat and serve said 2); an unknown flag is a usage error, 2.
Test(cli, exit_status_convention) {
    const char *cmds[] = {"run -p hi",       "chat",           "serve --port 0",
                          "eval --tokens 1", "tokenize -p hi", "bench -p 1 -n 1"};
    char args[512], *out, *err;
    for (size_t k = 0; k < sizeof cmds / sizeof cmds[0]; k++) {
        snprintf(args, sizeof args, "%s -m /nonexistent/model.gguf </dev/null", cmds[k]);
        cr_expect_eq(run_vela(args, &out, &err), 1, "vela %s: %s", cmds[k], err);
        cr_expect(strstr(err, "/nonexistent/model.gguf"), "vela %s: %s", cmds[k], err);
        free(out);
        free(err);
        snprintf(args, sizeof args, "%s -m %s --no-such-flag </dev/null", cmds[k], model_path);
        cr_expect_eq(run_vela(args, &out, &err), 2, "vela %s --no-such-flag: %s", cmds[k], err);
        free(out);
        free(err);
    }
}

// -t above the physical cores and -c above the trained context (64 tokens
// here) are taken, with a warning each; RoPE scaling or self-extend
// silences the second.
Test(cli, warns_threads_and_context) {
    char args[512], *out, *err;
    snprintf(args, sizeof args, "run -m %s -p hi -n 2 -t 4096 -c 128 --backend cpu", model_path);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    cr_expect(strstr(err, "warning: -t 4096 is more than the "), "%s", err);
    cr_expect(strstr(err, "warning: a context of 128 tokens is more than the model's trained "
                          "context (64 tokens)"),
              "%s", err);
    free(out);
    free(err);
    snprintf(args, sizeof args,
             "run -m %s -p hi -n 2 -c 128 --rope-scaling yarn --rope-scale 2 --backend cpu",
             model_path);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    cr_expect(!strstr(err, "warning"), "%s", err);
    free(out);
    free(err);
    snprintf(args, sizeof args, "eval -m %s --tokens 1,2 -c 100 --backend cpu", model_path);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    cr_expect(strstr(err, "warning: a context of 100 tokens"), "%s", err);
    free(out);
    free(err);
}

// `vela eval -m $M -p "Some text" --logits-out logits.f32` (README): a text
// of fewer tokens than the step API's least context (5) works; a run that
// fails leaves no logits file behind.
Test(cli, eval_short_text_and_no_file_on_failure) {
    char lpath[128], args[512], *out, *err;
    tiny_temp_path(lpath, sizeof lpath, "logits");
    snprintf(args, sizeof args, "eval -m %s -p hi --logits-out %s", model_path, lpath);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    struct stat sb;
    cr_expect_eq(stat(lpath, &sb), 0);
    free(out);
    free(err);
    unlink(lpath);
    snprintf(args, sizeof args, "eval -m %s --tokens 1,2 --logits-out %s", model_path, lpath);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    cr_expect_eq(stat(lpath, &sb), 0);
    cr_expect_eq((size_t)sb.st_size, sizeof(float) * 2 * 300);
    free(out);
    free(err);
    unlink(lpath);
    snprintf(args, sizeof args, "eval -m %s --tokens 1,2,3 -c 2 --logits-out %s", model_path,
             lpath);
    cr_expect_eq(run_vela(args, &out, &err), 1);
    cr_expect(stat(lpath, &sb) != 0, "a failed eval left %s behind", lpath);
    free(out);
    free(err);
    unlink(lpath);
}

// eval's -c 0 sizes the context to the tokens: its --help says that, and
// not the other commands' "0 = the model's training context".
Test(cli, eval_help_agrees_on_c) {
    char *out, *err;
    cr_assert_eq(run_vela("eval --help", &out, &err), 0);
    cr_expect(strstr(out, "0 = room for the tokens"), "%s", out);
    cr_expect(!strstr(out, "training context") && !strstr(out, "defaults to the number"), "%s",
              out);
    free(out);
    free(err);
}

// The text of out with every space, tab and newline taken out (malloc'd).
static char *squeeze(const char *out) {
    char *s = strdup(out), *w = s;
    for (const char *r = out; *r; r++)
        if (*r != ' ' && *r != '\n' && *r != '\t' && *r != '\r')
            *w++ = *r;
    *w = '\0';
    return s;
}

// --json-schema / --grammar constrain what run generates, whatever the
// (random) weights would say; bad grammars and schemas are usage errors.
Test(cli, grammar_and_json_schema_constrain_run) {
    char args[1024], *out = NULL, *err = NULL;
    for (int seed = 1; seed <= 3; seed++) {
        snprintf(args, sizeof args,
                 "run -m %s -p a -n 40 --temp 1.0 -s %d --backend cpu -t 1 -j "
                 "'{\"type\": \"object\", \"properties\": {\"ok\": {\"type\": \"boolean\"}}, "
                 "\"required\": [\"ok\"], \"additionalProperties\": false}'",
                 model_path, seed);
        cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
        char *s = squeeze(out);
        const size_t n = strlen(s);
        const bool ok = (n >= 11 && !strcmp(s + n - 11, "{\"ok\":true}")) ||
                        (n >= 12 && !strcmp(s + n - 12, "{\"ok\":false}"));
        cr_expect(ok, "seed %d: the output is not {\"ok\": <boolean>}: '%s'", seed, out);
        free(s), free(out), free(err);
    }
    snprintf(args, sizeof args,
             "run -m %s -p a -n 20 --temp 1.0 --backend cpu -t 1 --grammar 'root ::= \"yes\" | "
             "\"no\"'",
             model_path);
    cr_assert_eq(run_vela(args, &out, &err), 0, "%s", err);
    char *s = squeeze(out);
    const size_t n = strlen(s);
    cr_expect((n >= 3 && !strcmp(s + n - 3, "yes")) || (n >= 2 && !strcmp(s + n - 2, "no")),
              "not yes or no: '%s'", out);
    free(s), free(out), free(err);
    const char *bad[][2] = {
        {"-j '{\"type\": \"number\", \"multipleOf\": 2}'", "keyword 'multipleOf' is not supported"},
        {"--grammar 'root ::= ('", "the grammar:"},
        {"--grammar 'root ::= \"a\"' -j '{}'", "give one of --grammar"},
        {"--grammar-file /nonexistent/g.gbnf", "cannot read '/nonexistent/g.gbnf'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "run -m %s -p a -n 2 --backend cpu %s", model_path, bad[i][0]);
        cr_expect_eq(run_vela(args, &out, &err), 2, "%s: %s", bad[i][0], err);
        cr_expect(strstr(err, bad[i][1]) != NULL, "%s: '%s' lacks '%s'", bad[i][0], err, bad[i][1]);
        free(out), free(err);
    }
}
