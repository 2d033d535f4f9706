// Tool calling in `vela serve` (tools/serve/toolcall.h, api_tools.h): the
// request fields and their 400s, the prompt text against what the models'
// own Jinja templates write (Qwen 2.5's for chatml / Hermes, Llama 3.1's for
// llama3; expected strings written out by hand from those templates), the
// answer split into content and calls, what may be streamed before the end,
// and the response shapes (OpenAI's tool_calls, content null,
// finish_reason "tool_calls").
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "host/tokenizer/chat.h"
#include "tools/serve/api.h"
#include "tools/serve/toolcall.h"

#define WEATHER_TOOL                                                                               \
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get "   \
    "the weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "            \
    "{\"type\": \"string\"}}, \"required\": [\"city\"]}}}"

static int parse_chat(const char *body, struct api_request *r, struct api_error *e) {
    memset(e, 0, sizeof *e);
    return api_parse_request(API_CHAT, body, strlen(body), NULL, r, e);
}

// The prompt vela writes for body with template t (tools rendered, then
// chat_format with the generation prompt); malloc'd.
static char *prompt_of(enum chat_template t, const char *body) {
    struct api_request r;
    struct api_error e;
    cr_assert_eq(parse_chat(body, &r, &e), 0, "%s", e.message);
    struct chat_msg msgs[16];
    struct toolcall_strs keep = {0};
    int n = 0;
    cr_assert_eq(toolcall_render(t, &r, msgs, &n, &keep, &e), 0, "%s", e.message);
    char *out = NULL;
    size_t len = 0;
    struct verr err = {0};
    cr_assert_eq(chat_format(t, msgs, (size_t)n, true, &out, &len, &err), 0, "%s", err.msg);
    toolcall_strs_free(&keep);
    api_request_free(&r);
    return out;
}

Test(serve_tools, hermes_prompt_is_qwen25s) {
    char *p =
        prompt_of(CHAT_TMPL_CHATML,
                  "{\"messages\": [{\"role\": \"system\", \"content\": \"You are helpful.\"}, "
                  "{\"role\": \"user\", \"content\": \"Weather in Paris?\"}], \"tools\": "
                  "[" WEATHER_TOOL "]}");
    const char *want =
        "<|im_start|>system\nYou are helpful.\n\n# Tools\n\nYou may call one or more functions to "
        "assist with the user query.\n\nYou are provided with function signatures within "
        "<tools></tools> XML tags:\n<tools>\n" WEATHER_TOOL
        "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
        "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n";
    cr_expect_str_eq(p, want);
    free(p);
}

Test(serve_tools, hermes_calls_and_results_are_qwen25s) {
    char *p = prompt_of(
        CHAT_TMPL_CHATML,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}, {\"role\": "
        "\"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": "
        "\"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": "
        "\"{\\\"city\\\":\\\"Paris\\\"}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", "
        "\"content\": \"{\\\"temp\\\": 21}\"}, {\"role\": \"tool\", \"content\": \"sunny\"}], "
        "\"tools\": [" WEATHER_TOOL "]}");
    const char *tail = "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
                       "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                       "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": "
                       "21}\n</tool_response>\n<tool_response>\nsunny\n</tool_response><|im_end|>"
                       "\n<|im_start|>assistant\n";
    const char *at = strstr(p, "<|im_start|>user");
    cr_assert_not_null(at, "%s", p);
    cr_expect_str_eq(at, tail);
    cr_expect(strstr(p, "You are Qwen, created by Alibaba Cloud.") == p + strlen("<|im_start|>"
                                                                                 "system\n"),
              "no system message: Qwen 2.5's default system text opens the tools turn:\n%s", p);
    free(p);
}

Test(serve_tools, llama3_tools_go_in_the_first_user_turn) {
    char *p = prompt_of(CHAT_TMPL_LLAMA3,
                        "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, "
                        "{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c1\", \"type\": "
                        "\"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": "
                        "\"{\\\"city\\\": \\\"Paris\\\"}\"}}]}, {\"role\": \"tool\", \"content\": "
                        "\"21C\"}], \"tools\": [" WEATHER_TOOL "]}");
    const char *want =
        "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge "
        "Date: December 2023\nToday Date: 26 Jul 2024<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please "
        "respond with a JSON for a function call with its proper arguments that best answers "
        "the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
        "dictionary of argument name and its value}.Do not use variables.\n\n{\n    \"type\": "
        "\"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n        "
        "\"description\": \"Get the weather\",\n        \"parameters\": {\n            \"type\": "
        "\"object\",\n            \"properties\": {\n                \"city\": {\n              "
        "      \"type\": \"string\"\n                }\n            },\n            \"required\": "
        "[\n                \"city\"\n            ]\n        }\n    }\n}\n\nWeather in "
        "Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": "
        "\"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|><|start_header_id|>"
        "ipython<|end_header_id|>\n\n21C<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
        "\n\n";
    cr_expect_str_eq(p, want);
    free(p);
}

Test(serve_tools, tool_choice_none_hides_the_tools) {
    char *p = prompt_of(CHAT_TMPL_CHATML, "{\"messages\": [{\"role\": \"user\", \"content\": "
                                          "\"hi\"}], \"tool_choice\": \"none\", \"tools\": "
                                          "[" WEATHER_TOOL "]}");
    cr_expect_str_eq(p, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    free(p);
}

Test(serve_tools, a_template_without_a_format_is_refused) {
    struct api_request r;
    struct api_error e;
    cr_assert_eq(parse_chat("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                            "\"tools\": [" WEATHER_TOOL "]}",
                            &r, &e),
                 0);
    struct chat_msg msgs[4];
    struct toolcall_strs keep = {0};
    int n = 0;
    cr_expect_eq(toolcall_render(CHAT_TMPL_GEMMA, &r, msgs, &n, &keep, &e), -1);
    cr_expect_eq(e.status, 400);
    cr_expect(strstr(e.message, "'gemma' has no tool-call format") != NULL, "%s", e.message);
    toolcall_strs_free(&keep);
    api_request_free(&r);
}

static void expect_bad(const char *body, const char *what) {
    struct api_request r;
    struct api_error e;
    cr_expect_eq(parse_chat(body, &r, &e), -1, "accepted: %s", body);
    cr_expect_eq(e.status, 400);
    cr_expect(strstr(e.message, what) != NULL, "message '%s' lacks '%s'", e.message, what);
}

Test(serve_tools, bad_fields_name_themselves) {
#define MSG "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]"
    expect_bad("{" MSG ", \"tools\": {}}", "'tools' must be an array");
    expect_bad("{" MSG ", \"tools\": [{\"type\": \"retrieval\"}]}", "'tools[0]' must be");
    expect_bad("{" MSG
               ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]}",
               "'tools[0].function.name'");
    expect_bad("{" MSG ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", "
               "\"parameters\": 3}}]}",
               "'tools[0].function.parameters'");
    expect_bad("{" MSG ", \"tools\": [" WEATHER_TOOL "], \"tool_choice\": \"always\"}",
               "'tool_choice' is 'always'");
    expect_bad("{" MSG ", \"tools\": [" WEATHER_TOOL "], \"tool_choice\": {\"type\": "
               "\"function\", \"function\": {\"name\": \"nope\"}}}",
               "'nope', which is not in 'tools'");
    expect_bad("{" MSG ", \"tool_choice\": \"required\"}", "'tools' is empty");
    expect_bad("{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"tool_calls\": []}]}",
               "'messages[0].tool_calls' belongs to role 'assistant'");
    expect_bad("{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\": 3}]}]}",
               "'messages[0].tool_calls[0]' must be");
#undef MSG
}

