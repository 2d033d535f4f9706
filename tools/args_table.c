// The flag table of every vela command (args.h, read by tools/flags.c): one
// row per flag, llama.cpp's spellings, in the order --help lists them.
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>

#include "host/split/plan.h"
#include "host/tokenizer/chat_harmony.h"
#include "tools/args.h"
#include "tools/common.h"
#include "tools/mkmodel/ftype.h"
#include "tools/serve/api.h"
#include "tools/serve/chat_kwargs.h"
#include "tools/serve/json_schema.h"

// --help's sections, in its order.
enum {
    SEC_RUN,
    SEC_CHAT,
    SEC_EVAL,
    SEC_BENCH,
    SEC_SERVE,
    SEC_SERVE_LLAMA,
    SEC_TOKENIZE,
    SEC_QUANTIZE,
    SEC_DUMP,
    SEC_MK_OUTPUT,
    SEC_MK_SHAPE,
    SEC_MK_TYPES,
    SEC_MK_WEIGHTS,
    SEC_MK_ROPE,
    SEC_MK_SWA,
    SEC_MK_TOKENIZER,
    SEC_MODEL,
    SEC_SPLIT,
    SEC_ROPE,
    SEC_SPEC,
    SEC_SAMPLING,
    SEC_HELP,
    SEC_COUNT
};

static const char *const sections[SEC_COUNT] = {
    [SEC_RUN] = "prompt and generation",
    [SEC_CHAT] = "chat",
    [SEC_EVAL] = "input and output",
    [SEC_BENCH] = "tests",
    [SEC_SERVE] = "server",
    [SEC_SERVE_LLAMA] = "llama.cpp flags taken so that a llama-server command line runs unchanged",
    [SEC_TOKENIZE] = "options",
    [SEC_QUANTIZE] = "options",
    [SEC_DUMP] = "options",
    [SEC_MK_OUTPUT] = "output",
    [SEC_MK_SHAPE] = "shape",
    [SEC_MK_TYPES] = "weight types (f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k q4_k q5_k q6_k "
                     "iq4_nl iq4_xs mxfp4; norms and biases are always f32)",
    [SEC_MK_WEIGHTS] = "weight generation (matrices; norms and biases are always exact)",
    [SEC_MK_ROPE] = "rope",
    [SEC_MK_SWA] = "sliding window (gemma3)",
    [SEC_MK_TOKENIZER] = "tokenizer",
    [SEC_MODEL] = "model and backend",
    [SEC_SPLIT] = "several devices (split by layers, see docs/multi-gpu.md)",
    [SEC_ROPE] = "rope",
    [SEC_SPEC] = "speculative decoding (output unchanged: drafts are verified by the model; "
                 "see docs/serving.md)",
    [SEC_SAMPLING] = "sampling (chain: penalties -> top-k -> top-p -> min-p -> temp -> dist)",
    [SEC_HELP] = "",
};

// --- readers of the FLAG_FN rows ------------------------------------------------

static void *at(void *opts, const struct flag *f) {
    return (char *)opts + f->off;
}

// The int field becomes the row's lo (a flag that picks a constant).
static int set_const(void *opts, const struct flag *f, const char *where, const char *const *v,
                     int n, struct verr *err) {
    *(int *)at(opts, f) = (int)f->lo;
    return 0;
}

static int tensor_split(void *opts, const struct flag *f, const char *where, const char *const *v,
                        int n, struct verr *err) {
    float p[PLAN_MAX_DEVICES];
    int k = 0;
    int rc = plan_parse_split(v[0], p, PLAN_MAX_DEVICES, &k, err);
    if (rc)
        return rc;
    *(const char **)at(opts, f) = v[0];
    return 1;
}

static int devices(void *opts, const struct flag *f, const char *where, const char *const *v, int n,
                   struct verr *err) {
    struct backend_device d[PLAN_MAX_DEVICES];
    int k = 0;
    int rc = plan_parse_devices(v[0], d, PLAN_MAX_DEVICES, &k, err);
    if (rc)
        return rc;
    *(const char **)at(opts, f) = v[0];
    return 1;
}

// --self-extend G W: both values are checked before either is set.
static int self_extend(void *opts, const struct flag *f, const char *where, const char *const *v,
                       int n, struct verr *err) {
    static const char *const what[2] = {"G (group size)", "W (neighbor window)"};
    int val[2];
    for (int k = 0; k < 2; k++) {
        char *end;
        errno = 0;
        long x = strtol(v[k], &end, 10);
        if (end == v[k] || *end || errno || x < 1 || x > (1L << 24))
            return verr_set(err, VERR_RANGE, "%s: %s = '%s' must be an integer in [1, %ld]", where,
                            what[k], v[k], 1L << 24);
        val[k] = (int)x;
    }
    struct args_model *a = &((struct cli *)opts)->am;
    a->se_g = val[0];
    a->se_w = val[1];
    return 2;
}

// --rope-scale N: the frequency scale 1/N.
static int rope_scale(void *opts, const struct flag *f, const char *where, const char *const *v,
                      int n, struct verr *err) {
    float x;
    int rc = flags_read_float(where, v[0], &x, err);
    if (rc)
        return rc;
    if (!(x > 0))
        return verr_set(err, VERR_RANGE, "%s: %g must be > 0", where, x);
    ((struct cli *)opts)->am.rope.freq_scale = 1.0f / x;
    return 1;
}

// -l, --logit-bias TOKEN_ID(+/-)BIAS (llama.cpp's): 15043+1, 15043-1,
// 15043-inf (never); repeatable, the entries of one token add up.
static int logit_bias(void *opts, const struct flag *f, const char *where, const char *const *v,
                      int n, struct verr *err) {
    struct cli *c = opts;
    const char *s = v[0], *sign = s;
    while (*sign >= '0' && *sign <= '9')
        sign++;
    char *end;
    errno = 0;
    long tok = strtol(s, &end, 10);
    float x = 0;
    if (sign != s && end == sign && !errno && tok <= INT32_MAX && (*sign == '+' || *sign == '-')) {
        x = strtof(sign + 1, &end);
        if (end == sign + 1 || *end || !(isfinite(x) || isinf(x)) || x < 0)
            sign = NULL;
    } else {
        sign = NULL;
    }
    if (!sign || (isinf(x) && *sign == '+'))
        return verr_set(err, VERR_RANGE,
                        "%s: '%s' is not TOKEN_ID(+/-)BIAS (e.g. 15043+1, 15043-inf)", where, s);
    if (c->gp.sp.n_bias == CLI_LOGIT_BIAS_MAX)
        return verr_set(err, VERR_RANGE, "%s: more than %d entries", where, CLI_LOGIT_BIAS_MAX);
    c->logit_bias[c->gp.sp.n_bias++] = (struct sampler_bias){(int32_t)tok, *sign == '-' ? -x : x};
    c->gp.sp.bias = c->logit_bias;
    return 1;
}

// --grammar GBNF, --grammar-file FILE, -j / --json-schema SCHEMA,
// -jf / --json-schema-file FILE (llama.cpp's): one of them; a schema is
// converted to GBNF here, so a keyword it cannot express is an error of the
// command line.
static int grammar_flag(void *opts, const struct flag *f, const char *where, const char *const *v,
                        int n, struct verr *err) {
    struct cli *c = opts;
    if (c->grammar)
        return verr_set(err, VERR_RANGE,
                        "%s: give one of --grammar, --grammar-file, --json-schema and "
                        "--json-schema-file",
                        where);
    const bool file = strstr(f->names, "-file") != NULL;
    const bool schema = strstr(f->names, "json-schema") != NULL;
    size_t len = strlen(v[0]);
    char *text = file ? tools_read_file(v[0], &len) : (char *)v[0];
    if (!text)
        return verr_set(err, VERR_IO, "%s: cannot read '%s': %s", where, v[0], strerror(errno));
    int rc = 0;
    if (schema) {
        struct verr e2 = {0};
        if (json_schema_text_to_gbnf(text, len, &c->grammar, &e2))
            rc = verr_set(err, VERR_RANGE, "%s: %s", where, e2.msg);
    } else if (!(c->grammar = strndup(text, len))) {
        rc = verr_set(err, VERR_NOMEM, "%s: out of memory", where);
    }
    if (file)
        free(text);
    return rc ? rc : 1;
}

