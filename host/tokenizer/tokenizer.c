// The tokenizer: vocabulary, special-token handling, SentencePiece and
// byte-level BPE encoding, pieces and detokenization. The pre-tokenizers
// live in tokenizer_pre.c, the GGUF loading in tokenizer_load.c.
//
// Behaviour follows llama.cpp's llama-vocab.cpp (the reference for what the
// ids must be); the code is our own.
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/tokenizer/tokenizer.h"
#include "host/tokenizer/unicode.h"

// ---------------------------------------------------------------------------
// Hash table of byte strings -> int32, keys kept by the caller.

struct keyset {
    const char *blob;    // keys live here
    const size_t *off;   // [n] start of key i in blob
    const uint32_t *len; // [n]
};

struct strmap {
    int32_t *slots; // [cap]: entry index, -1 = empty
    uint32_t cap;   // power of two, > 2 * entries
};

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; // FNV-1a
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static int strmap_init(struct strmap *m, uint32_t n) {
    uint32_t cap = 16;
    while (cap < 2u * n + 1) {
        if (cap > (1u << 30))
            return -1;
        cap *= 2;
    }
    m->slots = malloc((size_t)cap * sizeof *m->slots);
    if (!m->slots)
        return -1;
    memset(m->slots, 0xFF, (size_t)cap * sizeof *m->slots);
    m->cap = cap;
    return 0;
}

// Returns the entry index holding key, or -1.
static int32_t strmap_find(const struct strmap *m, const struct keyset *k, const char *key,
                           size_t n) {
    if (!m->slots)
        return -1;
    uint32_t mask = m->cap - 1, i = (uint32_t)hash_bytes(key, n) & mask;
    for (;;) {
        int32_t e = m->slots[i];
        if (e < 0)
            return -1;
        if (k->len[e] == n && memcmp(k->blob + k->off[e], key, n) == 0)
            return e;
        i = (i + 1) & mask;
    }
}

// Inserts entry e (whose key is in k); returns the entry already holding an
// equal key, or -1 when e was inserted.
static int32_t strmap_insert(struct strmap *m, const struct keyset *k, int32_t e) {
    const char *key = k->blob + k->off[e];
    size_t n = k->len[e];
    uint32_t mask = m->cap - 1, i = (uint32_t)hash_bytes(key, n) & mask;
    for (;;) {
        int32_t o = m->slots[i];
        if (o < 0) {
            m->slots[i] = e;
            return -1;
        }
        if (k->len[o] == n && memcmp(k->blob + k->off[o], key, n) == 0)
            return o;
        i = (i + 1) & mask;
    }
}

// ---------------------------------------------------------------------------
// The tokenizer

struct tokenizer {
    enum tokenizer_type type;
    enum tokenizer_pre pre;
    int32_t n_vocab;

    // Vocabulary: token i's text is text_blob + text_off[i] (NUL-terminated).
    char *text_blob;
    size_t *text_off;
    uint32_t *text_len;
    float *scores;
    uint32_t *attrs;
    struct strmap tok_map;

    // BPE merges: entry j's key is [4-byte length of left] left right.
    char *merge_blob;
    size_t *merge_off;
    uint32_t *merge_len;
    int32_t *merge_rank;
    int32_t n_merges; // as given (ranks)
    struct strmap merge_map;

    // Pieces for special = true (see tokenizer_piece).
    char *piece_blob;
    size_t *piece_off;
    uint32_t *piece_len;

    int32_t bos, eos, eot, eom, unk, sep, pad, nl;
    int32_t fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
    bool add_bos, add_eos, add_space_prefix, ignore_merges, clean_spaces;

    int32_t *specials; // control / user-defined / unknown ids, longest text first
    int32_t n_specials;
    uint8_t *eog;          // [n_vocab] 1 = end of generation
    int32_t byte_tok[256]; // SPM byte fallback tokens, TOKENIZER_NULL if none
};

static struct keyset tok_keys(const struct tokenizer *t) {
    return (struct keyset){t->text_blob, t->text_off, t->text_len};
}

static struct keyset merge_keys(const struct tokenizer *t) {
    return (struct keyset){t->merge_blob, t->merge_off, t->merge_len};
}

int32_t tokenizer_find(const struct tokenizer *t, const char *text, size_t len) {
    struct keyset k = tok_keys(t);
    return strmap_find(&t->tok_map, &k, text, len);
}

static bool tok_text_is(const struct tokenizer *t, int32_t id, const char *s) {
    size_t n = strlen(s);
    return t->text_len[id] == n && memcmp(t->text_blob + t->text_off[id], s, n) == 0;
}

static bool valid_id(const struct tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab;
}

void tokenizer_desc_init(struct tokenizer_desc *d) {
    memset(d, 0, sizeof *d);
    d->bos = d->eos = d->eot = d->eom = d->unk = d->sep = d->pad = TOKENIZER_ID_UNSET;
    d->fim_pre = d->fim_suf = d->fim_mid = TOKENIZER_ID_UNSET;
    d->fim_pad = d->fim_rep = d->fim_sep = TOKENIZER_ID_UNSET;
    d->add_bos = d->add_eos = d->add_space_prefix = -1;
}

void tokenizer_free(struct tokenizer *t) {
    if (!t)
        return;
    free(t->text_blob);
    free(t->text_off);
    free(t->text_len);
    free(t->scores);
    free(t->attrs);
    free(t->tok_map.slots);
    free(t->merge_blob);
    free(t->merge_off);
    free(t->merge_len);
    free(t->merge_rank);
    free(t->merge_map.slots);
    free(t->piece_blob);
    free(t->piece_off);
    free(t->piece_len);
    free(t->specials);
    free(t->eog);
    free(t);
}

// ---------------------------------------------------------------------------
// Pre-tokenizer names

struct pre_name {
    const char *name;
    enum tokenizer_pre pre;
    bool clean_spaces;  // llama.cpp's clean_up_tokenization_spaces for it
    bool ignore_merges; // a word that is a token is emitted whole
    bool add_bos;       // default for add_bos_token
    bool no_bos;        // the model has no BOS token
};