Test(serve_tools, named_choice_and_parallel_flag_parse) {
    struct api_request r;
    struct api_error e;
    cr_assert_eq(parse_chat("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                            "\"tools\": [" WEATHER_TOOL "], \"tool_choice\": {\"type\": "
                            "\"function\", \"function\": {\"name\": \"get_weather\"}}, "
                            "\"parallel_tool_calls\": false}",
                            &r, &e),
                 0, "%s", e.message);
    cr_expect_eq(r.tools.choice, API_TOOL_CHOICE_NAMED);
    cr_expect_str_eq(r.tools.choice_name, "get_weather");
    cr_expect(!r.tools.parallel);
    cr_expect_eq(r.tools.n, 1);
    cr_expect_str_eq(r.tools.list[0].name, "get_weather");
    cr_expect(strstr(r.tools.list[0].parameters, "\"city\"") != NULL);
    api_request_free(&r);
}

struct split {
    size_t content_len;
    struct api_tool_call *calls;
    int n;
};

static struct split split_of(enum toolcall_format f, const char *text) {
    struct split s;
    cr_assert_eq(toolcall_parse(f, text, strlen(text), "call_x", &s.content_len, &s.calls, &s.n),
                 0);
    return s;
}

Test(serve_tools, hermes_answers_split_into_content_and_calls) {
    struct split s = split_of(TOOLCALL_HERMES,
                              "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", "
                              "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n"
                              "{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": 1}\"}");
    cr_expect_eq(s.content_len, strlen("Let me look."), "content: the text before the call");
    cr_assert_eq(s.n, 2, "the second call is unclosed (the answer ended) and still counts");
    cr_expect_str_eq(s.calls[0].name, "get_weather");
    cr_expect_str_eq(s.calls[0].arguments, "{\"city\":\"Paris\"}");
    cr_expect_str_eq(s.calls[0].id, "call_x_0");
    cr_expect_str_eq(s.calls[1].name, "get_time");
    cr_expect_str_eq(s.calls[1].arguments, "{\"tz\": 1}", "a string of arguments stays as sent");
    api_tools_calls_free(s.calls, s.n);
    const char *plain[] = {"No call here.", "<tool_call>\n{not json}\n</tool_call>",
                           "<tool_call>{\"arguments\": {}}</tool_call>",
                           "<tool_call>{\"name\": \"f\"}</tool_call> and then prose"};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        s = split_of(TOOLCALL_HERMES, plain[i]);
        cr_expect_eq(s.n, 0, "'%s' is not a call", plain[i]);
        cr_expect_eq(s.content_len, strlen(plain[i]), "'%s' stays content", plain[i]);
    }
}

