// The engine thread of `vela serve`: one thread owns the engine and runs
// engine_step continuously over every active request; HTTP threads hand it
// requests and cancellations through a locked queue and wait on their
// request for its results. No request waits for another to finish: a new
// one joins the running batch at the next step.
//
// A served request (struct srv_req) is one HTTP request with n choices; each
// choice is one engine request (struct srv_job) with its own seed
// (seed + index). Its text grows under the request's lock as tokens come;
// stop strings are matched across token boundaries and never emitted
// (host/engine/stop.h).
//
// Lifetime: a request is reference counted: the HTTP thread holds one
// reference, the engine thread one until every job has ended.
#ifndef VELA_TOOLS_SERVE_WORKER_H
#define VELA_TOOLS_SERVE_WORKER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "host/engine/engine.h"
#include "host/engine/step.h"
#include "host/engine/stop.h"
#include "host/tokenizer/chat_harmony.h"
#include "tools/serve/api.h"
#include "tools/serve/buf.h"

struct srv_job {
    struct srv_req *req;
    int index;                    // the choice
    uint64_t eid;                 // the engine's request id (0: not submitted)
    struct buf text;              // generated text as it can be shown (stop strings cut out);
                                  // with req->harmony, its content (final channel) only
    size_t sent;                  // bytes of text already streamed
    struct buf reasoning;         // with req->harmony: the analysis channel
    size_t reasoning_sent;        // bytes of reasoning already streamed
    struct harmony hp;            // with req->harmony: the parser of the shown text
    struct api_tool_call *calls;  // [n_calls] with req->harmony: the answer's tool calls
    int n_calls;                  // (name and arguments; no id)
    struct stop_matcher *stop;    // holds back what may begin a stop string
    struct api_token_logprob *lp; // [n_lp]
    int n_lp, cap_lp;
    int lp_sent;
    float *row;         // [n_vocab] the last logits row (logprobs only)
    const char *finish; // "stop", "length", "error", NULL while running
    char note[256];     // the engine's note on a grammar that allowed no token (finish "error")
    bool done;
    int n_gen;
    struct engine_req_stats st; // the engine's numbers, final once done
};

struct srv_req {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    struct api_request api;
    int32_t *tokens; // [n_tokens] the prompt
    int n_tokens;
    int32_t stop_tokens[2]; // the chat template's end of turn, when it has a token
    int n_stop_tokens;
    int max_gen; // most tokens a choice may generate (api_check_context); -1: no bound
    struct sampler_bias *bias; // [n_bias] logit_bias, resolved to token ids (owned)
    int n_bias;
    struct grammar *grammar;            // the output's grammar (owned) or NULL
    const struct grammar_vocab *gvocab; // the server's token trie, with a grammar
    // The control token that opens a tool call (toolcall_marker: Mistral's
    // [TOOL_CALLS]), written into the answer as marker_text; -1: none.
    int32_t marker;
    const char *marker_text;
    // The shown text is harmony (chat_harmony.h): split into text (content)
    // and reasoning. Its markers reach the parser as text: the tokenizer
    // renders harmony's markers (as llama.cpp's vocabulary does), and
    // <|return|> / <|call|> end the generation.
    bool harmony;
    int n_jobs;
    struct srv_job jobs[API_MAX_N];
    // set by the engine thread
    bool submitted;       // every job was given to the engine (or submit failed)
    struct api_error err; // submit failed when err.status != 0
    int n_done;
    // set by the HTTP thread: the client left; the engine thread cancels
    bool cancel;
    struct srv_req *next; // the worker's queue
    struct srv_worker *w; // set when submitted
    char id[48];
    int64_t created;
    int n_vocab;
    double t_submit_ms;
};

#define SRV_MAX_SLOTS 256 // --parallel's bound

// Counters for /metrics (under the worker's lock).
#define SRV_HIST_BUCKETS 12
struct srv_metrics {
    uint64_t requests_total, requests_ok, requests_failed, requests_cancelled;
    uint64_t prompt_tokens, generated_tokens;
    // prompt tokens of finished choices decoded, and found in a slot's kept cells
    uint64_t prompt_tokens_evaluated, prompt_tokens_cached;
    // draft tokens of finished choices verified, and of those accepted
    uint64_t draft_tokens, draft_tokens_accepted;
    double ttft_sum_ms, itl_sum_ms;
    uint64_t ttft_count, itl_count;
    uint64_t ttft_hist[SRV_HIST_BUCKETS], itl_hist[SRV_HIST_BUCKETS]; // cumulative on output
    int running, queued;
    // each slot's state after the last step (/slots): 0 free, 1 reading its
    // prompt, 2 generating; n_slots of them
    unsigned char slot_state[SRV_MAX_SLOTS];
    int n_slots;
    int kv_cells_used, kv_cells_total;
    double t_start_ms;
};
extern const double srv_hist_bounds_ms[SRV_HIST_BUCKETS];

struct srv_worker {
    struct engine *e;
    pthread_t thread;
    pthread_mutex_t mu; // the queue, flags and metrics
    pthread_cond_t cv;
    struct srv_req *incoming; // submitted by HTTP threads, not yet seen by the engine thread
    bool wake;                // a cancel or an incoming request is waiting
    bool stopping;
    bool ending;  // engine thread only: it is cancelling everything to stop
    bool started; // the thread runs
    bool inited;  // mu and cv exist
    struct srv_metrics m;
    int n_queue_max;
};

// Starts the engine thread (the engine is configured for n_slots sequences,
// a queue of n_queue_max requests and slot_similarity, see
// engine_sched_config).
int srv_worker_start(struct srv_worker *w, struct engine *e, int n_slots, int n_queue_max,
                     float slot_similarity, struct verr *err);
// Ends every running request with "error" finish, stops and joins the thread;
// later submissions get 503. srv_worker_free then, once no other thread can
// call in (the HTTP daemon is stopped).
void srv_worker_stop(struct srv_worker *w);
void srv_worker_free(struct srv_worker *w);

// A new request holding api (moved into it) and its prompt tokens (moved).
struct srv_req *srv_req_new(struct api_request *api, int32_t *tokens, int n_tokens, int n_vocab);
void srv_req_release(struct srv_req *r);

// Hands r to the engine thread and waits until every job was submitted or
// the submission failed (r->err.status != 0 then). Takes a reference for
// the engine thread.
void srv_worker_submit(struct srv_worker *w, struct srv_req *r);
// Asks the engine thread to cancel r's jobs (the client left).
void srv_worker_cancel(struct srv_worker *w, struct srv_req *r);

// A snapshot of the metrics.
void srv_worker_metrics(struct srv_worker *w, struct srv_metrics *out);

#endif
