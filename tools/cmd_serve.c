// vela serve: the OpenAI-compatible HTTP server (tools/serve/serve.h).
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "gguf/gguf.h"
#include "host/engine/engine.h"
#include "host/model/model.h"
#include "host/ops/backend.h"
#include "host/ops/selfextend.h"
#include "host/tokenizer/chat.h"
#include "tools/args.h"
#include "tools/cmds.h"
#include "tools/common.h"
#include "tools/default_model.h"
#include "tools/progress.h"
#include "tools/serve/chat_kwargs.h"
#include "tools/serve/log.h"
#include "tools/serve/serve.h"

#ifdef VELA_HAVE_MHD

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: vela serve [-m MODEL] [--host 127.0.0.1] [--port 8080] [--parallel N] "
        "[options]\n\n"
        "Serves the model over HTTP with the OpenAI API: POST /v1/completions,\n"
        "/v1/chat/completions (stream: server-sent events), GET /v1/models, /health,\n"
        "/metrics (Prometheus), POST /tokenize, /detokenize and llama-server's POST\n"
        "/completion (its own shape: prompt, n_predict, stream; content in the reply),\n"
        "GET /props, /slots, POST /apply-template. Requests are decoded together\n"
        "(continuous batching): a new one joins the running batch at the next step.\n"
        "Ctrl-C or SIGTERM stops it: each running stream gets a last chunk with\n"
        "finish_reason \"error\" and the error, then [DONE]; other running requests get\n"
        "503; it exits 0 within the decode step it is in plus 5 s for those answers.\n"
        "Without -m: the default model, SmolLM2-135M-Instruct, from the cache\n"
        "($VELA_CACHE or ~/.cache/vela; bash tools/model_cache.sh fetches it).\n\n"
        "Request fields beyond OpenAI's (vela and llama-server): top_k, min_p,\n"
        "ignore_eos, n_keep (a context shift when the slot's context is full; without\n"
        "it the request ends with finish_reason \"length\"), cache_prompt (default\n"
        "true: reuse the cells a slot kept from earlier requests, decode only the rest),\n"
        "grp_attn_n / grp_attn_w (llama.cpp's self-extend for this request, without\n"
        "--self-extend), self_extend {\"n\": G, \"w\": W} (exact self-extend for this\n"
        "request, with --self-extend or --kv-unrotated; n 1: off), n_predict\n"
        "(max_tokens; -1: until a stop), repeat_penalty, repeat_last_n. Sampling\n"
        "fields a request leaves out take the server's (the sampling flags below:\n"
        "llama-server's defaults, temperature 0.8, top_k 40, top_p 0.95, min_p 0.05).\n"
        "Also honoured: logit_bias, grammar (GBNF), json_schema, response_format (json_object,\n"
        "json_schema), tools with tool_choice (auto, none, required, a named\n"
        "function; the chatml and llama3 templates). Fields vela cannot honour yet get\n"
        "a 400 naming them, never silently ignored: typical_p other than 1, mirostat\n"
        "other than 0, schema keywords a grammar cannot express (multipleOf, pattern,\n"
        "...). A request may name any model (see --strict-model-name).\n\n");
    flags_help(out, &cli_flags, CLI_SERVE);
}

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

// The model's chat template (or the --chat-template override). A bad
// override is an error; a file whose template vela cannot format serves
// completions only, and says so.
static int pick_template(const char *path, const char *override, struct serve_config *sc,
                         struct verr *err) {
    struct gguf_file *f = NULL;
    int rc = gguf_open(&f, path, err);
    if (rc)
        return rc;
    const char *source = NULL;
    struct verr terr = {0};
    rc = chat_template_from_gguf(f, override, &sc->tmpl, &source, &terr);
    gguf_close(f);
    if (rc && override) {
        *err = terr;
        return rc;
    }
    sc->have_tmpl = rc == 0;
    if (rc)
        srv_log(SRV_LOG_WARN, "%s; /v1/chat/completions is off", terr.msg);
    else
        srv_log(SRV_LOG_INFO, "chat template %s (%s)", chat_template_name(sc->tmpl), source);
    return 0;
}

// Free memory of the device the KV cache will live on: the GPU when the
// backend may be CUDA and one answers, else the CPU; *name says which.
// BACKEND_MEM_UNLIMITED when it cannot say.
static size_t ctx_free_memory(const struct args_model *am, char *name, size_t cap) {
    size_t free_b = BACKEND_MEM_UNLIMITED, total = 0;
    struct verr err = {0};
    struct backend_device d = {BACKEND_DEVICE_CUDA, am->device};
    if (am->backend == LOAD_BACKEND_CPU || !backend_cuda_built() ||
        backend_device_memory(&d, &free_b, &total, &err))
        d = (struct backend_device){BACKEND_DEVICE_CPU, 0};
    if (d.kind == BACKEND_DEVICE_CPU && backend_device_memory(&d, &free_b, &total, &err))
        free_b = BACKEND_MEM_UNLIMITED;
    backend_device_name(&d, name, cap);
    return free_b;
}