static const struct pre_name pre_names[] = {
    {"default", TOKENIZER_PRE_DEFAULT, true, false, false, false},
    {"llama3", TOKENIZER_PRE_LLAMA3, true, true, true, false},
    {"llama-v3", TOKENIZER_PRE_LLAMA3, true, true, true, false},
    {"llama-bpe", TOKENIZER_PRE_LLAMA3, true, true, true, false},
    {"falcon3", TOKENIZER_PRE_LLAMA3, true, true, true, false},
    {"falcon-h1", TOKENIZER_PRE_LLAMA3, true, true, true, false},
    {"pixtral", TOKENIZER_PRE_LLAMA3, true, true, true, false},
    {"midm-2.0", TOKENIZER_PRE_LLAMA3, true, true, true, false},
    {"lfm2", TOKENIZER_PRE_LLAMA3, true, true, true, false},
    {"dbrx", TOKENIZER_PRE_LLAMA3, true, false, false, false},
    {"smaug-bpe", TOKENIZER_PRE_LLAMA3, true, false, false, false},
    {"chatglm-bpe", TOKENIZER_PRE_LLAMA3, true, false, false, true},
    {"glm4", TOKENIZER_PRE_LLAMA3, true, false, false, true},
    {"deepseek-llm", TOKENIZER_PRE_DEEPSEEK_LLM, false, false, false, false},
    {"deepseek-coder", TOKENIZER_PRE_DEEPSEEK_CODER, false, false, false, false},
    {"falcon", TOKENIZER_PRE_FALCON, true, false, false, false},
    {"mpt", TOKENIZER_PRE_GPT2, true, false, false, false},
    {"olmo", TOKENIZER_PRE_GPT2, true, false, false, false},
    {"jais", TOKENIZER_PRE_GPT2, true, false, false, false},
    {"gpt-2", TOKENIZER_PRE_GPT2, true, false, false, false},
    {"phi-2", TOKENIZER_PRE_GPT2, true, false, false, false},
    {"jina-es", TOKENIZER_PRE_GPT2, true, false, false, false},
    {"jina-de", TOKENIZER_PRE_GPT2, true, false, false, false},
    {"jina-v1-en", TOKENIZER_PRE_GPT2, true, false, false, false},
    {"jina-v2-es", TOKENIZER_PRE_GPT2, true, false, false, false},
    {"jina-v2-de", TOKENIZER_PRE_GPT2, true, false, false, false},
    {"jina-v2-code", TOKENIZER_PRE_GPT2, true, false, false, false},
    {"roberta-bpe", TOKENIZER_PRE_GPT2, true, false, false, false},
    {"gigachat", TOKENIZER_PRE_GPT2, true, false, false, false},
    {"a.x-4.0", TOKENIZER_PRE_GPT2, true, false, false, false},
    {"mellum", TOKENIZER_PRE_GPT2, true, false, false, false},
    {"modern-bert", TOKENIZER_PRE_GPT2, true, false, false, false},
    {"exaone4", TOKENIZER_PRE_GPT2, true, false, false, false},
    {"trillion", TOKENIZER_PRE_GPT2, false, false, false, false},
    {"granite-docling", TOKENIZER_PRE_GPT2, false, false, false, false},
    {"starcoder", TOKENIZER_PRE_STARCODER, true, false, false, false},
    {"refact", TOKENIZER_PRE_STARCODER, true, false, false, false},
    {"command-r", TOKENIZER_PRE_STARCODER, false, false, false, false},
    {"smollm", TOKENIZER_PRE_STARCODER, false, false, false, false},
    {"codeshell", TOKENIZER_PRE_STARCODER, true, false, false, false},
    {"exaone", TOKENIZER_PRE_STARCODER, true, false, false, false},
    {"minerva-7b", TOKENIZER_PRE_STARCODER, true, false, false, false},
    {"mellum2", TOKENIZER_PRE_STARCODER, true, false, false, false},
    {"qwen2", TOKENIZER_PRE_QWEN2, false, false, false, false},
    {"deepseek-r1-qwen", TOKENIZER_PRE_QWEN2, false, false, false, false},
    {"kormo", TOKENIZER_PRE_QWEN2, false, false, false, false},
    {"f2llmv2", TOKENIZER_PRE_QWEN2, false, false, false, false},
    {"stablelm2", TOKENIZER_PRE_QWEN2, true, false, false, false},
    {"megrez", TOKENIZER_PRE_QWEN2, true, false, false, false},
    {"hunyuan", TOKENIZER_PRE_QWEN2, false, false, false, false},
    {"solar-open", TOKENIZER_PRE_QWEN2, false, false, false, false},
    {"grok-2", TOKENIZER_PRE_QWEN2, false, false, false, false},
    {"gpt-4o", TOKENIZER_PRE_GPT4O, false, false, false, false},
    {"llama4", TOKENIZER_PRE_GPT4O, false, false, false, false},
    {"kanana2", TOKENIZER_PRE_GPT4O, false, false, false, false},
    {"talkie", TOKENIZER_PRE_GPT4O, false, false, false, false},
    {"minimax-m2", TOKENIZER_PRE_GPT4O, false, false, false, false},
};

static const struct pre_name *pre_lookup(const char *name) {
    for (size_t i = 0; i < sizeof pre_names / sizeof pre_names[0]; i++)
        if (!strcmp(pre_names[i].name, name))
            return &pre_names[i];
    return NULL;
}

int tokenizer_pre_from_name(const char *name, enum tokenizer_pre *pre, struct verr *err) {
    const struct pre_name *p = pre_lookup(name);
    if (!p)
        return verr_set(err, VERR_UNSUPPORTED,
                        "tokenizer.ggml.pre '%s': pre-tokenizer not supported by vela", name);
    *pre = p->pre;
    return 0;
}

const char *tokenizer_pre_name(enum tokenizer_pre pre) {
    switch (pre) {
    case TOKENIZER_PRE_DEFAULT:
        return "default";
    case TOKENIZER_PRE_LLAMA3:
        return "llama3";
    case TOKENIZER_PRE_QWEN2:
        return "qwen2";
    case TOKENIZER_PRE_GPT2:
        return "gpt-2";
    case TOKENIZER_PRE_DEEPSEEK_LLM:
        return "deepseek-llm";
    case TOKENIZER_PRE_DEEPSEEK_CODER:
        return "deepseek-coder";
    case TOKENIZER_PRE_FALCON:
        return "falcon";
    case TOKENIZER_PRE_STARCODER:
        return "starcoder";
    case TOKENIZER_PRE_GPT4O:
        return "gpt-4o";
    case TOKENIZER_PRE_COUNT:
        break;
    }
    return "unknown";
}

// ---------------------------------------------------------------------------
// Building

static size_t desc_len(const char *const *s, const size_t *lens, uint32_t i) {
    return lens ? lens[i] : strlen(s[i]);
}

static uint32_t attr_from_type(int32_t type) {
    switch (type) {
    case TOKEN_TYPE_NORMAL:
        return TOKEN_ATTR_NORMAL;
    case TOKEN_TYPE_UNKNOWN:
        return TOKEN_ATTR_UNKNOWN;
    case TOKEN_TYPE_CONTROL:
        return TOKEN_ATTR_CONTROL;
    case TOKEN_TYPE_USER_DEFINED:
        return TOKEN_ATTR_USER_DEFINED;
    case TOKEN_TYPE_UNUSED:
        return TOKEN_ATTR_UNUSED;
    case TOKEN_TYPE_BYTE:
        return TOKEN_ATTR_BYTE;
    default:
        return TOKEN_ATTR_UNDEFINED;
    }
}

static int build_vocab(struct tokenizer *t, const struct tokenizer_desc *d, struct verr *err) {
    uint32_t n = d->n_tokens;
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t l = desc_len(d->tokens, d->token_lens, i);
        if (l > UINT32_MAX / 2)
            return verr_set(err, VERR_RANGE, "tokenizer: token %u is %zu bytes long", i, l);
        total += (l ? l : 32) + 1; // an empty token becomes "[EMPTY_i]"
    }
    t->text_blob = malloc(total ? total : 1);
    t->text_off = malloc((size_t)n * sizeof *t->text_off);
    t->text_len = malloc((size_t)n * sizeof *t->text_len);
    t->scores = malloc((size_t)n * sizeof *t->scores);
    t->attrs = malloc((size_t)n * sizeof *t->attrs);
    if (!t->text_blob || !t->text_off || !t->text_len || !t->scores || !t->attrs ||
        strmap_init(&t->tok_map, n))
        return verr_set(err, VERR_NOMEM, "tokenizer: out of memory for %u tokens", n);
    size_t pos = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t l = desc_len(d->tokens, d->token_lens, i);
        t->text_off[i] = pos;
        if (l == 0) // llama.cpp's placeholder, so the text stays unique and non-empty
            l = (size_t)snprintf(t->text_blob + pos, 32, "[EMPTY_%u]", i);
        else
            memcpy(t->text_blob + pos, d->tokens[i], l);
        t->text_blob[pos + l] = '\0';
        t->text_len[i] = (uint32_t)l;
        pos += l + 1;
        t->scores[i] = d->scores ? d->scores[i] : 0.0f;
        t->attrs[i] = d->token_types ? attr_from_type(d->token_types[i]) : TOKEN_ATTR_NORMAL;
    }
    struct keyset k = tok_keys(t);
    for (uint32_t i = 0; i < n; i++) {
        int32_t o = strmap_insert(&t->tok_map, &k, (int32_t)i);
        if (o >= 0)
            return verr_set(err, VERR_FORMAT,
                            "tokenizer.ggml.tokens: duplicate token '%.*s' at ids %d and %u",
                            (int)(t->text_len[i] > 64 ? 64 : t->text_len[i]),
                            t->text_blob + t->text_off[i], o, i);
    }
    return 0;
}

