// The OpenAI request parser and response writer of `vela serve`
// (tools/serve/api.h): well-formed requests with their defaults, every kind
// of bad field answered with 400 naming it, UTF-8 validation, the error
// shape, whole responses and SSE chunks as the OpenAI API defines them.
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "tools/serve/api.h"

static int parse(enum api_kind k, const char *body, struct api_request *r, struct api_error *e) {
    memset(e, 0, sizeof *e);
    return api_parse_request(k, body, strlen(body), NULL, r, e);
}

Test(serve_api, completion_defaults_follow_openai) {
    struct api_request r;
    struct api_error e;
    cr_assert_eq(parse(API_COMPLETION, "{\"prompt\": \"hi\"}", &r, &e), 0, "%s", e.message);
    cr_expect_str_eq(r.prompt, "hi");
    cr_expect_eq(r.max_tokens, 16, "OpenAI's default for completions");
    cr_expect_float_eq(r.temperature, 1.0f, 0);
    cr_expect_float_eq(r.top_p, 1.0f, 0);
    cr_expect_eq(r.top_k, 0);
    cr_expect_eq(r.n, 1);
    cr_expect(!r.stream && !r.logprobs && !r.has_seed && r.n_stop == 0);
    cr_expect_eq(r.grp_attn_n, 1);
    api_request_free(&r);
    cr_assert_eq(
        parse(API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", &r, &e), 0,
        "%s", e.message);
    cr_expect_eq(r.max_tokens, -1, "chat: until a stop or the context is full");
    cr_expect_eq(r.n_messages, 1);
    cr_expect_str_eq(r.messages[0].role, "user");
    cr_expect_str_eq(r.messages[0].content, "x");
    api_request_free(&r);
}

Test(serve_api, every_field_is_read) {
    const char *body =
        "{\"model\": \"m\", \"prompt\": [1, 2, 3], \"max_tokens\": 7, \"temperature\": 0.5,"
        " \"top_p\": 0.9, \"top_k\": 40, \"min_p\": 0.05, \"presence_penalty\": 0.5,"
        " \"frequency_penalty\": -0.5, \"seed\": 1234, \"stop\": [\"a\", \"bc\"], \"n\": 3,"
        " \"stream\": true, \"stream_options\": {\"include_usage\": true}, \"logprobs\": 2,"
        " \"n_keep\": 5, \"grp_attn_n\": 4, \"grp_attn_w\": 256, \"ignore_eos\": true,"
        " \"unknown_field\": {\"is\": \"ignored\"}, \"user\": \"x\"}";
    struct api_request r;
    struct api_error e;
    cr_assert_eq(parse(API_COMPLETION, body, &r, &e), 0, "%s", e.message);
    cr_expect_str_eq(r.model, "m");
    cr_expect_eq(r.n_prompt_tokens, 3);
    cr_expect_eq(r.prompt_tokens[2], 3);
    cr_expect_eq(r.max_tokens, 7);
    cr_expect_float_eq(r.temperature, 0.5f, 0);
    cr_expect_float_eq(r.top_p, 0.9f, 1e-7);
    cr_expect_eq(r.top_k, 40);
    cr_expect_float_eq(r.min_p, 0.05f, 1e-7);
    cr_expect_float_eq(r.frequency_penalty, -0.5f, 0);
    cr_expect(r.has_seed && r.seed == 1234);
    cr_expect_eq(r.n_stop, 2);
    cr_expect_str_eq(r.stop[1], "bc");
    cr_expect_eq(r.n, 3);
    cr_expect(r.stream && r.include_usage && r.logprobs);
    cr_expect_eq(r.top_logprobs, 2);
    cr_expect(r.has_n_keep && r.n_keep == 5);
    cr_expect_eq(r.grp_attn_n, 4);
    cr_expect_eq(r.grp_attn_w, 256);
    cr_expect(r.ignore_eos);
    api_request_free(&r);
}

Test(serve_api, chat_content_parts_and_max_completion_tokens) {
    const char *body = "{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"},"
                       " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"},"
                       " {\"type\": \"text\", \"text\": \"b\"}]},"
                       " {\"role\": \"assistant\", \"content\": null}],"
                       " \"max_completion_tokens\": 9, \"logprobs\": true, \"top_logprobs\": 3}";
    struct api_request r;
    struct api_error e;
    cr_assert_eq(parse(API_CHAT, body, &r, &e), 0, "%s", e.message);
    cr_expect_eq(r.n_messages, 3);
    cr_expect_str_eq(r.messages[1].content, "ab");
    cr_expect_str_eq(r.messages[2].content, "");
    cr_expect_eq(r.max_tokens, 9);
    cr_expect(r.logprobs);
    cr_expect_eq(r.top_logprobs, 3);
    api_request_free(&r);
}

struct bad_case {
    enum api_kind k;
    const char *body, *want; // want: a part of the 400's message
};

// Each case is refused with a 400 whose message holds its `want`, and the
// refused request holds nothing.
static void expect_refused(const struct bad_case *cases, size_t n) {
    for (size_t i = 0; i < n; i++) {
        struct api_request r;
        struct api_error e;
        cr_expect_eq(parse(cases[i].k, cases[i].body, &r, &e), -1, "case %zu accepted: %s", i,
                     cases[i].body);
        cr_expect_eq(e.status, 400, "case %zu: status %d", i, e.status);
        cr_expect(strstr(e.message, cases[i].want), "case %zu: '%s' lacks '%s'", i, e.message,
                  cases[i].want);
        cr_expect_null(r.prompt, "case %zu: a refused request holds nothing", i);
    }
}

