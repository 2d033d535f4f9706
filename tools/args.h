// The command line of every vela command: struct cli holds what the flags
// set, and the flag table (tools/args.c, read with tools/flags.h) lists every
// flag once: its spellings (llama.cpp's), value, help, environment variable
// and the commands that take it. --help is written from the same table.
#ifndef VELA_HOST_ARGS_H
#define VELA_HOST_ARGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "gguf/types.h"
#include "gguf/verr.h"
#include "host/backend/sampler.h"
#include "host/engine/engine.h"
#include "host/forward/forward.h"
#include "host/model/model.h"
#include "host/ops/backend.h"
#include "host/split/pipeline.h"
#include "tools/flags.h"
#include "tools/mkmodel/mkmodel.h"
#include "tools/quantize.h"
#include "tools/serve/chat_kwargs.h"
#include "tools/serve/log.h"
#include "tools/serve/serve.h"

struct args_model {
    const char *model_path;     // -m, --model
    enum load_backend backend;  // --backend cpu|cuda
    int device;                 // --device N (CUDA ordinal, 0)
    int n_threads;              // -t, --threads (0: all cores)
    int n_ctx;                  // -c, --ctx-size (0: the model's, capped at FORWARD_CTX_CAP)
    int n_batch;                // -b, --batch-size (512)
    enum ggml_type type_k;      // --cache-type-k f32|f16|bf16|q8_0|q4_0|... (f16)
    enum ggml_type type_v;      // --cache-type-v, as type_k (f16)
    struct rope_overrides rope; // --rope-* / --yarn-*
    bool verbose;               // --verbose, -v
    bool no_progress;           // --no-progress: no load progress on stderr
    bool no_cuda_graph;         // --no-cuda-graph (forward_config.no_graph)
    bool no_attn_rot;           // --no-attn-rot (forward_config.no_attn_rot)
    bool k_unrotated;           // --kv-unrotated (forward_config.k_unrotated)
    int matvec_act;             // --matvec-act q8|f32: backend.act_q8 (BACKEND_ACT_*)
    // Several devices (host/split/pipeline.h), llama.cpp's flags. --main-gpu / -mg sets `device`.
    int split_mode;           // --split-mode layer|none (LOAD_SPLIT_*; layer by default)
    const char *tensor_split; // --tensor-split, -ts "3,1"; NULL: by free memory
    const char *devices;      // --devices, -dev "0,1" / "cpu,cpu"; NULL: every GPU
    int n_ubatch;             // --ubatch-size, -ub: pipeline micro-batch (0: auto)
    // --self-extend G W, -se: exact self-extend (host/ops/selfextend.h); 0: off
    int se_g, se_w;
};

void args_model_default(struct args_model *a);

// The commands (struct flag.cmds bits).
enum cli_cmd {
    CLI_RUN = 1u << 0,
    CLI_CHAT = 1u << 1,
    CLI_EVAL = 1u << 2,
    CLI_SERVE = 1u << 3,
    CLI_BENCH = 1u << 4,
    CLI_QUANTIZE = 1u << 5,
    CLI_MKMODEL = 1u << 6,
    CLI_TOKENIZE = 1u << 7,
    CLI_GGUF_DUMP = 1u << 8,
    CLI_MPI_WORKER = 1u << 9, // a rank other than 0 under mpirun: the model flags only
};
// The commands that load a model and run it, and those that sample.
#define CLI_MODEL (CLI_RUN | CLI_CHAT | CLI_EVAL | CLI_SERVE | CLI_BENCH | CLI_MPI_WORKER)
#define CLI_SAMPLE (CLI_RUN | CLI_CHAT | CLI_SERVE)

#define CLI_RUN_PARALLEL_MAX 256   // run --parallel
#define CLI_SERVE_PARALLEL_MAX 256 // serve --parallel
#define CLI_BENCH_MAX_LIST 16      // bench --parallel / -d: values in the list
#define CLI_LOGIT_BIAS_MAX 256     // run / chat -l entries

// vela tokenize: where the text comes from.
enum cli_text_source { CLI_TEXT_NONE, CLI_TEXT_PROMPT, CLI_TEXT_FILE, CLI_TEXT_STDIN };

