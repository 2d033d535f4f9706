// The OpenAI-compatible request and response shapes of `vela serve`:
// parsing and validating /v1/completions and /v1/chat/completions bodies
// into a plain struct, and writing responses, stream chunks and errors.
// Pure functions over cJSON (no engine, no sockets), so every rule here is
// tested on its own (tests/test_serve_api.c).
//
// Follows the OpenAI API; where OpenAI has no equivalent, llama-server
// (top_k, min_p, n_keep, ignore_eos, cache_prompt, grp_attn_n / grp_attn_w:
// llama.cpp's self-extend for this request, timings) and vela's extension
// self_extend {"n": G, "w": W} (exact self-extend, host/ops/selfextend.h).
#ifndef VELA_TOOLS_SERVE_API_H
#define VELA_TOOLS_SERVE_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/verr.h"
#include "host/engine/spec.h"
#include "host/tokenizer/chat_harmony.h"
#include "tools/serve/api_tools.h"
#include "tools/serve/chat_kwargs.h"

#define API_MAX_STOP 8          // stop strings per request (OpenAI: 4; llama-server: more)
#define API_MAX_STOP_LEN 256    // bytes per stop string
#define API_MAX_N 16            // choices per request
#define API_MAX_TOP_LOGPROBS 20 // OpenAI's limit
#define API_MAX_MESSAGES 1024   // chat messages per request
#define API_MAX_LOGIT_BIAS 1024 // logit_bias entries per request

enum api_kind {
    API_COMPLETION = 0, // POST /v1/completions
    API_CHAT = 1,       // POST /v1/chat/completions
    API_NATIVE = 2,     // POST /completion: llama-server's own shape (a prompt, one answer;
                        // without max_tokens / n_predict: until a stop)
};

struct api_message {
    char *role;                  // "system", "user", "assistant", "tool"
    char *content;               // text (array-of-parts content is joined); "" when null
    struct api_tool_call *calls; // [n_calls] an assistant message's tool_calls
    int n_calls;
    char *tool_call_id; // role "tool": the call it answers, or NULL
    char *reasoning;    // llama-server's reasoning_content, or NULL
};

// One logit_bias entry: OpenAI's {"15043": 1.5} or llama-server's
// [[15043, 1.5]] / [["Hello", -1]] (every token of the text, tokenized
// without BOS, gets the bias); false bans the token (-INFINITY).
struct api_bias {
    int32_t token; // -1: text
    char *text;    // owned; NULL: token
    float bias;    // finite, or -INFINITY
};

// A parsed request. Strings are owned (api_request_free).
struct api_request {
    enum api_kind kind;
    char *model; // NULL: not given

    // completions: the prompt as text, or as token ids
    char *prompt;
    int32_t *prompt_tokens;
    int n_prompt_tokens;
    // chat
    struct api_message *messages;
    int n_messages;

    int max_tokens;    // -1: until a stop or the context is full
    float temperature; // 1.0 (OpenAI's default)
    float top_p;       // 1.0
    int top_k;         // 0: off
    float min_p;       // 0: off
    float presence_penalty;
    float frequency_penalty;
    float repeat_penalty; // llama-server's: 1.0 (off)
    int repeat_last_n;    // tokens the penalties look back on (64; 0: off, -1: the context)
    int64_t seed;         // -1: random
    bool has_seed;
    char *stop[API_MAX_STOP];
    int n_stop;
    int n; // choices (1)
    bool stream;
    bool include_usage; // stream_options.include_usage
    bool logprobs;      // chat: logprobs true; completions: logprobs >= 0
    int top_logprobs;   // alternatives per token (0..API_MAX_TOP_LOGPROBS)
    bool echo;          // completions: refused when true (not supported)
    // vela / llama-server extensions
    int n_keep;      // tokens a context shift keeps (-1: the whole prompt)
    bool has_n_keep; // n_keep was given: the request asks for context shifts
    int grp_attn_n;  // 1: off
    int grp_attn_w;  // 512
    bool ignore_eos;
    bool cache_prompt; // reuse a slot's kept cells, keep this request's (default true)
    int se_n, se_w;    // self_extend {"n": G, "w": W} (0, 0: not given)
    // speculative {"type": "none"|"ngram"|"draft", "n_max", "n_min", "p_min"}:
    // the server's default (api_defaults.spec) with the fields given
    struct engine_spec spec;
    bool spec_given;       // the request has a "speculative" object
    struct api_bias *bias; // [n_bias] logit_bias (token ids are checked by the server)
    int n_bias;
    struct api_tools tools; // chat: tool calling (tools/serve/toolcall.h)
    // The output's grammar (GBNF, start rule "root"): the "grammar" field, or
    // the grammar of "json_schema" / response_format json_object or
    // json_schema (tools/serve/json_schema.h); NULL: unconstrained. The server
    // parses it against the model's vocabulary (a 400 when it does not parse).
    char *grammar;
    // llama-server's reasoning_format ("auto", "deepseek": a harmony
    // template's analysis channel as reasoning_content; "none": the
    // generated text, markers included, as the content)
    enum chat_reasoning reasoning;
    // chat: the chat template's variables: the server's (api_defaults.kwargs),
    // then llama-server's chat_template_kwargs {"reasoning_effort",
    // "model_identity"}, then OpenAI's reasoning_effort (tools/serve/chat_kwargs.h;
    // the server checks them against the model's template)
    struct chat_kwargs kwargs;
};