static int build_merges(struct tokenizer *t, const struct tokenizer_desc *d, struct verr *err) {
    uint32_t n = d->n_merges;
    if (n > INT32_MAX)
        return verr_set(err, VERR_RANGE, "tokenizer.ggml.merges: %u merges", n);
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t l = desc_len(d->merges, d->merge_lens, i);
        if (l > UINT32_MAX / 2)
            return verr_set(err, VERR_RANGE, "tokenizer.ggml.merges[%u]: %zu bytes long", i, l);
        total += l + 4;
    }
    t->n_merges = (int32_t)n;
    t->merge_blob = malloc(total ? total : 1);
    t->merge_off = malloc(((size_t)n + 1) * sizeof *t->merge_off);
    t->merge_len = malloc(((size_t)n + 1) * sizeof *t->merge_len);
    t->merge_rank = malloc(((size_t)n + 1) * sizeof *t->merge_rank);
    if (!t->merge_blob || !t->merge_off || !t->merge_len || !t->merge_rank ||
        strmap_init(&t->merge_map, n))
        return verr_set(err, VERR_NOMEM, "tokenizer: out of memory for %u merges", n);
    struct keyset k = merge_keys(t);
    size_t pos = 0;
    int32_t entries = 0;
    for (uint32_t i = 0; i < n; i++) {
        const char *m = d->merges[i];
        size_t l = desc_len(d->merges, d->merge_lens, i);
        // "left right", split at the first space after the first byte; a
        // merge without one pairs two empty strings (and never applies).
        size_t sp = 0;
        for (size_t j = 1; j < l; j++)
            if (m[j] == ' ') {
                sp = j;
                break;
            }
        size_t ll = sp ? sp : 0, rl = sp ? l - sp - 1 : 0;
        uint32_t l32 = (uint32_t)ll;
        char *key = t->merge_blob + pos;
        memcpy(key, &l32, 4);
        memcpy(key + 4, m, ll);
        memcpy(key + 4 + ll, m + (sp ? sp + 1 : 0), rl);
        t->merge_off[entries] = pos;
        t->merge_len[entries] = (uint32_t)(4 + ll + rl);
        t->merge_rank[entries] = (int32_t)i;
        // The first of duplicate merges keeps its rank.
        if (strmap_insert(&t->merge_map, &k, entries) < 0) {
            pos += 4 + ll + rl;
            entries++;
        }
    }
    return 0;
}

// Rank of merging left+right, or -1.
static int32_t merge_rank(const struct tokenizer *t, const char *l, size_t ln, const char *r,
                          size_t rn, char *scratch) {
    uint32_t l32 = (uint32_t)ln;
    memcpy(scratch, &l32, 4);
    memcpy(scratch + 4, l, ln);
    memcpy(scratch + 4 + ln, r, rn);
    struct keyset k = merge_keys(t);
    int32_t e = strmap_find(&t->merge_map, &k, scratch, 4 + ln + rn);
    return e < 0 ? -1 : t->merge_rank[e];
}

static size_t piece_of(const struct tokenizer *t, int32_t id, char *out) {
    const char *s = t->text_blob + t->text_off[id];
    size_t n = t->text_len[id];
    uint32_t a = t->attrs[id];
    if (a & (TOKEN_ATTR_UNKNOWN | TOKEN_ATTR_CONTROL | TOKEN_ATTR_USER_DEFINED)) {
        memcpy(out, s, n);
        return n;
    }
    if (a & TOKEN_ATTR_NORMAL) {
        size_t o = 0;
        if (t->type == TOKENIZER_SPM) {
            for (size_t i = 0; i < n; i++) {
                if (i + 2 < n && (uint8_t)s[i] == 0xE2 && (uint8_t)s[i + 1] == 0x96 &&
                    (uint8_t)s[i + 2] == 0x81) {
                    out[o++] = ' ';
                    i += 2;
                } else {
                    out[o++] = s[i];
                }
            }
            return o;
        }
        // Byte-level BPE: each code point stands for one byte. llama.cpp
        // writes an error marker for code points outside the table; we keep
        // their UTF-8 instead.
        size_t p = 0;
        while (p < n) {
            size_t at = p;
            uint32_t cp = unicode_utf8_decode(s, n, &p);
            int b = unicode_byte_decode(cp);
            if (b >= 0) {
                out[o++] = (char)b;
            } else {
                memcpy(out + o, s + at, p - at);
                o += p - at;
            }
        }
        return o;
    }
    if (a & TOKEN_ATTR_BYTE) {
        // "<0xXX>"
        if (n >= 6 && !memcmp(s, "<0x", 3)) {
            char hex[3] = {s[3], s[4], 0};
            char *end;
            long v = strtol(hex, &end, 16);
            if (*end == '\0') {
                out[0] = (char)v;
                return 1;
            }
        }
        memcpy(out, s, n);
        return n;
    }
    return 0;
}

static int build_pieces(struct tokenizer *t, struct verr *err) {
    size_t total = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        total += t->text_len[i];
    t->piece_blob = malloc(total ? total : 1);
    t->piece_off = malloc((size_t)t->n_vocab * sizeof *t->piece_off);
    t->piece_len = malloc((size_t)t->n_vocab * sizeof *t->piece_len);
    if (!t->piece_blob || !t->piece_off || !t->piece_len)
        return verr_set(err, VERR_NOMEM, "tokenizer: out of memory for pieces");
    size_t pos = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        // A piece is never longer than the token text.
        size_t n = piece_of(t, i, t->piece_blob + pos);
        t->piece_off[i] = pos;
        t->piece_len[i] = (uint32_t)n;
        pos += n;
    }
    return 0;
}

// Longest text first; equal lengths by id (llama.cpp leaves their order to
// std::sort; ours is deterministic).
static int cmp_special(const void *a, const void *b, void *ctx) {
    const struct tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (t->text_len[x] != t->text_len[y])
        return t->text_len[x] > t->text_len[y] ? -1 : 1;
    return (x > y) - (x < y);
}

// A merge sort (qsort has no context argument in C11).
static void sort_specials(const struct tokenizer *t, int32_t *v, int32_t *tmp, int32_t n) {
    if (n < 2)
        return;
    int32_t h = n / 2;
    sort_specials(t, v, tmp, h);
    sort_specials(t, v + h, tmp, n - h);
    int32_t i = 0, j = h, k = 0;
    while (i < h && j < n)
        tmp[k++] = cmp_special(&v[j], &v[i], (void *)t) < 0 ? v[j++] : v[i++];
    while (i < h)
        tmp[k++] = v[i++];
    while (j < n)
        tmp[k++] = v[j++];
    memcpy(v, tmp, (size_t)n * sizeof *v);
}

// Token texts llama.cpp recognises (its lists, not a model's metadata).
// DeepSeek spells its markers with U+FF5C (FULLWIDTH VERTICAL LINE) and U+2581.
#define FWBAR "\xef\xbd\x9c"
#define SPACE "\xe2\x96\x81"
static const char *const eot_texts[] = {"<|eot_id|>",
                                        "<|im_end|>",
                                        "<|end|>",
                                        "<end_of_turn>",
                                        "<|endoftext|>",
                                        "<|end_of_text|>",
                                        "<EOT>",
                                        "_<EOT>",
                                        "[EOT]",
                                        "<" FWBAR "end" SPACE "of" SPACE "sentence" FWBAR ">",
                                        "<end_of_utterance>",
                                        NULL};
static const char *const eom_texts[] = {"<|eom_id|>", NULL};
static const char *const fim_pre_texts[] = {"<|fim_prefix|>",
                                            "<fim-prefix>",
                                            "<fim_prefix>",
                                            "<" FWBAR "fim" SPACE "begin" FWBAR ">",
                                            "<PRE>",
                                            SPACE "<PRE>",
                                            "<|code_prefix|>",
                                            "<|prefix|>",
                                            NULL};
