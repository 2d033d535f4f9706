// Chat templates (see chat.h). Each formatter writes what llama.cpp's
// llm_chat_apply_template writes for the same template; the detection table
// holds llama.cpp's substrings in llama.cpp's order.
#include "host/tokenizer/chat.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf/gguf.h"
#include "host/tokenizer/tokenizer.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

static const char *const tmpl_names[CHAT_TMPL_COUNT] = {
    [CHAT_TMPL_CHATML] = "chatml",
    [CHAT_TMPL_LLAMA2] = "llama2",
    [CHAT_TMPL_LLAMA2_SYS] = "llama2-sys",
    [CHAT_TMPL_LLAMA2_SYS_BOS] = "llama2-sys-bos",
    [CHAT_TMPL_LLAMA2_SYS_STRIP] = "llama2-sys-strip",
    [CHAT_TMPL_MISTRAL_V1] = "mistral-v1",
    [CHAT_TMPL_MISTRAL_V3] = "mistral-v3",
    [CHAT_TMPL_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [CHAT_TMPL_MISTRAL_V7] = "mistral-v7",
    [CHAT_TMPL_MISTRAL_V7_TEKKEN] = "mistral-v7-tekken",
    [CHAT_TMPL_PHI3] = "phi3",
    [CHAT_TMPL_PHI4] = "phi4",
    [CHAT_TMPL_FALCON3] = "falcon3",
    [CHAT_TMPL_ZEPHYR] = "zephyr",
    [CHAT_TMPL_MONARCH] = "monarch",
    [CHAT_TMPL_GEMMA] = "gemma",
    [CHAT_TMPL_ORION] = "orion",
    [CHAT_TMPL_OPENCHAT] = "openchat",
    [CHAT_TMPL_VICUNA] = "vicuna",
    [CHAT_TMPL_VICUNA_ORCA] = "vicuna-orca",
    [CHAT_TMPL_DEEPSEEK] = "deepseek",
    [CHAT_TMPL_DEEPSEEK2] = "deepseek2",
    [CHAT_TMPL_DEEPSEEK3] = "deepseek3",
    [CHAT_TMPL_COMMAND_R] = "command-r",
    [CHAT_TMPL_LLAMA3] = "llama3",
    [CHAT_TMPL_CHATGLM3] = "chatglm3",
    [CHAT_TMPL_CHATGLM4] = "chatglm4",
    [CHAT_TMPL_GLMEDGE] = "glmedge",
    [CHAT_TMPL_MINICPM] = "minicpm",
    [CHAT_TMPL_EXAONE3] = "exaone3",
    [CHAT_TMPL_GRANITE] = "granite",
    [CHAT_TMPL_GPT_OSS] = "gpt-oss",
};

// Names llama.cpp knows that vela has no formatter for: a template named
// exactly so is recognised (and refused as unsupported), as llama.cpp's
// exact-name lookup would pick it.
static const char *const llamacpp_only_names[] = {
    "deepseek-ocr", "exaone4", "exaone-moe",     "rwkv-world",    "granite-4.0",   "granite-4.1",
    "gigachat",     "megrez",  "yandex",         "bailing",       "bailing-think", "bailing2",
    "llama4",       "smolvlm", "hunyuan-moe",    "hunyuan-dense", "hunyuan-vl",    "kimi-k2",
    "seed_oss",     "grok-2",  "pangu-embedded", "solar-open",    "dots1",
};

#define DS_ASSISTANT                                                                               \
    "<\xef\xbd\x9c"                                                                                \
    "Assistant\xef\xbd\x9c>" // <｜Assistant｜>
#define DS_USER                                                                                    \
    "<\xef\xbd\x9c"                                                                                \
    "User\xef\xbd\x9c>" // <｜User｜>
#define DS_EOS                                                                                     \
    "<\xef\xbd\x9c"                                                                                \
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define HY "<\xef\xbd\x9chy_"

// The default text of gpt-oss's system message (its template's
// build_system_message without model_identity or tools).
#define HARMONY_IDENTITY "You are ChatGPT, a large language model trained by OpenAI."
#define HARMONY_CHANNELS                                                                           \
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."

// One row of llama.cpp's detection chain after its <|im_start|> and mistral
// branches: the template is `name` when it contains every string of `all`.
struct detect_rule {
    const char *name;
    const char *all[4];
};

static const struct detect_rule detect_rules[] = {
    {"phi3", {"<|assistant|>", "<|end|>"}},
    {"chatglm4", {"[gMASK]<sop>"}},
    {"exaone-moe", {"<|assistant|>", "<|user|>", "<|tool_declare|>"}},
    {"falcon3", {"<|assistant|>", "<|user|>", "</s>"}},
    {"glmedge", {"<|assistant|>", "<|user|>"}},
    {"glmedge", {"<|{{ item['role'] }}|>", "<|begin_of_image|>"}},
    {"zephyr", {"<|user|>", "<|endoftext|>"}},
    {"monarch", {"bos_token + message['role']"}},
    {"gemma", {"<start_of_turn>"}},
    {"orion", {"'\\n\\nAssistant: ' + eos_token"}},
    {"openchat", {"GPT4 Correct "}},
    {"vicuna-orca", {"USER: ", "ASSISTANT: ", "SYSTEM: "}},
    {"vicuna", {"USER: ", "ASSISTANT: "}},
    {"deepseek", {"### Instruction:", "<|EOT|>"}},
    {"command-r", {"<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"}},
    {"llama3", {"<|start_header_id|>", "<|end_header_id|>"}},
    {"chatglm3", {"[gMASK]sop"}},
    {"minicpm", {"<\xe7\x94\xa8\xe6\x88\xb7>"}}, // <用户>
    {"deepseek2", {"'Assistant: ' + message['content'] + eos_token"}},
    {"deepseek3", {DS_ASSISTANT, DS_USER, DS_EOS}},
    {"exaone4", {"[|system|]", "[|assistant|]", "[|endofturn|]", "[|tool|]"}},
    {"exaone3", {"[|system|]", "[|assistant|]", "[|endofturn|]"}},
    {"rwkv-world", {"rwkv-world"}},
    {"rwkv-world", {"{{- 'User: ' + message['content']|trim + '\\n\\n' -}}"}},
    {"granite-4.0", {"<|start_of_role|>", "<tool_call>", "g4_default_system_message"}},
    {"granite-4.0", {"<|start_of_role|>", "<tools>", "g4_default_system_message"}},
    {"granite-4.1", {"<|start_of_role|>", "<tool_call>"}},
    {"granite-4.1", {"<|start_of_role|>", "<tools>"}},
    {"granite", {"<|start_of_role|>"}},
    {"gigachat",
     {"message['role'] + additional_special_tokens[0] + message['content'] + "
      "additional_special_tokens[1]"}},
    {"megrez", {"<|role_start|>"}},
    {"yandex", {" \xd0\x90\xd1\x81\xd1\x81\xd0\xb8\xd1\x81\xd1\x82\xd0\xb5\xd0\xbd\xd1\x82:"}},
    {"bailing", {"<role>ASSISTANT</role>", "'HUMAN'"}},
    {"bailing-think", {"<role>ASSISTANT</role>", "\"HUMAN\"", "<think>"}},
    {"bailing2", {"<role>ASSISTANT</role>", "<role>HUMAN</role>", "<|role_end|>"}},
    {"llama4", {"<|header_start|>", "<|header_end|>"}},
    {"dots1", {"<|endofuserprompt|>"}},
    {"hunyuan-moe", {"<|extra_0|>", "<|extra_4|>"}},
    {"gpt-oss", {"<|start|>", "<|channel|>"}},
    {"hunyuan-vl",
     {HY "Assistant\xef\xbd\x9c>", HY "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"}},
    {"hunyuan-dense",
     {HY "Assistant\xef\xbd\x9c>", HY "place\xe2\x96\x81holder\xe2\x96\x81no\xe2\x96\x81"
                                      "3\xef\xbd\x9c>"}},
    {"kimi-k2", {"<|im_assistant|>assistant<|im_middle|>"}},
    {"seed_oss", {"<seed:bos>"}},
    {"grok-2", {"'Assistant: '  + message['content'] + '<|separator|>"}},
    {"pangu-embedded",
     {"[unused9]\xe7\xb3\xbb\xe7\xbb\x9f\xef\xbc\x9a[unused10]"}}, // [unused9]系统：[unused10]
    {"solar-open", {"<|begin|>", "<|end|>", "<|content|>"}},
};

const char *chat_template_name(enum chat_template t) {
    return (unsigned)t < CHAT_TMPL_COUNT ? tmpl_names[t] : NULL;
}

size_t chat_template_list(char *buf, size_t size) {
    size_t need = 0;
    for (int t = 0; t < CHAT_TMPL_COUNT; t++) {
        const char *sep = t ? ", " : "";
        for (const char *s = sep; *s; s++, need++)
            if (need + 1 < size)
                buf[need] = *s;
        for (const char *s = tmpl_names[t]; *s; s++, need++)
            if (need + 1 < size)
                buf[need] = *s;
    }
    if (size)
        buf[need < size ? need : size - 1] = '\0';
    return need;
}

int chat_template_from_name(const char *name, enum chat_template *out, struct verr *err) {
    for (int t = 0; t < CHAT_TMPL_COUNT; t++)
        if (!strcmp(name, tmpl_names[t])) {
            *out = (enum chat_template)t;
            return 0;
        }
    char list[512];
    chat_template_list(list, sizeof list);
    for (size_t i = 0; i < LEN(llamacpp_only_names); i++)
        if (!strcmp(name, llamacpp_only_names[i]))
            return verr_set(err, VERR_UNSUPPORTED,
                            "chat template '%s' (llama.cpp's name) has no built-in formatter in "
                            "vela; built in: %s",
                            name, list);
    return verr_set(err, VERR_NOTFOUND, "unknown chat template '%s'; built in: %s", name, list);
}

static bool has(const char *hay, const char *needle) {
    return strstr(hay, needle) != NULL;
}

// llama.cpp's mistral / llama2 branch, taken when the template starts with
// "mistral" or holds "[INST]".
static const char *detect_inst(const char *t) {
    if (has(t, "[SYSTEM_PROMPT]"))
        return "mistral-v7";
    if (has(t, "' [INST] ' + system_message") || has(t, "[AVAILABLE_TOOLS]")) {
        if (has(t, " [INST]"))
            return "mistral-v1";
        if (has(t, "\"[INST]\""))
            return "mistral-v3-tekken";
        return "mistral-v3";
    }
    if (has(t, "content.strip()"))
        return "llama2-sys-strip";
    if (has(t, "bos_token + '[INST]"))
        return "llama2-sys-bos";
    if (has(t, "<<SYS>>"))
        return "llama2-sys";
    return "llama2";
}

const char *chat_template_detect_name(const char *t) {
    for (int i = 0; i < CHAT_TMPL_COUNT; i++)
        if (!strcmp(t, tmpl_names[i]))
            return tmpl_names[i];
    // "dots1" is detected by its text only: llama.cpp's name table lacks it.
    for (size_t i = 0; i < LEN(llamacpp_only_names); i++)
        if (!strcmp(t, llamacpp_only_names[i]) && strcmp(t, "dots1"))
            return llamacpp_only_names[i];
    if (has(t, "<|im_start|>"))
        return has(t, "<|im_sep|>") ? "phi4" : has(t, "<end_of_utterance>") ? "smolvlm" : "chatml";
    if (!strncmp(t, "mistral", 7) || has(t, "[INST]"))
        return detect_inst(t);
    for (size_t r = 0; r < LEN(detect_rules); r++) {
        bool all = true;
        for (size_t k = 0; k < LEN(detect_rules[r].all) && detect_rules[r].all[k]; k++)
            all = all && has(t, detect_rules[r].all[k]);
        if (all)
            return detect_rules[r].name;
    }
    return NULL;
}

int chat_template_detect(const char *tmpl, enum chat_template *out, struct verr *err) {
    const char *name = chat_template_detect_name(tmpl);
    if (name)
        return chat_template_from_name(name, out, err);
    char list[512];
    chat_template_list(list, sizeof list);
    return verr_set(err, VERR_NOTFOUND,
                    "the chat template (%zu bytes, starting \"%.40s\") is none vela recognises; "
                    "pick one with --chat-template NAME, built in: %s",
                    strlen(tmpl), tmpl, list);
}

int chat_template_from_gguf(const struct gguf_file *f, const char *override,
                            enum chat_template *out, const char **source, struct verr *err) {
    if (override) {
        if (source)
            *source = "--chat-template";
        return chat_template_from_name(override, out, err);
    }
    char *tmpl = NULL;
    int rc = gguf_get_str(f, "tokenizer.chat_template", &tmpl, err);
    if (rc == VERR_NOTFOUND) {
        if (source)
            *source = "default (no tokenizer.chat_template in the file)";
        *out = CHAT_TMPL_CHATML;
        return 0;
    }
    if (rc)
        return rc;
    if (source)
        *source = "tokenizer.chat_template";
    rc = chat_template_detect(tmpl, out, err);
    free(tmpl);
    return rc;
}

// ---------------------------------------------------------------------------
// Formatting

struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
};