void api_request_free(struct api_request *r);

// Whether r speculates: its "speculative" type, or the server's default
// unless it cannot speculate (logprobs, grp_attn_n > 1; asked for
// explicitly with them, the engine refuses it).
bool api_request_speculates(const struct api_request *r);

// What a request that leaves a sampling field out gets: the server's
// defaults (llama-server's --temp, --top-k, --top-p, --min-p,
// --repeat-penalty, --repeat-last-n, --presence-penalty,
// --frequency-penalty, --seed, -n).
struct api_defaults {
    float temperature, top_p, min_p;
    int top_k;
    float repeat_penalty;
    int repeat_last_n;
    float presence_penalty, frequency_penalty;
    int64_t seed;  // -1: random
    int n_predict; // -1: none given (OpenAI's max_tokens: 16 for completions, until a stop
                   // for chat); >= 0: the default of max_tokens / n_predict and their cap
    struct engine_spec spec;          // --spec-type, --draft-*: the speculation of requests
    enum chat_reasoning reasoning;    // --reasoning-format (auto)
    const struct chat_kwargs *kwargs; // --chat-template-kwargs; NULL: none
};
// OpenAI's: temperature 1, top_p 1, no top_k / min_p / penalties, random seed, no -n;
// no speculation.
void api_defaults_openai(struct api_defaults *d);

// An error as OpenAI reports it: HTTP status, type and code.
struct api_error {
    int status;       // 400, 401, 404, 405, 413, 500, 503
    const char *type; // "invalid_request_error", "authentication_error", "not_found_error",
                      // "server_error", "unavailable_error"
    const char *code; // "context_length_exceeded", "invalid_value", ... or NULL
    char message[512];
};

// Parses body (len bytes, not necessarily NUL-terminated) as a request of
// kind k; fields left out take d's values (NULL: api_defaults_openai).
// Unknown fields are ignored (OpenAI clients send many); a field of the
// wrong type or out of range, broken JSON, invalid UTF-8, or a missing
// prompt/messages is a 400 in *e naming the field and what was expected.
// Fields of llama-server or OpenAI that vela cannot honour yet (typical_p <
// 1, mirostat, a schema keyword tools/serve/json_schema.h cannot express) are a
// 400 naming the field, never silently ignored. n_predict is llama-server's
// max_tokens (-1: until a stop; it wins over max_tokens); d->n_predict >= 0 caps both. Returns 0 or
// -1 (then *r is freed and zeroed).
int api_parse_request(enum api_kind k, const char *body, size_t len, const struct api_defaults *d,
                      struct api_request *r, struct api_error *e);

// What a request's context fields are checked against: the server's slots
// and its cache mode.
struct api_ctx_limits {
    int n_ctx_slot;   // cells per slot
    int n_ctx_train;  // the model's trained context
    int se_g, se_w;   // the server's exact self-extend for requests that name none
                      // (--self-extend G W; se_g <= 1: off)
    bool k_unrotated; // K is cached unrotated (--self-extend or --kv-unrotated): a
                      // request may choose its own self_extend
};

// The rules of a request's context fields once its prompt has n_prompt
// tokens (the engine checks the rest: the slot's cells, grp_attn values):
// - a request's exact self-extend is its self_extend {n, w}, else the
//   server's; n > 1 needs K cached unrotated (l->k_unrotated): 400 otherwise;
//   n = 1 turns it off for the request;
// - grp_attn_n > 1 (llama.cpp's self-extend) excludes the exact one: 400;
// - with exact self-extend, w must be below the slot's context, and the
//   prompt and 4 more tokens (llama-cli's room) must fit the extended context
//   (n_ctx_train - w) * n + w: 400 context_length_exceeded with the sizes.
// *max_gen: the most tokens it may generate (the extended context less the
// prompt when that is below the slot's cells), -1: no bound here.
int api_check_context(const struct api_request *r, int n_prompt, const struct api_ctx_limits *l,
                      int *max_gen, struct api_error *e);