static const char *const fim_suf_texts[] = {"<|fim_suffix|>",
                                            "<fim-suffix>",
                                            "<fim_suffix>",
                                            "<" FWBAR "fim" SPACE "hole" FWBAR ">",
                                            "<SUF>",
                                            SPACE "<SUF>",
                                            "<|code_suffix|>",
                                            "<|suffix|>",
                                            NULL};
static const char *const fim_mid_texts[] = {"<|fim_middle|>",
                                            "<fim-middle>",
                                            "<fim_middle>",
                                            "<" FWBAR "fim" SPACE "end" FWBAR ">",
                                            "<MID>",
                                            SPACE "<MID>",
                                            "<|code_middle|>",
                                            "<|middle|>",
                                            NULL};
static const char *const fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>",
                                            "<PAD>",       "[PAD]",     NULL};
static const char *const fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                            "<REPO>",       "<reponame>",    NULL};
static const char *const fim_sep_texts[] = {"<|file_sep|>", NULL};
static const char *const eog_texts[] = {"<|eot_id|>",
                                        "<|im_end|>",
                                        "<|end|>",
                                        "<|return|>",
                                        "<|call|>",
                                        "<|flush|>",
                                        "<|calls|>",
                                        "<end_of_turn>",
                                        "<|endoftext|>",
                                        "</s>",
                                        "<|eom_id|>",
                                        "<EOT>",
                                        "_<EOT>",
                                        "[EOT]",
                                        "[EOS]",
                                        "<|end_of_text|>",
                                        "<end_of_utterance>",
                                        "<eos>",
                                        "<turn|>",
                                        "<|tool_response>",
                                        "<" FWBAR "end" SPACE "of" SPACE "sentence" FWBAR ">",
                                        "[e~[",
                                        NULL};
#undef FWBAR
#undef SPACE

static bool text_in(const struct tokenizer *t, int32_t id, const char *const *list) {
    for (; *list; list++)
        if (tok_text_is(t, id, *list))
            return true;
    return false;
}

// Text-based recognition of special tokens, as llama.cpp does at load:
// unset EOT / EOM / FIM ids are found by their text, tokens that end
// generation are collected, and all of them are made control tokens.
static void detect_specials(struct tokenizer *t) {
    struct {
        int32_t *id;
        const char *const *texts;
    } finds[] = {
        {&t->eot, eot_texts},         {&t->eom, eom_texts},         {&t->fim_pre, fim_pre_texts},
        {&t->fim_suf, fim_suf_texts}, {&t->fim_mid, fim_mid_texts}, {&t->fim_pad, fim_pad_texts},
        {&t->fim_rep, fim_rep_texts}, {&t->fim_sep, fim_sep_texts},
    };
    for (size_t f = 0; f < sizeof finds / sizeof finds[0]; f++) {
        if (*finds[f].id != TOKENIZER_NULL)
            continue;
        for (int32_t i = 0; i < t->n_vocab; i++)
            if (text_in(t, i, finds[f].texts)) {
                *finds[f].id = i;
                t->attrs[i] |= TOKEN_ATTR_CONTROL;
                break;
            }
    }
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if ((t->attrs[i] & TOKEN_ATTR_CONTROL) &&
            strstr(t->text_blob + t->text_off[i], "unused") != NULL)
            t->attrs[i] |= TOKEN_ATTR_UNUSED;
    }
    int32_t always[] = {t->fim_pad, t->fim_rep, t->fim_sep, t->eos, t->eot, t->eom};
    for (size_t i = 0; i < sizeof always / sizeof always[0]; i++)
        if (valid_id(t, always[i]))
            t->eog[always[i]] = 1;
    int32_t end_id = TOKENIZER_NULL, s_id = TOKENIZER_NULL;
    bool has_return = false, has_call = false, has_flush = false, has_tool_response = false;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (text_in(t, i, eog_texts)) {
            t->eog[i] = 1;
            t->attrs[i] |= TOKEN_ATTR_CONTROL;
        }
        // gpt-oss: these structure the output and are always rendered.
        if (tok_text_is(t, i, "<|channel|>") || tok_text_is(t, i, "<|message|>") ||
            tok_text_is(t, i, "<|start|>") || tok_text_is(t, i, "<|constrain|>"))
            t->attrs[i] = TOKEN_ATTR_USER_DEFINED;
    }
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (!t->eog[i])
            continue;
        if (tok_text_is(t, i, "<|return|>"))
            has_return = true;
        else if (tok_text_is(t, i, "<|call|>") || tok_text_is(t, i, "<|calls|>"))
            has_call = true;
        else if (tok_text_is(t, i, "<|flush|>"))
            has_flush = true;
        else if (tok_text_is(t, i, "<|end|>"))
            end_id = i;
        if (tok_text_is(t, i, "<|tool_response>"))
            has_tool_response = true;
        else if (tok_text_is(t, i, "</s>"))
            s_id = i;
    }
    // Harmony-style vocabularies: <|end|> ends a message, not the generation.
    if (end_id >= 0 && has_call && (has_return || has_flush)) {
        t->eog[end_id] = 0;
        t->attrs[end_id] = TOKEN_ATTR_USER_DEFINED;
    }
    // gemma4 / paddleocr: </s> is an ordinary token there.
    if (has_tool_response && s_id >= 0) {
        t->eog[s_id] = 0;
        t->attrs[s_id] = TOKEN_ATTR_NORMAL;
    }
}

static bool contains_ci(const char *hay, const char *needle) {
    size_t n = strlen(needle);
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i] && (hay[i] | 0x20) == (needle[i] | 0x20))
            i++;
        if (i == n)
            return true;
    }
    return false;
}

// The model's kind and its defaults: SPM ("llama") or BPE ("gpt2") with its
// pre-tokenizer.
static int set_model(struct tokenizer *t, const struct tokenizer_desc *d, struct verr *err) {
    if (!strcmp(d->model, "llama")) {
        t->type = TOKENIZER_SPM;
        t->pre = TOKENIZER_PRE_DEFAULT;
        t->bos = 1;
        t->eos = 2;
        t->unk = 0;
        t->add_space_prefix = true;
        t->add_bos = true;
        return 0;
    }
    if (strcmp(d->model, "gpt2"))
        return verr_set(err, VERR_UNSUPPORTED,
                        "tokenizer.ggml.model '%s': not supported (vela reads 'llama' and 'gpt2')",
                        d->model);
    t->type = TOKENIZER_BPE;
    t->bos = t->eos = 11; // llama.cpp's defaults for gpt2 vocabularies
    t->unk = TOKENIZER_NULL;
    const struct pre_name *pn = pre_lookup(d->pre ? d->pre : "default");
    if (!pn)
        return verr_set(err, VERR_UNSUPPORTED,
                        "tokenizer.ggml.pre '%s': pre-tokenizer not supported by vela "
                        "(supported: default, llama3/llama-bpe, qwen2, gpt-2, mpt, "
                        "deepseek-llm, deepseek-coder, falcon, starcoder, refact and "
                        "their aliases)",
                        d->pre);
    t->pre = pn->pre;
    t->clean_spaces = pn->clean_spaces;
    t->ignore_merges = pn->ignore_merges;
    t->add_bos = pn->add_bos;
    if (pn->no_bos)
        t->bos = TOKENIZER_NULL;
    return 0;
}