// Each bad body gets a 400 whose message names what is wrong.
Test(serve_api, bad_fields_are_400_naming_the_field) {
    static const struct bad_case cases[] = {
        {API_COMPLETION, "", "not valid JSON"},
        {API_COMPLETION, "{\"prompt\": \"x\"", "not valid JSON"},
        {API_COMPLETION, "[1, 2]", "JSON object"},
        {API_COMPLETION, "{\"prompt\": \"x\"} trailing", "not valid JSON"},
        {API_COMPLETION, "{\"prompt\": \"x\"}{}", "not valid JSON"},
        {API_COMPLETION, "{}", "'prompt' is required"},
        {API_COMPLETION, "{\"prompt\": 5}", "'prompt' must be"},
        {API_COMPLETION, "{\"prompt\": []}", "'prompt' is empty"},
        {API_COMPLETION, "{\"prompt\": [1, -2]}", "token ids"},
        {API_COMPLETION, "{\"prompt\": [1.5]}", "token ids"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": -1}", "'max_tokens'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": 1e300}", "'max_tokens'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": \"10\"}", "'max_tokens' must be"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": 2.5}", "integer"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"temperature\": 3}", "'temperature'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"temperature\": true}", "'temperature'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"top_p\": 1.5}", "'top_p'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"top_k\": -1}", "'top_k'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"presence_penalty\": 9}", "'presence_penalty'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"n\": 0}", "'n'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"n\": 1000}", "'n'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"stop\": 3}", "'stop'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"stop\": [\"\"]}", "'stop'"},
        {API_COMPLETION,
         "{\"prompt\": \"x\", \"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}",
         "'stop' has more"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"stream\": \"yes\"}", "'stream'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"echo\": true}", "'echo'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": 9}", "'logprobs'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"seed\": \"s\"}", "'seed'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"model\": 3}", "'model'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"grp_attn_n\": 0}", "'grp_attn_n'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"cache_prompt\": 1}", "'cache_prompt'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"self_extend\": 4}", "'self_extend' must be"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"self_extend\": {\"n\": 4}}",
         "'self_extend.w' is required"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"self_extend\": {\"w\": 4}}",
         "'self_extend.n' is required"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"self_extend\": {\"n\": 0, \"w\": 4}}",
         "'self_extend.n' is 0"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"self_extend\": {\"n\": 4, \"w\": -1}}",
         "'self_extend.w' is -1"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"self_extend\": {\"n\": 2.5, \"w\": 4}}",
         "'self_extend.n' must be an integer"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"self_extend\": {\"n\": \"2\", \"w\": 4}}",
         "'self_extend.n' must be an integer"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"self_extend\": {\"n\": 2, \"w\": 4, \"g\": 2}}",
         "'self_extend.g' is not known"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"stream_options\": 1}", "'stream_options'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"speculative\": 4}", "'speculative' must be"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"speculative\": {\"type\": \"eagle\"}}",
         "'speculative.type' must be"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"speculative\": {\"n_max\": 0}}",
         "'speculative.n_max' is 0"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"speculative\": {\"n_max\": 2.5}}",
         "'speculative.n_max' must be an integer"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"speculative\": {\"p_min\": 2}}",
         "'speculative.p_min' is 2"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"speculative\": {\"n_max\": 4, \"n_min\": 5}}",
         "'speculative.n_min' 5 is above n_max 4"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"speculative\": {\"nmax\": 4}}",
         "'speculative.nmax' is not known"},
        // cJSON refuses a lone surrogate escape as JSON: a 400 either way.
        {API_COMPLETION, "{\"prompt\": \"\\ud800\"}", "not valid"},
        {API_CHAT, "{\"messages\": []}", "'messages'"},
        {API_CHAT, "{\"messages\": \"hi\"}", "'messages'"},
        {API_CHAT, "{\"messages\": [1]}", "'messages[0]'"},
        {API_CHAT, "{\"messages\": [{\"content\": \"x\"}]}", "'messages[0].role'"},
        {API_CHAT, "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}", "robot"},
        {API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "content"},
        {API_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
         "'text'"},
        {API_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2}",
         "'logprobs': true"},
        {API_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
         "{\"type\": \"xml\"}}",
         "'response_format' has type 'xml'"},
    };
    expect_refused(cases, sizeof cases / sizeof cases[0]);
}

Test(serve_api, invalid_utf8_bodies_are_refused) {
    const char bad[] = "{\"prompt\": \"a\xC3\x28\"}"; // C3 then a non-continuation byte
    struct api_request r;
    struct api_error e;
    cr_expect_eq(api_parse_request(API_COMPLETION, bad, sizeof bad - 1, NULL, &r, &e), -1);
    cr_expect(strstr(e.message, "UTF-8"), "%s", e.message);
    const struct {
        const char *s;
        bool ok;
    } u[] = {
        {"plain", true},
        {"\xC3\xA9", true},
        {"\xE2\x82\xAC", true},
        {"\xF0\x9F\x98\x80", true},
        {"\xC0\xAF", false},         // overlong '/'
        {"\xED\xA0\x80", false},     // a surrogate
        {"\xF4\x90\x80\x80", false}, // past U+10FFFF
        {"\xE2\x82", false},         // cut short
        {"\xFF", false},
    };
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++)
        cr_expect_eq(api_utf8_valid(u[i].s, strlen(u[i].s)), u[i].ok, "case %zu", i);
}

Test(serve_api, error_json_has_openai_shape) {
    struct api_error e;
    api_fail(&e, 400, "invalid_request_error", "context_length_exceeded", "too long: %d", 9);
    char *s = api_error_json(&e);
    cJSON *o = cJSON_Parse(s);
    cr_assert_not_null(o, "%s", s);
    cJSON *in = cJSON_GetObjectItem(o, "error");
    cr_expect_str_eq(cJSON_GetObjectItem(in, "message")->valuestring, "too long: 9");
    cr_expect_str_eq(cJSON_GetObjectItem(in, "type")->valuestring, "invalid_request_error");
    cr_expect_str_eq(cJSON_GetObjectItem(in, "code")->valuestring, "context_length_exceeded");
    cr_expect(cJSON_IsNull(cJSON_GetObjectItem(in, "param")));
    cJSON_Delete(o);
    free(s);
}

// A generated NUL byte is text like any other: written as \u0000, with
// what follows it, in answers and in stream chunks (cJSON's strings end at a
// NUL: the text was cut there).
Test(serve_api, nul_bytes_in_text) {
    static const char text[] = {'a', '\0', 'b', '"', '\0', '\0', 'c'};
    struct api_choice ch = {.text = text, .len = sizeof text, .finish = "stop"};
    struct api_usage u = {.prompt_tokens = 1, .completion_tokens = 3};
    char *s = api_response_json(API_COMPLETION, "cmpl-1", "m", 42, &ch, 1, &u);
    cr_assert_not_null(strstr(s, "\"a\\u0000b\\\"\\u0000\\u0000c\""), "%s", s);
    cJSON *o = cJSON_Parse(s);
    cr_assert_not_null(o, "valid JSON: %s", s);
    cJSON_Delete(o);
    free(s);
    struct api_choice d = {.text = text, .len = 2};
    s = api_chunk_sse(API_CHAT, "chatcmpl-1", "m", 42, 0, &d, true, NULL);
    cr_expect_not_null(strstr(s, "\"content\":\"a\\u0000\""), "%s", s);
    free(s);
}