// --chat-template-kwargs JSON (llama.cpp's): an object of the template's
// variables; a later one adds its keys to the earlier's.
static int template_kwargs(void *opts, const struct flag *f, const char *where,
                           const char *const *v, int n, struct verr *err) {
    (void)f, (void)n;
    static const char flag[] = "--chat-template-kwargs";
    struct cli *c = opts;
    struct verr e2 = {0};
    if (!api_utf8_valid(v[0], strlen(v[0])))
        return verr_set(err, VERR_RANGE, "%s: the value is not valid UTF-8", where);
    if (chat_kwargs_parse(v[0], flag, &c->chat_kwargs, &e2)) {
        bool env = strcmp(where, flag) != 0; // the message names the flag; add the variable
        return verr_set(err, VERR_RANGE, "%s%s%s", env ? where : "", env ? ": " : "", e2.msg);
    }
    return 1;
}

// --reasoning-effort LEVEL (llama.cpp's): the template's reasoning_effort,
// or "default" for the template's own.
static int reasoning_effort(void *opts, const struct flag *f, const char *where,
                            const char *const *v, int n, struct verr *err) {
    (void)f, (void)n;
    struct cli *c = opts;
    if (!strcmp(v[0], "default")) {
        free(c->chat_kwargs.reasoning_effort);
        c->chat_kwargs.reasoning_effort = NULL;
        c->chat_kwargs.effort_from = NULL;
        return 1;
    }
    cJSON *s = cJSON_CreateString(v[0]);
    struct verr e2 = {0};
    int rc = s ? chat_kwargs_read_effort(s, "--reasoning-effort", &c->chat_kwargs, &e2)
               : verr_set(&e2, VERR_NOMEM, "out of memory");
    cJSON_Delete(s);
    if (rc)
        return verr_set(err, VERR_RANGE,
                        "%s: '%s' is not a reasoning effort (low, medium, high, "
                        "default)",
                        where, v[0]);
    return 1;
}

static int seed(void *opts, const struct flag *f, const char *where, const char *const *v, int n,
                struct verr *err) {
    char *end;
    errno = 0;
    long long x = strtoll(v[0], &end, 10);
    if (end == v[0] || *end || errno || x < -1 || x > (long long)UINT32_MAX)
        return verr_set(err, VERR_RANGE, "%s: '%s' is not a seed (0..4294967295, -1 for random)",
                        where, v[0]);
    ((struct cli *)opts)->gp.sp.seed = x < 0 ? SAMPLER_SEED_RANDOM : (uint32_t)x;
    return 1;
}

// "1,8,32" -> values in [lo, hi], at most CLI_BENCH_MAX_LIST of them, into
// the int array at f->off with its count right after it.
static int int_list(void *opts, const struct flag *f, const char *where, const char *const *v,
                    int n_v, struct verr *err) {
    int *vals = at(opts, f), *n_vals = vals + CLI_BENCH_MAX_LIST, n = 0;
    const long lo = (long)f->lo, hi = (long)f->hi;
    for (const char *p = v[0];;) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || (*end != ',' && *end != '\0'))
            return verr_set(err, VERR_RANGE, "%s: '%s' is not a list of numbers", where, v[0]);
        if (x < lo || x > hi)
            return verr_set(err, VERR_RANGE, "%s: %ld is out of range [%ld, %ld]", where, x, lo,
                            hi);
        if (n == CLI_BENCH_MAX_LIST)
            return verr_set(err, VERR_RANGE, "%s: at most %d values", where, CLI_BENCH_MAX_LIST);
        vals[n++] = (int)x;
        if (*end == '\0')
            break;
        p = end + 1;
    }
    *n_vals = n;
    return 1;
}

// -fa: llama.cpp took it bare, now with a value: one of these is taken along.
static int flash_attn(void *opts, const struct flag *f, const char *where, const char *const *v,
                      int n, struct verr *err) {
    static const char *const vals[] = {"on", "off", "auto", "1", "0"};
    for (size_t k = 0; n > 0 && k < sizeof vals / sizeof vals[0]; k++)
        if (!strcmp(v[0], vals[k]))
            return 1;
    return 0;
}

// -ngl 0: the CPU backend; any other count: the default backend.
static int gpu_layers(void *opts, const struct flag *f, const char *where, const char *const *v,
                      int n, struct verr *err) {
    int layers = 0;
    int rc = flags_read_int(where, v[0], -1, 1 << 20, &layers, err);
    if (rc)
        return rc;
    if (layers == 0)
        ((struct cli *)opts)->am.backend = LOAD_BACKEND_CPU;
    return 1;
}

static int max_body(void *opts, const struct flag *f, const char *where, const char *const *v,
                    int n, struct verr *err) {
    int bytes = 0;
    int rc = flags_read_int(where, v[0], 1024, 1 << 30, &bytes, err);
    if (rc)
        return rc;
    ((struct cli *)opts)->sc.max_body = (size_t)bytes;
    return 1;
}

// tokenize's text: -p TEXT, -f FILE or --stdin (the row's lo), once.
static int text_source(void *opts, const struct flag *f, const char *where, const char *const *v,
                       int n, struct verr *err) {
    struct cli *c = opts;
    if (c->tok.src != CLI_TEXT_NONE)
        return verr_set(err, VERR_RANGE,
                        "%s: give the text once (-p, -f and --stdin exclude each other)", where);
    c->tok.src = (enum cli_text_source)(int)f->lo;
    c->tok.text = n > 0 ? v[0] : NULL;
    return n;
}

// A weight type name (q8_0, f16, ...) into the int field.
static int weight_type(void *opts, const struct flag *f, const char *where, const char *const *v,
                       int n, struct verr *err) {
    int t = ggml_type_from_name(v[0]);
    if (t < 0)
        return verr_set(err, VERR_RANGE, "%s: '%s' is not a weight type (q8_0, f16, ...)", where,
                        v[0]);
    *(int *)at(opts, f) = t;
    return 1;
}

static int mk_seed(void *opts, const struct flag *f, const char *where, const char *const *v, int n,
                   struct verr *err) {
    char *end;
    errno = 0;
    unsigned long long x = v[0][0] == '-' ? 0 : strtoull(v[0], &end, 0);
    if (v[0][0] == '-' || errno || end == v[0] || *end)
        return verr_set(err, VERR_RANGE, "%s: '%s' is not an unsigned 64-bit integer", where, v[0]);
    ((struct cli *)opts)->mk.cfg.seed = x;
    return 1;
}

static int mk_name(void *opts, const struct flag *f, const char *where, const char *const *v, int n,
                   struct verr *err) {
    struct mkmodel_config *c = &((struct cli *)opts)->mk.cfg;
    if (strlen(v[0]) >= sizeof c->name)
        return verr_set(err, VERR_RANGE, "%s: longer than %zu bytes", where, sizeof c->name - 1);
    snprintf(c->name, sizeof c->name, "%s", v[0]);
    return 1;
}

// --arch: a registered architecture, or "mixtral": llama with experts (8
// of which 2 are used, unless --n-expert / --n-expert-used say otherwise).
static int mk_arch(void *opts, const struct flag *f, const char *where, const char *const *v, int n,
                   struct verr *err) {
    struct mkmodel_config *c = &((struct cli *)opts)->mk.cfg;
    if (!strcasecmp(v[0], "mixtral")) {
        c->arch = MKMODEL_ARCH_LLAMA;
        if (c->n_expert == 0)
            c->n_expert = 8;
        return 1;
    }
    const struct arch *a = arch_find(v[0]);
    char names[256];
    if (!a)
        return verr_set(err, VERR_RANGE, "%s: '%s' is not an architecture (%s, mixtral)", where,
                        v[0], arch_names(names, sizeof names));
    c->arch = (enum mkmodel_arch)a->id;
    return 1;
}

static int mk_mix(void *opts, const struct flag *f, const char *where, const char *const *v, int n,
                  struct verr *err) {
    struct cli *c = opts;
    const struct ftype_info *ft = ftype_find(v[0]);
    char names[256];
    if (strcasecmp(v[0], "none") && !ft)
        return verr_set(err, VERR_RANGE, "%s: '%s' is not a file type (none, %s)", where, v[0],
                        ftype_names(names, sizeof names));
    c->mk.cfg.mix = ft ? ft->id : MKMODEL_MIX_NONE;
    c->mk.saw_mix = c->mk.cfg.mix != MKMODEL_MIX_NONE;
    return 1;
}

