// The tool-calling fields of /v1/chat/completions: parsing "tools",
// "tool_choice", "parallel_tool_calls", an assistant message's "tool_calls"
// and a tool message's "tool_call_id", and writing an answer's tool_calls
// as OpenAI's JSON. Used by api.c (which embeds struct api_tools in its
// request) and tools/serve/toolcall.c; depends on neither. A bad field is
// reported as -1 with a message naming it (api.c answers 400 with it).
#ifndef VELA_TOOLS_SERVE_API_TOOLS_H
#define VELA_TOOLS_SERVE_API_TOOLS_H

#include <stdbool.h>
#include <stddef.h>

struct cJSON;

#define API_MAX_TOOLS 128 // tools per request (OpenAI: 128)

// A tool call: of an assistant message in the request, or found in an answer.
struct api_tool_call {
    char *id;        // "call_..." (a request's may be NULL)
    char *name;      // the function's name
    char *arguments; // the arguments object as JSON text (OpenAI sends and expects a string)
};

// A function the model may call ("tools": [{"type": "function", "function":
// {"name", "description", "parameters"}}]).
struct api_tool {
    char *name;
    char *json;       // the whole tool object, unformatted JSON (what the prompt shows)
    char *parameters; // its parameters' JSON schema as text, or NULL
};

enum api_tool_choice {
    API_TOOL_CHOICE_AUTO = 0, // the model decides (OpenAI's default with tools)
    API_TOOL_CHOICE_NONE,     // no call: the tools are not shown
    API_TOOL_CHOICE_REQUIRED, // at least one call
    API_TOOL_CHOICE_NAMED,    // a call of choice_name
};

// A request's tools (owned; api_tools_free).
struct api_tools {
    struct api_tool *list; // [n]
    int n;
    enum api_tool_choice choice;
    char *choice_name; // API_TOOL_CHOICE_NAMED: one of the tools' names
    bool parallel;     // OpenAI's parallel_tool_calls (default true)
};

// Results of the parsers: 0, API_TOOLS_BAD (msg says which field and what
// was expected) or API_TOOLS_NOMEM.
enum { API_TOOLS_BAD = -1, API_TOOLS_NOMEM = -2 };

// tools, tool_choice and parallel_tool_calls of request object o (chat:
// a /v1/chat/completions request; others take only an empty tools array).
int api_tools_parse(const struct cJSON *o, bool chat, struct api_tools *t, char *msg, size_t cap);

// Message i's tool_calls (of role "assistant" only) and tool_call_id.
int api_tools_parse_message(const struct cJSON *m, int i, const char *role,
                            struct api_tool_call **calls, int *n_calls, char **tool_call_id,
                            char *msg, size_t cap);

void api_tools_free(struct api_tools *t);
void api_tools_calls_free(struct api_tool_call *calls, int n);

// calls[0..n) as OpenAI's tool_calls array; stream: each with its "index"
// (the delta shape). NULL when out of memory.
struct cJSON *api_tools_calls_json(const struct api_tool_call *calls, int n, bool stream);

#endif