Test(serve_api, response_and_chunks) {
    struct api_choice ch[2] = {{.text = "hello", .len = 5, .finish = "stop"},
                               {.text = "hi there", .len = 2, .finish = "length"}};
    struct api_usage u = {.prompt_tokens = 3, .completion_tokens = 4};
    char *s = api_response_json(API_CHAT, "chatcmpl-1", "m", 42, ch, 2, &u);
    cJSON *o = cJSON_Parse(s);
    cr_assert_not_null(o, "%s", s);
    cr_expect_str_eq(cJSON_GetObjectItem(o, "object")->valuestring, "chat.completion");
    cJSON *c1 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 1);
    cr_expect_eq(cJSON_GetObjectItem(c1, "index")->valueint, 1);
    cJSON *msg = cJSON_GetObjectItem(c1, "message");
    cr_expect_str_eq(cJSON_GetObjectItem(msg, "role")->valuestring, "assistant");
    cr_expect_str_eq(cJSON_GetObjectItem(msg, "content")->valuestring, "hi", "len, not strlen");
    cr_expect_str_eq(cJSON_GetObjectItem(c1, "finish_reason")->valuestring, "length");
    cr_expect_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "total_tokens")->valueint, 7);
    cJSON_Delete(o);
    free(s);

    // A stream chunk is one SSE event: "data: " + JSON + a blank line.
    struct api_choice d = {.text = "x\ny", .len = 3};
    s = api_chunk_sse(API_CHAT, "chatcmpl-1", "m", 42, 0, &d, true, NULL);
    size_t n = strlen(s);
    cr_assert(!strncmp(s, "data: {", 7), "%s", s);
    cr_assert(n > 9 && strchr(s, '\n') == s + n - 2 && s[n - 1] == '\n',
              "one line of JSON then a blank line: %s", s);
    o = cJSON_ParseWithLength(s + 6, n - 8);
    cr_assert_not_null(o);
    cr_expect_str_eq(cJSON_GetObjectItem(o, "object")->valuestring, "chat.completion.chunk");
    cJSON *delta =
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "delta");
    cr_expect_str_eq(cJSON_GetObjectItem(delta, "role")->valuestring, "assistant");
    cr_expect_str_eq(cJSON_GetObjectItem(delta, "content")->valuestring, "x\ny");
    cJSON_Delete(o);
    free(s);
    // The usage chunk has no choices.
    s = api_chunk_sse(API_COMPLETION, "cmpl-1", "m", 42, 0, NULL, false, &u);
    o = cJSON_ParseWithLength(s + 6, strlen(s) - 8);
    cr_assert_not_null(o);
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "choices")), 0);
    cr_expect_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "prompt_tokens")->valueint,
                 3);
    cJSON_Delete(o);
    free(s);
    cr_expect_str_eq(api_sse_done, "data: [DONE]\n\n");
}

Test(serve_api, cache_prompt_and_self_extend_are_read) {
    struct api_request r;
    struct api_error e;
    cr_assert_eq(parse(API_COMPLETION, "{\"prompt\": \"x\"}", &r, &e), 0, "%s", e.message);
    cr_expect(r.cache_prompt, "llama-server's default: on");
    cr_expect_eq(r.se_n, 0, "no self_extend given");
    api_request_free(&r);
    cr_assert_eq(parse(API_CHAT,
                       "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
                       " \"cache_prompt\": false, \"self_extend\": {\"w\": 1024, \"n\": 4}}",
                       &r, &e),
                 0, "%s", e.message);
    cr_expect(!r.cache_prompt);
    cr_expect_eq(r.se_n, 4);
    cr_expect_eq(r.se_w, 1024);
    api_request_free(&r);
    cr_assert_eq(parse(API_COMPLETION, "{\"prompt\": \"x\", \"self_extend\": null}", &r, &e), 0,
                 "%s", e.message);
    cr_expect_eq(r.se_n, 0, "null: not given");
    api_request_free(&r);
}

// api_check_context on a request of n_prompt tokens; returns the status (0: accepted).
static int check(const char *body, int n_prompt, const struct api_ctx_limits *l, int *max_gen,
                 struct api_error *e) {
    struct api_request r;
    cr_assert_eq(parse(API_COMPLETION, body, &r, e), 0, "%s", e->message);
    memset(e, 0, sizeof *e);
    int rc = api_check_context(&r, n_prompt, l, max_gen, e);
    api_request_free(&r);
    cr_assert_eq(rc == 0, e->status == 0);
    return e->status;
}