// --type: a weight type (q4_k: every matrix Q4_K), else a llama.cpp file
// type (q4_k_m: --mix q4_k_m).
static int mk_type(void *opts, const struct flag *f, const char *where, const char *const *v, int n,
                   struct verr *err) {
    struct cli *c = opts;
    const int t = ggml_type_from_name(v[0]);
    const struct ftype_info *ft = NULL;
    if (t >= 0) {
        c->mk.cfg.type = (enum ggml_type)t;
        c->mk.cfg.mix = MKMODEL_MIX_NONE;
        c->mk.saw_type = true;
    } else if ((ft = ftype_find(v[0]))) {
        c->mk.cfg.mix = ft->id;
    } else {
        return verr_set(err, VERR_RANGE, "%s: '%s' is not a weight or file type", where, v[0]);
    }
    return 1;
}

// --- the rows ------------------------------------------------------------------------

static const struct flag_choice backends[] = {
    {"cpu", LOAD_BACKEND_CPU}, {"cuda", LOAD_BACKEND_CUDA}, {"auto", LOAD_BACKEND_AUTO}, {0}};
// llama.cpp's --cache-type-k/-v names (backend_cache_type_quantized beside
// the floats).
static const struct flag_choice cache_types[] = {
    {"f16", GGML_TYPE_F16},       {"f32", GGML_TYPE_F32},
    {"bf16", GGML_TYPE_BF16},     {"q8_0", GGML_TYPE_Q8_0},
    {"q4_0", GGML_TYPE_Q4_0},     {"q4_1", GGML_TYPE_Q4_1},
    {"q5_0", GGML_TYPE_Q5_0},     {"q5_1", GGML_TYPE_Q5_1},
    {"iq4_nl", GGML_TYPE_IQ4_NL}, {0}};
// "row" is taken so that the pipeline's setup refuses it by name.
static const struct flag_choice split_modes[] = {
    {"layer", LOAD_SPLIT_LAYER}, {"none", LOAD_SPLIT_NONE}, {"row", LOAD_SPLIT_ROW}, {0}};
static const struct flag_choice acts[] = {{"q8", BACKEND_ACT_Q8}, {"f32", BACKEND_ACT_F32}, {0}};
static const struct flag_choice rope_types[] = {
    {"none", ROPE_SCALING_NONE}, {"linear", ROPE_SCALING_LINEAR}, {"yarn", ROPE_SCALING_YARN}, {0}};
static const struct flag_choice spec_types[] = {
    {"none", ENGINE_SPEC_NONE}, {"ngram", ENGINE_SPEC_NGRAM}, {"draft", ENGINE_SPEC_DRAFT}, {0}};
static const struct flag_choice log_formats[] = {
    {"text", SRV_LOG_TEXT}, {"json", SRV_LOG_JSON}, {0}};
static const struct flag_choice reasoning_formats[] = {{"auto", CHAT_REASONING_AUTO},
                                                       {"deepseek", CHAT_REASONING_AUTO},
                                                       {"none", CHAT_REASONING_NONE},
                                                       {0}};
static const struct flag_choice mk_rope_types[] = {{"none", MKMODEL_ROPE_SCALING_NONE},
                                                   {"linear", MKMODEL_ROPE_SCALING_LINEAR},
                                                   {"yarn", MKMODEL_ROPE_SCALING_YARN},
                                                   {0}};

#define OFF(f) offsetof(struct cli, f)
#define SEEN(f) (offsetof(struct cli, f) + 1)
#define INT(f, a, b) .kind = FLAG_INT, .off = OFF(f), .lo = (a), .hi = (b)
#define FLOAT(f, a, b) .kind = FLAG_FLOAT, .off = OFF(f), .lo = (a), .hi = (b)
#define FLOAT_ANY(f) FLOAT(f, -INFINITY, INFINITY)
#define POSITIVE(f) .kind = FLAG_FLOAT, .off = OFF(f), .lo = 0, .lo_open = true
#define STR(f) .kind = FLAG_STR, .off = OFF(f)
#define SET(f) .kind = FLAG_SET, .off = OFF(f)
#define UNSET(f) .kind = FLAG_UNSET, .off = OFF(f)
#define ENUM(f, c, what) .kind = FLAG_ENUM, .off = OFF(f), .choices = c, .expected = what
#define FN(f, n, cb) .kind = FLAG_FN, .off = OFF(f), .n_values = (n), .fn = cb
#define NOTE .kind = FLAG_NOTE
#define CLI_ALL 0x1ffu
#define TEXT_OF_(x) #x
#define TEXT_OF(x) TEXT_OF_(x)

// The commands that load a model, the MPI workers but for -m's help.
#define MODEL_CMDS (CLI_MODEL & ~CLI_MPI_WORKER)

