// Chat templates: a conversation (role, content messages) -> the prompt text
// a chat model was trained on, following llama.cpp's built-in formatters
// (llm_chat_detect_template / llm_chat_apply_template in src/llama-chat.cpp).
// This is not a Jinja interpreter: tokenizer.chat_template is recognised by
// the same substrings llama.cpp looks for and mapped to a formatter written
// in C, so a template llama.cpp's legacy path cannot format is refused here
// too, with the list of names that can be given instead (--chat-template).
//
// BOS: the formatted text never starts with the BOS token (llama.cpp's
// formatters leave it to the tokenizer). Tokenize the first turn with
// add_special (BOS where the vocabulary asks for it, tokenizer_add_bos) and
// every later turn without it; always with parse_special, so the template's
// markers ("<|im_start|>", "[INST]", ...) become their control tokens.
//
// End of a turn: generation of an assistant message stops at an
// end-of-generation token (tokenizer_is_eog) or at the template's end-of-turn
// text (chat_template_eot), as a token where the vocabulary has one
// (chat_eot_token), else as a stop string.
//
// gpt-oss (harmony) is formatted as its Jinja template renders for inference,
// not as llama.cpp's legacy formatter: the system message with the
// template's text (model identity, knowledge cutoff, the current
// date, the reasoning effort, the valid channels), a first system or
// developer message as the developer message's instructions, earlier
// assistant turns as their final channel closed by <|end|> (llama.cpp's
// inference form; <|return|> only ends a generation). The answer opens with
// <|start|>assistant and ends at <|return|> (or <|call|>): the generated
// channels are split by chat_harmony.h. The identity and the effort are the
// template's variables model_identity and reasoning_effort (struct
// chat_opts).
//
// Contract: everything here is thread-safe and pure (no global state) but
// for gpt-oss's current date, read from the clock (local time, as the
// template's strftime_now).
// Functions returning int give 0 or a negative VERR_* code with a message.
#ifndef VELA_HOST_TOKENIZER_CHAT_H
#define VELA_HOST_TOKENIZER_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/verr.h"

struct gguf_file;
struct tokenizer;

// The built-in formatters; names (chat_template_name) are llama.cpp's.
enum chat_template {
    CHAT_TMPL_CHATML = 0,        // "chatml": Qwen, SmolLM, OpenHermes, ...
    CHAT_TMPL_LLAMA2,            // "llama2": [INST] without a system block
    CHAT_TMPL_LLAMA2_SYS,        // "llama2-sys": <<SYS>> block
    CHAT_TMPL_LLAMA2_SYS_BOS,    // "llama2-sys-bos": <s> before each later [INST]
    CHAT_TMPL_LLAMA2_SYS_STRIP,  // "llama2-sys-strip": contents trimmed
    CHAT_TMPL_MISTRAL_V1,        // "mistral-v1"
    CHAT_TMPL_MISTRAL_V3,        // "mistral-v3"
    CHAT_TMPL_MISTRAL_V3_TEKKEN, // "mistral-v3-tekken"
    CHAT_TMPL_MISTRAL_V7,        // "mistral-v7"
    CHAT_TMPL_MISTRAL_V7_TEKKEN, // "mistral-v7-tekken"
    CHAT_TMPL_PHI3,              // "phi3"
    CHAT_TMPL_PHI4,              // "phi4"
    CHAT_TMPL_FALCON3,           // "falcon3"
    CHAT_TMPL_ZEPHYR,            // "zephyr"
    CHAT_TMPL_MONARCH,           // "monarch"
    CHAT_TMPL_GEMMA,             // "gemma"
    CHAT_TMPL_ORION,             // "orion"
    CHAT_TMPL_OPENCHAT,          // "openchat"
    CHAT_TMPL_VICUNA,            // "vicuna"
    CHAT_TMPL_VICUNA_ORCA,       // "vicuna-orca"
    CHAT_TMPL_DEEPSEEK,          // "deepseek": DeepSeek Coder
    CHAT_TMPL_DEEPSEEK2,         // "deepseek2"
    CHAT_TMPL_DEEPSEEK3,         // "deepseek3"
    CHAT_TMPL_COMMAND_R,         // "command-r"
    CHAT_TMPL_LLAMA3,            // "llama3"
    CHAT_TMPL_CHATGLM3,          // "chatglm3"
    CHAT_TMPL_CHATGLM4,          // "chatglm4"
    CHAT_TMPL_GLMEDGE,           // "glmedge"
    CHAT_TMPL_MINICPM,           // "minicpm"
    CHAT_TMPL_EXAONE3,           // "exaone3"
    CHAT_TMPL_GRANITE,           // "granite": IBM Granite 3.x
    CHAT_TMPL_GPT_OSS,           // "gpt-oss": OpenAI's harmony format (chat_harmony.h)
    CHAT_TMPL_COUNT
};

struct chat_msg {
    const char *role;    // "system", "user", "assistant" (others pass through where the
                         // template writes the role as text)
    const char *content; // NUL-terminated UTF-8
};

// The template's name ("chatml", "llama3", ...); NULL outside the enum.
const char *chat_template_name(enum chat_template t);