// Special ids: defaults outside the vocabulary are dropped; given ids
// outside it are ignored (llama.cpp warns and keeps the default). Then the
// add_* flags, which need their token.
static int set_special_ids(struct tokenizer *t, const struct tokenizer_desc *d, struct verr *err) {
    struct {
        int32_t *id;
        int64_t given;
    } ids[] = {
        {&t->bos, d->bos},         {&t->eos, d->eos},         {&t->eot, d->eot},
        {&t->eom, d->eom},         {&t->unk, d->unk},         {&t->sep, d->sep},
        {&t->pad, d->pad},         {&t->fim_pre, d->fim_pre}, {&t->fim_suf, d->fim_suf},
        {&t->fim_mid, d->fim_mid}, {&t->fim_pad, d->fim_pad}, {&t->fim_rep, d->fim_rep},
        {&t->fim_sep, d->fim_sep},
    };
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        if (*ids[i].id >= t->n_vocab)
            *ids[i].id = TOKENIZER_NULL;
        if (ids[i].given != TOKENIZER_ID_UNSET && ids[i].given >= 0 && ids[i].given < t->n_vocab)
            *ids[i].id = (int32_t)ids[i].given;
    }
    if (d->add_bos >= 0)
        t->add_bos = d->add_bos;
    if (d->add_eos >= 0)
        t->add_eos = d->add_eos;
    if (t->add_bos && t->bos == TOKENIZER_NULL)
        return verr_set(err, VERR_FORMAT,
                        "tokenizer: tokenizer.ggml.add_bos_token is true, but "
                        "tokenizer.ggml.bos_token_id is not set");
    if (t->add_eos && t->eos == TOKENIZER_NULL)
        return verr_set(err, VERR_FORMAT,
                        "tokenizer: tokenizer.ggml.add_eos_token is true, but "
                        "tokenizer.ggml.eos_token_id is not set");
    return 0;
}

// The sorted list of special tokens (control, user-defined, unknown).
static int list_specials(struct tokenizer *t, struct verr *err) {
    int32_t n_spec = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->attrs[i] & (TOKEN_ATTR_CONTROL | TOKEN_ATTR_USER_DEFINED | TOKEN_ATTR_UNKNOWN))
            n_spec++;
    t->specials = malloc(((size_t)n_spec + 1) * sizeof *t->specials);
    int32_t *tmp = malloc(((size_t)n_spec + 1) * sizeof *tmp);
    if (!t->specials || !tmp) {
        free(tmp);
        return verr_set(err, VERR_NOMEM, "tokenizer: out of memory");
    }
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->attrs[i] & (TOKEN_ATTR_CONTROL | TOKEN_ATTR_USER_DEFINED | TOKEN_ATTR_UNKNOWN))
            t->specials[t->n_specials++] = i;
    sort_specials(t, t->specials, tmp, t->n_specials);
    free(tmp);
    return 0;
}

// Phi-3 GGUFs carry no strip attributes; llama.cpp sets them by name.
static void phi3_strip_attrs(struct tokenizer *t, const char *name) {
    if (!name || !(contains_ci(name, "phi-3") || contains_ci(name, "phi3")))
        return;
    for (int32_t i = 0; i < t->n_specials; i++)
        t->attrs[t->specials[i]] |= TOKEN_ATTR_RSTRIP;
    int32_t s = tokenizer_find(t, "</s>", 4);
    if (s >= 0)
        t->attrs[s] |= TOKEN_ATTR_RSTRIP;
    const char *keep[] = {"<unk>", "<s>", "<|endoftext|>"};
    for (size_t i = 0; i < 3; i++) {
        s = tokenizer_find(t, keep[i], strlen(keep[i]));
        if (s >= 0)
            t->attrs[s] &= ~(uint32_t)TOKEN_ATTR_RSTRIP;
    }
}

// The byte tokens and the newline token: SPM's byte token, else whatever
// "\n" encodes to.
static void find_byte_tokens(struct tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        int32_t id = tokenizer_find(t, hex, 6);
        if (id < 0) {
            char c = (char)b;
            id = tokenizer_find(t, &c, 1);
        }
        t->byte_tok[b] = id;
    }
    if (t->type == TOKENIZER_SPM) {
        t->nl = t->byte_tok['\n'] >= 0 ? t->byte_tok['\n'] : t->pad;
    } else {
        int32_t ids_nl[8];
        int n_nl = 0;
        int rc = tokenizer_encode(t, "\n", 1, false, false, ids_nl, 8, &n_nl, NULL);
        t->nl = (rc == 0 || rc == VERR_FULL) && n_nl > 0 ? ids_nl[0] : t->pad;
    }
}

int tokenizer_build(struct tokenizer **out, const struct tokenizer_desc *d, struct verr *err) {
    *out = NULL;
    if (!d->model)
        return verr_set(err, VERR_NOTFOUND, "tokenizer: tokenizer.ggml.model is missing");
    if (d->n_tokens == 0 || !d->tokens)
        return verr_set(err, VERR_NOTFOUND, "tokenizer: tokenizer.ggml.tokens is missing or empty");
    if (d->n_tokens > (uint32_t)INT32_MAX)
        return verr_set(err, VERR_RANGE, "tokenizer.ggml.tokens: %u tokens", d->n_tokens);
    struct tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return verr_set(err, VERR_NOMEM, "tokenizer: out of memory");
    int rc;
    t->n_vocab = (int32_t)d->n_tokens;
    t->eot = t->eom = t->sep = t->pad = TOKENIZER_NULL;
    t->fim_pre = t->fim_suf = t->fim_mid = t->fim_pad = t->fim_rep = t->fim_sep = TOKENIZER_NULL;
    if ((rc = set_model(t, d, err)))
        goto fail;
    if (d->add_space_prefix >= 0)
        t->add_space_prefix = d->add_space_prefix;
    if ((rc = build_vocab(t, d, err)))
        goto fail;
    if (t->type == TOKENIZER_BPE) {
        if (!d->merges && d->n_merges) {
            rc = verr_set(err, VERR_FORMAT, "tokenizer.ggml.merges: missing strings");
            goto fail;
        }
        if ((rc = build_merges(t, d, err)))
            goto fail;
    }
    if ((rc = set_special_ids(t, d, err)))
        goto fail;
    t->eog = calloc((size_t)t->n_vocab, 1);
    if (!t->eog) {
        rc = verr_set(err, VERR_NOMEM, "tokenizer: out of memory");
        goto fail;
    }
    detect_specials(t);
    if ((rc = list_specials(t, err)) || (rc = build_pieces(t, err)))
        goto fail;
    phi3_strip_attrs(t, d->name);
    find_byte_tokens(t);
    *out = t;
    return 0;
fail:
    tokenizer_free(t);
    return rc;
}

// ---------------------------------------------------------------------------
// Encoding scratch

struct ivec {
    int32_t *v;
    size_t n, cap;
    bool oom;
};

static void ivec_push(struct ivec *a, int32_t x) {
    if (a->oom)
        return;
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) {
            a->oom = true;
            return;
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
}

// Grows *buf to at least n bytes.
static bool grow(void **buf, size_t *cap, size_t n, size_t elem) {
    if (n <= *cap)
        return true;
    size_t c = *cap ? *cap : 256;
    while (c < n)
        c *= 2;
    void *p = realloc(*buf, c * elem);
    if (!p)
        return false;
    *buf = p;
    *cap = c;
    return true;
}

struct symbol {
    size_t off; // into the word being merged
    uint32_t n; // bytes; 0 once merged into its left neighbour
    int32_t prev, next;
};

// Candidate merge of symbols left and right, valid while both still have
// the lengths they had when it was queued (lengths only grow).
struct bigram {
    double key; // smaller first: BPE rank, or minus the SPM score
    int32_t left, right;
    uint32_t ln, rn;
};

struct heap {
    struct bigram *v;
    size_t n, cap;
    bool oom;
};

static bool bigram_before(const struct bigram *a, const struct bigram *b) {
    return a->key < b->key || (a->key == b->key && a->left < b->left);
}

static void heap_push(struct heap *h, struct bigram b) {
    if (h->oom)
        return;
    if (h->n == h->cap && !grow((void **)&h->v, &h->cap, h->n + 1, sizeof *h->v)) {
        h->oom = true;
        return;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bigram_before(&b, &h->v[p]))
            break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = b;
}

static struct bigram heap_pop(struct heap *h) {
    struct bigram top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const struct bigram *best = &last;
        if (l < h->n && bigram_before(&h->v[l], best)) {
            m = l;
            best = &h->v[l];
        }
        if (r < h->n && bigram_before(&h->v[r], best))
            m = r;
        if (m == i)
            break;
        h->v[i] = h->v[m];
        i = m;
    }
    if (h->n)
        h->v[i] = last;
    return top;
}