struct cJSON;
// Parses s[0..len) as exactly one JSON value (white space around it only);
// NULL otherwise. Free with cJSON_Delete.
struct cJSON *api_json_parse(const char *s, size_t len);

// Whether s[0..n) is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
bool api_utf8_valid(const char *s, size_t n);

// The error body: {"error": {"message", "type", "param": null, "code"}}.
// malloc'd, NUL-terminated; NULL when out of memory.
char *api_error_json(const struct api_error *e);
// Fills e; returns -1 (for `return api_fail(...)`).
int api_fail(struct api_error *e, int status, const char *type, const char *code, const char *fmt,
             ...) __attribute__((format(printf, 5, 6)));

// One choice's result, for responses and chunks.
struct api_logprob_alt {
    char token[64];
    float logprob;
};
struct api_token_logprob {
    char token[64]; // the token's text (truncated to fit)
    float logprob;
    struct api_logprob_alt top[API_MAX_TOP_LOGPROBS];
    int n_top;
};
struct api_choice {
    const char *text; // generated text (stop strings removed)
    size_t len;
    const char *reasoning; // chat: reasoning_content (llama-server's), [reasoning_len] bytes;
    size_t reasoning_len;  // 0: none (the field is left out, and so is an empty delta's content)
    const char *finish;    // "stop", "length", or NULL (streaming, not finished)
    const struct api_token_logprob *lp; // [n_lp] when logprobs were asked for
    int n_lp;
    const struct api_tool_call *calls; // [n_calls] chat: the answer's tool calls
    int n_calls;
};

struct api_usage {
    int prompt_tokens;
    int completion_tokens;
    int cached_tokens; // of the prompt, found in the slot's kept cells
                       // (usage.prompt_tokens_details.cached_tokens)
    // llama-server's "timings" object beside "usage" (cache_n: cached_tokens,
    // predicted_n: completion_tokens), when set.
    bool timings;
    int prompt_n; // prompt tokens evaluated
    double prompt_ms, predicted_ms;
    // speculative decoding (llama-server's draft_n, draft_n_accepted in
    // "timings"), when the request speculated
    bool spec;
    int draft_n, draft_n_accepted;
};

// A whole (non-streamed) response with n choices. id: "cmpl-..." or
// "chatcmpl-...". malloc'd JSON text; NULL when out of memory.
char *api_response_json(enum api_kind k, const char *id, const char *model, int64_t created,
                        const struct api_choice *choices, int n, const struct api_usage *u);

// One stream chunk for choice `index` as a complete SSE event
// ("data: {...}\n\n"). first: the chat role delta goes in it. A usage chunk
// (choices: []) when c is NULL and u is set. malloc'd; NULL when out of memory.
char *api_chunk_sse(enum api_kind k, const char *id, const char *model, int64_t created, int index,
                    const struct api_choice *c, bool first, const struct api_usage *u);

// The last chunk of choice `index` when it ended in error (the server
// shutting down, a failed step): finish_reason "error" and, beside the
// choices, the error object of api_error_json. malloc'd; NULL when out of
// memory.
char *api_chunk_error_sse(enum api_kind k, const char *id, const char *model, int64_t created,
                          int index, const struct api_error *e);

// llama-server's /completion answer (API_NATIVE), the whole one:
// {"content", "stop": true, "id_slot": -1, "model", "tokens_predicted",
// "tokens_evaluated", "tokens_cached", "stop_type": "eos" | "limit",
// "truncated": false, "timings"}. malloc'd; NULL when out of memory.
char *api_native_json(const char *model, const struct api_choice *c, const struct api_usage *u);
// One stream event of it: {"content", "stop": false, "id_slot": -1} while
// it runs (u NULL), the whole answer's fields with "stop": true at the end
// (u set). No [DONE] follows, as in llama-server. malloc'd; NULL when out of
// memory.
char *api_native_chunk_sse(const char *model, const struct api_choice *c,
                           const struct api_usage *u);
// The error object of api_error_json as an SSE event (a /completion stream
// that ended in error). malloc'd; NULL when out of memory.
char *api_error_sse(const struct api_error *e);

// The SSE terminator "data: [DONE]\n\n".
extern const char api_sse_done[];

#endif
