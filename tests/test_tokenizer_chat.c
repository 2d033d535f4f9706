// Chat templates (host/tokenizer/chat.h): detection of real templates,
// every built-in formatter on one conversation, generation prompts, the
// next-message difference, the end-of-turn tokens and the errors.
//
// Where the expected strings come from: llama.cpp's own functions. Its
// src/llama-chat.cpp (as vendored by llama-cpp-python 0.3.36) was compiled
// into a small harness (not part of vela) and run:
//  - llm_chat_detect_template on each file of tests/data/chat_templates/
//    (real templates: the name it returned is the file's prefix, see the
//    README there);
//  - llm_chat_apply_template(name, conversation, add_ass = true) on the
//    six-message conversation of llama.cpp's tests/test-chat-template.cpp
//    (system, user, assistant, user, assistant with surrounding spaces,
//    user), for every template name in expected_full[] below.
// The strings were then read against each formatter's rules by hand; the
// notes beside some cases say what each shows. gpt-oss is the exception:
// vela formats it as its Jinja template does (chat.h), so its string was
// written by hand from tests/data/chat_templates/gpt-oss--*.jinja and
// checked by rendering that file with Python's jinja2 (strftime_now giving
// the date, shown here as YYYY-MM-DD).
#include <criterion/criterion.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "host/tokenizer/chat.h"
#include "host/tokenizer/tokenizer.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

static const struct chat_msg conversation[] = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you"},
    {"assistant", "   I am an assistant   "},
    {"user", "Another question"},
};