struct scratch {
    struct symbol *sym;
    size_t sym_cap;
    struct heap heap;
    char *buf; // SPM text / BPE word
    size_t buf_cap;
    char *key; // merge lookup keys
    size_t key_cap;
    uint32_t *cpts;
    size_t cpts_cap;
    bool oom;
};

static void scratch_free(struct scratch *s) {
    free(s->sym);
    free(s->heap.v);
    free(s->buf);
    free(s->key);
    free(s->cpts);
}

// Splits s->buf[0..len) into UTF-8 characters (length from the lead byte,
// cut at the end) as a doubly linked list of symbols. Returns the count.
static int32_t make_symbols(struct scratch *s, size_t len) {
    if (!grow((void **)&s->sym, &s->sym_cap, len, sizeof *s->sym)) {
        s->oom = true;
        return 0;
    }
    int32_t n = 0;
    for (size_t off = 0; off < len;) {
        size_t l = unicode_utf8_len((uint8_t)s->buf[off]);
        if (l > len - off)
            l = len - off;
        s->sym[n] = (struct symbol){off, (uint32_t)l, n - 1, off + l == len ? -1 : n + 1};
        off += l;
        n++;
    }
    return n;
}

// Queues the pair of symbols l, r for merging when the vocabulary allows it.
typedef void (*try_bigram_fn)(const struct tokenizer *t, struct scratch *s, int32_t l, int32_t r);

// The merge loop SentencePiece and BPE share: splits s->buf[0..len) into
// symbols, queues every adjacent pair, then merges the best-ranked pair until
// none is left. Returns false when there is nothing to emit (no symbols, or
// out of memory: s->oom set); the merged symbols are then s->sym from 0 on.
static bool merge_symbols(const struct tokenizer *t, struct scratch *s, size_t len,
                          try_bigram_fn try_bigram) {
    int32_t n = make_symbols(s, len);
    if (s->oom || n == 0)
        return false;
    s->heap.n = 0;
    for (int32_t i = 1; i < n; i++)
        try_bigram(t, s, i - 1, i);
    while (s->heap.n && !s->heap.oom) {
        struct bigram bg = heap_pop(&s->heap);
        struct symbol *a = &s->sym[bg.left], *b = &s->sym[bg.right];
        if (a->n == 0 || b->n == 0 || a->n != bg.ln || b->n != bg.rn)
            continue;
        a->n += b->n;
        b->n = 0;
        a->next = b->next;
        if (b->next >= 0)
            s->sym[b->next].prev = bg.left;
        try_bigram(t, s, a->prev, bg.left);
        try_bigram(t, s, bg.left, a->next);
    }
    if (s->heap.oom) {
        s->oom = true;
        return false;
    }
    return true;
}

// ---------------------------------------------------------------------------
// SentencePiece

static void spm_try_bigram(const struct tokenizer *t, struct scratch *s, int32_t l, int32_t r) {
    if (l < 0 || r < 0)
        return;
    const struct symbol *a = &s->sym[l], *b = &s->sym[r];
    int32_t id = tokenizer_find(t, s->buf + a->off, (size_t)a->n + b->n);
    if (id < 0)
        return;
    heap_push(&s->heap, (struct bigram){-(double)t->scores[id], l, r, a->n, b->n});
}

// Tokenizes s->buf[0..len) (spaces already escaped) into out.
static void spm_tokenize(const struct tokenizer *t, struct scratch *s, size_t len,
                         struct ivec *out) {
    if (!merge_symbols(t, s, len, spm_try_bigram))
        return;
    for (int32_t i = 0; i != -1; i = s->sym[i].next) {
        const struct symbol *y = &s->sym[i];
        int32_t id = tokenizer_find(t, s->buf + y->off, y->n);
        if (id >= 0) {
            ivec_push(out, id);
            continue;
        }
        // Not in the vocabulary: its bytes, as <0xXX> tokens.
        for (uint32_t j = 0; j < y->n; j++) {
            int32_t bt = t->byte_tok[(uint8_t)s->buf[y->off + j]];
            if (bt < 0)
                bt = t->unk;
            if (bt >= 0)
                ivec_push(out, bt);
        }
    }
}

// ---------------------------------------------------------------------------
// Byte-level BPE

static void bpe_try_bigram(const struct tokenizer *t, struct scratch *s, int32_t l, int32_t r) {
    if (l < 0 || r < 0)
        return;
    const struct symbol *a = &s->sym[l], *b = &s->sym[r];
    int32_t rank = merge_rank(t, s->buf + a->off, a->n, s->buf + b->off, b->n, s->key);
    if (rank < 0)
        return;
    heap_push(&s->heap, (struct bigram){(double)rank, l, r, a->n, b->n});
}

// Merges one byte-encoded word s->buf[0..len) and emits its tokens.
static void bpe_word(const struct tokenizer *t, struct scratch *s, size_t len, struct ivec *out) {
    if (t->ignore_merges) {
        int32_t id = tokenizer_find(t, s->buf, len);
        if (id >= 0) {
            ivec_push(out, id);
            return;
        }
    }
    if (!grow((void **)&s->key, &s->key_cap, len + 4, 1)) {
        s->oom = true;
        return;
    }
    if (!merge_symbols(t, s, len, bpe_try_bigram))
        return;
    for (int32_t i = 0; i != -1; i = s->sym[i].next) {
        const struct symbol *y = &s->sym[i];
        int32_t id = tokenizer_find(t, s->buf + y->off, y->n);
        if (id >= 0) {
            ivec_push(out, id);
            continue;
        }
        // llama.cpp's fallback: each byte of the encoded symbol on its own,
        // where the vocabulary has it.
        for (uint32_t j = 0; j < y->n; j++) {
            int32_t bt = tokenizer_find(t, s->buf + y->off + j, 1);
            if (bt >= 0)
                ivec_push(out, bt);
        }
    }
}

static int bpe_tokenize(const struct tokenizer *t, struct scratch *s, const char *text, size_t len,
                        struct ivec *out, struct verr *err) {
    if (!grow((void **)&s->cpts, &s->cpts_cap, len, sizeof *s->cpts))
        return verr_set(err, VERR_NOMEM, "tokenizer: out of memory");
    size_t n = unicode_utf8_to_cpts(text, len, s->cpts);
    size_t *lens = NULL, n_words = 0;
    int rc = tokenizer_pre_split(t->pre, s->cpts, n, &lens, &n_words, err);
    if (rc)
        return rc;
    size_t start = 0;
    char u8[4], enc[2];
    for (size_t w = 0; w < n_words && !s->oom; w++) {
        // UTF-8 of the word, each byte replaced by its printable stand-in
        // (at most 4 * 2 bytes per code point).
        if (!grow((void **)&s->buf, &s->buf_cap, lens[w] * 8, 1)) {
            s->oom = true;
            break;
        }
        size_t bl = 0;
        for (size_t i = start; i < start + lens[w]; i++) {
            size_t k = unicode_utf8_encode(s->cpts[i], u8);
            for (size_t j = 0; j < k; j++) {
                size_t e = unicode_byte_encode((uint8_t)u8[j], enc);
                memcpy(s->buf + bl, enc, e);
                bl += e;
            }
        }
        bpe_word(t, s, bl, out);
        start += lens[w];
    }
    free(lens);
    if (s->oom)
        return verr_set(err, VERR_NOMEM, "tokenizer: out of memory");
    return 0;
}

// ---------------------------------------------------------------------------
// Special tokens: the text is cut into raw-text fragments and special-token
// fragments, one special token at a time, longest first.

struct frag {
    int32_t tok; // TOKENIZER_NULL: text[off .. off + len)
    size_t off, len;
};

struct fvec {
    struct frag *v;
    size_t n, cap;
    bool oom;
};

