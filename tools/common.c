#include "tools/common.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "host/backend/threadpool.h"
#include "host/engine/constrain.h"
#include "host/engine/core.h"
#include "host/engine/draft.h"
#include "host/engine/engine.h"

// -t above the physical cores this process may run on is taken (the
// backend runs that many threads) but they take turns on the cores, which
// slows every step down: a warning, not an error.
static void warn_threads(const char *cmd, int n_threads) {
    const int cores = threadpool_default_threads();
    if (n_threads > cores)
        fprintf(stderr,
                "vela %s: warning: -t %d is more than the %d physical core%s this process may "
                "run on; the extra threads wait for a core and slow each step (default: %d)\n",
                cmd, n_threads, cores, cores == 1 ? "" : "s", cores);
}

int tools_parse(const char *name, unsigned cmd, void (*usage)(FILE *), struct cli *c, int argc,
                char **argv, int max_pos) {
    struct verr err = {0};
    int rc = flags_parse(&cli_flags, cmd, c, argc, argv, 1, c->pos, max_pos, &c->n_pos, &err);
    if (rc == FLAGS_HELP) {
        usage(stdout);
        return TOOLS_EXIT_OK;
    }
    if (rc == FLAGS_UNKNOWN) {
        fprintf(stderr, "vela %s: %s (see 'vela %s --help')\n", name, err.msg, name);
        return TOOLS_EXIT_USAGE;
    }
    if (rc) {
        fprintf(stderr, "vela %s: %s\n", name, err.msg);
        return TOOLS_EXIT_USAGE;
    }
    if (cmd & CLI_MODEL)
        warn_threads(name, c->am.n_threads);
    return -1;
}

char *tools_read_file(const char *path, size_t *len_out) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (len + 1 >= cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
    }
    fclose(f);
    if (!buf)
        return NULL;
    buf[len] = '\0';
    *len_out = len;
    return buf;
}

uint32_t tools_seed_resolve(uint32_t seed) {
    if (seed != SAMPLER_SEED_RANDOM)
        return seed;
    uint32_t s = 0;
    if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s = (uint32_t)(ts.tv_nsec ^ ts.tv_sec);
    }
    return s == SAMPLER_SEED_RANDOM ? 1u : s;
}

int tools_warn_ctx(const char *cmd, const struct args_model *am, int n_ctx_seq, int n_ctx_train,
                   bool extended) {
    const struct rope_overrides *r = &am->rope;
    const bool scaled =
        (r->scaling != ROPE_SCALING_UNSPECIFIED && r->scaling != ROPE_SCALING_NONE) ||
        (r->freq_scale > 0 && r->freq_scale != 1.0f) || am->se_g > 1;
    if (n_ctx_train <= 0 || n_ctx_seq <= n_ctx_train || scaled || extended)
        return 0;
    fprintf(stderr,
            "vela %s: warning: a context of %d tokens is more than the model's trained context "
            "(%d tokens): past it the model meets positions it never saw and its text degrades; "
            "--rope-scaling yarn --rope-scale %.2f or --self-extend G W extend it, a smaller -c "
            "avoids it\n",
            cmd, n_ctx_seq, n_ctx_train, (double)n_ctx_seq / n_ctx_train);
    return 1;
}

int tools_grammar_attach(const char *cmd, const struct cli *c, const struct engine *e,
                         struct sampler_params *sp, struct grammar_vocab **vocab) {
    *vocab = NULL;
    if (!c->grammar)
        return TOOLS_EXIT_OK;
    struct verr err = {0};
    if (!e->tok) {
        fprintf(stderr, "vela %s: --grammar needs the model's tokenizer, and this model has none\n",
                cmd);
        return TOOLS_EXIT_USAGE;
    }
    if (constrain_vocab_new(vocab, e->tok, &err)) {
        fprintf(stderr, "vela %s: %s\n", cmd, err.msg);
        return TOOLS_EXIT_RUNTIME;
    }
    if (constrain_parse(&sp->grammar, e->tok, c->grammar, strlen(c->grammar), NULL, &err)) {
        fprintf(stderr, "vela %s: the grammar: %s\n", cmd, err.msg);
        grammar_vocab_free(*vocab);
        *vocab = NULL;
        return TOOLS_EXIT_USAGE;
    }
    sp->grammar_vocab = *vocab;
    return TOOLS_EXIT_OK;
}

int tools_spec_resolve(const char *cmd, struct cli *c) {
    struct engine_spec *sp = &c->gp.spec;
    if (c->draft.model && !c->draft.type_given)
        sp->type = ENGINE_SPEC_DRAFT;
    if (sp->type == ENGINE_SPEC_DRAFT && !c->draft.model) {
        fprintf(stderr, "vela %s: --spec-type draft needs a draft model (-md FILE)\n", cmd);
        return TOOLS_EXIT_USAGE;
    }
    if (c->draft.model && sp->type != ENGINE_SPEC_DRAFT) {
        fprintf(stderr, "vela %s: -md %s with --spec-type %s: the draft model would go unused\n",
                cmd, c->draft.model, engine_spec_type_name(sp->type));
        return TOOLS_EXIT_USAGE;
    }
    if (sp->n_min > sp->n_max) {
        fprintf(stderr, "vela %s: --draft-min %d is above --draft-max %d\n", cmd, sp->n_min,
                sp->n_max);
        return TOOLS_EXIT_USAGE;
    }
    return -1;
}

int tools_spec_outputs(const struct cli *c, int n_seq, int n_batch) {
    if (c->gp.spec.type == ENGINE_SPEC_NONE)
        return n_seq;
    const long n = (long)n_seq * (c->gp.spec.n_max + 1);
    return n < n_batch ? (int)n : n_batch > n_seq ? n_batch : n_seq;
}

int tools_draft_open(const char *cmd, const struct cli *c, struct engine *e, int n_seq) {
    if (!c->draft.model)
        return 0;
    struct args_model am = c->am;
    am.model_path = c->draft.model;
    if (c->draft.ngl == 0)
        am.backend = LOAD_BACKEND_CPU;
    struct engine_config op;
    args_engine_config(&am, &op);
    const struct forward_config *tc = context_config(e->ctx);
    const int per_seq = tc->n_ctx / n_seq > 2 * (ENGINE_SPEC_MAX + 1) ? tc->n_ctx / n_seq
                                                                      : 2 * (ENGINE_SPEC_MAX + 1);
    op.ctx.n_ctx = per_seq * n_seq;
    op.ctx.n_batch = tc->n_batch;
    op.ctx.n_seq_max = n_seq;
    op.ctx.n_outputs_max = n_seq;
    op.need_tokenizer = true;
    struct engine *d = NULL;
    struct verr err = {0};
    if (engine_open(&d, &op, &err)) {
        fprintf(stderr, "vela %s: draft model: %s\n", cmd, err.msg);
        return TOOLS_EXIT_RUNTIME;
    }
    if (engine_draft_attach(e, d, &err)) {
        fprintf(stderr, "vela %s: -md %s: %s\n", cmd, c->draft.model, err.msg);
        engine_close(d);
        return TOOLS_EXIT_RUNTIME;
    }
    if (c->am.verbose)
        fprintf(stderr, "vela %s: draft model %s (%s backend, -ngld %d), %d cells per slot\n", cmd,
                c->draft.model, am.backend == LOAD_BACKEND_CPU ? "CPU" : "the model's",
                c->draft.ngl, per_seq);
    return 0;
}