// llm_chat_apply_template(name, conversation, add_ass = true). What each
// shows: llama2 puts the system text inside the first [INST] (llama2-sys
// in a <<SYS>> block), starts later turns with <s> only for llama2-sys-bos
// and trims only for -strip; mistral-v3 trims assistant messages, v1 has a
// leading space before [INST]; gemma folds the system message into the
// first user turn and trims everything; llama3 and command-r trim; the
// templates without a generation marker (llama2, mistral, orion, minicpm)
// end with the user's turn.
static const struct {
    const char *name;
    const char *expected;
} expected_full[] = {
    {"chatml", "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\n"
               "Hello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\n"
               "Who are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n"
               "<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n"},
    {"llama2", "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you "
               "[/INST]   I am an assistant   </s>[INST] Another question [/INST]"},
    {"llama2-sys",
     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who "
     "are you [/INST]   I am an assistant   </s>[INST] Another question [/INST]"},
    {"llama2-sys-bos",
     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s><s>[INST] "
     "Who are you [/INST]   I am an assistant   </s><s>[INST] Another question [/INST]"},
    {"llama2-sys-strip",
     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who "
     "are you [/INST]I am an assistant</s>[INST] Another question [/INST]"},
    {"mistral-v1", " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who "
                   "are you [/INST]    I am an assistant   </s> [INST] Another question [/INST]"},
    {"mistral-v3", "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are "
                   "you[/INST] I am an assistant</s>[INST] Another question[/INST]"},
    {"mistral-v3-tekken", "[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>[INST]Who "
                          "are you[/INST]   I am an assistant   </s>[INST]Another question[/INST]"},
    {"mistral-v7", "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] "
                   "Hi there</s>[INST] Who are you[/INST]    I am an assistant   </s>[INST] "
                   "Another question[/INST]"},
    {"mistral-v7-tekken",
     "[SYSTEM_PROMPT]You are a helpful assistant[/SYSTEM_PROMPT][INST]Hello[/INST]Hi "
     "there</s>[INST]Who are you[/INST]   I am an assistant   </s>[INST]Another question[/INST]"},
    {"phi3", "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n"
             "<|assistant|>\nHi there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n"
             "   I am an assistant   <|end|>\n<|user|>\nAnother question<|end|>\n<|assistant|>\n"
             ""},
    {"phi4", "<|im_start|>system<|im_sep|>You are a helpful "
             "assistant<|im_end|><|im_start|>user<|im_sep|>Hello<|im_end|><|im_start|>assistant<|"
             "im_sep|>Hi there<|im_end|><|im_start|>user<|im_sep|>Who are "
             "you<|im_end|><|im_start|>assistant<|im_sep|>   I am an assistant   "
             "<|im_end|><|im_start|>user<|im_sep|>Another "
             "question<|im_end|><|im_start|>assistant<|im_sep|>"},
    {"falcon3", "<|system|>\nYou are a helpful assistant\n<|user|>\nHello\n<|assistant|>\n"
                "Hi there\n<|user|>\nWho are you\n<|assistant|>\n   I am an assistant   \n"
                "<|user|>\nAnother question\n<|assistant|>\n"},
    {"zephyr",
     "<|system|>\nYou are a helpful assistant<|endoftext|>\n<|user|>\nHello<|endoftext|>\n"
     "<|assistant|>\nHi there<|endoftext|>\n<|user|>\nWho are you<|endoftext|>\n"
     "<|assistant|>\n   I am an assistant   <|endoftext|>\n<|user|>\nAnother "
     "question<|endoftext|>\n"
     "<|assistant|>\n"},
    {"monarch",
     "system\nYou are a helpful assistant</s>\n<s>user\nHello</s>\n<s>assistant\n"
     "Hi there</s>\n<s>user\nWho are you</s>\n<s>assistant\n   I am an assistant   </s>\n"
     "<s>user\nAnother question</s>\n<s>assistant\n"},
    {"gemma",
     "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n"
     "<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n"
     "<start_of_turn>model\nI am an assistant<end_of_turn>\n<start_of_turn>user\n"
     "Another question<end_of_turn>\n<start_of_turn>model\n"},
    {"orion", "Human: You are a helpful assistant\n\nHello\n\nAssistant: </s>Hi there</s>Human: "
              "Who are you\n"
              "\nAssistant: </s>   I am an assistant   </s>Human: Another question\n\n"
              "Assistant: </s>"},
    {"openchat",
     "You are a helpful assistant<|end_of_turn|>GPT4 Correct User: Hello<|end_of_turn|>GPT4 "
     "Correct Assistant: Hi there<|end_of_turn|>GPT4 Correct User: Who are you<|end_of_turn|>GPT4 "
     "Correct Assistant:    I am an assistant   <|end_of_turn|>GPT4 Correct User: Another "
     "question<|end_of_turn|>GPT4 Correct Assistant:"},
    {"vicuna",
     "You are a helpful assistant\n\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\n"
     "ASSISTANT:    I am an assistant   </s>\nUSER: Another question\nASSISTANT:"},
    {"vicuna-orca",
     "SYSTEM: You are a helpful assistant\nUSER: Hello\nASSISTANT: Hi there</s>\n"
     "USER: Who are you\nASSISTANT:    I am an assistant   </s>\nUSER: Another question\n"
     "ASSISTANT:"},
    {"deepseek", "You are a helpful assistant### Instruction:\nHello\n### Response:\nHi there\n"
                 "<|EOT|>\n### Instruction:\nWho are you\n### Response:\n   I am an assistant   \n"
                 "<|EOT|>\n### Instruction:\nAnother question\n### Response:\n"},
    {"deepseek2",
     "You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi "
     "there<\357\275\234end\342\226\201of\342\226\201sentence\357\275\234>User: Who are you\n"
     "\nAssistant:    I am an assistant   "
     "<\357\275\234end\342\226\201of\342\226\201sentence\357\275\234>User: Another question\n"
     "\nAssistant:"},
    {"deepseek3",
     "You are a helpful "
     "assistant\n\n<\357\275\234User\357\275\234>Hello<\357\275\234Assistant\357\275\234>Hi "
     "there<\357\275\234end\342\226\201of\342\226\201sentence\357\275\234><"
     "\357\275\234User\357\275\234>Who are you<\357\275\234Assistant\357\275\234>   I am an "
     "assistant   "
     "<\357\275\234end\342\226\201of\342\226\201sentence\357\275\234><\357\275\234User\357\275\234>"
     "Another question<\357\275\234Assistant\357\275\234>"},
    {"command-r", "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful "
                  "assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello<|END_"
                  "OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hi "
                  "there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Who are "
                  "you<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>I am an "
                  "assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Another "
                  "question<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"},
    {"llama3", "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful "
               "assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
               "\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi "
               "there<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
               "\nWho are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
               "I am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
               "Another question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
               "\n"},
    {"chatglm3", "[gMASK]sop<|system|>\n You are a helpful assistant<|user|>\n Hello<|assistant|>\n"
                 " Hi there<|user|>\n Who are you<|assistant|>\n    I am an assistant   <|user|>\n"
                 " Another question<|assistant|>"},
    {"chatglm4", "[gMASK]<sop><|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\n"
                 "Hi there<|user|>\nWho are you<|assistant|>\n   I am an assistant   <|user|>\n"
                 "Another question<|assistant|>\n"},
    {"glmedge",
     "<|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi there<|user|>\n"
     "Who are you<|assistant|>\n   I am an assistant   <|user|>\nAnother question<|assistant|>"},
    {"minicpm", "You are a helpful assistant<\347\224\250\346\210\267>Hello<AI>Hi "
                "there<\347\224\250\346\210\267>Who are you<AI>I am an "
                "assistant<\347\224\250\346\210\267>Another question<AI>"},
    {"exaone3",
     "[|system|]You are a helpful assistant[|endofturn|]\n[|user|]Hello\n[|assistant|]Hi "
     "there[|endofturn|]\n"
     "[|user|]Who are you\n[|assistant|]I am an assistant[|endofturn|]\n[|user|]Another question\n"
     "[|assistant|]"},
    {"granite", "<|start_of_role|>system<|end_of_role|>You are a helpful assistant<|end_of_text|>\n"
                "<|start_of_role|>user<|end_of_role|>Hello<|end_of_text|>\n<|start_of_role|>"
                "assistant<|end_of_role|>Hi there<|end_of_text|>\n"
                "<|start_of_role|>user<|end_of_role|>Who are "
                "you<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>   I am an assistant "
                "  <|end_of_text|>\n"
                "<|start_of_role|>user<|end_of_role|>Another "
                "question<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>"},
    // The template's system message, the first system message as the
    // developer's instructions, assistant turns as their final channel.
    {"gpt-oss",
     "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
     "Knowledge cutoff: 2024-06\nCurrent date: YYYY-MM-DD\n\nReasoning: medium\n\n# Valid "
     "channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
     "<|start|>developer<|message|># Instructions\n\nYou are a helpful assistant\n\n<|end|>"
     "<|start|>user<|message|>Hello<|end|><|start|>assistant<|channel|>final<|message|>Hi "
     "there<|end|><|start|>user<|message|>Who are you<|end|><|start|>assistant<|channel|>final"
     "<|message|>   I am an assistant   <|end|><|start|>user<|message|>Another question<|end|>"
     "<|start|>assistant"},
};

