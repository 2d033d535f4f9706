// Tool calling in `vela serve` (tools/serve/toolcall.h, api_tools.h): the
// request fields and their 400s, the prompt text against what the models'
// own Jinja templates write (Qwen 2.5's for chatml / Hermes, Llama 3.1's for
// llama3, Mistral 7B v0.3's, Mistral Nemo's and Mistral Small 3.1's for
// mistral-v3, -v3-tekken and -v7-tekken; expected strings written out by
// hand from those templates), the
// answer split into content and calls, what may be streamed before the end,
// and the response shapes (OpenAI's tool_calls, content null,
// finish_reason "tool_calls").
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "host/grammar/grammar.h"
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
    cr_assert_eq(chat_format(t, msgs, (size_t)n, NULL, true, &out, &len, &err), 0, "%s", err.msg);
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

// toolcall_render of body with template t is a 400 whose message holds what.
static void expect_render_400(enum chat_template t, const char *body, const char *what) {
    struct api_request r;
    struct api_error e;
    cr_assert_eq(parse_chat(body, &r, &e), 0, "%s", e.message);
    struct chat_msg msgs[8];
    struct toolcall_strs keep = {0};
    int n = 0;
    cr_expect_eq(toolcall_render(t, &r, msgs, &n, &keep, &e), -1);
    cr_expect_eq(e.status, 400);
    cr_expect(strstr(e.message, what) != NULL, "message '%s' lacks '%s'", e.message, what);
    toolcall_strs_free(&keep);
    api_request_free(&r);
}