static void fvec_push(struct fvec *a, struct frag f) {
    if (a->oom)
        return;
    if (a->n == a->cap && !grow((void **)&a->v, &a->cap, a->n + 1, sizeof *a->v)) {
        a->oom = true;
        return;
    }
    a->v[a->n++] = f;
}

// C-locale isspace, as llama.cpp uses for LSTRIP / RSTRIP.
static bool c_space(char c) {
    return c == ' ' || (c >= '\t' && c <= '\r');
}

static const char *find_bytes(const char *hay, size_t hn, const char *needle, size_t nn) {
    if (nn == 0 || nn > hn)
        return NULL;
    const char *end = hay + hn - nn;
    for (const char *p = hay; p <= end; p++) {
        p = memchr(p, needle[0], (size_t)(end - p) + 1);
        if (!p)
            return NULL;
        if (!memcmp(p, needle, nn))
            return p;
    }
    return NULL;
}

static int partition(const struct tokenizer *t, const char *text, size_t len, bool parse_special,
                     struct fvec *frags, struct verr *err) {
    frags->n = 0;
    if (len == 0)
        return 0;
    fvec_push(frags, (struct frag){TOKENIZER_NULL, 0, len});
    struct fvec next = {0};
    for (int32_t k = 0; k < t->n_specials && !frags->oom && !next.oom; k++) {
        int32_t id = t->specials[k];
        uint32_t attr = t->attrs[id];
        if (!parse_special && (attr & (TOKEN_ATTR_CONTROL | TOKEN_ATTR_UNKNOWN)))
            continue;
        const char *st = t->text_blob + t->text_off[id];
        size_t sl = t->text_len[id];
        next.n = 0;
        bool changed = false;
        for (size_t f = 0; f < frags->n; f++) {
            struct frag fr = frags->v[f];
            if (fr.tok != TOKENIZER_NULL || fr.len < sl) {
                fvec_push(&next, fr);
                continue;
            }
            size_t base = fr.off, blen = fr.len;
            for (;;) {
                const char *m = find_bytes(text + base, blen, st, sl);
                if (!m) {
                    fvec_push(&next, (struct frag){TOKENIZER_NULL, base, blen});
                    break;
                }
                changed = true;
                size_t mpos = (size_t)(m - text);
                size_t left = mpos - base;
                if (attr & TOKEN_ATTR_LSTRIP)
                    while (left > 0 && c_space(text[base + left - 1]))
                        left--;
                if (left > 0)
                    fvec_push(&next, (struct frag){TOKENIZER_NULL, base, left});
                fvec_push(&next, (struct frag){id, 0, 0});
                size_t rstart = mpos + sl, rlen = base + blen - rstart;
                if (attr & TOKEN_ATTR_RSTRIP)
                    while (rlen > 0 && c_space(text[rstart])) {
                        rstart++;
                        rlen--;
                    }
                if (rlen == 0)
                    break;
                base = rstart;
                blen = rlen;
            }
        }
        if (changed) {
            struct fvec tmp = *frags;
            *frags = next;
            next = tmp;
        }
    }
    bool oom = frags->oom || next.oom;
    free(next.v);
    if (oom)
        return verr_set(err, VERR_NOMEM, "tokenizer: out of memory");
    return 0;
}

static int encode_vec(const struct tokenizer *t, const char *text, size_t len, bool add_special,
                      bool parse_special, struct ivec *out, struct verr *err) {
    struct fvec frags = {0};
    struct scratch s = {0};
    int rc = partition(t, text, len, parse_special, &frags, err);
    if (rc)
        goto done;
    if (add_special && t->add_bos)
        ivec_push(out, t->bos);
    bool prev_special = true; // SPM: a space goes in front of text that follows a special token
    for (size_t f = 0; f < frags.n && !s.oom; f++) {
        const struct frag *fr = &frags.v[f];
        if (fr->tok != TOKENIZER_NULL) {
            ivec_push(out, fr->tok);
            prev_special = true;
            continue;
        }
        const char *src = text + fr->off;
        if (t->type == TOKENIZER_SPM) {
            // Every space (and the prefix) becomes U+2581, 3 bytes.
            if (!grow((void **)&s.buf, &s.buf_cap, 3 * fr->len + 3, 1)) {
                s.oom = true;
                break;
            }
            size_t bl = 0;
            if (t->add_space_prefix && prev_special) {
                memcpy(s.buf, "\xe2\x96\x81", 3);
                bl = 3;
            }
            for (size_t i = 0; i < fr->len; i++) {
                if (src[i] == ' ') {
                    memcpy(s.buf + bl, "\xe2\x96\x81", 3);
                    bl += 3;
                } else {
                    s.buf[bl++] = src[i];
                }
            }
            spm_tokenize(t, &s, bl, out);
        } else {
            if ((rc = bpe_tokenize(t, &s, src, fr->len, out, err)))
                goto done;
        }
        prev_special = false;
    }
    if (add_special && t->add_eos)
        ivec_push(out, t->eos);
    if (s.oom || out->oom)
        rc = verr_set(err, VERR_NOMEM, "tokenizer: out of memory encoding %zu bytes", len);
done:
    free(frags.v);
    scratch_free(&s);
    return rc;
}

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t *out, int max, int *n_out, struct verr *err) {
    *n_out = 0;
    struct ivec v = {0};
    int rc = encode_vec(t, text, len, add_special, parse_special, &v, err);
    if (rc) {
        free(v.v);
        return rc;
    }
    if (v.n > (size_t)INT_MAX) {
        free(v.v);
        return verr_set(err, VERR_RANGE, "tokenizer: %zu tokens do not fit an int", v.n);
    }
    *n_out = (int)v.n;
    size_t k = v.n;
    if (max < 0)
        max = 0;
    if (k > (size_t)max)
        k = (size_t)max;
    if (k)
        memcpy(out, v.v, k * sizeof *out);
    free(v.v);
    if (v.n > (size_t)max)
        return verr_set(err, VERR_FULL, "tokenizer: %zu tokens, room for %d", v.n, max);
    return 0;
}

int tokenizer_encode_alloc(const struct tokenizer *t, const char *text, size_t len,
                           bool add_special, bool parse_special, int32_t **out, int *n_out,
                           struct verr *err) {
    *out = NULL;
    *n_out = 0;
    struct ivec v = {0};
    int rc = encode_vec(t, text, len, add_special, parse_special, &v, err);
    if (rc) {
        free(v.v);
        return rc;
    }
    if (v.n > (size_t)INT_MAX) {
        free(v.v);
        return verr_set(err, VERR_RANGE, "tokenizer: %zu tokens do not fit an int", v.n);
    }
    if (v.n == 0) {
        free(v.v);
        return 0;
    }
    *out = v.v;
    *n_out = (int)v.n;
    return 0;
}

// ---------------------------------------------------------------------------
// Decoding

int tokenizer_piece(const struct tokenizer *t, int32_t id, bool special, const char **piece,
                    size_t *len, struct verr *err) {
    *piece = "";
    *len = 0;
    if (!valid_id(t, id))
        return verr_set(err, VERR_RANGE, "tokenizer: token id %d outside the vocabulary (0..%d)",
                        id, t->n_vocab - 1);
    if (!special && (t->attrs[id] & (TOKEN_ATTR_UNKNOWN | TOKEN_ATTR_CONTROL)))
        return 0;
    *piece = t->piece_blob + t->piece_off[id];
    *len = t->piece_len[id];
    return 0;
}