// Writes the names of all built-in templates, comma separated, into buf
// (truncated to size, always NUL-terminated when size > 0); returns the
// length the whole list needs.
size_t chat_template_list(char *buf, size_t size);

// A name given by the user (--chat-template NAME). An unknown name is
// VERR_NOTFOUND with a message listing the built-in names.
int chat_template_from_name(const char *name, enum chat_template *out, struct verr *err);

// llama.cpp's detection: a template that is exactly a built-in name is that
// template; otherwise the Jinja text is matched by llama.cpp's substrings, in
// llama.cpp's order. Returns the name llama.cpp would pick (which may be one
// vela has no formatter for, e.g. "granite-4.0") or NULL when llama.cpp
// recognises nothing.
const char *chat_template_detect_name(const char *tmpl);

// chat_template_detect_name then chat_template_from_name: VERR_UNSUPPORTED
// (naming what llama.cpp calls it) for a template vela cannot format,
// VERR_NOTFOUND for one nobody recognises; both messages list the names
// --chat-template accepts.
int chat_template_detect(const char *tmpl, enum chat_template *out, struct verr *err);

// The model's template: override (a name, as --chat-template) when not NULL,
// else tokenizer.chat_template of the file, else (no such key) "chatml", as
// llama.cpp's llama_chat_apply_template does for a NULL template. *source
// (when not NULL) is set to a static string saying where it came from:
// "--chat-template", "tokenizer.chat_template" or "default (no
// tokenizer.chat_template in the file)".
int chat_template_from_gguf(const struct gguf_file *f, const char *override,
                            enum chat_template *out, const char **source, struct verr *err);

// A message of role CHAT_ROLE_RAW is written as it is, outside any turn: the
// tool-call markers of Mistral's templates sit between turns
// ([AVAILABLE_TOOLS], [TOOL_CALLS], [TOOL_RESULTS]; tools/serve/toolcall.h).
// Only mistral-v3, -v3-tekken, -v7, -v7-tekken and gpt-oss take it.
// gpt-oss takes raw messages too (its tool calls and results, written by
// tools/serve/toolcall.c), and a message of role CHAT_ROLE_TOOLS: the
// "namespace functions" text its template puts in the developer message
// under "# Tools" (the system message then says calls go to the commentary
// channel).
#define CHAT_ROLE_RAW "raw"
#define CHAT_ROLE_TOOLS "tools"
bool chat_template_takes_raw(enum chat_template t);

// The variables of a Jinja template that vela's formatters read (llama.cpp's
// chat_template_kwargs): only gpt-oss's template reads any. NULL: the
// template's default.
struct chat_opts {
    const char *reasoning_effort; // "low", "medium" or "high"; default "medium"
    const char *model_identity;   // any text; default "You are ChatGPT, a large
                                  // language model trained by OpenAI."
};

// The variable names struct chat_opts holds, as the templates spell them.
#define CHAT_VAR_REASONING_EFFORT "reasoning_effort"
#define CHAT_VAR_MODEL_IDENTITY "model_identity"

// Whether template t reads the variable named var (CHAT_VAR_*).
bool chat_template_reads(enum chat_template t, const char *var);

// Checks o (NULL: no variables) for template t: a variable t does not read
// is VERR_UNSUPPORTED, a reasoning effort other than low, medium or high is
// VERR_RANGE; the message names the variable and what was expected.
int chat_opts_check(enum chat_template t, const struct chat_opts *o, struct verr *err);

// Formats msgs[0..n) into a malloc'd NUL-terminated string (*len bytes, the
// NUL not counted) with the template's variables opts (NULL: the defaults;
// checked by chat_opts_check). add_generation_prompt appends what opens the
// assistant's reply (for templates that have such a marker; llama2 and
// mistral end the user turn with [/INST] and add nothing). A raw message for
// a template that does not take it: VERR_RANGE.
int chat_format(enum chat_template t, const struct chat_msg *msgs, size_t n,
                const struct chat_opts *opts, bool add_generation_prompt, char **out, size_t *len,
                struct verr *err);

// The text one more message adds to a conversation already in the cache:
// llama.cpp's common_chat_format_single. Formats msgs[0..n-1) without a
// generation prompt and msgs[0..n) with add_generation_prompt, and returns
// the difference (with the newline a formatted history ends with kept when
// a generation prompt is added). n >= 1; opts as chat_format's.
int chat_format_next(enum chat_template t, const struct chat_msg *msgs, size_t n,
                     const struct chat_opts *opts, bool add_generation_prompt, char **out,
                     size_t *len, struct verr *err);

// The text the template writes after an assistant message ("<|im_end|>",
// "<|eot_id|>", "</s>", ...): where the model writes it, its turn is over.
const char *chat_template_eot(enum chat_template t);

// The vocabulary's token for chat_template_eot, or TOKENIZER_NULL when the
// vocabulary has no token with exactly that text.
int32_t chat_eot_token(const struct tokenizer *tok, enum chat_template t);

// Whether token id ends an assistant turn: an end-of-generation token of the
// vocabulary or chat_eot_token.
bool chat_is_end_of_turn(const struct tokenizer *tok, enum chat_template t, int32_t id);

#endif