static void today(char out[16]) {
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(out, 16, "%Y-%m-%d", &tm);
}

static char *fmt_opts(enum chat_template t, const struct chat_msg *m, size_t n,
                      const struct chat_opts *o, bool add_ass) {
    char *out = NULL, before[16], after[16];
    size_t len = 0;
    struct verr err = {0};
    today(before);
    int rc = chat_format(t, m, n, o, add_ass, &out, &len, &err);
    today(after);
    cr_assert_eq(rc, 0, "%s: %s", chat_template_name(t), err.msg);
    cr_assert_eq(len, strlen(out));
    // gpt-oss's current date: today's (the day before or after the call),
    // then the placeholder the expected strings hold.
    char *d = strstr(out, "Current date: ");
    if (t == CHAT_TMPL_GPT_OSS) {
        cr_assert_not_null(d);
        d += strlen("Current date: ");
        cr_assert(!strncmp(d, before, 10) || !strncmp(d, after, 10), "date %.10s, today %s", d,
                  before);
        memcpy(d, "YYYY-MM-DD", 10);
    }
    return out;
}

static char *fmt(enum chat_template t, const struct chat_msg *m, size_t n, bool add_ass) {
    return fmt_opts(t, m, n, NULL, add_ass);
}

Test(chat, every_template_on_the_conversation) {
    cr_assert_eq(LEN(expected_full), CHAT_TMPL_COUNT, "one expected string per built-in template");
    for (size_t i = 0; i < LEN(expected_full); i++) {
        enum chat_template t;
        struct verr err = {0};
        cr_assert_eq(chat_template_from_name(expected_full[i].name, &t, &err), 0, "%s", err.msg);
        cr_assert_str_eq(chat_template_name(t), expected_full[i].name);
        char *got = fmt(t, conversation, LEN(conversation), true);
        cr_expect_str_eq(got, expected_full[i].expected, "template %s", expected_full[i].name);
        free(got);
    }
}