static const struct flag rows[] = {
    // --- vela run ---
    {CLI_RUN | CLI_EVAL, SEC_RUN, "-p, --prompt", "TEXT",
     "the prompt; run: escapes \\n \\t \\\\ \\xNN are processed (default: empty = BOS); eval: "
     "tokenized with BOS as the model asks",
     NULL, STR(prompt)},
    {CLI_RUN | CLI_EVAL, SEC_RUN, "-f, --file", "FILE",
     "read the prompt from FILE (one trailing newline dropped); run with --parallel N > 1: one "
     "prompt per line (blank lines skipped)",
     NULL, STR(prompt_file)},
    {CLI_RUN, SEC_RUN, "-n, --n-predict", "N",
     "tokens to generate per sequence, -1 = until end of generation (with context shift: without "
     "end), -2 = until the context is full (default: -1)",
     "VELA_ARG_N_PREDICT", INT(gp.n_predict, -2, 1L << 30), .seen = SEEN(run.n_given)},
    {CLI_RUN | CLI_CHAT, SEC_RUN, "--ignore-eos", NULL,
     "do not stop at end-of-generation (chat: or end-of-turn) tokens", NULL, SET(gp.ignore_eos)},
    {CLI_RUN, SEC_RUN, "--no-display-prompt", NULL,
     "do not print the prompt before the generated text", NULL, UNSET(run.display_prompt)},
    {CLI_RUN, SEC_RUN, "--no-escape", NULL, "take -p literally", NULL, UNSET(run.escape)},
    {CLI_RUN, SEC_RUN, "-e, --escape", NULL, "process escapes in -p (default)", NULL,
     SET(run.escape)},
    {CLI_RUN, SEC_RUN, "--chat", NULL,
     "one-shot chat: -p (or -f) is the user's message, formatted with the model's chat template "
     "(tokenizer.chat_template); prints the reply, generated until the end of the assistant's "
     "turn or until the context is full (no context shift unless --context-shift)",
     NULL, SET(run.chat)},
    {CLI_RUN | CLI_CHAT | CLI_SERVE, SEC_RUN, "--chat-template", "NAME",
     "this built-in template instead of the model's tokenizer.chat_template (chatml, llama2, "
     "llama3, mistral-v7, phi3, gemma, zephyr, ...; an unknown name lists them all); run: with "
     "--chat",
     "VELA_ARG_CHAT_TEMPLATE", STR(chat_template)},
    {CLI_RUN | CLI_CHAT | CLI_SERVE, SEC_RUN, "--reasoning-format", "FORMAT",
     "where a reasoning model's thoughts go (gpt-oss's analysis channel): auto or deepseek "
     "(default: apart; serve: reasoning_content, run and chat: between [Start thinking] and "
     "[End thinking]), none (the generated text as it is, markers included, as the answer); "
     "serve: the default of requests' reasoning_format",
     "VELA_ARG_REASONING_FORMAT",
     ENUM(reasoning, reasoning_formats, "a reasoning format (auto, deepseek, none)")},
    {CLI_RUN | CLI_CHAT | CLI_SERVE, SEC_RUN, "--chat-template-kwargs", "JSON",
     "the chat template's variables, a JSON object as llama.cpp's (vela reads gpt-oss's: "
     "'{\"reasoning_effort\":\"high\"}' (low, medium, high; default medium) and "
     "\"model_identity\"); any other key, or a variable the model's template does not read, is "
     "an error; serve: the default a request's chat_template_kwargs and reasoning_effort "
     "override; run: with --chat",
     "VELA_ARG_CHAT_TEMPLATE_KWARGS", FN(chat_kwargs, 1, template_kwargs)},
    {CLI_RUN | CLI_CHAT | CLI_SERVE, SEC_RUN, "--reasoning-effort", "LEVEL",
     "the chat template's reasoning_effort (gpt-oss): low, medium or high, or default (the "
     "template's, medium); as the key of --chat-template-kwargs (the later flag wins)",
     "VELA_ARG_REASONING_EFFORT", FN(chat_kwargs, 1, reasoning_effort)},
    {CLI_RUN | CLI_CHAT, SEC_RUN, "-sys, --system", "TEXT",
     "a system message before the user's (run: with --chat)", NULL, STR(system_msg)},
    {CLI_RUN, SEC_RUN, "-np, --parallel", "N",
     "sequences decoded together (1..256, default: 1); -c is shared, each sequence gets -c / N "
     "cells. With -p: N samples of the prompt (sample i uses seed + i)",
     "VELA_ARG_N_PARALLEL", INT(gp.n_parallel, 1, CLI_RUN_PARALLEL_MAX)},
    {CLI_RUN, SEC_RUN, "--context-shift", NULL,
     "when a sequence's context is full, keep --keep tokens, drop half of the rest and go on "
     "(default, but for --chat)",
     NULL, SET(gp.ctx_shift), .seen = SEEN(run.shift_given)},
    {CLI_RUN, SEC_RUN, "--no-context-shift", NULL, "stop with \"context full\" instead", NULL,
     UNSET(gp.ctx_shift), .seen = SEEN(run.shift_given)},
    {CLI_RUN, SEC_RUN, "--keep", "N",
     "tokens of the prompt kept on a context shift, -1 = all (default: 0; BOS is kept on top of "
     "N)",
     NULL, INT(gp.n_keep, -1, 1L << 30)},
    {CLI_RUN | CLI_EVAL, SEC_RUN, "-gan, --grp-attn-n", "N",
     "self-extend group factor, 1 = off (default: 1); positions are regrouped before each batch; "
     "run: turns the context shift off; -v prints its shift: / div: lines",
     NULL, INT(gp.ga_n, 1, 1L << 20)},
    {CLI_RUN | CLI_EVAL, SEC_RUN, "-gaw, --grp-attn-w", "N",
     "self-extend group width, a multiple of -gan (default: 512)", NULL, INT(gp.ga_w, 1, 1L << 30)},

    // --- vela chat ---
    {CLI_CHAT, SEC_CHAT, "-n, --n-predict", "N",
     "longest answer in tokens (default: -1, until the end of the turn)", "VELA_ARG_N_PREDICT",
     INT(gp.n_predict, -1, 1L << 30)},
    {CLI_CHAT, SEC_CHAT, "--no-history", NULL,
     "keep no history file (the session's history, Up / Down, stays)", NULL, SET(chat.no_history)},

    // --- vela eval ---
    {CLI_EVAL, SEC_EVAL, "--tokens", "LIST", "comma-separated token ids", NULL, STR(eval.tokens)},
    {CLI_EVAL, SEC_EVAL, "--logits-out", "FILE", "where the logits go (default: not written)", NULL,
     STR(eval.logits_out)},

    // --- vela bench ---
    {CLI_BENCH, SEC_BENCH, "-p, --n-prompt", "N",
     "prompt tokens per pp test; 0 skips it (default: 512)", NULL, INT(bench.n_prompt, 0, 1L << 20),
     .seen = SEEN(bench.p_given)},
    {CLI_BENCH, SEC_BENCH, "-n, --n-gen", "N",
     "decode steps per tg test; 0 skips it (default: 128)", NULL, INT(bench.n_gen, 0, 1L << 20)},
    {CLI_BENCH, SEC_BENCH, "-np, --parallel", "N[,N...]",
     "sequences decoding at once in the tg tests, one token each per step (default: 1), e.g. "
     "1,8,32,64,128,256",
     NULL, FN(bench.par, 1, int_list), .lo = 1, .hi = 4096},
    {CLI_BENCH, SEC_BENCH, "-d, --n-depth", "N[,N...]",
     "run every test on top of N cached tokens (filled untimed, the same prefix for each "
     "repetition and sequence): \"pp512 @ d4096\" (default: 0)",
     NULL, FN(bench.depth, 1, int_list), .lo = 0, .hi = 1 << 24},
    {CLI_BENCH, SEC_BENCH, "-r, --repetitions", "N", "timed repetitions of each test (default: 5)",
     NULL, INT(bench.reps, 1, 100000)},
    {CLI_BENCH, SEC_BENCH, "--full-logits", NULL,
     "download every logits row to the host (llama.cpp's behaviour) instead of only its argmax",
     NULL, SET(bench.full_logits)},
    {CLI_BENCH, SEC_BENCH, "--json", NULL, "print JSON instead of the table", NULL,
     SET(bench.json)},
    {CLI_BENCH, SEC_BENCH, "--draft", NULL,
     "speculative decoding instead of pp/tg: for each --parallel N, N sequences of built-in text "
     "generate -n tokens greedy, plain and speculating (--spec-type, -md, --draft-*; ngram by "
     "default): tokens/s of each, the speedup, drafts accepted, and a check that the tokens are "
     "the same",
     NULL, SET(bench.draft)},
    {CLI_BENCH, SEC_BENCH, "--split-compare", NULL,
     "run every test twice: on the main device alone (--split-mode none) and split as the flags "
     "ask; print the ratio split t/s / one-device t/s per test",
     NULL, SET(bench.split_compare)},
    {CLI_BENCH, SEC_BENCH, "--no-stage-times", NULL,
     "a split model: skip the extra run per test that times each stage (it serialises the "
     "stages, so t/s never comes from it)",
     NULL, SET(bench.no_stage_times)},
    {CLI_BENCH, SEC_BENCH, NULL, NULL,
     "(-b sets the pp batch size; the KV cache holds what each test needs, or -c cells when that "
     "is larger; --devices, --tensor-split, --split-mode and -ub split the model by layers as "
     "'vela run' does, see below)",
     NULL, NOTE},

    // --- vela serve ---
    {CLI_SERVE, SEC_SERVE, "--host", "ADDR",
     "IPv4 address to listen on (default: 127.0.0.1, this machine only; 0.0.0.0: every "
     "interface)",
     "VELA_ARG_HOST", STR(sc.host)},
    {CLI_SERVE, SEC_SERVE, "--port", "N", "TCP port (default: 8080; 0: any free port)",
     "VELA_ARG_PORT", INT(sc.port, 0, 65535)},
    {CLI_SERVE, SEC_SERVE, "-np, --parallel", "N",
     "slots: sequences decoded together (1..256, default: 4). -c is split between them: each "
     "request gets -c / N cells of context. Without -c (or -c 0) each slot gets the model's "
     "trained context, capped so that the KV cache takes at most half the free memory left "
     "beside the weights (a line says what it chose)",
     "VELA_ARG_N_PARALLEL", INT(sc.n_parallel, 1, CLI_SERVE_PARALLEL_MAX)},
    {CLI_SERVE, SEC_SERVE, "--queue", "N",
     "requests waiting for a free slot before new ones get 503 (default: 64)", NULL,
     INT(sc.n_queue_max, 1, 1 << 16)},
    {CLI_SERVE, SEC_SERVE, "--api-key", "KEY",
     "require 'Authorization: Bearer KEY' (all but /health)", "VELA_API_KEY", STR(sc.api_key)},
    {CLI_SERVE, SEC_SERVE, "--max-body", "BYTES",
     "largest request body (default: 4194304; 413 beyond)", NULL, FN(sc.max_body, 1, max_body)},
    {CLI_SERVE, SEC_SERVE, "--max-connections", "N", "concurrent connections (default: 256)", NULL,
     INT(sc.max_connections, 1, 1 << 16)},
    {CLI_SERVE, SEC_SERVE, "--timeout", "SECONDS", "idle connection timeout (default: 600)",
     "VELA_ARG_TIMEOUT", INT(sc.timeout_s, 1, 1 << 20)},
    {CLI_SERVE, SEC_SERVE, "-a, --alias", "NAME",
     "the model id /v1/models lists and answers carry (default: the file's base name without "
     ".gguf)",
     "VELA_ARG_ALIAS", STR(sc.model_id)},
    {CLI_SERVE, SEC_SERVE, "--strict-model-name", NULL,
     "a request naming another model gets 404 (default: any name is answered by the served "
     "model, as llama-server does)",
     NULL, SET(sc.strict_model_name)},
    {CLI_SERVE, SEC_SERVE, "--slots", NULL,
     "GET /slots answers with each slot's state (default: off, 501 as in llama-server without "
     "--slots)",
     NULL, SET(sc.slots)},
    {CLI_SERVE, SEC_SERVE, "--no-slots", NULL, "GET /slots answers 501 (the default)", NULL,
     UNSET(sc.slots)},
    {CLI_SERVE, SEC_SERVE, "-n, --n-predict, --predict", "N",
     "tokens a request generates when it names no max_tokens / n_predict, and the most it may "
     "ask for (default: -1, none: OpenAI's 16 for completions, until a stop or the slot's "
     "context for chat)",
     "VELA_ARG_N_PREDICT", INT(gp.n_predict, -1, 1 << 24)},
    {CLI_SERVE, SEC_SERVE, "-sps, --slot-prompt-similarity", "F",
     "a request takes the free slot whose cached tokens share the longest prefix with its "
     "prompt when that prefix is more than F of them (0..1, default: 0.5; 0: any common "
     "prefix); else the least recently used",
     NULL, FLOAT(sc.slot_similarity, 0, 1)},
    {CLI_SERVE, SEC_SERVE, "--log-file", "FILE",
     "write the log to FILE (appended) instead of stderr", "VELA_ARG_LOG_FILE", STR(log.path)},
    {CLI_SERVE, SEC_SERVE, "--log-format", "text|json",
     "log lines as text or one JSON object each (default: text); -v adds debug lines "
     "(libmicrohttpd's messages)",
     "VELA_ARG_LOG_FORMAT", ENUM(log.format, log_formats, "a log format (text, json)")},
    {CLI_SERVE, SEC_SERVE, "--no-access-log", NULL,
     "no line per request (method, path, status, client, tokens in and out, milliseconds)", NULL,
     UNSET(log.access)},
    {CLI_SERVE, SEC_SERVE, "--no-webui", NULL,
     "no chat page at / (404 instead; the page is served without the API key, as llama-server's)",
     NULL, SET(sc.no_webui)},
    {CLI_SERVE, SEC_SERVE_LLAMA, "-ngl, --n-gpu-layers, --gpu-layers", "N",
     "0: the CPU backend; any other count: every layer on the GPU (vela does not split layers "
     "with the CPU)",
     "VELA_ARG_N_GPU_LAYERS", FN(am.backend, 1, gpu_layers)},
    {CLI_SERVE, SEC_SERVE_LLAMA, "-fa, --flash-attn", "[on|off|auto]",
     "accepted, nothing changes: attention is always fused", NULL,
     FN(am.backend, FLAG_VALUE_OPTIONAL, flash_attn)},
    {CLI_SERVE, SEC_SERVE_LLAMA, "--jinja, --no-jinja", NULL,
     "accepted, nothing changes: chat templates are formatted by vela", NULL, SET(ignored)},
    {CLI_SERVE, SEC_SERVE_LLAMA, "-cb, --cont-batching", NULL,
     "accepted, nothing changes: batching is always continuous", NULL, SET(ignored)},
    {CLI_SERVE, SEC_SERVE_LLAMA, "--metrics", NULL,
     "accepted, nothing changes: /metrics is always on", NULL, SET(ignored)},
    {CLI_SERVE, SEC_SERVE_LLAMA, "--no-mmap, --mlock", NULL,
     "accepted, nothing changes: weights are mmap'd and uploaded", NULL, SET(ignored)},

    // --- vela tokenize ---
    {CLI_TOKENIZE, SEC_TOKENIZE, "-m, --model", "FILE",
     "GGUF file holding the tokenizer (tokenizer.ggml.*)", "VELA_ARG_MODEL", STR(am.model_path)},
    {CLI_TOKENIZE, SEC_TOKENIZE, "-p, --prompt", "TEXT", "the text to tokenize", NULL,
     FN(tok, 1, text_source), .lo = CLI_TEXT_PROMPT},
    {CLI_TOKENIZE, SEC_TOKENIZE, "-f, --file", "FILE", "read the text from FILE", NULL,
     FN(tok, 1, text_source), .lo = CLI_TEXT_FILE},
    {CLI_TOKENIZE, SEC_TOKENIZE, "--stdin", NULL, "read the text from standard input", NULL,
     FN(tok, 0, text_source), .lo = CLI_TEXT_STDIN},
    {CLI_TOKENIZE, SEC_TOKENIZE, "--ids", NULL, "print only the ids, as [1, 2, 3]", NULL,
     SET(tok.ids_only)},
    {CLI_TOKENIZE, SEC_TOKENIZE, "--show-pieces", NULL,
     "print \"ID -> 'PIECE'\" lines (the default)", NULL, UNSET(tok.ids_only)},
    {CLI_TOKENIZE, SEC_TOKENIZE, "--show-count", NULL, "also print the number of tokens", NULL,
     SET(tok.show_count)},
    {CLI_TOKENIZE, SEC_TOKENIZE, "--no-bos", NULL,
     "add no BOS / EOS even where the model asks for them", NULL, SET(tok.no_bos)},
    {CLI_TOKENIZE, SEC_TOKENIZE, "--no-parse-special", NULL,
     "read control tokens in the text (\"<|im_start|>\") as plain text", NULL,
     UNSET(tok.parse_special)},
    {CLI_TOKENIZE, SEC_TOKENIZE, "--no-escape", NULL,
     "take \\n, \\t, \\xHH, ... in the text literally", NULL, UNSET(tok.escapes)},

    // --- vela quantize ---
    {CLI_QUANTIZE, SEC_QUANTIZE, "--pure", NULL,
     "every matrix in TYPE's base type (no mix, no Q6_K head)", NULL, SET(quant.o.pure)},
    {CLI_QUANTIZE, SEC_QUANTIZE, "--leave-output-tensor", NULL, "output.weight as it is", NULL,
     SET(quant.o.keep_output)},
    {CLI_QUANTIZE, SEC_QUANTIZE, "--token-embedding-type", "T",
     "token_embd.weight in T (a weight type: q8_0, f16, ...)", NULL,
     FN(quant.o.type_embd, 1, weight_type)},
    {CLI_QUANTIZE, SEC_QUANTIZE, "--output-tensor-type", "T", "output.weight in T", NULL,
     FN(quant.o.type_output, 1, weight_type)},
    {CLI_QUANTIZE, SEC_QUANTIZE, "--allow-requantize", NULL,
     "convert tensors that are already quantized (each such tensor is decoded and encoded "
     "again: precision is lost twice)",
     NULL, SET(quant.o.allow_requantize)},
    {CLI_QUANTIZE, SEC_QUANTIZE, "-t, --threads", "N",
     "converting threads (default: the physical cores)", NULL, INT(quant.o.n_threads, 1, 1024)},
    {CLI_QUANTIZE, SEC_QUANTIZE, "-q, --quiet", NULL, "print nothing but errors", NULL,
     SET(quant.quiet)},

    // --- vela gguf dump ---
    {CLI_GGUF_DUMP, SEC_DUMP, "--json", NULL,
     "print everything as one JSON object instead (arrays in full)", NULL, SET(dump.json)},
    {CLI_GGUF_DUMP, SEC_DUMP, "--no-tensors", NULL, "leave the tensors out", NULL,
     UNSET(dump.tensors)},

    // --- vela mkmodel ---
    {CLI_MKMODEL, SEC_MK_OUTPUT, "-o, --output", "FILE", "the GGUF file to write (required)", NULL,
     STR(mk.out)},
    {CLI_MKMODEL, SEC_MK_OUTPUT, "--preset", "NAME", "start from a preset shape (see below)", NULL,
     STR(mk.preset)},
    {CLI_MKMODEL, SEC_MK_OUTPUT, "--name", "STR",
     "general.name (default vela-synthetic-<preset|arch>)", NULL, FN(mk.cfg.name, 1, mk_name)},
    {CLI_MKMODEL, SEC_MK_OUTPUT, "--seed", "N", "random seed (default 42); same seed, same bytes",
     NULL, FN(mk.cfg.seed, 1, mk_seed)},
    {CLI_MKMODEL, SEC_MK_OUTPUT, "--threads", "N",
     "generating/quantizing threads (default: all CPUs, >= 2)", NULL, INT(mk.cfg.n_threads, 0, 64)},
    {CLI_MKMODEL, SEC_MK_OUTPUT, "-q, --quiet", NULL, "print nothing but errors", NULL,
     SET(mk.quiet)},
    {CLI_MKMODEL, SEC_MK_SHAPE, "--arch", "NAME",
     "architecture (default llama; mixtral: llama with experts); the architectures are listed "
     "below",
     NULL, FN(mk.cfg.arch, 1, mk_arch)},
    {CLI_MKMODEL, SEC_MK_SHAPE, "--n-embd", "N", "embedding length (default 256)", NULL,
     INT(mk.cfg.n_embd, 1, INT_MAX)},
    {CLI_MKMODEL, SEC_MK_SHAPE, "--n-layer", "N", "blocks (default 4)", NULL,
     INT(mk.cfg.n_layer, 1, INT_MAX)},
    {CLI_MKMODEL, SEC_MK_SHAPE, "--n-head", "N", "attention heads (default 8)", NULL,
     INT(mk.cfg.n_head, 1, INT_MAX)},
    {CLI_MKMODEL, SEC_MK_SHAPE, "--n-head-kv", "N",
     "key/value heads, must divide --n-head (default 4)", NULL, INT(mk.cfg.n_head_kv, 1, INT_MAX)},
    {CLI_MKMODEL, SEC_MK_SHAPE, "--n-ff", "N", "feed-forward length (default 768)", NULL,
     INT(mk.cfg.n_ff, 1, INT_MAX)},
    {CLI_MKMODEL, SEC_MK_SHAPE, "--n-expert", "N",
     "experts per block, {arch}.expert_count (default: none; 8 for qwen3moe, qwen2moe and "
     "--arch mixtral)",
     NULL, INT(mk.cfg.n_expert, 1, 1024)},
    {CLI_MKMODEL, SEC_MK_SHAPE, "--n-expert-used", "N",
     "experts per token, expert_used_count (default min(2, --n-expert))", NULL,
     INT(mk.cfg.n_expert_used, 1, 1024)},
    {CLI_MKMODEL, SEC_MK_SHAPE, "--n-ff-exp", "N",
     "an expert's feed-forward length, expert_feed_forward_length (default --n-ff / "
     "--n-expert-used; llama/mixtral: --n-ff)",
     NULL, INT(mk.cfg.n_ff_exp, 1, INT_MAX)},
    {CLI_MKMODEL, SEC_MK_SHAPE, "--n-ff-shexp", "N",
     "the shared expert's feed-forward length (qwen2moe; default --n-ff)", NULL,
     INT(mk.cfg.n_ff_shexp, 1, INT_MAX)},
    {CLI_MKMODEL, SEC_MK_SHAPE, "--n-vocab", "N",
     "vocabulary size; the generated vocabulary is padded to it (default and minimum: the "
     "generated vocabulary's size); ignored with --vocab",
     NULL, INT(mk.cfg.n_vocab, 1, INT_MAX), .seen = SEEN(mk.saw_n_vocab)},
    {CLI_MKMODEL, SEC_MK_SHAPE, "--ctx", "N", "context_length (default 2048)", NULL,
     INT(mk.cfg.n_ctx, 1, INT_MAX)},
    {CLI_MKMODEL, SEC_MK_SHAPE, "--head-dim", "N",
     "head dimension (default n_embd / n_head); writes attention.key_length/value_length when it "
     "differs",
     NULL, INT(mk.cfg.head_dim, 1, INT_MAX)},
    {CLI_MKMODEL, SEC_MK_SHAPE, "--n-rot", "N",
     "rope.dimension_count, even, <= head dim (default head dim; llama.cpp refuses other "
     "values: vela only)",
     NULL, INT(mk.cfg.n_rot, 1, INT_MAX)},
    {CLI_MKMODEL, SEC_MK_SHAPE, "--norm-eps", "F",
     "RMS norm epsilon (default 1e-5 llama, 1e-6 qwen2)", NULL, POSITIVE(mk.cfg.norm_eps)},
    {CLI_MKMODEL, SEC_MK_SHAPE, "--tied", NULL, "no output.weight: the head reuses token_embd",
     NULL, SET(mk.cfg.tied)},
    {CLI_MKMODEL, SEC_MK_SHAPE, "--untied", NULL,
     "write output.weight (default; undoes a preset's --tied)", NULL, UNSET(mk.cfg.tied)},
    {CLI_MKMODEL, SEC_MK_TYPES, "--type", "T",
     "every matrix (default f32); a llama.cpp file type such as q4_k_m means --mix T", NULL,
     FN(mk.cfg.type, 1, mk_type)},
    {CLI_MKMODEL, SEC_MK_TYPES, "--type-embd", "T", "token_embd.weight", NULL,
     FN(mk.cfg.type_embd, 1, weight_type)},
    {CLI_MKMODEL, SEC_MK_TYPES, "--type-output", "T", "output.weight (and token_embd when --tied)",
     NULL, FN(mk.cfg.type_output, 1, weight_type)},
    {CLI_MKMODEL, SEC_MK_TYPES, "--type-attn", "T", "attn_q/k/v/output", NULL,
     FN(mk.cfg.type_attn, 1, weight_type)},
    {CLI_MKMODEL, SEC_MK_TYPES, "--type-ffn", "T", "ffn_gate/up/down", NULL,
     FN(mk.cfg.type_ffn, 1, weight_type)},
    {CLI_MKMODEL, SEC_MK_TYPES, "--mix", "FTYPE|none",
     "llama-quantize's types for a llama.cpp file type: q4_k_m is q4_k, with q6_k for "
     "output.weight and for attn_v / ffn_down in about half the layers (also q2_k, q2_k_s, "
     "q3_k_s/m/l, q4_k_s, q5_k_s/m, q6_k, q4_0 ...: the head gets q6_k)",
     NULL, FN(mk.cfg.mix, 1, mk_mix)},
    {CLI_MKMODEL, SEC_MK_TYPES, NULL, NULL,
     "A row length the type's block does not divide falls back as llama.cpp's quantize does "
     "(q4_k->q5_0, q5_k->q5_1, q6_k->q8_0, else f16), with a note.",
     NULL, NOTE},
    {CLI_MKMODEL, SEC_MK_WEIGHTS, "--exact-weights", NULL,
     "N(0, s^2) floats (s = 1/sqrt(n_in) for most matrices), then quantized (ggml's reference "
     "quantizers for q8_0/q4_x/q5_x, vela's least-squares search for K-quants: ~1 us per weight, "
     "minutes for a 7B model); default up to 1e9 params",
     NULL, FN(mk.cfg.weights, 0, set_const), .lo = MKMODEL_WEIGHTS_EXACT},
    {CLI_MKMODEL, SEC_MK_WEIGHTS, "--fast-weights", NULL,
     "random but valid blocks written directly: quant bits from the generator, scales set so "
     "that the values have mean 0 and the same std s; f32/f16/bf16 from a 4096-level normal "
     "table (~1 ns per weight); default above 1e9 params",
     NULL, FN(mk.cfg.weights, 0, set_const), .lo = MKMODEL_WEIGHTS_FAST},
    {CLI_MKMODEL, SEC_MK_WEIGHTS, NULL, NULL,
     "The two give different bytes for the same seed; each is deterministic.", NULL, NOTE},
    {CLI_MKMODEL, SEC_MK_ROPE, "--rope-freq-base", "F",
     "rope.freq_base (default 10000 llama, 1000000 qwen2)", NULL, POSITIVE(mk.cfg.rope_freq_base)},
    {CLI_MKMODEL, SEC_MK_ROPE, "--rope-scaling", "none|linear|yarn",
     "rope.scaling.type (default none: no keys)", NULL,
     ENUM(mk.cfg.rope_scaling, mk_rope_types, "a scaling type (none, linear, yarn)")},
    {CLI_MKMODEL, SEC_MK_ROPE, "--rope-scale", "F",
     "rope.scaling.factor, with --rope-scaling (default 1)", NULL, POSITIVE(mk.cfg.rope_scale),
     .seen = SEEN(mk.saw_rope_scale)},
    {CLI_MKMODEL, SEC_MK_ROPE, "--yarn-orig-ctx", "N",
     "rope.scaling.original_context_length (yarn; default --ctx)", NULL,
     INT(mk.cfg.yarn_orig_ctx, 1, INT_MAX), .seen = SEEN(mk.saw_yarn_ctx)},
    {CLI_MKMODEL, SEC_MK_ROPE, "--rope-freqs", NULL,
     "add rope_freqs.weight with Llama 3.1's factors (llama)", NULL, SET(mk.cfg.rope_freqs)},
    {CLI_MKMODEL, SEC_MK_ROPE, "--rope-freqs-factor", "F",
     "their scale factor, with --rope-freqs (default 8)", NULL, POSITIVE(mk.cfg.rope_freqs_factor),
     .seen = SEEN(mk.saw_freqs_opt)},
    {CLI_MKMODEL, SEC_MK_ROPE, "--rope-freqs-orig-ctx", "N",
     "their original context (default 8192)", NULL, INT(mk.cfg.rope_freqs_orig_ctx, 1, INT_MAX),
     .seen = SEEN(mk.saw_freqs_opt)},
    {CLI_MKMODEL, SEC_MK_ROPE, "--rope-freq-base-swa", "F",
     "rope.freq_base_swa, the local layers' base (gemma3; default: not written, llama.cpp takes "
     "10000)",
     NULL, POSITIVE(mk.cfg.rope_freq_base_swa)},
    {CLI_MKMODEL, SEC_MK_SWA, "--sliding-window", "N",
     "attention.sliding_window: local layers see the last N positions (default: none, every "
     "layer global)",
     NULL, INT(mk.cfg.sliding_window, 1, INT_MAX)},
    {CLI_MKMODEL, SEC_MK_SWA, "--swa-pattern", "N",
     "attention.sliding_window_pattern: every N-th layer is global (default: not written, "
     "llama.cpp takes 6)",
     NULL, INT(mk.cfg.swa_pattern, 1, INT_MAX)},
    {CLI_MKMODEL, SEC_MK_TOKENIZER, "--vocab", "FILE",
     "copy every tokenizer.* key from FILE (e.g. a ggml-vocab-*.gguf); n_vocab becomes its size",
     NULL, STR(mk.cfg.vocab_path)},
    {CLI_MKMODEL, SEC_MK_TOKENIZER, NULL, NULL,
     "(default: a generated byte-level BPE vocabulary, gpt2 model, with merges of frequent "
     "English pieces and <|begin_of_text|> / <|end_of_text|> as BOS / EOS)",
     NULL, NOTE},

    // --- the model, its backend and context: every command that runs one ---
    {CLI_MODEL, SEC_MODEL, "-m, --model", "FILE",
     "GGUF model to load (make one with 'vela mkmodel')", "VELA_ARG_MODEL", STR(am.model_path)},
    {CLI_MODEL, SEC_MODEL, "--backend", "cpu|cuda",
     "backend (default: cuda when a GPU is usable, else cpu)", "VELA_ARG_BACKEND",
     ENUM(am.backend, backends, "a backend (cpu, cuda)")},
    {CLI_MODEL, SEC_MODEL, "--device", "N", "CUDA device ordinal (default: 0)", NULL,
     INT(am.device, 0, 1024)},
    {CLI_MODEL, SEC_MODEL, "-t, --threads", "N",
     "CPU threads (default: the physical cores it may use; more than those is taken, with a "
     "warning)",
     "VELA_ARG_THREADS", INT(am.n_threads, 0, 4096)},
    {CLI_RUN | CLI_CHAT | CLI_BENCH | CLI_MPI_WORKER, SEC_MODEL, "-c, --ctx-size", "N",
     "context size in tokens (default: 0);\n0 = the model's training context (its "
     "context_length), at most " TEXT_OF(
         FORWARD_CTX_CAP) "; more than the training context is "
                          "taken, with a warning unless RoPE scaling or self-extend extends it",
     "VELA_ARG_CTX_SIZE", INT(am.n_ctx, 0, 1L << 24)},
    {CLI_EVAL, SEC_MODEL, "-c, --ctx-size", "N",
     "context size in tokens; 0 = room for the tokens (at least 5 cells) (default: 0)",
     "VELA_ARG_CTX_SIZE", INT(am.n_ctx, 0, 1L << 24)},
    {CLI_SERVE, SEC_MODEL, "-c, --ctx-size", "N",
     "KV cells the slots share (default, or 0: each slot the model's trained context, capped by "
     "memory)",
     "VELA_ARG_CTX_SIZE", INT(am.n_ctx, 0, 1L << 24)},
    {CLI_MODEL, SEC_MODEL, "-b, --batch-size", "N",
     "tokens per forward pass when processing a prompt (default: 512)", "VELA_ARG_BATCH",
     INT(am.n_batch, 1, 1L << 20)},
    {CLI_MODEL, SEC_MODEL, "-ctk, --cache-type-k", "T",
     "KV cache type for K: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl (default: f16)",
     "VELA_ARG_CACHE_TYPE_K",
     ENUM(am.type_k, cache_types,
          "a cache type (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl)")},
    {CLI_MODEL, SEC_MODEL, "-ctv, --cache-type-v", "T",
     "KV cache type for V: as --cache-type-k (default: f16)", "VELA_ARG_CACHE_TYPE_V",
     ENUM(am.type_v, cache_types,
          "a cache type (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl)")},
    {CLI_MODEL, SEC_MODEL, "--no-attn-rot", NULL,
     "no Hadamard rotation of q, K, V and the attention output with a quantized KV cache (on by "
     "default, as llama.cpp; also VELA_ATTN_ROT_DISABLE=1, llama.cpp's LLAMA_ATTN_ROT_DISABLE)",
     NULL, SET(am.no_attn_rot)},
    {CLI_MODEL, SEC_MODEL, "-v, --verbose", NULL, "print model and context details", NULL,
     SET(am.verbose)},
    {CLI_MODEL, SEC_MODEL, "--no-progress", NULL, "no progress bar while the weights load", NULL,
     SET(am.no_progress)},
    {CLI_MODEL, SEC_MODEL, "--no-cuda-graph", NULL,
     "run decode steps op by op instead of replaying CUDA graphs (also VELA_NO_CUDA_GRAPH=1)", NULL,
     SET(am.no_cuda_graph)},
    {CLI_MODEL, SEC_MODEL, "--matvec-act", "q8|f32",
     "activations of mat-vecs with quantized weights: q8 rounds them to 8 bits for integer dot "
     "products, as llama.cpp does (default; on the CPU for every batch, with AVX2/AVX-VNNI "
     "kernels), f32 keeps them exact (the CPU's float32 reference; its default without AVX2)",
     NULL, ENUM(am.matvec_act, acts, "an activation type (q8, f32)")},
    {CLI_MODEL, SEC_SPLIT, "-dev, --devices", "LIST",
     "devices of the stages: 0,1 / cuda0,cuda1 / cpu,cpu (default: every GPU)", "VELA_ARG_DEVICE",
     FN(am.devices, 1, devices)},
    {CLI_MODEL, SEC_SPLIT, "-sm, --split-mode", "MODE",
     "layer: contiguous layers per device (default); none: one device", "VELA_ARG_SPLIT_MODE",
     ENUM(am.split_mode, split_modes, "a split mode (layer, none)")},
    {CLI_MODEL, SEC_SPLIT, "-ts, --tensor-split", "A,B",
     "proportions of layers per device (default: by free memory)", "VELA_ARG_TENSOR_SPLIT",
     FN(am.tensor_split, 1, tensor_split)},
    {CLI_MODEL, SEC_SPLIT, "-mg, --main-gpu", "N", "the device with --split-mode none (default: 0)",
     "VELA_ARG_MAIN_GPU", INT(am.device, 0, 1024)},
    {CLI_MODEL, SEC_SPLIT, "-ub, --ubatch-size", "N",
     "micro-batch tokens in flight between stages (default: batch / stages)", "VELA_ARG_UBATCH",
     INT(am.n_ubatch, 0, 1L << 20)},
    {CLI_MODEL, SEC_ROPE, "--rope-scaling", "none|linear|yarn",
     "RoPE frequency scaling (default: the model's)", "VELA_ARG_ROPE_SCALING_TYPE",
     ENUM(am.rope.scaling, rope_types, "a scaling type (none, linear, yarn)")},
    {CLI_MODEL, SEC_ROPE, "--rope-scale", "N",
     "RoPE context scaling factor: sets freq scale to 1/N", "VELA_ARG_ROPE_SCALE",
     FN(am.rope.freq_scale, 1, rope_scale)},
    {CLI_MODEL, SEC_ROPE, "--rope-freq-base", "N", "RoPE base frequency (default: the model's)",
     "VELA_ARG_ROPE_FREQ_BASE", FLOAT(am.rope.freq_base, 0, INFINITY)},
    {CLI_MODEL, SEC_ROPE, "--rope-freq-scale", "N",
     "RoPE frequency scaling factor (default: the model's)", "VELA_ARG_ROPE_FREQ_SCALE",
     FLOAT(am.rope.freq_scale, 0, INFINITY)},
    {CLI_MODEL, SEC_ROPE, "--yarn-orig-ctx", "N",
     "YaRN original context size (default: the model's)", "VELA_ARG_YARN_ORIG_CTX",
     INT(am.rope.yarn_orig_ctx, 0, INT_MAX)},
    {CLI_MODEL, SEC_ROPE, "--yarn-ext-factor", "N",
     "YaRN extrapolation mix factor (default: -1 = 1.0 for yarn, else 0)",
     "VELA_ARG_YARN_EXT_FACTOR", FLOAT_ANY(am.rope.yarn_ext_factor)},
    {CLI_MODEL, SEC_ROPE, "--yarn-attn-factor", "N", "YaRN magnitude scale (default: 1.0)",
     "VELA_ARG_YARN_ATTN_FACTOR", FLOAT_ANY(am.rope.yarn_attn_factor)},
    {CLI_MODEL, SEC_ROPE, "--yarn-beta-fast", "N", "YaRN low correction dim (default: 32.0)",
     "VELA_ARG_YARN_BETA_FAST", FLOAT_ANY(am.rope.yarn_beta_fast)},
    {CLI_MODEL, SEC_ROPE, "--yarn-beta-slow", "N", "YaRN high correction dim (default: 1.0)",
     "VELA_ARG_YARN_BETA_SLOW", FLOAT_ANY(am.rope.yarn_beta_slow)},
    {CLI_MODEL, SEC_ROPE, "-se, --self-extend", "G W",
     "exact self-extend: keys within W positions of a query keep their positions, farther ones "
     "are grouped by G (in one softmax). Extends the usable context to (n_ctx_train - W) * G + W "
     "and sizes the cache for it (unless -c; serve: each slot's, -c is split between slots); K "
     "is cached unrotated. -v prints it",
     NULL, FN(am.se_g, 2, self_extend)},
    {CLI_MODEL, SEC_ROPE, "--kv-unrotated", NULL,
     "cache K without RoPE; attention rotates it (a context shift then rewrites no K; serve: "
     "requests may choose their own self_extend, on with --self-extend)",
     NULL, SET(am.k_unrotated)},

    // --- speculative decoding (llama.cpp's spellings and defaults) ---
    {CLI_RUN | CLI_SERVE | CLI_BENCH, SEC_SPEC, "-md, --model-draft", "FILE",
     "a draft model with the model's vocabulary: it proposes tokens the model verifies in one "
     "batch (implies --spec-type draft)",
     "VELA_ARG_MODEL_DRAFT", STR(draft.model)},
    {CLI_RUN | CLI_SERVE | CLI_BENCH, SEC_SPEC, "-ngld, --gpu-layers-draft, --n-gpu-layers-draft",
     "N",
     "the draft model's -ngl: 0 runs it on the CPU backend; any other count where the model runs",
     NULL, INT(draft.ngl, -1, 1 << 20)},
    {CLI_RUN | CLI_SERVE | CLI_BENCH, SEC_SPEC, "--spec-type", "none|ngram|draft",
     "where drafts come from: ngram = prompt lookup (what followed the last 3 or 2 tokens' "
     "latest earlier occurrence in the prompt and output), draft = -md (default: draft with -md, "
     "else none; serve: the default of requests that name none)",
     NULL, ENUM(gp.spec.type, spec_types, "a speculative type (none, ngram, draft)"),
     .seen = SEEN(draft.type_given)},
    {CLI_RUN | CLI_SERVE, SEC_SPEC, "--draft-max, --draft, --draft-n", "N",
     "draft tokens per step, 1.." TEXT_OF(ENGINE_SPEC_MAX) " and below -b (default: 16)", NULL,
     INT(gp.spec.n_max, 1, ENGINE_SPEC_MAX)},
    {CLI_BENCH, SEC_SPEC, "--draft-max, --draft-n", "N",
     "draft tokens per step, 1.." TEXT_OF(ENGINE_SPEC_MAX) " and below -b (default: 16)", NULL,
     INT(gp.spec.n_max, 1, ENGINE_SPEC_MAX)},
    {CLI_RUN | CLI_SERVE | CLI_BENCH, SEC_SPEC, "--draft-min, --draft-n-min", "N",
     "fewer drafts than N are not verified (default: 0)", NULL,
     INT(gp.spec.n_min, 0, ENGINE_SPEC_MAX)},
    {CLI_RUN | CLI_SERVE | CLI_BENCH, SEC_SPEC, "--draft-p-min", "P",
     "the draft model stops proposing when its top token's probability is below P (default: "
     "0.75)",
     NULL, FLOAT(gp.spec.p_min, 0, 1)},

    // --- sampling (llama.cpp's defaults) ---
    {CLI_SAMPLE, SEC_SAMPLING, "--temp", "N", "temperature; <= 0 is greedy (default: 0.8)", NULL,
     FLOAT_ANY(gp.sp.temp)},
    {CLI_SAMPLE, SEC_SAMPLING, "--top-k", "N", "top-k sampling; <= 0 is off (default: 40)", NULL,
     INT(gp.sp.top_k, INT_MIN, INT_MAX)},
    {CLI_SAMPLE, SEC_SAMPLING, "--top-p", "N", "top-p sampling; 1.0 is off (default: 0.95)", NULL,
     FLOAT_ANY(gp.sp.top_p)},
    {CLI_SAMPLE, SEC_SAMPLING, "--min-p", "N", "min-p sampling; 0.0 is off (default: 0.05)", NULL,
     FLOAT_ANY(gp.sp.min_p)},
    {CLI_SAMPLE, SEC_SAMPLING, "--repeat-penalty", "N",
     "penalize repeated tokens; 1.0 is off (default: 1.0)", NULL, FLOAT_ANY(gp.sp.repeat_penalty)},
    {CLI_SAMPLE, SEC_SAMPLING, "--repeat-last-n", "N",
     "tokens the penalties look back on; 0 off, -1 the context (default: 64)", NULL,
     INT(gp.sp.repeat_last_n, -1, INT_MAX)},
    {CLI_SAMPLE, SEC_SAMPLING, "--presence-penalty", "N",
     "presence penalty; 0.0 is off (default: 0.0)", NULL, FLOAT_ANY(gp.sp.presence_penalty)},
    {CLI_SAMPLE, SEC_SAMPLING, "--frequency-penalty", "N",
     "frequency penalty; 0.0 is off (default: 0.0)", NULL, FLOAT_ANY(gp.sp.frequency_penalty)},
    {CLI_RUN | CLI_CHAT, SEC_SAMPLING, "-l, --logit-bias", "TOKEN_ID(+/-)BIAS",
     "add BIAS to the logit of TOKEN_ID before sampling (15043+1, 15043-1; 15043-inf: never); "
     "repeatable (serve: the request's logit_bias)",
     NULL, FN(logit_bias, 1, logit_bias)},
    {CLI_SAMPLE, SEC_SAMPLING, "-s, --seed", "N", "RNG seed; -1 is random (default: -1)", NULL,
     FN(gp.sp.seed, 1, seed)},
    {CLI_SAMPLE, SEC_SAMPLING, "--grammar", "GRAMMAR",
     "constrain the output to a GBNF grammar (llama.cpp's syntax; start rule root) (serve: the "
     "grammar of requests that give none)",
     NULL, FN(grammar, 1, grammar_flag)},
    {CLI_SAMPLE, SEC_SAMPLING, "--grammar-file", "FILE", "--grammar, read from FILE", NULL,
     FN(grammar, 1, grammar_flag)},
    {CLI_SAMPLE, SEC_SAMPLING, "-j, --json-schema", "SCHEMA",
     "constrain the output to JSON matching SCHEMA (a JSON schema; {} is any JSON object)", NULL,
     FN(grammar, 1, grammar_flag)},
    {CLI_SAMPLE, SEC_SAMPLING, "-jf, --json-schema-file", "FILE", "--json-schema, read from FILE",
     NULL, FN(grammar, 1, grammar_flag)},

    {CLI_ALL, SEC_HELP, "-h, --help", NULL, "this help", NULL, .kind = FLAG_HELP},
};

const struct flag_table cli_flags = {rows, sizeof rows / sizeof rows[0], sections, SEC_COUNT};
