// llama.cpp's chat template variables as vela's tools take them: the
// chat_template_kwargs object of a chat request and of
// --chat-template-kwargs (serve, run --chat, chat), and OpenAI's top-level
// reasoning_effort of a chat request.
//
// vela has no Jinja: it takes only the variables its formatters read
// (struct chat_opts, host/tokenizer/chat.h: reasoning_effort and
// model_identity, read by gpt-oss's template). llama.cpp hands every key to
// the template, which may or may not read it; vela cannot tell, so any other
// key (enable_thinking, ...) is refused, and so is a variable the model's
// template does not read (chat_kwargs_check), rather than dropped.
//
// Precedence, as llama-server's: the server's --chat-template-kwargs, then
// the request's chat_template_kwargs, then its reasoning_effort (each key
// given later wins). A null value in an object takes the key away (the
// template's default, whatever an earlier object gave); a null top-level
// reasoning_effort is a field not given.
#ifndef VELA_TOOLS_SERVE_CHAT_KWARGS_H
#define VELA_TOOLS_SERVE_CHAT_KWARGS_H

#include "gguf/verr.h"
#include "host/tokenizer/chat.h"

struct cJSON;

struct chat_kwargs {
    char *reasoning_effort; // owned; NULL: not given
    char *model_identity;   // owned; NULL: not given
    // Where each was given (static strings, for errors): "reasoning_effort",
    // "chat_template_kwargs", "--chat-template-kwargs", "--reasoning-effort";
    // NULL: not given.
    const char *effort_from, *identity_from;
};

// Reads the JSON value v, which must be an object, into k (its keys replace
// k's); where names it in errors (a static string). VERR_TYPE: v is not an
// object or a value is not a string; VERR_RANGE: an effort other than low,
// medium or high; VERR_UNSUPPORTED: a key vela does not read; VERR_NOMEM.
// Strings are taken as they are: a request's body is checked as UTF-8 as a
// whole (tools/serve/api.h), as a flag's value is by the caller.
// On error k keeps what it had.
int chat_kwargs_read(const struct cJSON *v, const char *where, struct chat_kwargs *k,
                     struct verr *err);

// chat_kwargs_read of JSON text (a flag's value, NUL-terminated UTF-8: the
// caller checks the UTF-8); text that is not one JSON value is VERR_FORMAT.
int chat_kwargs_parse(const char *json, const char *where, struct chat_kwargs *k, struct verr *err);

// OpenAI's top-level reasoning_effort or llama.cpp's --reasoning-effort
// (where: "reasoning_effort", "--reasoning-effort"; static): v, the value
// (NULL or null: not given), a string, low, medium or high, into
// k->reasoning_effort.
int chat_kwargs_read_effort(const struct cJSON *v, const char *where, struct chat_kwargs *k,
                            struct verr *err);

// A deep copy of src into *dst (zeroed first); VERR_NOMEM.
int chat_kwargs_copy(struct chat_kwargs *dst, const struct chat_kwargs *src, struct verr *err);
void chat_kwargs_free(struct chat_kwargs *k);

// The variables for chat_format; points into k.
struct chat_opts chat_kwargs_opts(const struct chat_kwargs *k);

// Whether template t reads every variable k gives: VERR_UNSUPPORTED naming
// the variable, where it was given and the template otherwise.
int chat_kwargs_check(const struct chat_kwargs *k, enum chat_template t, struct verr *err);

#endif