static void sb_putn(struct sbuf *b, const char *s, size_t n) {
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_put(struct sbuf *b, const char *s) {
    sb_putn(b, s, strlen(s));
}

// Several pieces in a row, up to a NULL.
static void sb_cat(struct sbuf *b, const char *const *parts) {
    for (; *parts; parts++)
        sb_put(b, *parts);
}
#define SB(b, ...) sb_cat((b), (const char *const[]){__VA_ARGS__, NULL})

static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

// s without leading and trailing whitespace (C-locale isspace, as llama.cpp's trim).
static void sb_put_trim(struct sbuf *b, const char *s) {
    size_t n = strlen(s);
    while (n && is_space(*s))
        s++, n--;
    while (n && is_space(s[n - 1]))
        n--;
    sb_putn(b, s, n);
}

static bool role_is(const struct chat_msg *m, const char *role) {
    return !strcmp(m->role, role);
}

// Templates where each message is prefix + role + middle + content + suffix
// and the generation prompt a fixed string.
struct simple_fmt {
    enum chat_template t;
    const char *prefix, *middle, *suffix, *gen;
    bool trim;
};

static const struct simple_fmt simple_fmts[] = {
    {CHAT_TMPL_CHATML, "<|im_start|>", "\n", "<|im_end|>\n", "<|im_start|>assistant\n", false},
    {CHAT_TMPL_PHI3, "<|", "|>\n", "<|end|>\n", "<|assistant|>\n", false},
    {CHAT_TMPL_PHI4, "<|im_start|>", "<|im_sep|>", "<|im_end|>", "<|im_start|>assistant<|im_sep|>",
     false},
    {CHAT_TMPL_FALCON3, "<|", "|>\n", "\n", "<|assistant|>\n", false},
    {CHAT_TMPL_ZEPHYR, "<|", "|>\n", "<|endoftext|>\n", "<|assistant|>\n", false},
    {CHAT_TMPL_LLAMA3, "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>",
     "<|start_header_id|>assistant<|end_header_id|>\n\n", true},
    {CHAT_TMPL_CHATGLM3, "<|", "|>\n ", "", "<|assistant|>", false},
    {CHAT_TMPL_CHATGLM4, "<|", "|>\n", "", "<|assistant|>\n", false},
    {CHAT_TMPL_GLMEDGE, "<|", "|>\n", "", "<|assistant|>", false},
    {CHAT_TMPL_GRANITE, "<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>\n",
     "<|start_of_role|>assistant<|end_of_role|>", false},
};

static void fmt_simple(struct sbuf *b, const struct simple_fmt *f, const struct chat_msg *m,
                       size_t n, bool add_ass) {
    if (f->t == CHAT_TMPL_CHATGLM3)
        sb_put(b, "[gMASK]sop");
    else if (f->t == CHAT_TMPL_CHATGLM4)
        sb_put(b, "[gMASK]<sop>");
    for (size_t i = 0; i < n; i++) {
        SB(b, f->prefix, m[i].role, f->middle);
        if (f->t == CHAT_TMPL_GRANITE && role_is(&m[i], "assistant_tool_call"))
            sb_put(b, "<|tool_call|>");
        if (f->trim)
            sb_put_trim(b, m[i].content);
        else
            sb_put(b, m[i].content);
        sb_put(b, f->suffix);
    }
    if (add_ass)
        sb_put(b, f->gen);
}

static void fmt_mistral_v7(struct sbuf *b, enum chat_template t, const struct chat_msg *m,
                           size_t n) {
    const char *sp = t == CHAT_TMPL_MISTRAL_V7 ? " " : "";
    for (size_t i = 0; i < n; i++) {
        if (role_is(&m[i], CHAT_ROLE_RAW))
            sb_put(b, m[i].content);
        else if (role_is(&m[i], "system"))
            SB(b, "[SYSTEM_PROMPT]", sp, m[i].content, "[/SYSTEM_PROMPT]");
        else if (role_is(&m[i], "user"))
            SB(b, "[INST]", sp, m[i].content, "[/INST]");
        else
            SB(b, sp, m[i].content, "</s>");
    }
}

// mistral v1, v3 and v3-tekken: a system message goes inside the first [INST].
static void fmt_mistral(struct sbuf *b, enum chat_template t, const struct chat_msg *m, size_t n) {
    const char *lead = t == CHAT_TMPL_MISTRAL_V1 ? " " : "";
    const char *trail = t == CHAT_TMPL_MISTRAL_V3_TEKKEN ? "" : " ";
    bool in_turn = false;
    for (size_t i = 0; i < n; i++) {
        if (role_is(&m[i], CHAT_ROLE_RAW)) { // between turns: the next user opens one
            sb_put(b, m[i].content);
            in_turn = false;
            continue;
        }
        if (!in_turn) {
            SB(b, lead, "[INST]", trail);
            in_turn = true;
        }
        if (role_is(&m[i], "system")) {
            SB(b, m[i].content, "\n\n");
        } else if (role_is(&m[i], "user")) {
            SB(b, m[i].content, lead, "[/INST]");
        } else {
            sb_put(b, trail);
            if (t == CHAT_TMPL_MISTRAL_V3)
                sb_put_trim(b, m[i].content);
            else
                sb_put(b, m[i].content);
            sb_put(b, "</s>");
            in_turn = false;
        }
    }
}

static void fmt_llama2(struct sbuf *b, enum chat_template t, const struct chat_msg *m, size_t n) {
    const bool sys = t != CHAT_TMPL_LLAMA2;
    const bool strip = t == CHAT_TMPL_LLAMA2_SYS_STRIP;
    bool in_turn = true; // the first [INST] is written here, its BOS by the tokenizer
    sb_put(b, "[INST] ");
    for (size_t i = 0; i < n; i++) {
        if (!in_turn) {
            in_turn = true;
            sb_put(b, t == CHAT_TMPL_LLAMA2_SYS_BOS ? "<s>[INST] " : "[INST] ");
        }
        const bool is_sys = role_is(&m[i], "system"), is_user = role_is(&m[i], "user");
        if (is_sys && sys)
            sb_put(b, "<<SYS>>\n");
        if (strip)
            sb_put_trim(b, m[i].content);
        else
            sb_put(b, m[i].content);
        if (is_sys)
            sb_put(b, sys ? "\n<</SYS>>\n\n" : "\n");
        else if (is_user)
            sb_put(b, " [/INST]");
        else {
            sb_put(b, "</s>");
            in_turn = false;
        }
    }
}

// gemma: no system role; the system text opens the next non-model message.
static void fmt_gemma(struct sbuf *b, const struct chat_msg *m, size_t n, bool add_ass) {
    struct sbuf sys = {0};
    for (size_t i = 0; i < n; i++) {
        if (role_is(&m[i], "system")) {
            sb_put_trim(&sys, m[i].content);
            continue;
        }
        const char *role = role_is(&m[i], "assistant") ? "model" : m[i].role;
        SB(b, "<start_of_turn>", role, "\n");
        if (sys.len && strcmp(role, "model")) {
            SB(b, sys.p, "\n\n");
            sys.len = 0;
        }
        sb_put_trim(b, m[i].content);
        sb_put(b, "<end_of_turn>\n");
    }
    b->oom |= sys.oom;
    free(sys.p);
    if (add_ass)
        sb_put(b, "<start_of_turn>model\n");
}

static void fmt_orion(struct sbuf *b, const struct chat_msg *m, size_t n) {
    struct sbuf sys = {0};
    for (size_t i = 0; i < n; i++) {
        if (role_is(&m[i], "system")) {
            sb_put(&sys, m[i].content);
        } else if (role_is(&m[i], "user")) {
            sb_put(b, "Human: ");
            if (sys.len) {
                SB(b, sys.p, "\n\n");
                sys.len = 0;
            }
            SB(b, m[i].content, "\n\nAssistant: </s>");
        } else {
            SB(b, m[i].content, "</s>");
        }
    }
    b->oom |= sys.oom;
    free(sys.p);
}

static void fmt_monarch(struct sbuf *b, const struct chat_msg *m, size_t n, bool add_ass) {
    for (size_t i = 0; i < n; i++)
        SB(b, i ? "<s>" : "", m[i].role, "\n", m[i].content, "</s>\n");
    if (add_ass)
        sb_put(b, "<s>assistant\n");
}

static void fmt_openchat(struct sbuf *b, const struct chat_msg *m, size_t n, bool add_ass) {
    for (size_t i = 0; i < n; i++) {
        if (role_is(&m[i], "system")) {
            SB(b, m[i].content, "<|end_of_turn|>");
            continue;
        }
        char first[2] = {m[i].role[0], 0};
        if (first[0] >= 'a' && first[0] <= 'z')
            first[0] = (char)(first[0] - 'a' + 'A');
        SB(b, "GPT4 Correct ", first, m[i].role[0] ? m[i].role + 1 : "", ": ", m[i].content,
           "<|end_of_turn|>");
    }
    if (add_ass)
        sb_put(b, "GPT4 Correct Assistant:");
}

static void fmt_vicuna(struct sbuf *b, enum chat_template t, const struct chat_msg *m, size_t n,
                       bool add_ass) {
    for (size_t i = 0; i < n; i++) {
        if (role_is(&m[i], "system")) {
            if (t == CHAT_TMPL_VICUNA_ORCA)
                SB(b, "SYSTEM: ", m[i].content, "\n");
            else
                SB(b, m[i].content, "\n\n");
        } else if (role_is(&m[i], "user")) {
            SB(b, "USER: ", m[i].content, "\n");
        } else if (role_is(&m[i], "assistant")) {
            SB(b, "ASSISTANT: ", m[i].content, "</s>\n");
        }
    }
    if (add_ass)
        sb_put(b, "ASSISTANT:");
}

// Templates that write system, user and assistant messages each with their
// own prefix and suffix (other roles are dropped), then a generation prompt.
struct role_fmt {
    enum chat_template t;
    const char *sys[2], *user[2], *ass[2], *gen;
    bool trim;
};

static const struct role_fmt role_fmts[] = {
    {CHAT_TMPL_DEEPSEEK,
     {"", ""},
     {"### Instruction:\n", "\n"},
     {"### Response:\n", "\n<|EOT|>\n"},
     "### Response:\n",
     false},
    {CHAT_TMPL_DEEPSEEK2,
     {"", "\n\n"},
     {"User: ", "\n\n"},
     {"Assistant: ", DS_EOS},
     "Assistant:",
     false},
    {CHAT_TMPL_DEEPSEEK3, {"", "\n\n"}, {DS_USER, ""}, {DS_ASSISTANT, DS_EOS}, DS_ASSISTANT, false},
    {CHAT_TMPL_COMMAND_R,
     {"<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>", "<|END_OF_TURN_TOKEN|>"},
     {"<|START_OF_TURN_TOKEN|><|USER_TOKEN|>", "<|END_OF_TURN_TOKEN|>"},
     {"<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"},
     "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
     true},
    {CHAT_TMPL_EXAONE3,
     {"[|system|]", "[|endofturn|]\n"},
     {"[|user|]", "\n"},
     {"[|assistant|]", "[|endofturn|]\n"},
     "[|assistant|]",
     true},
};

static void fmt_roles(struct sbuf *b, const struct role_fmt *f, const struct chat_msg *m, size_t n,
                      bool add_ass) {
    for (size_t i = 0; i < n; i++) {
        const char *const *w = role_is(&m[i], "system")      ? f->sys
                               : role_is(&m[i], "user")      ? f->user
                               : role_is(&m[i], "assistant") ? f->ass
                                                             : NULL;
        if (!w)
            continue;
        sb_put(b, w[0]);
        if (f->trim)
            sb_put_trim(b, m[i].content);
        else
            sb_put(b, m[i].content);
        sb_put(b, w[1]);
    }
    if (add_ass)
        sb_put(b, f->gen);
}

// minicpm: user turns are wrapped, everything else is written trimmed as is.
static void fmt_minicpm(struct sbuf *b, const struct chat_msg *m, size_t n) {
    for (size_t i = 0; i < n; i++) {
        bool user = role_is(&m[i], "user");
        if (user)
            sb_put(b, "<\xe7\x94\xa8\xe6\x88\xb7>"); // <用户>
        sb_put_trim(b, m[i].content);
        if (user)
            sb_put(b, "<AI>");
    }
}

// gpt-oss: the harmony format as openai-gpt-oss's template renders it for
// inference (chat.h). Roles the template drops (a system message after the
// first, a developer message there) are dropped.
static void fmt_gpt_oss(struct sbuf *b, const struct chat_msg *m, size_t n,
                        const struct chat_opts *o, bool add_ass) {
    char date[32] = "";
    time_t now = time(NULL);
    struct tm tm;
    if (localtime_r(&now, &tm))
        strftime(date, sizeof date, "%Y-%m-%d", &tm);
    const char *tools = NULL;
    for (size_t i = 0; i < n; i++)
        if (role_is(&m[i], CHAT_ROLE_TOOLS))
            tools = m[i].content;
    const char *identity = o->model_identity ? o->model_identity : HARMONY_IDENTITY;
    const char *effort = o->reasoning_effort ? o->reasoning_effort : "medium";
    SB(b, "<|start|>system<|message|>", identity,
       "\nKnowledge cutoff: 2024-06\nCurrent date: ", date, "\n\nReasoning: ", effort,
       "\n\n" HARMONY_CHANNELS);
    if (tools)
        sb_put(b, "\nCalls to these tools must go to the commentary channel: 'functions'.");
    sb_put(b, "<|end|>");
    size_t i = 0;
    const char *dev = "";
    if (n && (role_is(&m[0], "system") || role_is(&m[0], "developer")))
        dev = m[i++].content;
    if (dev[0] || tools) {
        sb_put(b, "<|start|>developer<|message|>");
        if (dev[0])
            SB(b, "# Instructions\n\n", dev, "\n\n");
        if (tools)
            SB(b, "# Tools\n\n", tools);
        sb_put(b, "<|end|>");
    }
    for (; i < n; i++) {
        if (role_is(&m[i], CHAT_ROLE_RAW))
            sb_put(b, m[i].content);
        else if (role_is(&m[i], "assistant"))
            SB(b, "<|start|>assistant<|channel|>final<|message|>", m[i].content, "<|end|>");
        else if (role_is(&m[i], "user"))
            SB(b, "<|start|>user<|message|>", m[i].content, "<|end|>");
    }
    if (add_ass)
        sb_put(b, "<|start|>assistant");
}

static void fmt_dispatch(struct sbuf *b, enum chat_template t, const struct chat_msg *m, size_t n,
                         const struct chat_opts *o, bool add_ass) {
    for (size_t i = 0; i < LEN(simple_fmts); i++)
        if (simple_fmts[i].t == t)
            return fmt_simple(b, &simple_fmts[i], m, n, add_ass);
    for (size_t i = 0; i < LEN(role_fmts); i++)
        if (role_fmts[i].t == t)
            return fmt_roles(b, &role_fmts[i], m, n, add_ass);
    switch (t) {
    case CHAT_TMPL_MISTRAL_V7:
    case CHAT_TMPL_MISTRAL_V7_TEKKEN:
        return fmt_mistral_v7(b, t, m, n);
    case CHAT_TMPL_MISTRAL_V1:
    case CHAT_TMPL_MISTRAL_V3:
    case CHAT_TMPL_MISTRAL_V3_TEKKEN:
        return fmt_mistral(b, t, m, n);
    case CHAT_TMPL_LLAMA2:
    case CHAT_TMPL_LLAMA2_SYS:
    case CHAT_TMPL_LLAMA2_SYS_BOS:
    case CHAT_TMPL_LLAMA2_SYS_STRIP:
        return fmt_llama2(b, t, m, n);
    case CHAT_TMPL_GEMMA:
        return fmt_gemma(b, m, n, add_ass);
    case CHAT_TMPL_ORION:
        return fmt_orion(b, m, n);
    case CHAT_TMPL_MONARCH:
        return fmt_monarch(b, m, n, add_ass);
    case CHAT_TMPL_OPENCHAT:
        return fmt_openchat(b, m, n, add_ass);
    case CHAT_TMPL_VICUNA:
    case CHAT_TMPL_VICUNA_ORCA:
        return fmt_vicuna(b, t, m, n, add_ass);
    case CHAT_TMPL_MINICPM:
        return fmt_minicpm(b, m, n);
    case CHAT_TMPL_GPT_OSS:
        return fmt_gpt_oss(b, m, n, o, add_ass);
    default:
        return;
    }
}

bool chat_template_takes_raw(enum chat_template t) {
    return t == CHAT_TMPL_MISTRAL_V3 || t == CHAT_TMPL_MISTRAL_V3_TEKKEN ||
           t == CHAT_TMPL_MISTRAL_V7 || t == CHAT_TMPL_MISTRAL_V7_TEKKEN || t == CHAT_TMPL_GPT_OSS;
}

bool chat_template_reads(enum chat_template t, const char *var) {
    return t == CHAT_TMPL_GPT_OSS && var &&
           (!strcmp(var, CHAT_VAR_REASONING_EFFORT) || !strcmp(var, CHAT_VAR_MODEL_IDENTITY));
}

int chat_opts_check(enum chat_template t, const struct chat_opts *o, struct verr *err) {
    if ((unsigned)t >= CHAT_TMPL_COUNT)
        return verr_set(err, VERR_RANGE, "chat template %d out of range", (int)t);
    if (!o)
        return 0;
    const char *given[] = {o->reasoning_effort ? CHAT_VAR_REASONING_EFFORT : NULL,
                           o->model_identity ? CHAT_VAR_MODEL_IDENTITY : NULL};
    for (size_t i = 0; i < LEN(given); i++)
        if (given[i] && !chat_template_reads(t, given[i]))
            return verr_set(err, VERR_UNSUPPORTED,
                            "the chat template '%s' has no variable %s (only gpt-oss's reads "
                            "reasoning_effort and model_identity)",
                            chat_template_name(t), given[i]);
    const char *e = o->reasoning_effort;
    if (e && strcmp(e, "low") && strcmp(e, "medium") && strcmp(e, "high"))
        return verr_set(err, VERR_RANGE,
                        "reasoning_effort '%.64s' is not one of \"low\", \"medium\", \"high\"", e);
    return 0;
}

int chat_format(enum chat_template t, const struct chat_msg *msgs, size_t n,
                const struct chat_opts *opts, bool add_generation_prompt, char **out, size_t *len,
                struct verr *err) {
    *out = NULL;
    *len = 0;
    int rc = chat_opts_check(t, opts, err);
    if (rc)
        return rc;
    const struct chat_opts none = {0};
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content)
            return verr_set(err, VERR_RANGE, "chat message %zu has no %s", i,
                            msgs[i].role ? "content" : "role");
        if (role_is(&msgs[i], CHAT_ROLE_RAW) && !chat_template_takes_raw(t))
            return verr_set(err, VERR_RANGE,
                            "chat message %zu: the template '%s' has no place for raw text", i,
                            chat_template_name(t));
    }
    struct sbuf b = {0};
    sb_put(&b, ""); // an empty conversation is "", not NULL
    fmt_dispatch(&b, t, msgs, n, opts ? opts : &none, add_generation_prompt);
    if (b.oom) {
        free(b.p);
        return verr_set(err, VERR_NOMEM, "out of memory formatting a chat of %zu messages", n);
    }
    *out = b.p;
    *len = b.len;
    return 0;
}