Test(serve_api, context_fields_are_checked_against_the_server) {
    struct api_error e;
    int max_gen = 0;
    // A rotated cache (no --self-extend): llama.cpp's grp_attn_* is the engine's to check;
    // self_extend cannot run.
    const struct api_ctx_limits rotated = {.n_ctx_slot = 256, .n_ctx_train = 512, .se_g = 0};
    cr_expect_eq(check("{\"prompt\": \"x\", \"grp_attn_n\": 2, \"grp_attn_w\": 64}", 100, &rotated,
                       &max_gen, &e),
                 0, "%s", e.message);
    cr_expect_eq(max_gen, -1);
    cr_expect_eq(check("{\"prompt\": \"x\", \"self_extend\": {\"n\": 4, \"w\": 32}}", 10, &rotated,
                       &max_gen, &e),
                 400);
    cr_expect(strstr(e.message, "--self-extend G W or --kv-unrotated"), "%s", e.message);
    cr_expect_str_eq(e.code, "invalid_value");
    // n = 1 (off) runs anywhere.
    cr_expect_eq(check("{\"prompt\": \"x\", \"self_extend\": {\"n\": 1, \"w\": 1}}", 10, &rotated,
                       &max_gen, &e),
                 0, "%s", e.message);

    // --self-extend 4 32 on a model trained for 128 tokens: (128 - 32) * 4 + 32 = 416.
    const struct api_ctx_limits se = {
        .n_ctx_slot = 600, .n_ctx_train = 128, .se_g = 4, .se_w = 32, .k_unrotated = true};
    cr_expect_eq(check("{\"prompt\": \"x\"}", 200, &se, &max_gen, &e), 0, "%s", e.message);
    cr_expect_eq(max_gen, 216, "the extended context (416, below the slot's 600) ends it");
    cr_expect_eq(check("{\"prompt\": \"x\", \"self_extend\": {\"n\": 4, \"w\": 32}}", 200, &se,
                       &max_gen, &e),
                 0, "the server's own values: %s", e.message);
    // A request's own values: (128 - 32) * 2 + 32 = 224, (128 - 16) * 4 + 16 = 464.
    cr_expect_eq(check("{\"prompt\": \"x\", \"self_extend\": {\"n\": 2, \"w\": 32}}", 200, &se,
                       &max_gen, &e),
                 0, "%s", e.message);
    cr_expect_eq(max_gen, 24);
    cr_expect_eq(check("{\"prompt\": \"x\", \"self_extend\": {\"n\": 4, \"w\": 16}}", 200, &se,
                       &max_gen, &e),
                 0, "%s", e.message);
    cr_expect_eq(max_gen, 264);
    cr_expect_eq(check("{\"prompt\": \"x\", \"self_extend\": {\"n\": 2, \"w\": 32}}", 221, &se,
                       &max_gen, &e),
                 400, "224 holds 220 prompt tokens and 4 more, not 221");
    cr_expect(strstr(e.message, "n = 2, w = 32") && strstr(e.message, "224"), "%s", e.message);
    cr_expect_eq(
        check("{\"prompt\": \"x\", \"self_extend\": {\"n\": 1, \"w\": 1}}", 200, &se, &max_gen, &e),
        0, "off for this request: %s", e.message);
    cr_expect_eq(max_gen, -1);
    cr_expect_eq(check("{\"prompt\": \"x\", \"grp_attn_n\": 2}", 200, &se, &max_gen, &e), 400);
    cr_expect(strstr(e.message, "exclude each other"), "%s", e.message);
    cr_expect_eq(check("{\"prompt\": \"x\", \"grp_attn_n\": 2, \"self_extend\": {\"n\": 1, "
                       "\"w\": 1}}",
                       100, &se, &max_gen, &e),
                 0, "llama.cpp's self-extend once the exact one is off: %s", e.message);

    // --kv-unrotated alone: no exact self-extend unless a request asks.
    const struct api_ctx_limits unrot = {
        .n_ctx_slot = 600, .n_ctx_train = 128, .se_g = 0, .k_unrotated = true};
    cr_expect_eq(check("{\"prompt\": \"x\"}", 200, &unrot, &max_gen, &e), 0, "%s", e.message);
    cr_expect_eq(max_gen, -1);
    cr_expect_eq(check("{\"prompt\": \"x\", \"self_extend\": {\"n\": 4, \"w\": 32}}", 200, &unrot,
                       &max_gen, &e),
                 0, "%s", e.message);
    cr_expect_eq(max_gen, 216);
    cr_expect_eq(check("{\"prompt\": \"x\", \"self_extend\": {\"n\": 4, \"w\": 600}}", 20, &unrot,
                       &max_gen, &e),
                 400);
    cr_expect(strstr(e.message, "not below the slot's context of 600"), "%s", e.message);
    // The prompt and 4 more tokens must fit the extended context.
    cr_expect_eq(check("{\"prompt\": \"x\"}", 412, &se, &max_gen, &e), 0, "%s", e.message);
    cr_expect_eq(max_gen, 4);
    cr_expect_eq(check("{\"prompt\": \"x\"}", 413, &se, &max_gen, &e), 400);
    cr_expect_str_eq(e.code, "context_length_exceeded");
    cr_expect_str_eq(e.type, "invalid_request_error");
    cr_expect(strstr(e.message, "413 tokens, max 412") && strstr(e.message, "416") &&
                  strstr(e.message, "128"),
              "the sizes: %s", e.message);
    // A slot smaller than the extended context: the engine's slot limit applies.
    const struct api_ctx_limits small = {
        .n_ctx_slot = 300, .n_ctx_train = 128, .se_g = 4, .se_w = 32, .k_unrotated = true};
    cr_expect_eq(check("{\"prompt\": \"x\"}", 200, &small, &max_gen, &e), 0, "%s", e.message);
    cr_expect_eq(max_gen, -1);
    // W not below the slot's context, or not below the trained one.
    const struct api_ctx_limits tight = {
        .n_ctx_slot = 32, .n_ctx_train = 128, .se_g = 4, .se_w = 32, .k_unrotated = true};
    cr_expect_eq(check("{\"prompt\": \"x\"}", 8, &tight, &max_gen, &e), 400);
    cr_expect(strstr(e.message, "not below the slot's context of 32"), "%s", e.message);
    const struct api_ctx_limits wide = {
        .n_ctx_slot = 4096, .n_ctx_train = 128, .se_g = 4, .se_w = 128, .k_unrotated = true};
    cr_expect_eq(check("{\"prompt\": \"x\"}", 8, &wide, &max_gen, &e), 400);
    cr_expect(strstr(e.message, "below the trained context 128"), "%s", e.message);
}

Test(serve_api, usage_reports_cached_tokens_and_timings) {
    struct api_choice ch = {.text = "a", .len = 1, .finish = "length"};
    struct api_usage u = {.prompt_tokens = 30,
                          .completion_tokens = 4,
                          .cached_tokens = 29,
                          .timings = true,
                          .prompt_n = 1,
                          .prompt_ms = 2,
                          .predicted_ms = 8};
    char *s = api_response_json(API_COMPLETION, "cmpl-1", "m", 1, &ch, 1, &u);
    cJSON *o = cJSON_Parse(s);
    cr_assert_not_null(o, "%s", s);
    cJSON *us = cJSON_GetObjectItem(o, "usage");
    cr_expect_eq(
        cJSON_GetObjectItem(cJSON_GetObjectItem(us, "prompt_tokens_details"), "cached_tokens")
            ->valueint,
        29, "OpenAI's usage.prompt_tokens_details.cached_tokens");
    cJSON *t = cJSON_GetObjectItem(o, "timings");
    cr_assert_not_null(t, "llama-server's timings: %s", s);
    cr_expect_eq(cJSON_GetObjectItem(t, "cache_n")->valueint, 29);
    cr_expect_eq(cJSON_GetObjectItem(t, "prompt_n")->valueint, 1);
    cr_expect_eq(cJSON_GetObjectItem(t, "predicted_n")->valueint, 4);
    cr_expect_float_eq(cJSON_GetObjectItem(t, "predicted_per_second")->valuedouble, 500.0, 1e-9);
    cJSON_Delete(o);
    free(s);
    // Without timings (u.timings false) only the usage object.
    u.timings = false;
    s = api_chunk_sse(API_COMPLETION, "cmpl-1", "m", 1, 0, NULL, false, &u);
    o = cJSON_ParseWithLength(s + 6, strlen(s) - 8);
    cr_assert_not_null(o);
    cr_expect_null(cJSON_GetObjectItem(o, "timings"));
    cr_expect_not_null(
        cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "prompt_tokens_details"));
    cJSON_Delete(o);
    free(s);
}

