// The tool-calling fields of /v1/chat/completions (api.h's struct
// api_tool, api_tool_call, api_tool_choice): parsing "tools",
// "tool_choice", "parallel_tool_calls", an assistant message's "tool_calls"
// and a tool message's "tool_call_id", and writing an answer's tool_calls.
// Used by api.c; a 400 names the field and what was expected.
#ifndef VELA_TOOLS_SERVE_API_TOOLS_H
#define VELA_TOOLS_SERVE_API_TOOLS_H

#include <stdbool.h>

#include "tools/serve/api.h"

struct cJSON;

#define API_MAX_TOOLS 128 // tools per request (OpenAI: 128)

// tools, tool_choice and parallel_tool_calls of request object o into r.
int api_tools_parse(const struct cJSON *o, struct api_request *r, struct api_error *e);

// Message i's tool_calls (an assistant's) and tool_call_id (a tool's) into m.
int api_tools_parse_message(const struct cJSON *msg, int i, struct api_message *m,
                            struct api_error *e);

void api_tools_free(struct api_request *r);

// calls[0..n) as OpenAI's tool_calls array; stream: each with its "index"
// (the delta shape). NULL when out of memory.
struct cJSON *api_tools_calls_json(const struct api_tool_call *calls, int n, bool stream);

#endif