Test(serve_tools, llama3_answers_split) {
    struct split s = split_of(TOOLCALL_LLAMA3, " <|python_tag|>{\"name\": \"get_weather\", "
                                               "\"parameters\": {\"city\": \"a;b\"}}; {\"name\": "
                                               "\"f\", \"parameters\": {}}");
    cr_assert_eq(s.n, 2);
    cr_expect_eq(s.content_len, 0);
    cr_expect_str_eq(s.calls[0].arguments, "{\"city\":\"a;b\"}", "';' inside a string is text");
    cr_expect_str_eq(s.calls[1].name, "f");
    api_tools_calls_free(s.calls, s.n);
    s = split_of(TOOLCALL_LLAMA3, "It is {warm} today.");
    cr_expect_eq(s.n, 0);
}

Test(serve_tools, streaming_holds_back_only_what_may_be_a_call) {
    const char *t = "Sure. <tool_ca";
    cr_expect_eq(toolcall_stream_safe(TOOLCALL_HERMES, t, strlen(t)), strlen("Sure. "));
    t = "a < b";
    cr_expect_eq(toolcall_stream_safe(TOOLCALL_HERMES, t, strlen(t)), strlen(t));
    t = "x <tool_call>\n{\"name\"";
    cr_expect_eq(toolcall_stream_safe(TOOLCALL_HERMES, t, strlen(t)), 2);
    cr_expect_eq(toolcall_stream_safe(TOOLCALL_LLAMA3, "  {\"na", 6), 0);
    cr_expect_eq(toolcall_stream_safe(TOOLCALL_LLAMA3, "<|pyth", 6), 0);
    cr_expect_eq(toolcall_stream_safe(TOOLCALL_LLAMA3, "Hello", 5), 5);
}

Test(serve_tools, responses_carry_tool_calls) {
    struct api_tool_call call = {
        .id = "call_1", .name = "get_weather", .arguments = "{\"city\":\"Paris\"}"};
    struct api_choice c = {
        .text = "", .len = 0, .finish = "tool_calls", .calls = &call, .n_calls = 1};
    char *js = api_response_json(API_CHAT, "chatcmpl-1", "m", 1, &c, 1, NULL);
    cJSON *o = cJSON_Parse(js);
    cr_assert_not_null(o, "%s", js);
    cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    cJSON *msg = cJSON_GetObjectItem(ch, "message");
    cr_expect(cJSON_IsNull(cJSON_GetObjectItem(msg, "content")), "content null: %s", js);
    cr_expect_str_eq(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "tool_calls");
    cJSON *tc = cJSON_GetArrayItem(cJSON_GetObjectItem(msg, "tool_calls"), 0);
    cr_assert_not_null(tc, "%s", js);
    cr_expect_str_eq(cJSON_GetObjectItem(tc, "id")->valuestring, "call_1");
    cr_expect_str_eq(cJSON_GetObjectItem(tc, "type")->valuestring, "function");
    cJSON *fn = cJSON_GetObjectItem(tc, "function");
    cr_expect_str_eq(cJSON_GetObjectItem(fn, "name")->valuestring, "get_weather");
    cr_expect_str_eq(cJSON_GetObjectItem(fn, "arguments")->valuestring, "{\"city\":\"Paris\"}");
    cr_expect_null(cJSON_GetObjectItem(tc, "index"), "no index outside a stream");
    cJSON_Delete(o);
    free(js);
    c.finish = NULL;
    char *sse = api_chunk_sse(API_CHAT, "chatcmpl-1", "m", 1, 0, &c, false, NULL);
    cr_assert(strncmp(sse, "data: ", 6) == 0);
    o = cJSON_Parse(sse + 6);
    cr_assert_not_null(o, "%s", sse);
    cJSON *delta =
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "delta");
    tc = cJSON_GetArrayItem(cJSON_GetObjectItem(delta, "tool_calls"), 0);
    cr_expect_eq(cJSON_GetObjectItem(tc, "index")->valueint, 0, "%s", sse);
    cr_expect_null(cJSON_GetObjectItem(delta, "content"), "no content in a calls delta: %s", sse);
    cJSON_Delete(o);
    free(sse);
}