// llama.cpp's clean_up_tokenization_spaces, in place; returns the new length.
static size_t clean_spaces(char *s, size_t total) {
    // " ?", " !", " .", " ,": drop the space.
    size_t n1 = total, o = total ? 1 : 0;
    for (size_t i = 1; i < n1; i++) {
        char x = s[i];
        if (s[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ','))
            o--;
        s[o++] = x;
    }
    // " ' ": a lone apostrophe between spaces loses both spaces.
    size_t n2 = o;
    o = n2 ? 1 : 0;
    for (size_t i = 1; i < n2; i++) {
        char x = s[i];
        if (x == '\'' && i + 1 < n2 && s[i - 1] == ' ' && s[i + 1] == ' ') {
            o--;
            s[++i] = '\0';
        }
        s[o++] = x;
    }
    // " 's", " 'm", " 're", " 've": drop the space before the contraction.
    size_t n3 = o;
    o = n3 ? 1 : 0;
    for (size_t i = 1; i < n3; i++) {
        char x = s[i];
        if (s[i - 1] == ' ' && x == '\'' && i + 1 < n3) {
            char x1 = s[i + 1];
            if (x1 == 's' || x1 == 'm') {
                o--;
            } else if (x1 != 't' && x1 != 'd' && i + 2 < n3) {
                char x2 = s[i + 2];
                if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e'))
                    o--;
            }
        }
        s[o++] = x;
    }
    return o;
}

int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, int n, bool remove_special,
                     bool unparse_special, char **out, size_t *len, struct verr *err) {
    *out = NULL;
    *len = 0;
    if (n < 0)
        n = 0;
    bool remove_space = t->add_space_prefix;
    if (remove_special && t->add_bos && n > 0 && ids[0] == t->bos) {
        remove_space = false;
        ids++;
        n--;
    }
    if (remove_special && t->add_eos && n > 0 && ids[n - 1] == t->eos)
        n--;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const char *p;
        size_t l;
        int rc = tokenizer_piece(t, ids[i], unparse_special, &p, &l, err);
        if (rc)
            return rc;
        total += l;
    }
    char *s = malloc(total + 1);
    if (!s)
        return verr_set(err, VERR_NOMEM, "tokenizer: out of memory decoding %d tokens", n);
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        const char *p;
        size_t l;
        tokenizer_piece(t, ids[i], unparse_special, &p, &l, NULL);
        if (remove_space && l > 0 && p[0] == ' ') {
            p++;
            l--;
        }
        remove_space = false;
        memcpy(s + o, p, l);
        o += l;
    }
    if (t->clean_spaces)
        o = clean_spaces(s, o);
    s[o] = '\0';
    *out = s;
    *len = o;
    return 0;
}

// ---------------------------------------------------------------------------
// Streaming decoder

struct tokenizer_stream {
    const struct tokenizer *t;
    bool special;
    uint8_t seq[4]; // the character being assembled
    int have, need; // bytes in seq, continuation bytes still expected
    uint8_t lo, hi; // allowed range of the next continuation byte
    char *buf;
    size_t cap;
};

int tokenizer_stream_new(struct tokenizer_stream **out, const struct tokenizer *t, bool special,
                         struct verr *err) {
    struct tokenizer_stream *s = calloc(1, sizeof *s);
    if (!s)
        return verr_set(err, VERR_NOMEM, "tokenizer: out of memory");
    s->t = t;
    s->special = special;
    *out = s;
    return 0;
}

void tokenizer_stream_free(struct tokenizer_stream *s) {
    if (!s)
        return;
    free(s->buf);
    free(s);
}

static const char replacement[3] = {'\xEF', '\xBF', '\xBD'};

// Feeds one byte; appends finished output to s->buf at *o.
static void stream_byte(struct tokenizer_stream *s, uint8_t b, size_t *o) {
    for (;;) {
        if (s->need == 0) {
            if (b < 0x80) {
                s->buf[(*o)++] = (char)b;
                return;
            }
            // Well-formed lead bytes and the range of the byte after them
            // (Unicode table 3-7: no overlongs, surrogates or > U+10FFFF).
            int need = 0;
            uint8_t lo = 0x80, hi = 0xBF;
            if (b >= 0xC2 && b <= 0xDF)
                need = 1;
            else if (b == 0xE0)
                need = 2, lo = 0xA0;
            else if (b == 0xED)
                need = 2, hi = 0x9F;
            else if (b >= 0xE1 && b <= 0xEF)
                need = 2;
            else if (b == 0xF0)
                need = 3, lo = 0x90;
            else if (b >= 0xF1 && b <= 0xF3)
                need = 3;
            else if (b == 0xF4)
                need = 3, hi = 0x8F;
            if (!need) {
                memcpy(s->buf + *o, replacement, 3);
                *o += 3;
                return;
            }
            s->seq[0] = b;
            s->have = 1;
            s->need = need;
            s->lo = lo;
            s->hi = hi;
            return;
        }
        if (b >= s->lo && b <= s->hi) {
            s->seq[s->have++] = b;
            s->lo = 0x80;
            s->hi = 0xBF;
            if (--s->need == 0) {
                memcpy(s->buf + *o, s->seq, (size_t)s->have);
                *o += (size_t)s->have;
                s->have = 0;
            }
            return;
        }
        // The character broke off: replace what we had, then read b afresh.
        memcpy(s->buf + *o, replacement, 3);
        *o += 3;
        s->have = s->need = 0;
    }
}

int tokenizer_stream_push(struct tokenizer_stream *s, int32_t id, const char **text, size_t *len,
                          struct verr *err) {
    *text = "";
    *len = 0;
    const char *p;
    size_t l;
    int rc = tokenizer_piece(s->t, id, s->special, &p, &l, err);
    if (rc)
        return rc;
    // Worst case every byte becomes U+FFFD, plus a broken held-back character.
    if (!grow((void **)&s->buf, &s->cap, 3 * l + 8, 1))
        return verr_set(err, VERR_NOMEM, "tokenizer: out of memory");
    size_t o = 0;
    for (size_t i = 0; i < l; i++)
        stream_byte(s, (uint8_t)p[i], &o);
    *text = s->buf;
    *len = o;
    return 0;
}

void tokenizer_stream_flush(struct tokenizer_stream *s, const char **text, size_t *len) {
    *text = replacement;
    *len = s->need ? 3 : 0;
    s->have = s->need = 0;
}

// ---------------------------------------------------------------------------
// Accessors

enum tokenizer_type tokenizer_get_type(const struct tokenizer *t) {
    return t->type;
}
enum tokenizer_pre tokenizer_get_pre(const struct tokenizer *t) {
    return t->pre;
}
int32_t tokenizer_n_vocab(const struct tokenizer *t) {
    return t->n_vocab;
}
int32_t tokenizer_n_merges(const struct tokenizer *t) {
    return t->n_merges;
}
int32_t tokenizer_bos(const struct tokenizer *t) {
    return t->bos;
}
int32_t tokenizer_eos(const struct tokenizer *t) {
    return t->eos;
}
int32_t tokenizer_eot(const struct tokenizer *t) {
    return t->eot;
}
int32_t tokenizer_unk(const struct tokenizer *t) {
    return t->unk;
}
int32_t tokenizer_pad(const struct tokenizer *t) {
    return t->pad;
}
int32_t tokenizer_nl(const struct tokenizer *t) {
    return t->nl;
}
bool tokenizer_add_bos(const struct tokenizer *t) {
    return t->add_bos;
}
bool tokenizer_add_eos(const struct tokenizer *t) {
    return t->add_eos;
}
bool tokenizer_is_eog(const struct tokenizer *t, int32_t id) {
    return valid_id(t, id) && t->eog[id];
}
bool tokenizer_is_control(const struct tokenizer *t, int32_t id) {
    return valid_id(t, id) && (t->attrs[id] & TOKEN_ATTR_CONTROL);
}
uint32_t tokenizer_token_attr(const struct tokenizer *t, int32_t id) {
    return valid_id(t, id) ? t->attrs[id] : 0;
}
float tokenizer_token_score(const struct tokenizer *t, int32_t id) {
    return valid_id(t, id) ? t->scores[id] : 0.0f;
}
const char *tokenizer_token_text(const struct tokenizer *t, int32_t id, size_t *len) {
    if (!valid_id(t, id)) {
        if (len)
            *len = 0;
        return NULL;
    }
    if (len)
        *len = t->text_len[id];
    return t->text_blob + t->text_off[id];
}