int chat_format_next(enum chat_template t, const struct chat_msg *msgs, size_t n,
                     const struct chat_opts *opts, bool add_generation_prompt, char **out,
                     size_t *len, struct verr *err) {
    *out = NULL;
    *len = 0;
    if (n == 0)
        return verr_set(err, VERR_RANGE, "chat_format_next needs at least one message");
    char *past = NULL, *all = NULL;
    size_t past_len = 0, all_len = 0;
    int rc = chat_format(t, msgs, n - 1, opts, false, &past, &past_len, err);
    if (!rc)
        rc = chat_format(t, msgs, n, opts, add_generation_prompt, &all, &all_len, err);
    if (!rc) {
        // The history formatted alone may differ from its prefix in the whole
        // (llama.cpp takes the tail by length all the same).
        size_t from = past_len < all_len ? past_len : all_len;
        bool nl = add_generation_prompt && past_len && past[past_len - 1] == '\n';
        struct sbuf b = {0};
        sb_put(&b, nl ? "\n" : "");
        sb_putn(&b, all + from, all_len - from);
        if (b.oom)
            rc = verr_set(err, VERR_NOMEM, "out of memory formatting a chat message");
        else
            *out = b.p, *len = b.len;
        if (rc)
            free(b.p);
    }
    free(past);
    free(all);
    return rc;
}