Test(serve_tools, a_template_without_a_format_is_refused) {
    expect_render_400(CHAT_TMPL_GEMMA,
                      "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                      "\"tools\": [" WEATHER_TOOL "]}",
                      "'gemma' has no tool-call format");
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

// Each of texts[0..n) is content: no call found in it.
static void expect_content(enum toolcall_format f, const char *const *texts, size_t n) {
    for (size_t i = 0; i < n; i++) {
        struct split s = split_of(f, texts[i]);
        cr_expect_eq(s.n, 0, "'%s' is not a call", texts[i]);
        cr_expect_eq(s.content_len, strlen(texts[i]), "'%s' stays content", texts[i]);
    }
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
    expect_content(TOOLCALL_HERMES, plain, sizeof plain / sizeof plain[0]);
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

// --- Mistral -----------------------------------------------------------------------

// A call with a 9-character id, its result, and a new question: the tools go
// before the last user turn.
#define MISTRAL_CHAT                                                                               \
    "{\"messages\": [{\"role\": \"system\", \"content\": \"You are helpful.\"}, {\"role\": "       \
    "\"user\", \"content\": \"Weather in Paris?\"}, {\"role\": \"assistant\", \"content\": null, " \
    "\"tool_calls\": [{\"id\": \"abcDEF123\", \"type\": \"function\", \"function\": {\"name\": "   \
    "\"get_weather\", \"arguments\": \"{\\\"city\\\":\\\"Paris\\\"}\"}}]}, {\"role\": \"tool\", "  \
    "\"tool_call_id\": \"abcDEF123\", \"content\": \"{\\\"temp\\\": 21}\"}, {\"role\": "           \
    "\"user\", \"content\": \"And tomorrow?\"}], \"tools\": [" WEATHER_TOOL "]}"
#define MISTRAL_CALL                                                                               \
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": "                   \
    "\"abcDEF123\"}]</s>"
#define MISTRAL_TOOL                                                                               \
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get "   \
    "the weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "            \
    "{\"type\": \"string\"}}, \"required\": [\"city\"]}}}]"

static void expect_prompt(enum chat_template t, const char *body, const char *want) {
    char *p = prompt_of(t, body);
    cr_expect_str_eq(p, want);
    free(p);
}

Test(serve_tools, mistral_v3_prompt_is_mistral_7b_v03s) {
    const char *want = "[INST] Weather in Paris?[/INST][TOOL_CALLS] [" MISTRAL_CALL
                       "[TOOL_RESULTS] {\"content\": {\"temp\": 21}, \"call_id\": \"abcDEF123\"}"
                       "[/TOOL_RESULTS][AVAILABLE_TOOLS] [" MISTRAL_TOOL "[/AVAILABLE_TOOLS]"
                       "[INST] You are helpful.\n\nAnd tomorrow?[/INST]";
    expect_prompt(CHAT_TMPL_MISTRAL_V3, MISTRAL_CHAT, want);
}

Test(serve_tools, mistral_v3_tekken_prompt_is_nemos) {
    const char *want = "[INST]Weather in Paris?[/INST][TOOL_CALLS][" MISTRAL_CALL
                       "[TOOL_RESULTS]{\"content\": {\"temp\": 21}, \"call_id\": \"abcDEF123\"}"
                       "[/TOOL_RESULTS][AVAILABLE_TOOLS][" MISTRAL_TOOL "[/AVAILABLE_TOOLS]"
                       "[INST]You are helpful.\n\nAnd tomorrow?[/INST]";
    expect_prompt(CHAT_TMPL_MISTRAL_V3_TEKKEN, MISTRAL_CHAT, want);
}

Test(serve_tools, mistral_v7_tekken_prompt_is_small_31s) {
    const char *want =
        "[SYSTEM_PROMPT]You are a helpful assistant that can call tools. If you call one or more "
        "tools, format them in a single JSON array or objects, where each object is a tool call, "
        "not as separate objects outside of an array or multiple arrays. Use the format "
        "[{\"name\": tool call name, \"arguments\": tool call arguments}, additional tool calls] "
        "if you call more than one tool. If you call tools, do not attempt to interpret them or "
        "otherwise provide a response until you receive a tool call result that you can "
        "interpret for the user.\n\nYou are helpful.[/SYSTEM_PROMPT][INST]Weather in "
        "Paris?[/INST][TOOL_CALLS] [" MISTRAL_CALL
        "[TOOL_RESULTS] {\"content\": {\"temp\": 21}, \"call_id\": \"abcDEF123\"}"
        "[/TOOL_RESULTS][AVAILABLE_TOOLS] [" MISTRAL_TOOL "[/AVAILABLE_TOOLS][INST]And "
        "tomorrow?[/INST]";
    expect_prompt(CHAT_TMPL_MISTRAL_V7_TEKKEN, MISTRAL_CHAT, want);
}

// Ids that are not 9 letters and digits (OpenAI's "call_..."): mapped to
// such, the same in the call and in its result, different for another id.
Test(serve_tools, mistral_ids_are_nine_alphanumerics_and_still_pair) {
    char *p = prompt_of(
        CHAT_TMPL_MISTRAL_V3,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}, {\"role\": "
        "\"assistant\", \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", "
        "\"function\": {\"name\": \"get_weather\", \"arguments\": \"{}\"}}, {\"id\": \"call_2\", "
        "\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": "
        "\"{}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"call_2\", \"content\": \"x\"}], "
        "\"tools\": [" WEATHER_TOOL "]}");
    const char *a = strstr(p, "\"id\": \""), *b = a ? strstr(a + 1, "\"id\": \"") : NULL;
    const char *r = strstr(p, "\"call_id\": \"");
    cr_assert(a && b && r, "%s", p);
    a += 7, b += 7, r += 12;
    for (int i = 0; i < 9; i++)
        cr_expect((a[i] >= '0' && a[i] <= '9') || ((a[i] | 0x20) >= 'a' && (a[i] | 0x20) <= 'z'),
                  "%s", p);
    cr_expect_eq(a[9], '"', "9 characters: %s", p);
    cr_expect(memcmp(a, b, 9) != 0, "call_1 and call_2 differ: %s", p);
    cr_expect(memcmp(b, r, 9) == 0, "the result names call_2's id: %s", p);
    free(p);
}

Test(serve_tools, mistral_results_need_their_call_id) {
    expect_render_400(CHAT_TMPL_MISTRAL_V3,
                      "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, "
                      "{\"role\": \"tool\", \"content\": \"21\"}], \"tools\": [" WEATHER_TOOL "]}",
                      "'messages[1].tool_call_id' is required");
}

Test(serve_tools, raw_text_only_where_the_template_takes_it) {
    const struct chat_msg m[] = {{CHAT_ROLE_RAW, "[X]"}, {"user", "hi"}};
    char *out = NULL;
    size_t len = 0;
    struct verr err = {0};
    cr_expect_eq(chat_format(CHAT_TMPL_CHATML, m, 2, NULL, true, &out, &len, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "'chatml' has no place for raw text") != NULL, "%s", err.msg);
    cr_assert_eq(chat_format(CHAT_TMPL_MISTRAL_V3, m, 2, NULL, true, &out, &len, &err), 0, "%s",
                 err.msg);
    cr_expect_str_eq(out, "[X][INST] hi[/INST]");
    free(out);
}

Test(serve_tools, mistral_answers_split) {
    struct split s = split_of(TOOLCALL_MISTRAL,
                              "Checking. [TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": "
                              "{\"city\": \"Paris\"}}, {\"name\": \"f\", \"arguments\": {}}]");
    cr_expect_eq(s.content_len, strlen("Checking."));
    cr_assert_eq(s.n, 2);
    cr_expect_str_eq(s.calls[0].name, "get_weather");
    cr_expect_str_eq(s.calls[0].arguments, "{\"city\":\"Paris\"}");
    cr_expect_str_eq(s.calls[1].name, "f");
    cr_expect_eq(strlen(s.calls[0].id), 9, "%s", s.calls[0].id);
    cr_expect_str_neq(s.calls[0].id, s.calls[1].id);
    api_tools_calls_free(s.calls, s.n);
    s = split_of(TOOLCALL_MISTRAL, "[TOOL_CALLS]{\"name\": \"f\", \"arguments\": {\"a\": 1}}");
    cr_expect_eq(s.n, 1, "one object after the marker");
    api_tools_calls_free(s.calls, s.n);
    s = split_of(TOOLCALL_MISTRAL, " [{\"name\": \"f\", \"arguments\": {}}]");
    cr_expect_eq(s.n, 1, "a bare array of calls (a forced call)");
    cr_expect_eq(s.content_len, 0);
    api_tools_calls_free(s.calls, s.n);
    const char *plain[] = {"[1, 2]",
                           "[]",
                           "[TOOL_CALLS] nonsense",
                           "{\"name\": \"f\"}",
                           "[link](http://x)",
                           "[TOOL_CALLS] [{\"arguments\": {}}]"};
    expect_content(TOOLCALL_MISTRAL, plain, sizeof plain / sizeof plain[0]);
}

Test(serve_tools, mistral_streaming_holds_back_only_what_may_be_a_call) {
    const char *t = "Sure. [TOOL_C";
    cr_expect_eq(toolcall_stream_safe(TOOLCALL_MISTRAL, t, strlen(t)), strlen("Sure. "));
    cr_expect_eq(toolcall_stream_safe(TOOLCALL_MISTRAL, " [", 2), 0);
    cr_expect_eq(toolcall_stream_safe(TOOLCALL_MISTRAL, "[ {\"na", 6), 0);
    t = "[link](x) and more";
    cr_expect_eq(toolcall_stream_safe(TOOLCALL_MISTRAL, t, strlen(t)), strlen(t));
    cr_expect_str_eq(toolcall_marker(TOOLCALL_MISTRAL), "[TOOL_CALLS]");
    cr_expect_null(toolcall_marker(TOOLCALL_HERMES));
}

// A request that forces a call of WEATHER_TOOL (tool_choice required).
static void parse_required(struct api_request *r, struct api_error *e) {
    cr_assert_eq(parse_chat("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                            "\"tools\": [" WEATHER_TOOL "], \"tool_choice\": \"required\"}",
                            r, e),
                 0, "%s", e->message);
}

// A forced call's grammar takes the array that follows [TOOL_CALLS], and
// what it takes parses back as the calls.
Test(serve_tools, mistral_forced_call_grammar_takes_an_array_of_calls) {
    struct api_request r;
    struct api_error e;
    parse_required(&r, &e);
    char *gbnf = NULL;
    cr_assert_eq(toolcall_grammar(CHAT_TMPL_MISTRAL_V3, &r, &gbnf, &e), 0, "%s", e.message);
    struct grammar *g = NULL;
    struct verr err = {0};
    cr_assert_eq(grammar_parse(&g, gbnf, strlen(gbnf), NULL, &err), 0, "%s\n%s", err.msg, gbnf);
    const char *ok[] = {"[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
                        "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}, "
                        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"B\"}}]"};
    for (size_t i = 0; i < 2; i++) {
        struct grammar_state *st = NULL;
        cr_assert_eq(grammar_state_new(&st, g, &err), 0, "%s", err.msg);
        cr_expect_eq(grammar_state_accept_bytes(st, ok[i], strlen(ok[i]), &err), 0, "'%s': %s\n%s",
                     ok[i], err.msg, gbnf);
        cr_expect(grammar_state_can_end(st), "'%s' is a whole answer", ok[i]);
        grammar_state_free(st);
        struct split s = split_of(TOOLCALL_MISTRAL, ok[i]);
        cr_expect_eq(s.n, (int)i + 1, "'%s' parses back", ok[i]);
        api_tools_calls_free(s.calls, s.n);
    }
    struct grammar_state *st = NULL;
    cr_assert_eq(grammar_state_new(&st, g, &err), 0, "%s", err.msg);
    const char *bad = "[{\"name\": \"other\"";
    cr_expect_neq(grammar_state_accept_bytes(st, bad, strlen(bad), &err), 0,
                  "a tool that is not offered");
    grammar_state_free(st);
    grammar_free(g);
    free(gbnf);
    api_request_free(&r);
}

// gpt-oss (harmony): the tools as the template's TypeScript namespace in the
// developer message, a call (its content as analysis, no later answer) and a
// result. The expected string was written by hand from
// tests/data/chat_templates/gpt-oss--openai-gpt-oss-120b.jinja and checked
// by rendering that template with Python's jinja2 (trim_blocks,
// lstrip_blocks; tojson as json.dumps), the date shown as YYYY-MM-DD: a
// string enum with its default, an integer default, a string array, a
// nested object (whose property types follow a line break and 16 spaces in
// the template), a type list, a tool without parameters.
#define GPT_OSS_TOOLS                                                                              \
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get "  \
    "the weather of a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "  \
    "{\"type\": \"string\", \"description\": \"The city\"}, \"unit\": {\"type\": \"string\", "     \
    "\"enum\": [\"c\", \"f\"], \"default\": \"c\"}, \"days\": {\"type\": \"integer\", "            \
    "\"default\": 1}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}, "        \
    "\"opts\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"boolean\"}, \"b\": "    \
    "{\"type\": [\"string\", \"null\"]}}, \"required\": [\"a\"]}}, \"required\": [\"city\"]}}}, "  \
    "{\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"The time\", "   \
    "\"parameters\": {\"type\": \"object\", \"properties\": {}}}}]"

Test(serve_tools, gpt_oss_prompt_is_its_templates) {
    char *p = prompt_of(
        CHAT_TMPL_GPT_OSS,
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
        "\"content\": \"Weather in Paris?\"}, {\"role\": \"assistant\", \"content\": \"Need the "
        "weather.\", \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": "
        "{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\":\\\"Paris\\\"}\"}}]}, "
        "{\"role\": \"tool\", \"content\": \"{\\\"t\\\": 21}\"}, {\"role\": \"user\", "
        "\"content\": \"Thanks\"}], \"tools\": " GPT_OSS_TOOLS "}");
    char *d = strstr(p, "Current date: ");
    cr_assert_not_null(d);
    memcpy(d + strlen("Current date: "), "YYYY-MM-DD", 10);
    const char *want =
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\nCurrent date: YYYY-MM-DD\n\nReasoning: medium\n\n# Valid "
        "channels: analysis, commentary, final. Channel must be included for every message.\n"
        "Calls to these tools must go to the commentary channel: 'functions'.<|end|><|start|>"
        "developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\nnamespace "
        "functions {\n\n// Get the weather of a city\ntype get_weather = (_: {\n// The city\ncity: "
        "string,\nunit?: \"c\" | \"f\", // default: c,\ndays?: number, // default: 1,\ntags?: "
        "string[],\nopts?: {\na: \n                boolean, b?: \n                string | null},"
        "\n}) => any;\n\n// The time\ntype now = () => any;\n\n} // namespace functions<|end|>"
        "<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant<|channel|>analysis"
        "<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>"
        "commentary json<|message|>{\"city\": \"Paris\"}<|call|><|start|>functions.get_weather "
        "to=assistant<|channel|>commentary<|message|>\"{\\\"t\\\": 21}\"<|end|><|start|>user"
        "<|message|>Thanks<|end|><|start|>assistant";
    cr_expect_str_eq(p, want);
    free(p);
}

// A later answer drops a call's analysis (the template keeps it only while
// no answer follows); a result needs a call before it; oneOf and forced
// calls are refused by name.
Test(serve_tools, gpt_oss_rules_and_refusals) {
    char *p = prompt_of(
        CHAT_TMPL_GPT_OSS,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", "
        "\"content\": \"Thinking\", \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", "
        "\"function\": {\"name\": \"now\", \"arguments\": \"{}\"}}]}, {\"role\": \"tool\", "
        "\"content\": \"noon\"}, {\"role\": \"assistant\", \"content\": \"It is noon.\"}, "
        "{\"role\": \"user\", \"content\": \"Ok\"}], \"tools\": " GPT_OSS_TOOLS "}");
    const char *tail =
        "<|start|>user<|message|>Hi<|end|><|start|>assistant to=functions.now<|channel|>commentary "
        "json<|message|>{}<|call|><|start|>functions.now to=assistant<|channel|>commentary"
        "<|message|>\"noon\"<|end|><|start|>assistant<|channel|>final<|message|>It is noon.<|end|>"
        "<|start|>user<|message|>Ok<|end|><|start|>assistant";
    cr_expect(strlen(p) > strlen(tail) && !strcmp(p + strlen(p) - strlen(tail), tail), "%s", p);
    free(p);
    // llama-server's reasoning_content of a call's message is its analysis
    // (llama.cpp passes it as the template's "thinking").
    p = prompt_of(CHAT_TMPL_GPT_OSS,
                  "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": "
                  "\"assistant\", \"content\": null, \"reasoning_content\": \"Check the time.\", "
                  "\"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": "
                  "{\"name\": \"now\", \"arguments\": \"{}\"}}]}], \"tools\": " GPT_OSS_TOOLS "}");
    tail = "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>analysis<|message|>Check "
           "the time.<|end|><|start|>assistant to=functions.now<|channel|>commentary json"
           "<|message|>{}<|call|><|start|>assistant";
    cr_expect(strlen(p) > strlen(tail) && !strcmp(p + strlen(p) - strlen(tail), tail), "%s", p);
    free(p);
    expect_render_400(CHAT_TMPL_GPT_OSS,
                      "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}], \"tools\": "
                      "[" WEATHER_TOOL "]}",
                      "tool call before it");
    expect_render_400(CHAT_TMPL_GPT_OSS,
                      "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": "
                      "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
                      "{\"type\": \"object\", \"properties\": {\"v\": {\"oneOf\": [{\"type\": "
                      "\"string\"}, {\"type\": \"number\"}]}}}}}]}",
                      "oneOf");
    struct api_request r;
    struct api_error e;
    parse_required(&r, &e);
    char *g = NULL;
    cr_expect_eq(toolcall_grammar(CHAT_TMPL_GPT_OSS, &r, &g, &e), -1);
    cr_expect(e.status == 400 && strstr(e.message, "gpt-oss"), "%s", e.message);
    api_request_free(&r);
}