// llama-server's fields that vela's sampler honours are read; the ones it
// cannot honour yet are refused with a 400 naming them, never ignored.
Test(serve_api, llama_server_sampling_fields_are_read) {
    struct api_request r;
    struct api_error e;
    cr_assert_eq(parse(API_COMPLETION,
                       "{\"prompt\": \"x\", \"n_predict\": 9, \"max_tokens\": 3, "
                       "\"repeat_penalty\": 1.3, \"repeat_last_n\": -1, \"typical_p\": 1, "
                       "\"mirostat\": 0, \"mirostat_tau\": 5, \"mirostat_eta\": 0.1, "
                       "\"logit_bias\": {}, \"tools\": [], \"tool_choice\": \"none\", "
                       "\"grammar\": \"\", \"json_schema\": null}",
                       &r, &e),
                 0, "%s", e.message);
    cr_expect_eq(r.max_tokens, 9, "n_predict wins over max_tokens, as in llama-server");
    cr_expect_float_eq(r.repeat_penalty, 1.3f, 1e-7);
    cr_expect_eq(r.repeat_last_n, -1);
    api_request_free(&r);
    cr_assert_eq(parse(API_COMPLETION, "{\"prompt\": \"x\", \"n_predict\": -1}", &r, &e), 0, "%s",
                 e.message);
    cr_expect_eq(r.max_tokens, -1, "n_predict -1: until a stop");
    cr_expect_float_eq(r.repeat_penalty, 1.0f, 0, "off unless asked");
    cr_expect_eq(r.repeat_last_n, 64);
    api_request_free(&r);
}

// logit_bias in OpenAI's shape (an object of token ids) and llama-server's
// (pairs of a token id or a text and a bias, false: never); a bad entry is a
// 400 that names it.
Test(serve_api, logit_bias_both_shapes) {
    struct api_request r;
    struct api_error e;
    cr_assert_eq(parse(API_COMPLETION,
                       "{\"prompt\": \"x\", \"logit_bias\": {\"28\": -100, \"7\": 2.5}}", &r, &e),
                 0, "%s", e.message);
    cr_assert_eq(r.n_bias, 2);
    cr_expect_eq(r.bias[0].token, 28);
    cr_expect_float_eq(r.bias[0].bias, -100.0f, 0);
    cr_expect_eq(r.bias[1].token, 7);
    cr_expect_float_eq(r.bias[1].bias, 2.5f, 0);
    cr_expect_null(r.bias[1].text);
    api_request_free(&r);
    cr_assert_eq(parse(API_CHAT,
                       "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                       "\"logit_bias\": [[15043, 1], [\"Hello\", false]]}",
                       &r, &e),
                 0, "%s", e.message);
    cr_assert_eq(r.n_bias, 2);
    cr_expect_eq(r.bias[0].token, 15043);
    cr_expect_float_eq(r.bias[0].bias, 1.0f, 0);
    cr_expect_eq(r.bias[1].token, -1);
    cr_expect_str_eq(r.bias[1].text, "Hello");
    cr_expect(isinf(r.bias[1].bias) && r.bias[1].bias < 0, "false: never");
    api_request_free(&r);
    cr_assert_eq(parse(API_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": null}", &r, &e), 0);
    cr_expect_eq(r.n_bias, 0);
    api_request_free(&r);
    static const struct bad_case bad[] = {
        {API_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": 3}", "'logit_bias' must be"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"abc\": 1}}",
         "'logit_bias' key 'abc'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"-1\": 1}}",
         "'logit_bias' key '-1'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"5\": \"a\"}}",
         "'logit_bias' entry 0: the bias must be"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"5\": true}}",
         "'logit_bias' entry 0: the bias must be"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": [[5]]}",
         "'logit_bias' entry 0: a pair"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": [[1, 2], [1.5, 2]]}",
         "'logit_bias' entry 1: the token must be"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": [[\"\", 2]]}",
         "'logit_bias' entry 0: the text must be non-empty"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": [[3, 1e9]]}",
         "'logit_bias' entry 0: the bias must be"},
    };
    expect_refused(bad, sizeof bad / sizeof bad[0]);
}

Test(serve_api, fields_vela_cannot_honour_are_refused_by_name) {
    static const struct bad_case cases[] = {
        {API_COMPLETION,
         "{\"prompt\": \"x\", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
         "\"f\"}}]}",
         "'tools' is a field of /v1/chat/completions"},
        {API_COMPLETION,
         "{\"prompt\": \"x\", \"json_schema\": {\"type\": \"object\", \"properties\": "
         "{\"n\": {\"type\": \"number\", \"multipleOf\": 2}}}}",
         "'json_schema': /properties/n: keyword 'multipleOf' is not supported"},
        {API_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
         "{\"type\": \"json_schema\", \"json_schema\": {}}}",
         "'response_format.json_schema' must be an object with a 'schema'"},
        {API_COMPLETION,
         "{\"prompt\": \"x\", \"grammar\": \"root ::= [a-z]+\", \"json_schema\": {}}",
         "give one of 'grammar', 'json_schema' and 'response_format'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"grammar\": 3}", "'grammar' must be a string"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"typical_p\": 0.5}",
         "'typical_p' 0.5 is not supported yet"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"mirostat\": 2}", "'mirostat' 2 is not supported"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"mirostat_tau\": \"5\"}", "'mirostat_tau'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"repeat_penalty\": 0}", "'repeat_penalty'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"repeat_penalty\": \"1\"}", "'repeat_penalty'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"repeat_last_n\": -2}", "'repeat_last_n'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"n_predict\": -2}", "'n_predict'"},
        {API_COMPLETION, "{\"prompt\": \"x\", \"n_predict\": 1.5}", "'n_predict' must be"},
    };
    expect_refused(cases, sizeof cases / sizeof cases[0]);
}

// The server's defaults (--temp ... -n) fill what a request leaves out; a
// request's own values win, and -n caps max_tokens / n_predict.
Test(serve_api, server_defaults_fill_what_a_request_leaves_out) {
    struct api_defaults d;
    api_defaults_openai(&d);
    d.temperature = 0.8f;
    d.top_k = 40;
    d.top_p = 0.95f;
    d.min_p = 0.05f;
    d.repeat_penalty = 1.1f;
    d.seed = 7;
    d.n_predict = 32;
    struct api_request r;
    struct api_error e = {0};
    const char *chat = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}";
    cr_assert_eq(api_parse_request(API_CHAT, chat, strlen(chat), &d, &r, &e), 0, "%s", e.message);
    cr_expect_float_eq(r.temperature, 0.8f, 0);
    cr_expect_eq(r.top_k, 40);
    cr_expect_float_eq(r.top_p, 0.95f, 0);
    cr_expect_float_eq(r.min_p, 0.05f, 0);
    cr_expect_float_eq(r.repeat_penalty, 1.1f, 0);
    cr_expect(r.has_seed && r.seed == 7, "the server's seed");
    cr_expect_eq(r.max_tokens, 32, "-n is the default");
    api_request_free(&r);
    const char *own = "{\"prompt\": \"x\", \"temperature\": 0, \"top_k\": 0, \"seed\": -1, "
                      "\"max_tokens\": 100}";
    cr_assert_eq(api_parse_request(API_COMPLETION, own, strlen(own), &d, &r, &e), 0, "%s",
                 e.message);
    cr_expect_float_eq(r.temperature, 0.0f, 0, "the request's own value wins");
    cr_expect_eq(r.top_k, 0);
    cr_expect(!r.has_seed, "seed -1: random, as in llama-server");
    cr_expect_eq(r.max_tokens, 32, "-n caps what a request asks for");
    api_request_free(&r);
    const char *inf = "{\"prompt\": \"x\", \"n_predict\": -1}";
    cr_assert_eq(api_parse_request(API_COMPLETION, inf, strlen(inf), &d, &r, &e), 0, "%s",
                 e.message);
    cr_expect_eq(r.max_tokens, 32, "-n caps n_predict -1 too");
    api_request_free(&r);
}

