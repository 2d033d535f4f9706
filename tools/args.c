// The flags' defaults and the library's configs made from them (args.h);
// the flag table is tools/args_table.c.
#include "tools/args.h"
#include "host/split/context.h"
#include "host/split/mpi.h"

#include <stdlib.h>
#include <string.h>

void args_model_default(struct args_model *a) {
    memset(a, 0, sizeof *a);
    a->backend = LOAD_BACKEND_AUTO;
    a->n_batch = 512;
    a->type_k = GGML_TYPE_F16;
    a->type_v = GGML_TYPE_F16;
    rope_overrides_default(&a->rope);
}

void cli_defaults(struct cli *c) {
    memset(c, 0, sizeof *c);
    args_model_default(&c->am);
    engine_gen_params_default(&c->gp);
    c->run.display_prompt = true;
    c->run.escape = true;
    c->bench.n_prompt = 512;
    c->bench.n_gen = 128;
    c->bench.reps = 5;
    c->bench.par[0] = 1;
    c->bench.n_par = 1;
    c->bench.n_depth = 1;
    serve_config_default(&c->sc);
    c->log = (struct srv_log_config){.format = SRV_LOG_TEXT, .access = true};
    c->tok.parse_special = true;
    c->tok.escapes = true;
    c->quant.o.type_embd = -1;
    c->quant.o.type_output = -1;
    mkmodel_config_default(&c->mk.cfg);
    c->dump.tensors = true;
    c->draft.ngl = -1;
}

int args_selfextend_check(const struct args_model *a, const struct model_hparams *hp, int n_ctx,
                          int n_prompt, FILE *out, struct verr *err) {
    if (a->se_g < 1)
        return 0;
    int ext = 0;
    int rc = forward_selfextend_ctx(hp, a->se_g, a->se_w, &ext, err);
    if (rc)
        return rc;
    if (a->verbose && out)
        fprintf(out,
                "self-extend: G %d, W %d (exact, RoPE inside attention, K cached unrotated): "
                "usable context (n_ctx_train %d - W) * G + W = %d tokens, cache %d cells\n",
                a->se_g, a->se_w, hp->n_ctx_train, ext, n_ctx);
    if (n_prompt > ext)
        return verr_set(err, VERR_RANGE,
                        "self-extend: the prompt has %d tokens, more than the extended context "
                        "(%d - W %d) * G %d + W = %d",
                        n_prompt, hp->n_ctx_train, a->se_w, a->se_g, ext);
    return 0;
}

void args_load_config(const struct args_model *a, struct load_config *lc) {
    load_config_default(lc);
    lc->model_path = a->model_path;
    lc->backend = a->backend;
    lc->main_device = a->device;
    lc->be.n_threads = a->n_threads;
    lc->be.act = (enum backend_act)a->matvec_act;
    lc->split_mode = (enum load_split_mode)a->split_mode;
    lc->devices = a->devices;
    lc->tensor_split = a->tensor_split;
    lc->n_ubatch = a->n_ubatch;
}

void args_ctx_config(const struct args_model *a, struct forward_config *fc) {
    forward_config_default(fc);
    fc->n_ctx = a->n_ctx;
    fc->n_batch = a->n_batch;
    fc->type_k = a->type_k;
    fc->type_v = a->type_v;
    fc->rope = a->rope;
    fc->no_graph = a->no_cuda_graph;
    fc->no_attn_rot = a->no_attn_rot;
    fc->k_unrotated = a->k_unrotated;
    fc->se_g = a->se_g;
    fc->se_w = a->se_w;
}

void args_engine_config(const struct args_model *a, struct engine_config *c) {
    engine_config_default(c);
    args_load_config(a, &c->load);
    const int n_seq = c->ctx.n_seq_max;
    args_ctx_config(a, &c->ctx);
    c->ctx.n_seq_max = n_seq;
}

bool args_mpi_worker(int argc, char **argv, int *status) {
    *status = 0;
    if (!pipeline_mpi_is_worker())
        return false;
    static struct cli c; // large: off the stack
    cli_defaults(&c);
    struct verr err = {0};
    // argv[0] is vela, argv[1] the command; flags that are not the model's
    // (prompt, sampling, output files) belong to rank 0 and are skipped.
    int rc = flags_parse_env(&cli_flags, CLI_MPI_WORKER, &c, &err);
    for (int i = 2; rc >= 0 && i < argc;) {
        rc = flags_parse_one(&cli_flags, CLI_MPI_WORKER, &c, argc, argv, &i, &err);
        if (rc == 0 || rc == 2)
            i++;
    }
    if (rc < 0) {
        fprintf(stderr, "vela (rank %s): %s\n", getenv("OMPI_COMM_WORLD_RANK"), err.msg);
        *status = 2;
        return true;
    }
    const struct args_model a = c.am;
    if (!a.model_path) {
        fprintf(stderr, "vela: MPI worker: no model (-m)\n");
        *status = 2;
        return true;
    }
    struct load_config lc;
    struct forward_config fc;
    args_load_config(&a, &lc);
    args_ctx_config(&a, &fc);
    if (context_serve_rank(&lc, &fc, &err)) {
        fprintf(stderr, "vela (rank %s): %s\n", getenv("OMPI_COMM_WORLD_RANK"), err.msg);
        *status = 1;
    }
    return true;
}
