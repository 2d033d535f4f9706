// Tool calling for /v1/chat/completions: the request's tools and the
// conversation's calls and results written in the text format a chat
// template's models were trained on, and the model's answer split back into
// content and tool_calls. Pure functions over strings and cJSON (tested in
// tests/test_serve_api.c).
//
// Formats, as the models' own Jinja templates write them (llama.cpp runs
// those templates with --jinja; vela writes the same text in C):
// - TOOLCALL_HERMES (chatml: Qwen 2.5 / 3, Hermes 2 Pro, SmolLM): the tools
//   as JSON lines inside <tools></tools> in the system turn; a call is
//   <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>; results
//   go back in a user turn as <tool_response>\n...\n</tool_response>.
// - TOOLCALL_LLAMA3 (llama3: Llama 3.1 / 3.2 / 3.3, custom tools in the
//   first user message): the tools as indented JSON before the user's
//   question; a call is the whole answer, {"name": ..., "parameters":
//   {...}} (after an optional <|python_tag|>); results come back in an
//   "ipython" turn.
// - TOOLCALL_MISTRAL (mistral-v3: Mistral 7B v0.3; mistral-v3-tekken:
//   Mistral Nemo; mistral-v7 / -v7-tekken: Mistral Small 3.1's template):
//   the tools as [AVAILABLE_TOOLS] [...][/AVAILABLE_TOOLS] before the last
//   user turn; a call is [TOOL_CALLS] [{"name": ..., "arguments": {...},
//   "id": ...}] (the marker a control token, written into the answer by the
//   server: toolcall_marker); results are [TOOL_RESULTS] {"content": ...,
//   "call_id": ...}[/TOOL_RESULTS]. Call ids are 9 letters and digits, as
//   the templates require: ids that are not are mapped to such (the same id
//   always to the same one, so a call and its result still pair). v3 puts
//   the system text in front of the last message when that is the user's
//   (and drops it otherwise, as its template does); v7 opens its system
//   prompt with the template's instructions for parallel calls.
// - TOOLCALL_HARMONY (gpt-oss): the tools as a TypeScript "namespace
//   functions" in the developer message (the system message then says calls
//   go to the commentary channel); a call is <|start|>assistant
//   to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|> (one
//   per message, the message's content before it as an analysis message
//   unless a later answer follows); results are <|start|>functions.NAME
//   to=assistant<|channel|>commentary<|message|>"..."<|end|>. The answer's
//   calls are read by the harmony parser (host/tokenizer/chat_harmony.h),
//   not by toolcall_parse. Forced calls (tool_choice required or named) are
//   refused: no grammar is written for them yet.
// Other templates have no format here: a request with tools is refused.
#ifndef VELA_TOOLS_SERVE_TOOLCALL_H
#define VELA_TOOLS_SERVE_TOOLCALL_H

#include <stdbool.h>
#include <stddef.h>

#include "host/tokenizer/chat.h"
#include "tools/serve/api.h"

enum toolcall_format {
    TOOLCALL_NONE = 0, // the template has no tool-call format here
    TOOLCALL_HERMES,
    TOOLCALL_LLAMA3,
    TOOLCALL_MISTRAL,
    TOOLCALL_HARMONY,
};

// The format of template t's models.
enum toolcall_format toolcall_format_of(enum chat_template t);

// Strings made by toolcall_render, freed together.
struct toolcall_strs {
    char **p; // [n]
    int n, cap;
};
void toolcall_strs_free(struct toolcall_strs *s);

// The request's messages as the chat_msgs template t formats: the tools
// announced (unless tool_choice is none), assistant tool_calls and role
// "tool" results written in t's format. out has room for r->n_messages + 1
// entries; *n_out is set. Strings live in *keep. A request with tools (or
// with calls or results in its messages) for a template without a format is
// a 400 naming the template.
int toolcall_render(enum chat_template t, const struct api_request *r, struct chat_msg *out,
                    int *n_out, struct toolcall_strs *keep, struct api_error *e);

// The grammar (GBNF, malloc'd) of the answer a forced call asks for
// (tool_choice required: a call of any tool, several when
// parallel_tool_calls; named: one call of that tool), written in template
// t's format with each tool's parameters as its arguments' JSON schema. A
// schema tools/serve/json_schema.h cannot express is a 400 naming it.
int toolcall_grammar(enum chat_template t, const struct api_request *r, char **gbnf,
                     struct api_error *e);

// Whether the answer to r is to be read for tool calls (tools given and
// tool_choice is not none).
bool toolcall_wanted(const struct api_request *r);

// The answer text[0..len) split: *content_len bytes of content (the text
// before the first call, white space at its end dropped; all of it when
// there is no call) and the calls, each with id "<id_prefix>_<i>" (malloc'd
// into *calls, free with api_tools_calls_free (api_tools.h)). A call whose JSON does not
// parse, or names no function, leaves the whole text as content. Returns 0,
// or -1 when out of memory.
int toolcall_parse(enum toolcall_format f, const char *text, size_t len, const char *id_prefix,
                   size_t *content_len, struct api_tool_call **calls, int *n_calls);

// The text of the control token that opens format f's calls ("[TOOL_CALLS]"),
// or NULL: the detokenizer drops control tokens, so the server writes this
// text into the answer where the model sampled that token.
const char *toolcall_marker(enum toolcall_format f);

// How many bytes of the answer so far, text[0..len), may be streamed as
// content now: all but what may be (the start of) a tool call.
size_t toolcall_stream_safe(enum toolcall_format f, const char *text, size_t len);

#endif