// POST /completion (llama-server's own shape): a prompt, one answer, until a
// stop unless n_predict / max_tokens; n > 1 and logprobs are refused.
Test(serve_api, native_completion_request_and_answer) {
    struct api_request r;
    struct api_error e = {0};
    const char *body = "{\"prompt\": \"hi\", \"stream\": true}";
    cr_assert_eq(api_parse_request(API_NATIVE, body, strlen(body), NULL, &r, &e), 0, "%s",
                 e.message);
    cr_expect_str_eq(r.prompt, "hi");
    cr_expect_eq(r.max_tokens, -1, "llama-server's n_predict default: until a stop");
    cr_expect(r.stream);
    api_request_free(&r);
    const char *n2 = "{\"prompt\": \"hi\", \"n\": 2}";
    cr_expect_eq(api_parse_request(API_NATIVE, n2, strlen(n2), NULL, &r, &e), -1);
    cr_expect(strstr(e.message, "'n' is not supported by /completion"), "%s", e.message);

    const struct api_choice c = {.text = "abc", .len = 2, .finish = "length"};
    const struct api_usage u = {.prompt_tokens = 5, .completion_tokens = 2, .cached_tokens = 1};
    char *js = api_native_json("m", &c, &u);
    cJSON *o = cJSON_Parse(js);
    cr_assert_not_null(o, "%s", js);
    cr_expect_str_eq(cJSON_GetObjectItem(o, "content")->valuestring, "ab");
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(o, "stop")));
    cr_expect_str_eq(cJSON_GetObjectItem(o, "stop_type")->valuestring, "limit");
    cr_expect_eq(cJSON_GetObjectItem(o, "tokens_predicted")->valueint, 2);
    cr_expect_eq(cJSON_GetObjectItem(o, "tokens_evaluated")->valueint, 5);
    cr_expect_not_null(cJSON_GetObjectItem(o, "timings"));
    cJSON_Delete(o);
    free(js);
    char *ev = api_native_chunk_sse("m", &c, NULL);
    cr_expect_str_eq(ev, "data: {\"content\":\"ab\",\"stop\":false,\"id_slot\":-1}\n\n");
    free(ev);
}

// The output's constraint as GBNF: the grammar as given, a JSON schema
// (llama-server's json_schema, OpenAI's response_format) converted.
Test(serve_api, grammar_fields_become_one_grammar) {
    struct api_request r;
    struct api_error e;
    cr_assert_eq(
        parse(API_COMPLETION, "{\"prompt\": \"x\", \"grammar\": \"root ::= [a-z]+\"}", &r, &e), 0,
        "%s", e.message);
    cr_expect_str_eq(r.grammar, "root ::= [a-z]+");
    api_request_free(&r);
    const char *const bodies[] = {
        "{\"prompt\": \"x\", \"json_schema\": {\"type\": \"object\", \"properties\": {\"ok\": "
        "{\"type\": \"boolean\"}}, \"required\": [\"ok\"]}}",
        "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_object\"}}",
        "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
        "{\"name\": \"r\", \"strict\": true, \"schema\": {\"enum\": [\"a\", \"b\"]}}}}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        cr_assert_eq(parse(API_COMPLETION, bodies[i], &r, &e), 0, "%s: %s", bodies[i], e.message);
        cr_expect(r.grammar && strstr(r.grammar, "root ::=") != NULL, "%s -> %s", bodies[i],
                  r.grammar ? r.grammar : "(none)");
        api_request_free(&r);
    }
    cr_assert_eq(parse(API_COMPLETION,
                       "{\"prompt\": \"x\", \"response_format\": {\"type\": "
                       "\"text\"}, \"grammar\": \"\"}",
                       &r, &e),
                 0, "%s", e.message);
    cr_expect_null(r.grammar, "text and an empty grammar ask for nothing");
    api_request_free(&r);
}

// "speculative" over the server's default: each field given replaces the
// default's; logprobs leave the default out but not an explicit request.
Test(serve_api, speculative_over_the_server_default) {
    struct api_defaults d;
    api_defaults_openai(&d);
    cr_expect_eq(d.spec.type, ENGINE_SPEC_NONE, "OpenAI's defaults do not speculate");
    d.spec.type = ENGINE_SPEC_NGRAM;
    d.spec.n_max = 12;
    struct api_request r;
    struct api_error e;
    const char *b = "{\"prompt\": \"x\"}";
    cr_assert_eq(api_parse_request(API_COMPLETION, b, strlen(b), &d, &r, &e), 0, "%s", e.message);
    cr_expect(r.spec.type == ENGINE_SPEC_NGRAM && r.spec.n_max == 12 && !r.spec_given);
    cr_expect(api_request_speculates(&r));
    api_request_free(&r);
    b = "{\"prompt\": \"x\", \"logprobs\": 2}";
    cr_assert_eq(api_parse_request(API_COMPLETION, b, strlen(b), &d, &r, &e), 0, "%s", e.message);
    cr_expect(!api_request_speculates(&r), "the default leaves logprobs requests out");
    api_request_free(&r);
    b = "{\"prompt\": \"x\", \"speculative\": {\"type\": \"draft\", \"n_min\": 2, "
        "\"p_min\": 0.5}}";
    cr_assert_eq(api_parse_request(API_COMPLETION, b, strlen(b), &d, &r, &e), 0, "%s", e.message);
    cr_expect(r.spec.type == ENGINE_SPEC_DRAFT && r.spec.n_max == 12 && r.spec.n_min == 2 &&
              r.spec.p_min == 0.5f && r.spec_given);
    api_request_free(&r);
    b = "{\"prompt\": \"x\", \"speculative\": {\"type\": \"none\"}}";
    cr_assert_eq(api_parse_request(API_COMPLETION, b, strlen(b), &d, &r, &e), 0, "%s", e.message);
    cr_expect(!api_request_speculates(&r));
    api_request_free(&r);
}