// Without the generation prompt, the templates that have one end with the
// last message (llm_chat_apply_template with add_ass = false: the same
// strings less the final marker).
Test(chat, no_generation_prompt) {
    const struct chat_msg m[] = {{"user", "Hi"}};
    char *s = fmt(CHAT_TMPL_CHATML, m, 1, false);
    cr_expect_str_eq(s, "<|im_start|>user\nHi<|im_end|>\n");
    free(s);
    s = fmt(CHAT_TMPL_LLAMA3, m, 1, false);
    cr_expect_str_eq(s, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
    free(s);
    s = fmt(CHAT_TMPL_GEMMA, m, 1, true);
    cr_expect_str_eq(s, "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
    free(s);
    // An empty conversation is the generation prompt alone.
    s = fmt(CHAT_TMPL_PHI3, NULL, 0, true);
    cr_expect_str_eq(s, "<|assistant|>\n");
    free(s);
    s = fmt(CHAT_TMPL_MISTRAL_V7, NULL, 0, true);
    cr_expect_str_eq(s, "");
    free(s);
}

// common_chat_format_single's rule: format the history without and with the
// new message and keep the difference; a history ending in "\n" gives that
// newline back when a generation prompt follows (llama.cpp's comment: "if
// the past_msg ends with a newline, we must preserve it").
Test(chat, next_message) {
    char *s = NULL;
    size_t len = 0;
    struct verr err = {0};
    cr_assert_eq(chat_format_next(CHAT_TMPL_CHATML, conversation, 2, NULL, true, &s, &len, &err),
                 0);
    cr_expect_str_eq(s, "\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
    free(s);
    cr_assert_eq(chat_format_next(CHAT_TMPL_LLAMA3, conversation, 4, NULL, true, &s, &len, &err),
                 0);
    cr_expect_str_eq(s, "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(s);
    // The first message: the whole formatted text.
    cr_assert_eq(
        chat_format_next(CHAT_TMPL_CHATML, conversation + 1, 1, NULL, true, &s, &len, &err), 0);
    cr_expect_str_eq(s, "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
    free(s);
    cr_expect_eq(chat_format_next(CHAT_TMPL_CHATML, conversation, 0, NULL, true, &s, &len, &err),
                 VERR_RANGE);
}

static void data_dir(char *buf, size_t cap) {
    const char *src = __FILE__; // absolute: the build passes full paths
    const char *slash = strrchr(src, '/');
    int n = slash ? (int)(slash - src) : 0;
    snprintf(buf, cap, "%.*s/data/chat_templates", n, slash ? src : ".");
}

Test(chat, detect_real_templates) {
    char dir[4096];
    data_dir(dir, sizeof dir);
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "cannot open %s", dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const char *dash = strstr(e->d_name, "--");
        if (!dash || !strstr(e->d_name, ".jinja"))
            continue;
        char path[8192], want[64];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        snprintf(want, sizeof want, "%.*s", (int)(dash - e->d_name), e->d_name);
        FILE *f = fopen(path, "rb");
        cr_assert_not_null(f);
        char text[32768];
        size_t len = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[len] = '\0';
        const char *got = chat_template_detect_name(text);
        cr_expect(got && !strcmp(got, want), "%s: detected %s", e->d_name, got ? got : "nothing");
        // Names vela formats are mapped, the others refused as unsupported.
        enum chat_template t;
        struct verr err = {0};
        int rc = chat_template_detect(text, &t, &err);
        if (rc == 0)
            cr_expect_str_eq(chat_template_name(t), want);
        else
            cr_expect(rc == VERR_UNSUPPORTED && strstr(err.msg, want) && strstr(err.msg, "chatml"),
                      "%s: %s", e->d_name, err.msg);
        n++;
    }
    closedir(d);
    cr_expect_geq(n, 30, "only %d templates in %s", n, dir);
}

// llama.cpp's detection, rule by rule, on the fragments it looks for
// (derived from llm_chat_detect_template's conditions and their order).
Test(chat, detect_rules) {
    static const struct {
        const char *tmpl, *want;
    } cases[] = {
        {"llama3", "llama3"}, // an exact name is that template
        {"mistral-v7-tekken", "mistral-v7-tekken"},
        {"granite-4.0", "granite-4.0"},
        {"{{'<|im_start|>' + role}}", "chatml"},
        {"<|im_start|>x<|im_sep|>", "phi4"},
        {"<|im_start|><end_of_utterance>", "smolvlm"},
        {"mistral anything", "llama2"}, // starts with "mistral"
        {"[INST] [SYSTEM_PROMPT]", "mistral-v7"},
        {"[INST] ' [INST] ' + system_message", "mistral-v1"},
        {"[AVAILABLE_TOOLS]\"[INST]\"", "mistral-v3-tekken"},
        {"[AVAILABLE_TOOLS][INST]", "mistral-v3"},
        {"[INST] <<SYS>> content.strip()", "llama2-sys-strip"},
        {"bos_token + '[INST] <<SYS>>", "llama2-sys-bos"},
        {"[INST] <<SYS>>", "llama2-sys"},
        {"<|user|><|assistant|><|end|>", "phi3"},
        {"<|user|><|assistant|></s>", "falcon3"},
        {"<|user|><|assistant|>", "glmedge"},
        {"<|user|>...<|endoftext|>", "zephyr"},
        {"<start_of_turn>", "gemma"},
        {"GPT4 Correct User", "openchat"},
        {"USER: ASSISTANT: ", "vicuna"},
        {"SYSTEM: USER: ASSISTANT: ", "vicuna-orca"},
        {"### Instruction: <|EOT|>", "deepseek"},
        {"<|start_header_id|>user<|end_header_id|>", "llama3"},
        {"<\xef\xbd\x9c"
         "Assistant\xef\xbd\x9c><\xef\xbd\x9c"
         "User\xef\xbd\x9c><\xef\xbd\x9c"
         "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
         "deepseek3"},
        {"[|system|][|assistant|][|endofturn|]", "exaone3"},
        {"<|start_of_role|>", "granite"},
        {"<|endofuserprompt|>", "dots1"},
        {"<|begin|><|end|><|content|>", "solar-open"},
        {"{{ messages }}", NULL},
        {"", NULL},
    };
    for (size_t i = 0; i < LEN(cases); i++) {
        const char *got = chat_template_detect_name(cases[i].tmpl);
        if (cases[i].want)
            cr_expect(got && !strcmp(got, cases[i].want), "'%s': %s, expected %s", cases[i].tmpl,
                      got ? got : "nothing", cases[i].want);
        else
            cr_expect_null(got, "'%s': %s, expected nothing", cases[i].tmpl, got);
    }
    // "dots1" is no name in llama.cpp's table: only its text picks it.
    cr_expect_null(chat_template_detect_name("dots1"));
}

Test(chat, unknown_names_list_the_built_ins) {
    enum chat_template t;
    struct verr err = {0};
    cr_expect_eq(chat_template_from_name("chatmlx", &t, &err), VERR_NOTFOUND);
    cr_expect(strstr(err.msg, "'chatmlx'") && strstr(err.msg, "chatml, llama2, ") &&
                  strstr(err.msg, "gemma") && strstr(err.msg, "deepseek3"),
              "%s", err.msg);
    cr_expect_eq(chat_template_detect("{{ messages }}", &t, &err), VERR_NOTFOUND);
    cr_expect(strstr(err.msg, "--chat-template") && strstr(err.msg, "zephyr"), "%s", err.msg);
    cr_expect_eq(chat_template_from_name("kimi-k2", &t, &err), VERR_UNSUPPORTED);
    cr_expect(strstr(err.msg, "kimi-k2") && strstr(err.msg, "llama3"), "%s", err.msg);
    char small[8];
    size_t need = chat_template_list(small, sizeof small);
    cr_expect_str_eq(small, "chatml,");
    char *big = malloc(need + 1);
    cr_assert_eq(chat_template_list(big, need + 1), need);
    cr_expect_eq(strlen(big), need);
    free(big);
    const struct chat_msg bad[] = {{"user", NULL}};
    char *out;
    size_t len;
    cr_expect_eq(chat_format(CHAT_TMPL_CHATML, bad, 1, NULL, true, &out, &len, &err), VERR_RANGE);
    cr_expect_eq(chat_format((enum chat_template)99, conversation, 1, NULL, true, &out, &len, &err),
                 VERR_RANGE);
    cr_expect_null(chat_template_name(CHAT_TMPL_COUNT));
}

// A GGUF with a template, one without, and an override.
static struct gguf_file *gguf_with(const char *tmpl) {
    struct gguf_writer *w = gguf_writer_new();
    cr_assert_not_null(w);
    gguf_writer_set_str(w, "general.architecture", "llama");
    if (tmpl)
        gguf_writer_set_str(w, "tokenizer.chat_template", tmpl);
    char path[] = "/tmp/vela_test_chat_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    struct verr err = {0};
    cr_assert_eq(gguf_writer_save(w, path, &err), 0, "%s", err.msg);
    gguf_writer_free(w);
    struct gguf_file *f = NULL;
    cr_assert_eq(gguf_open(&f, path, &err), 0, "%s", err.msg);
    unlink(path);
    return f;
}

#define GPT_OSS_SYSTEM                                                                             \
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"       \
    "Knowledge cutoff: 2024-06\nCurrent date: YYYY-MM-DD\n\nReasoning: medium\n\n# Valid "         \
    "channels: analysis, commentary, final. Channel must be included for every message.<|end|>"

// gpt-oss's template on the cases its logic branches on (each string written
// by hand from the template, checked with jinja2 as above): no system
// message, no generation prompt (an assistant's last turn closed by <|end|>,
// llama.cpp's inference form), a developer message first, an empty system
// message (no developer message) and roles the template drops.
Test(chat, gpt_oss_cases) {
    const struct chat_msg user[] = {{"user", "Hi"}};
    char *s = fmt(CHAT_TMPL_GPT_OSS, user, 1, false);
    cr_expect_str_eq(s, GPT_OSS_SYSTEM "<|start|>user<|message|>Hi<|end|>");
    free(s);
    const struct chat_msg ans[] = {{"user", "Hi"}, {"assistant", "Yo"}};
    s = fmt(CHAT_TMPL_GPT_OSS, ans, 2, false);
    cr_expect_str_eq(s, GPT_OSS_SYSTEM "<|start|>user<|message|>Hi<|end|><|start|>assistant"
                                       "<|channel|>final<|message|>Yo<|end|>");
    free(s);
    const struct chat_msg dev[] = {{"developer", "Be brief"}, {"user", "Hi"}, {"system", "late"}};
    s = fmt(CHAT_TMPL_GPT_OSS, dev, 3, true);
    cr_expect_str_eq(s, GPT_OSS_SYSTEM "<|start|>developer<|message|># Instructions\n\nBe "
                                       "brief\n\n<|end|><|start|>user<|message|>Hi<|end|>"
                                       "<|start|>assistant");
    free(s);
    const struct chat_msg empty[] = {{"system", ""}, {"user", "Hi"}};
    s = fmt(CHAT_TMPL_GPT_OSS, empty, 2, true);
    cr_expect_str_eq(s, GPT_OSS_SYSTEM "<|start|>user<|message|>Hi<|end|><|start|>assistant");
    free(s);
    s = fmt(CHAT_TMPL_GPT_OSS, NULL, 0, true);
    cr_expect_str_eq(s, GPT_OSS_SYSTEM "<|start|>assistant");
    free(s);
    // The next message: what the conversation adds to what the cache holds.
    size_t len = 0;
    struct verr err = {0};
    cr_assert_eq(chat_format_next(CHAT_TMPL_GPT_OSS, conversation, 4, NULL, true, &s, &len, &err),
                 0);
    cr_expect_str_eq(s, "<|start|>user<|message|>Who are you<|end|><|start|>assistant");
    free(s);
    cr_expect_str_eq(chat_template_eot(CHAT_TMPL_GPT_OSS), "<|return|>");
}

// gpt-oss's template variables (llama.cpp's chat_template_kwargs): each
// expected string is what jinja2 renders from
// tests/data/chat_templates/gpt-oss--openai-gpt-oss-120b.jinja (trim_blocks,
// lstrip_blocks, strftime_now giving YYYY-MM-DD) for [system "Be brief.",
// user "Hi"] with add_generation_prompt and the variables beside it.
#define GPT_OSS_SYS(identity, effort)                                                              \
    "<|start|>system<|message|>" identity "\nKnowledge cutoff: 2024-06\nCurrent date: "            \
    "YYYY-MM-DD\n\nReasoning: " effort "\n\n# Valid channels: analysis, commentary, final. "       \
    "Channel must be included for every message.<|end|><|start|>developer<|message|># "            \
    "Instructions\n\nBe brief.\n\n<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant"
#define CHATGPT "You are ChatGPT, a large language model trained by OpenAI."

Test(chat, gpt_oss_variables) {
    const struct chat_msg m[] = {{"system", "Be brief."}, {"user", "Hi"}};
    static const struct {
        struct chat_opts o;
        const char *want;
    } cases[] = {
        {{0}, GPT_OSS_SYS(CHATGPT, "medium")},
        {{.reasoning_effort = "low"}, GPT_OSS_SYS(CHATGPT, "low")},
        {{.reasoning_effort = "medium"}, GPT_OSS_SYS(CHATGPT, "medium")},
        {{.reasoning_effort = "high"}, GPT_OSS_SYS(CHATGPT, "high")},
        {{.model_identity = "You are Vela, a helpful assistant."},
         GPT_OSS_SYS("You are Vela, a helpful assistant.", "medium")},
        {{.reasoning_effort = "high", .model_identity = "I am \"Q\" \xc3\xa9\nline2"},
         GPT_OSS_SYS("I am \"Q\" \xc3\xa9\nline2", "high")},
    };
    for (size_t i = 0; i < LEN(cases); i++) {
        char *s = fmt_opts(CHAT_TMPL_GPT_OSS, m, 2, &cases[i].o, true);
        cr_expect_str_eq(s, cases[i].want, "case %zu", i);
        free(s);
    }
    // The next message carries the variables too (its history is formatted
    // with them, so the difference is the new turn alone).
    const struct chat_opts high = {.reasoning_effort = "high"};
    char *s = NULL;
    size_t len = 0;
    struct verr err = {0};
    cr_assert_eq(chat_format_next(CHAT_TMPL_GPT_OSS, m, 2, &high, true, &s, &len, &err), 0, "%s",
                 err.msg);
    cr_expect_str_eq(s, "<|start|>user<|message|>Hi<|end|><|start|>assistant");
    free(s);
}

Test(chat, template_variables_refused) {
    const struct chat_msg m[] = {{"user", "Hi"}};
    char *s = NULL;
    size_t len = 0;
    struct verr err = {0};
    const struct chat_opts bad[] = {
        {.reasoning_effort = "none"}, {.reasoning_effort = "High"}, {.reasoning_effort = ""}};
    for (size_t i = 0; i < LEN(bad); i++) {
        cr_expect_eq(chat_format(CHAT_TMPL_GPT_OSS, m, 1, &bad[i], true, &s, &len, &err),
                     VERR_RANGE);
        cr_expect_null(s);
    }
    cr_expect_str_eq(err.msg, "reasoning_effort '' is not one of \"low\", \"medium\", \"high\"");
    // Templates that read no variable refuse them rather than drop them.
    const struct chat_opts effort = {.reasoning_effort = "high"};
    cr_expect_eq(chat_format(CHAT_TMPL_CHATML, m, 1, &effort, true, &s, &len, &err),
                 VERR_UNSUPPORTED);
    cr_expect_str_eq(err.msg, "the chat template 'chatml' has no variable reasoning_effort (only "
                              "gpt-oss's reads reasoning_effort and model_identity)");
    const struct chat_opts id = {.model_identity = "x"};
    cr_expect_eq(chat_opts_check(CHAT_TMPL_LLAMA3, &id, &err), VERR_UNSUPPORTED);
    cr_expect(strstr(err.msg, "'llama3' has no variable model_identity"), "%s", err.msg);
    const struct chat_opts none = {0};
    cr_expect_eq(chat_opts_check(CHAT_TMPL_CHATML, &none, &err), 0);
    cr_expect(chat_template_reads(CHAT_TMPL_GPT_OSS, CHAT_VAR_REASONING_EFFORT));
    cr_expect(chat_template_reads(CHAT_TMPL_GPT_OSS, CHAT_VAR_MODEL_IDENTITY));
    cr_expect(!chat_template_reads(CHAT_TMPL_GPT_OSS, "enable_thinking"));
    cr_expect(!chat_template_reads(CHAT_TMPL_CHATML, CHAT_VAR_REASONING_EFFORT));
}

Test(chat, from_gguf) {
    enum chat_template t;
    const char *src = NULL;
    struct verr err = {0};
    struct gguf_file *f = gguf_with("{% for m in messages %}<start_of_turn>{% endfor %}");
    cr_assert_eq(chat_template_from_gguf(f, NULL, &t, &src, &err), 0, "%s", err.msg);
    cr_expect_eq(t, CHAT_TMPL_GEMMA);
    cr_expect_str_eq(src, "tokenizer.chat_template");
    cr_assert_eq(chat_template_from_gguf(f, "zephyr", &t, &src, &err), 0, "%s", err.msg);
    cr_expect_eq(t, CHAT_TMPL_ZEPHYR);
    cr_expect_str_eq(src, "--chat-template");
    cr_expect_eq(chat_template_from_gguf(f, "nope", &t, &src, &err), VERR_NOTFOUND);
    gguf_close(f);
    f = gguf_with(NULL);
    cr_assert_eq(chat_template_from_gguf(f, NULL, &t, &src, &err), 0, "%s", err.msg);
    cr_expect_eq(t, CHAT_TMPL_CHATML, "llama.cpp formats with chatml when there is no template");
    cr_expect(strstr(src, "default"));
    gguf_close(f);
    f = gguf_with("{{ something unknown }}");
    cr_expect_eq(chat_template_from_gguf(f, NULL, &t, &src, &err), VERR_NOTFOUND);
    gguf_close(f);
}

// The end of a turn on a small vocabulary: the template's end text as a
// token, and the vocabulary's end-of-generation tokens.
Test(chat, end_of_turn_tokens) {
    const char *tokens[] = {"<unk>", "<s>", "</s>", "<|im_end|>", "a", "<|eot_id|>"};
    const int32_t types[] = {TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_CONTROL, TOKEN_TYPE_CONTROL,
                             TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL,  TOKEN_TYPE_NORMAL};
    struct tokenizer_desc d;
    tokenizer_desc_init(&d);
    d.model = "llama";
    d.n_tokens = LEN(tokens);
    d.tokens = tokens;
    d.token_types = types;
    struct tokenizer *tok = NULL;
    struct verr err = {0};
    cr_assert_eq(tokenizer_build(&tok, &d, &err), 0, "%s", err.msg);
    cr_expect_eq(chat_eot_token(tok, CHAT_TMPL_CHATML), 3);
    cr_expect_eq(chat_eot_token(tok, CHAT_TMPL_LLAMA3), 5);
    cr_expect_eq(chat_eot_token(tok, CHAT_TMPL_GEMMA), TOKENIZER_NULL);
    cr_expect_str_eq(chat_template_eot(CHAT_TMPL_GEMMA), "<end_of_turn>");
    cr_expect(chat_is_end_of_turn(tok, CHAT_TMPL_CHATML, 3));
    cr_expect(chat_is_end_of_turn(tok, CHAT_TMPL_CHATML, 2), "EOS ends every turn");
    cr_expect(!chat_is_end_of_turn(tok, CHAT_TMPL_CHATML, 4));
    cr_expect(chat_is_end_of_turn(tok, CHAT_TMPL_LLAMA3, 5));
    cr_expect(!chat_is_end_of_turn(tok, CHAT_TMPL_LLAMA3, -1));
    for (int t = 0; t < CHAT_TMPL_COUNT; t++)
        cr_expect_not_null(chat_template_eot((enum chat_template)t), "%s", chat_template_name(t));
    tokenizer_free(tok);
}
