// `vela serve`: an OpenAI-compatible HTTP server over the engine's step API.
//
// HTTP comes from libmicrohttpd (Debian's libmicrohttpd-dev) in its
// thread-per-connection mode: each connection's thread parses and validates
// its request, hands it to the one engine thread (tools/serve/worker.h) and
// waits on it, streaming tokens as server-sent events as they come. A
// connection's wait is a blocking wait on its own request, which is what
// that mode is made for; the number of connections is bounded
// (--max-connections), as are bodies (--max-body), headers, prompt length
// (the slot's context), max_tokens and idle time (--timeout). Its messages,
// libmicrohttpd's and one access line per request go to the server's log
// (tools/serve/log.h).
#ifndef VELA_TOOLS_SERVE_SERVE_H
#define VELA_TOOLS_SERVE_SERVE_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

#include "gguf/verr.h"
#include "host/engine/engine.h"
#include "host/tokenizer/chat.h"
#include "tools/serve/api.h"

struct serve_config {
    const char *host;       // "127.0.0.1"
    int port;               // 8080; 0: any free port (printed)
    int n_parallel;         // slots (sequences decoded together)
    int n_queue_max;        // requests waiting for a slot before 503
    const char *api_key;    // NULL: no authentication
    size_t max_body;        // bytes of a request body (413 beyond)
    int max_connections;    // concurrent connections
    int timeout_s;          // idle connection timeout
    const char *model_path; // the GGUF file (/props)
    const char *model_id;   // the name /v1/models lists and responses carry (--alias; by
                            // default the file's base name without ".gguf")
    // --strict-model-name: a request naming another model gets 404; otherwise
    // any name is answered by the served model, as llama-server does
    bool strict_model_name;
    bool slots;    // --slots: GET /slots answers (llama-server's guard); 501 otherwise
    bool no_webui; // --no-webui: no chat page at / (404, as llama-server; tools/serve/webui.h)
    struct api_defaults defaults; // sampling fields a request leaves out (--temp, ..., -n)
    const char *grammar; // --grammar / --json-schema (GBNF): requests that give none take it
    enum chat_template tmpl;
    bool have_tmpl; // the model has a usable chat template
    bool verbose;
    // engine_sched_config.slot_similarity (llama-server's --slot-prompt-similarity, 0.5)
    float slot_similarity;
};

void serve_config_default(struct serve_config *c);

struct serve;

// Starts listening at once (/health answers 503 "loading" until
// serve_set_engine). *port_out: the port bound.
int serve_start(struct serve **out, const struct serve_config *c, int *port_out, struct verr *err);
// The engine is loaded: starts the engine thread; requests are served from
// now on. Refused (VERR_RANGE) when the context's exact self-extend window is
// not below a slot's context (every request would be refused).
int serve_set_engine(struct serve *s, struct engine *e, struct verr *err);
// Stops accepting, ends running requests (each stream's choices get a last
// chunk with finish_reason "error" and the error object, then [DONE]; a
// non-streamed request gets a 503 "shutting_down" error), waits up to
// SERVE_DRAIN_MS for those answers to be sent, then closes every connection
// and joins every thread: it returns within one decode step (the engine
// thread finishes the step it is in) plus SERVE_DRAIN_MS. Safe on a partly
// started server.
#define SERVE_DRAIN_MS 5000
void serve_stop(struct serve *s);

#endif