Test(serve_api, timings_report_drafts) {
    struct api_choice ch = {.text = "a", .len = 1, .finish = "length"};
    struct api_usage u = {.prompt_tokens = 3,
                          .completion_tokens = 4,
                          .timings = true,
                          .spec = true,
                          .draft_n = 7,
                          .draft_n_accepted = 5};
    char *s = api_response_json(API_COMPLETION, "cmpl-1", "m", 1, &ch, 1, &u);
    cJSON *o = cJSON_Parse(s);
    cr_assert_not_null(o, "%s", s);
    cJSON *t = cJSON_GetObjectItem(o, "timings");
    cr_assert_not_null(t, "%s", s);
    cr_expect_eq(cJSON_GetObjectItem(t, "draft_n")->valueint, 7);
    cr_expect_eq(cJSON_GetObjectItem(t, "draft_n_accepted")->valueint, 5);
    cJSON_Delete(o);
    free(s);
    u.spec = false; // a request that did not speculate: no draft fields
    s = api_response_json(API_COMPLETION, "cmpl-1", "m", 1, &ch, 1, &u);
    o = cJSON_Parse(s);
    cr_expect_null(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "timings"), "draft_n"));
    cJSON_Delete(o);
    free(s);
}

// llama-server's reasoning: message.reasoning_content beside content, a
// reasoning delta without content, no field where there is no reasoning;
// reasoning_format read, its unknown values refused, the server's default
// kept when a request leaves it out.
Test(serve_api, reasoning_content_and_format) {
    struct api_choice ch = {.text = "Paris.",
                            .len = 6,
                            .finish = "stop",
                            .reasoning = "Capital of France?",
                            .reasoning_len = 18};
    char *s = api_response_json(API_CHAT, "chatcmpl-1", "m", 42, &ch, 1, NULL);
    cJSON *o = cJSON_Parse(s);
    cr_assert_not_null(o, "%s", s);
    cJSON *msg =
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "message");
    cr_expect_str_eq(cJSON_GetObjectItem(msg, "content")->valuestring, "Paris.");
    cr_expect_str_eq(cJSON_GetObjectItem(msg, "reasoning_content")->valuestring,
                     "Capital of France?");
    cJSON_Delete(o);
    free(s);
    const struct api_choice think = {.text = "", .reasoning = "Capital", .reasoning_len = 7};
    s = api_chunk_sse(API_CHAT, "chatcmpl-1", "m", 42, 0, &think, true, NULL);
    o = cJSON_ParseWithLength(s + 6, strlen(s) - 8);
    cr_assert_not_null(o, "%s", s);
    cJSON *delta =
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "delta");
    cr_expect_str_eq(cJSON_GetObjectItem(delta, "reasoning_content")->valuestring, "Capital");
    cr_expect_null(cJSON_GetObjectItem(delta, "content"), "%s", s);
    cr_expect_str_eq(cJSON_GetObjectItem(delta, "role")->valuestring, "assistant");
    cJSON_Delete(o);
    free(s);
    const struct api_choice answer = {.text = "Paris", .len = 5};
    s = api_chunk_sse(API_CHAT, "chatcmpl-1", "m", 42, 0, &answer, false, NULL);
    cr_expect_null(strstr(s, "reasoning_content"), "%s", s);
    cr_expect_not_null(strstr(s, "\"content\":\"Paris\""), "%s", s);
    free(s);

    struct api_request r;
    struct api_error e;
    const char *msgs = "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]";
    char body[256];
    snprintf(body, sizeof body, "{%s}", msgs);
    cr_assert_eq(parse(API_CHAT, body, &r, &e), 0, "%s", e.message);
    cr_expect_eq(r.reasoning, CHAT_REASONING_AUTO);
    api_request_free(&r);
    snprintf(body, sizeof body, "{%s, \"reasoning_format\": \"none\"}", msgs);
    cr_assert_eq(parse(API_CHAT, body, &r, &e), 0, "%s", e.message);
    cr_expect_eq(r.reasoning, CHAT_REASONING_NONE);
    api_request_free(&r);
    snprintf(body, sizeof body, "{%s, \"reasoning_format\": \"deepseek\"}", msgs);
    cr_assert_eq(parse(API_CHAT, body, &r, &e), 0, "%s", e.message);
    cr_expect_eq(r.reasoning, CHAT_REASONING_AUTO);
    api_request_free(&r);
    snprintf(body, sizeof body, "{%s, \"reasoning_format\": \"deepseek-legacy\"}", msgs);
    cr_expect_eq(parse(API_CHAT, body, &r, &e), -1);
    cr_expect_eq(e.status, 400);
    cr_expect_not_null(strstr(e.message, "reasoning_format"), "%s", e.message);
    snprintf(body, sizeof body, "{%s, \"reasoning_format\": 1}", msgs);
    cr_expect_eq(parse(API_CHAT, body, &r, &e), -1);
    struct api_defaults d;
    api_defaults_openai(&d);
    d.reasoning = CHAT_REASONING_NONE;
    snprintf(body, sizeof body, "{%s}", msgs);
    cr_assert_eq(api_parse_request(API_CHAT, body, strlen(body), &d, &r, &e), 0, "%s", e.message);
    cr_expect_eq(r.reasoning, CHAT_REASONING_NONE, "the server's --reasoning-format");
    api_request_free(&r);
}

// A chat body with the messages and extra fields (", ..." or "").
static int parse_chat(const char *extra, const struct api_defaults *d, struct api_request *r,
                      struct api_error *e) {
    char body[1024];
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]%s}",
             extra);
    memset(e, 0, sizeof *e);
    return api_parse_request(API_CHAT, body, strlen(body), d, r, e);
}