// -c when not given (llama-server's -c 0): every slot gets the model's
// trained context, as long as the KV cache takes at most half of the
// device's free memory once the weights (the file's size) are counted;
// a multiple of 256 cells a slot when memory caps it. Logs what it chose.
static int pick_ctx(struct args_model *am, int n_parallel, struct verr *err) {
    if (am->n_ctx > 0)
        return 0;
    struct gguf_file *f = NULL;
    struct model_hparams hp;
    int rc = gguf_open(&f, am->model_path, err);
    if (rc)
        return rc;
    rc = model_read_hparams(f, &hp, err);
    gguf_close(f);
    if (rc)
        return rc;
    // Bytes of one cell follow the cache types (a q8_0 cell is 34/64 of an
    // f16 one: about twice the cells in the same memory). A type whose block
    // does not divide the head dims gives 0 here; the context refuses it.
    const size_t per_cell =
        (size_t)hp.n_layer * (ggml_row_bytes(am->type_k, (int64_t)hp.n_head_kv * hp.head_dim) +
                              ggml_row_bytes(am->type_v, (int64_t)hp.n_head_kv * hp.head_dim_v));
    struct stat st;
    const size_t weights = stat(am->model_path, &st) ? 0 : (size_t)st.st_size;
    char dev[32];
    const size_t free_b = ctx_free_memory(am, dev, sizeof dev);
    int64_t slot = hp.n_ctx_train > 0 ? hp.n_ctx_train : FORWARD_CTX_CAP;
    bool capped = false;
    if (free_b != BACKEND_MEM_UNLIMITED && per_cell > 0) {
        const size_t budget = free_b > weights ? (free_b - weights) / 2 : 0;
        const int64_t fit = (int64_t)(budget / per_cell) / n_parallel / 256 * 256;
        if (fit < slot) {
            slot = fit > 256 ? fit : 256;
            capped = true;
        }
    }
    if (slot * n_parallel > (1 << 30) / 2)
        slot = (1 << 30) / 2 / n_parallel;
    am->n_ctx = (int)(slot * n_parallel);
    srv_log(SRV_LOG_INFO,
            "context: -c %d, %d slots of %lld tokens (%s; KV cache %s/%s, %zu bytes a cell, "
            "%.0f MiB, %.0f MiB free on %s); -c N sets it",
            am->n_ctx, n_parallel, (long long)slot,
            capped ? "the model's trained context capped by memory"
                   : "each the model's trained context",
            ggml_type_name(am->type_k), ggml_type_name(am->type_v), per_cell,
            (double)per_cell * am->n_ctx / 1048576.0,
            free_b == BACKEND_MEM_UNLIMITED ? -1.0 : (double)free_b / 1048576.0, dev);
    return 0;
}

// The model id by default: the file's base name without ".gguf" (llama-server's habit).
static void model_id_of(const char *path, char *out, size_t cap) {
    const char *s = strrchr(path, '/');
    snprintf(out, cap, "%s", s ? s + 1 : path);
    size_t n = strlen(out);
    if (n > 5 && !strcmp(out + n - 5, ".gguf"))
        out[n - 5] = '\0';
}

// The server's sampling defaults from the sampler flags and -n; a request
// overrides each.
static int serve_defaults(const struct cli *f, struct api_defaults *d, struct verr *err) {
    const struct sampler_params *p = &f->gp.sp;
    if (!(p->repeat_penalty > 0))
        return verr_set(err, VERR_RANGE, "--repeat-penalty: %g must be above 0",
                        (double)p->repeat_penalty);
    *d = (struct api_defaults){.temperature = p->temp,
                               .top_p = p->top_p,
                               .min_p = p->min_p,
                               .top_k = p->top_k,
                               .repeat_penalty = p->repeat_penalty,
                               .repeat_last_n = p->repeat_last_n,
                               .presence_penalty = p->presence_penalty,
                               .frequency_penalty = p->frequency_penalty,
                               .seed = p->seed == SAMPLER_SEED_RANDOM ? -1 : (int64_t)p->seed,
                               .n_predict = f->gp.n_predict,
                               .spec = f->gp.spec,
                               .reasoning = (enum chat_reasoning)f->reasoning,
                               .kwargs = &f->chat_kwargs};
    return 0;
}