// ---------------------------------------------------------------------------
// End of turn

static const char *const eot_texts[CHAT_TMPL_COUNT] = {
    [CHAT_TMPL_CHATML] = "<|im_end|>",
    [CHAT_TMPL_LLAMA2] = "</s>",
    [CHAT_TMPL_LLAMA2_SYS] = "</s>",
    [CHAT_TMPL_LLAMA2_SYS_BOS] = "</s>",
    [CHAT_TMPL_LLAMA2_SYS_STRIP] = "</s>",
    [CHAT_TMPL_MISTRAL_V1] = "</s>",
    [CHAT_TMPL_MISTRAL_V3] = "</s>",
    [CHAT_TMPL_MISTRAL_V3_TEKKEN] = "</s>",
    [CHAT_TMPL_MISTRAL_V7] = "</s>",
    [CHAT_TMPL_MISTRAL_V7_TEKKEN] = "</s>",
    [CHAT_TMPL_PHI3] = "<|end|>",
    [CHAT_TMPL_PHI4] = "<|im_end|>",
    [CHAT_TMPL_FALCON3] = "<|endoftext|>",
    [CHAT_TMPL_ZEPHYR] = "<|endoftext|>",
    [CHAT_TMPL_MONARCH] = "</s>",
    [CHAT_TMPL_GEMMA] = "<end_of_turn>",
    [CHAT_TMPL_ORION] = "</s>",
    [CHAT_TMPL_OPENCHAT] = "<|end_of_turn|>",
    [CHAT_TMPL_VICUNA] = "</s>",
    [CHAT_TMPL_VICUNA_ORCA] = "</s>",
    [CHAT_TMPL_DEEPSEEK] = "<|EOT|>",
    [CHAT_TMPL_DEEPSEEK2] = DS_EOS,
    [CHAT_TMPL_DEEPSEEK3] = DS_EOS,
    [CHAT_TMPL_COMMAND_R] = "<|END_OF_TURN_TOKEN|>",
    [CHAT_TMPL_LLAMA3] = "<|eot_id|>",
    [CHAT_TMPL_CHATGLM3] = "<|user|>",
    [CHAT_TMPL_CHATGLM4] = "<|user|>",
    [CHAT_TMPL_GLMEDGE] = "<|user|>",
    [CHAT_TMPL_MINICPM] = "</s>",
    [CHAT_TMPL_EXAONE3] = "[|endofturn|]",
    [CHAT_TMPL_GRANITE] = "<|end_of_text|>",
    [CHAT_TMPL_GPT_OSS] = "<|return|>",
};

const char *chat_template_eot(enum chat_template t) {
    return (unsigned)t < CHAT_TMPL_COUNT ? eot_texts[t] : NULL;
}

int32_t chat_eot_token(const struct tokenizer *tok, enum chat_template t) {
    const char *s = chat_template_eot(t);
    return s ? tokenizer_find(tok, s, strlen(s)) : TOKENIZER_NULL;
}

bool chat_is_end_of_turn(const struct tokenizer *tok, enum chat_template t, int32_t id) {
    if (id < 0)
        return false;
    return tokenizer_is_eog(tok, id) || id == chat_eot_token(tok, t);
}