// The chat template's variables: llama-server's chat_template_kwargs and
// OpenAI's reasoning_effort, over the server's --chat-template-kwargs, in
// llama-server's order (server, then the request's kwargs, then
// reasoning_effort); where each came from is kept for the server's check
// against the model's template.
Test(serve_api, chat_template_kwargs_and_reasoning_effort) {
    struct api_request r;
    struct api_error e;
    // The extra fields, then the variables and where each came from (NULL: not given).
    static const struct {
        const char *extra, *effort, *effort_from, *identity, *identity_from;
    } good[] = {
        {"", NULL, NULL, NULL, NULL},
        {", \"chat_template_kwargs\": {\"reasoning_effort\": \"low\", \"model_identity\": "
         "\"You are Vela.\"}",
         "low", "chat_template_kwargs", "You are Vela.", "chat_template_kwargs"},
        // the top-level field wins over the kwargs, as in llama-server
        {", \"reasoning_effort\": \"high\", \"chat_template_kwargs\": {\"reasoning_effort\": "
         "\"low\"}",
         "high", "reasoning_effort", NULL, NULL},
        // null: not given; {}: nothing
        {", \"reasoning_effort\": null, \"chat_template_kwargs\": {}", NULL, NULL, NULL, NULL},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        cr_assert_eq(parse_chat(good[i].extra, NULL, &r, &e), 0, "%s: %s", good[i].extra,
                     e.message);
        const char *got[] = {r.kwargs.reasoning_effort, r.kwargs.effort_from,
                             r.kwargs.model_identity, r.kwargs.identity_from};
        const char *want[] = {good[i].effort, good[i].effort_from, good[i].identity,
                              good[i].identity_from};
        for (int j = 0; j < 4; j++)
            cr_expect(got[j] && want[j] ? !strcmp(got[j], want[j]) : got[j] == want[j],
                      "%s: field %d is '%s', expected '%s'", good[i].extra, j,
                      got[j] ? got[j] : "(null)", want[j] ? want[j] : "(null)");
        api_request_free(&r);
    }
    // Completions have no template: the fields are not read there.
    cr_assert_eq(parse(API_COMPLETION, "{\"prompt\": \"x\", \"reasoning_effort\": 3}", &r, &e), 0,
                 "%s", e.message);
    api_request_free(&r);

    static const struct {
        const char *extra, *msg;
    } bad[] = {
        {", \"reasoning_effort\": \"max\"",
         "'reasoning_effort' is \"max\"; expected \"low\", \"medium\" or \"high\""},
        {", \"reasoning_effort\": \"none\"",
         "'reasoning_effort' is \"none\"; expected \"low\", \"medium\" or \"high\""},
        {", \"reasoning_effort\": 2", "'reasoning_effort' must be a string"},
        {", \"chat_template_kwargs\": \"{}\"", "'chat_template_kwargs' must be a JSON object"},
        {", \"chat_template_kwargs\": [1]", "'chat_template_kwargs' must be a JSON object"},
        {", \"chat_template_kwargs\": {\"reasoning_effort\": true}",
         "'chat_template_kwargs.reasoning_effort' must be a string"},
        {", \"chat_template_kwargs\": {\"model_identity\": 7}",
         "'chat_template_kwargs.model_identity' must be a string"},
        {", \"chat_template_kwargs\": {\"reasoning_effort\": \"HIGH\"}",
         "'chat_template_kwargs.reasoning_effort' is \"HIGH\"; expected \"low\", \"medium\" or "
         "\"high\""},
        {", \"chat_template_kwargs\": {\"enable_thinking\": false}",
         "'chat_template_kwargs': unknown key 'enable_thinking' (vela has no Jinja and reads only "
         "reasoning_effort and model_identity, gpt-oss's variables)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_eq(parse_chat(bad[i].extra, NULL, &r, &e), -1, "%s", bad[i].extra);
        cr_expect_eq(e.status, 400);
        cr_expect_str_eq(e.message, bad[i].msg, "%s", bad[i].extra);
        cr_expect_null(r.kwargs.reasoning_effort, "a refused request is freed");
    }

    // The server's --chat-template-kwargs: the default a request overrides key by key.
    struct chat_kwargs srv = {0};
    struct verr err = {0};
    cr_assert_eq(chat_kwargs_parse("{\"reasoning_effort\": \"high\", \"model_identity\": \"S\"}",
                                   "--chat-template-kwargs", &srv, &err),
                 0, "%s", err.msg);
    struct api_defaults d;
    api_defaults_openai(&d);
    d.kwargs = &srv;
    cr_assert_eq(parse_chat("", &d, &r, &e), 0, "%s", e.message);
    cr_expect_str_eq(r.kwargs.reasoning_effort, "high");
    cr_expect_str_eq(r.kwargs.effort_from, "--chat-template-kwargs");
    cr_expect_str_eq(r.kwargs.model_identity, "S");
    api_request_free(&r);
    cr_assert_eq(parse_chat(", \"chat_template_kwargs\": {\"model_identity\": null}, "
                            "\"reasoning_effort\": \"low\"",
                            &d, &r, &e),
                 0, "%s", e.message);
    cr_expect_str_eq(r.kwargs.reasoning_effort, "low");
    cr_expect_null(r.kwargs.model_identity, "null takes the server's identity away");
    cr_expect_null(r.kwargs.identity_from);
    api_request_free(&r);
    cr_expect_str_eq(srv.reasoning_effort, "high", "the server's own are untouched");
    chat_kwargs_free(&srv);
}

// The flag's JSON text, and the check against the model's template (the
// server's 400 and the CLI's error say the same).
Test(serve_api, chat_kwargs_text_and_template_check) {
    struct chat_kwargs k = {0};
    struct verr err = {0};
    cr_expect_eq(
        chat_kwargs_parse("{\"reasoning_effort\": \"low\"", "--chat-template-kwargs", &k, &err),
        VERR_FORMAT);
    cr_expect_str_eq(err.msg, "'--chat-template-kwargs': '{\"reasoning_effort\": \"low\"' is not "
                              "valid JSON; expected an object such as "
                              "'{\"reasoning_effort\":\"high\"}'");
    cr_expect_eq(chat_kwargs_parse("{} x", "--chat-template-kwargs", &k, &err), VERR_FORMAT);
    cr_expect_eq(chat_kwargs_parse("\"high\"", "--chat-template-kwargs", &k, &err), VERR_TYPE);
    cr_expect_str_eq(err.msg, "'--chat-template-kwargs' must be a JSON object");
    cr_assert_eq(
        chat_kwargs_parse("{\"reasoning_effort\": \"low\"}", "--chat-template-kwargs", &k, &err), 0,
        "%s", err.msg);
    // A later flag adds its keys; a bad one leaves what was there.
    cr_assert_eq(
        chat_kwargs_parse("{\"model_identity\": \"I\"}", "--chat-template-kwargs", &k, &err), 0,
        "%s", err.msg);
    cr_expect_eq(chat_kwargs_parse("{\"model_identity\": \"J\", \"reasoning_effort\": \"x\"}",
                                   "--chat-template-kwargs", &k, &err),
                 VERR_RANGE);
    cr_expect_str_eq(k.reasoning_effort, "low");
    cr_expect_str_eq(k.model_identity, "I");
    cr_expect_eq(chat_kwargs_check(&k, CHAT_TMPL_GPT_OSS, &err), 0, "%s", err.msg);
    cr_expect_eq(chat_kwargs_check(&k, CHAT_TMPL_CHATML, &err), VERR_UNSUPPORTED);
    cr_expect_str_eq(err.msg, "'--chat-template-kwargs': the chat template 'chatml' has no "
                              "variable reasoning_effort (only gpt-oss's reads reasoning_effort "
                              "and model_identity)");
    struct chat_opts o = chat_kwargs_opts(&k);
    cr_expect_str_eq(o.reasoning_effort, "low");
    cr_expect_str_eq(o.model_identity, "I");
    chat_kwargs_free(&k);
    cr_expect_eq(chat_kwargs_check(&k, CHAT_TMPL_CHATML, &err), 0,
                 "nothing given, nothing to "
                 "check");
}