static int run_server(struct args_model *am, struct cli *f) {
    struct verr err = {0};
    char id[256];
    f->sc.model_path = am->model_path;
    f->sc.grammar = f->grammar;
    if (!f->sc.model_id) {
        model_id_of(am->model_path, id, sizeof id);
        f->sc.model_id = id;
    }
    if (pick_template(am->model_path, f->chat_template, &f->sc, &err) ||
        (f->sc.have_tmpl && chat_kwargs_check(&f->chat_kwargs, f->sc.tmpl, &err)) ||
        pick_ctx(am, f->sc.n_parallel, &err)) {
        srv_log(SRV_LOG_ERROR, "%s", err.msg);
        return 1; // the model file (or its template) failed: a runtime error, as in run
    }
    struct serve *s = NULL;
    int port = 0;
    if (serve_start(&s, &f->sc, &port, &err)) {
        srv_log(SRV_LOG_ERROR, "%s", err.msg);
        return 1;
    }
    srv_log(SRV_LOG_INFO, "listening on http://%s:%d (loading %s)", f->sc.host, port,
            am->model_path);
    struct engine_config ec;
    args_engine_config(am, &ec);
    ec.ctx.n_seq_max = f->sc.n_parallel;
    ec.ctx.n_outputs_max = tools_spec_outputs(f, f->sc.n_parallel, ec.ctx.n_batch);
    struct load_progress lprog;
    load_progress_init(&lprog, "vela serve", am->no_progress);
    ec.progress = load_progress_update;
    ec.progress_user = &lprog;
    struct engine *e = NULL;
    int status = 1;
    if (engine_open(&e, &ec, &err)) {
        srv_log(SRV_LOG_ERROR, "%s", err.msg);
        goto out;
    }
    if (tools_draft_open("serve", f, e, f->sc.n_parallel))
        goto out;
    if (serve_set_engine(s, e, &err)) {
        srv_log(SRV_LOG_ERROR, "%s", err.msg);
        goto out;
    }
    tools_warn_ctx("serve", am, context_config(e->ctx)->n_ctx / f->sc.n_parallel,
                   e->m->hp.n_ctx_train, false);
    const struct forward_config *cc = context_config(e->ctx);
    srv_log(SRV_LOG_INFO,
            "ready: model '%s', %d slots of %d tokens, backend %s, KV cache %s/%s: %.0f MiB "
            "(%.0f bytes a cell)",
            f->sc.model_id, f->sc.n_parallel, cc->n_ctx / f->sc.n_parallel,
            context_backend_name(e->ctx), ggml_type_name(cc->type_k), ggml_type_name(cc->type_v),
            context_kv_bytes(e->ctx) / 1048576.0, context_kv_bytes(e->ctx) / cc->n_ctx);
    const struct api_defaults *d = &f->sc.defaults;
    srv_log(SRV_LOG_INFO,
            "sampling defaults (a request overrides each): temperature %g, top_k %d, top_p %g, "
            "min_p %g, repeat_penalty %g, n_predict %d",
            (double)d->temperature, d->top_k, (double)d->top_p, (double)d->min_p,
            (double)d->repeat_penalty, d->n_predict);
    if (d->spec.type != ENGINE_SPEC_NONE)
        srv_log(SRV_LOG_INFO,
                "speculative decoding by default (a request's \"speculative\" overrides it): "
                "%s, draft max %d, min %d, p_min %g",
                engine_spec_type_name(d->spec.type), d->spec.n_max, d->spec.n_min,
                (double)d->spec.p_min);
    if (context_config(e->ctx)->se_g > 1) {
        const int slot = context_config(e->ctx)->n_ctx / f->sc.n_parallel;
        const int64_t ext = se_extended_ctx(e->m->hp.n_ctx_train, context_config(e->ctx)->se_g,
                                            context_config(e->ctx)->se_w);
        srv_log(SRV_LOG_INFO,
                "exact self-extend G %d, W %d: a request may use %lld tokens "
                "(the trained context %d extends to %lld; a slot holds %d)",
                context_config(e->ctx)->se_g, context_config(e->ctx)->se_w,
                (long long)(ext < slot ? ext : slot), e->m->hp.n_ctx_train, (long long)ext, slot);
    }
    fflush(stderr);
    while (!g_stop) {
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
    srv_log(SRV_LOG_INFO, "stopping: running requests end, their answers drain (at most %d ms)",
            SERVE_DRAIN_MS);
    status = 0;
out:
    serve_stop(s);
    engine_close(e);
    return status;
}

int cmd_serve(int argc, char **argv) {
    static struct cli f; // large: off the stack
    cli_defaults(&f);
    int st = tools_parse("serve", CLI_SERVE, usage, &f, argc, argv, 0);
    if (st >= 0 || (st = tools_spec_resolve("serve", &f)) >= 0)
        return st;
    struct args_model am = f.am;
    struct verr err = {0};
    if (serve_defaults(&f, &f.sc.defaults, &err)) {
        fprintf(stderr, "vela serve: %s\n", err.msg);
        return 2;
    }
    if (!am.model_path && (st = tools_use_default_model("serve", &am.model_path)))
        return st;
    f.log.verbose = f.sc.verbose = am.verbose;
    if (srv_log_open(&f.log, &err)) {
        fprintf(stderr, "vela serve: %s\n", err.msg);
        return 1;
    }
    if (f.log.format == SRV_LOG_JSON && !f.log.path)
        am.no_progress = true; // the progress bar would break stderr's JSON lines
    if (tools_model_is_synthetic(am.model_path))
        srv_log(SRV_LOG_INFO, "note: %s " TOOLS_SYNTHETIC_NOTE, am.model_path);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN); // a client that leaves mid-stream must not kill the server
    int status = run_server(&am, &f);
    srv_log_close();
    return status;
}

#else // built without libmicrohttpd

int cmd_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "vela serve: vela was built without libmicrohttpd (install "
                    "libmicrohttpd-dev, e.g. with tools/setup.sh, and rebuild)\n");
    return 1;
}

#endif