// What the flags of every command set. Fields a command does not read keep
// their defaults (cli_defaults).
struct cli {
    struct args_model am;        // model, backend, split, rope (CLI_MODEL)
    struct engine_gen_params gp; // -n, sampling, -gan/-gaw, --ignore-eos, run's --parallel
    struct sampler_bias logit_bias[CLI_LOGIT_BIAS_MAX]; // -l: gp.sp.bias points here
    // --grammar, --grammar-file, -j / --json-schema, -jf / --json-schema-file:
    // the output's grammar as GBNF (a schema converted when read; owned);
    // NULL: none. run / chat parse it against the model (tools_grammar_attach),
    // serve takes it as the grammar of requests that give none.
    char *grammar;

    struct engine_eval_params ep;   // eval (its ga_n / ga_w come from gp)
    const char *prompt;             // -p: run, eval
    const char *prompt_file;        // -f: run, eval
    const char *system_msg;         // -sys: run --chat, chat
    const char *chat_template;      // --chat-template: run --chat, chat, serve
    struct chat_kwargs chat_kwargs; // --chat-template-kwargs: run --chat, chat, serve
    int reasoning;                  // --reasoning-format: enum chat_reasoning (run --chat, chat,
                                    // serve)
    struct {
        bool display_prompt, escape, chat; // --no-display-prompt, --[no-]escape, --chat
        bool n_given, shift_given;         // -n, --[no-]context-shift were given
    } run;
    struct {
        bool no_history; // --no-history: no history file
    } chat;
    struct {
        const char *tokens, *logits_out;
    } eval;
    struct {
        int n_prompt, n_gen, reps;
        int par[CLI_BENCH_MAX_LIST], n_par;     // --parallel
        int depth[CLI_BENCH_MAX_LIST], n_depth; // -d
        bool json, full_logits, split_compare, no_stage_times;
        bool draft;   // --draft: speculative decoding on real text (tools/bench_spec.h)
        bool p_given; // -p was given
    } bench;
    struct serve_config sc;    // serve
    struct srv_log_config log; // serve's --log-*
    struct {
        enum cli_text_source src;
        const char *text; // -p's text or -f's path
        bool ids_only, show_count, no_bos, parse_special, escapes;
    } tok;
    struct {
        struct quantize_opts o;
        bool quiet;
    } quant;
    struct {
        struct mkmodel_config cfg;
        const char *out, *preset;
        bool quiet, saw_type, saw_mix;
        bool saw_n_vocab, saw_rope_scale, saw_yarn_ctx, saw_freqs_opt; // checked after parsing
    } mk;
    struct {
        bool json, tensors;
    } dump;
    struct {
        const char *model; // -md, --model-draft
        int ngl;           // -ngld: 0 puts the draft on the CPU backend (-1: not given)
        bool type_given;   // --spec-type was given (else -md means draft)
    } draft;
    bool ignored;       // the llama-server flags that change nothing here
    const char *pos[4]; // arguments that are not flags (quantize, gguf dump)
    int n_pos;
};

// Every command's defaults (llama.cpp's where it has the flag).
void cli_defaults(struct cli *c);

// The flag table of every command.
extern const struct flag_table cli_flags;

// The library's configuration from the flags: where and how the model runs
// (host/split/pipeline.h) and the context (host/forward/forward.h; n_ctx 0
// stays 0, the model's context capped at FORWARD_CTX_CAP, resolved when the
// model is known).
void args_load_config(const struct args_model *a, struct load_config *lc);
void args_ctx_config(const struct args_model *a, struct forward_config *fc);
// With --self-extend: checks a prompt of n_prompt tokens against the
// extended context (n_ctx_train - W) * G + W of hp and the cache (n_ctx
// cells), VERR_RANGE with a message when it does not fit; with verbose,
// prints the extension to `out`. Without the flag it does nothing.
int args_selfextend_check(const struct args_model *a, const struct model_hparams *hp, int n_ctx,
                          int n_prompt, FILE *out, struct verr *err);
// Both, into an engine config (engine_config_default for the rest).
void args_engine_config(const struct args_model *a, struct engine_config *c);

// Under mpirun, a rank other than 0 serves its pipeline stage with the
// model flags of the command line (the others belong to rank 0): returns
// true and sets *status (the exit status); false on rank 0 or outside mpirun.
bool args_mpi_worker(int argc, char **argv, int *status);

#endif
