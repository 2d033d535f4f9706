// The generated tokenizer of mkmodel: a byte-level BPE vocabulary in GPT-2's
// format (tokenizer.ggml.model "gpt2"), small enough for tiny test models.
//
// Layout of the token ids (fixed, whatever n_vocab is):
//   [0, 256)            one token per byte value b, spelled with GPT-2's
//                       bytes-to-unicode mapping ("Ġ" is the space byte);
//   [256, 256 + M)      one token per merge, learned by a tiny BPE trainer
//                       from the English sample below (same order as merges);
//   256 + M, 256 + M + 1 <|begin_of_text|> (BOS) and <|end_of_text|> (EOS),
//                       CONTROL tokens;
//   the rest            padding up to n_vocab: pronounceable pseudo-words with
//                       a leading space (NORMAL tokens no merge produces), so
//                       text sampled from a padded vocabulary stays readable.
#include "tools/mkmodel/mkmodel_vocab.h"

#include <stdlib.h>
#include <string.h>

// Written for this purpose; common English words and word pieces, so that the
// learned merges shorten ordinary text.
static const char vocab_sample[] =
    "The quick brown fox jumps over the lazy dog. This is a small model that was made "
    "for testing, and it has no idea what the words mean. It is only here so that the "
    "tokenizer has something to learn from. When people write English, they use the same "
    "short words again and again: the, of, and, to, in, is, that, it, for, was, on, are, "
    "with, as, at, be, this, have, from, or, one, had, by, but, not, what, all, were, we, "
    "when, your, can, said, there, use, an, each, which, she, do, how, their, if, will, up, "
    "other, about, out, many, then, them, these, so, some, her, would, make, like, him, "
    "into, time, has, look, two, more, write, go, see, number, no, way, could, people, my, "
    "than, first, water, been, call, who, its, now, find, long, down, day, did, get, come, "
    "made, may, part. The model reads a prompt, turns it into tokens, and then predicts "
    "the next token again and again until it is told to stop. A token is often a whole "
    "word, and sometimes only a piece of a word such as ing, tion, ment, ness, able, or "
    "er. Longer words are built from these pieces: reading, writing, thinking, working, "
    "information, question, station, nation, government, movement, development, "
    "kindness, darkness, happiness, comfortable, readable, understandable, teacher, "
    "worker, reader, writer, player, speaker. In the morning the people of the town went "
    "to the market to buy bread and water, and in the evening they came back to their "
    "homes. The children were playing in the garden while their mother was reading a "
    "book and their father was working on the house. There are many things that we "
    "want to know about the world, and there is always more to learn. The weather was "
    "cold and the sky was grey, but the sun came out in the afternoon and the day became "
    "warm. She said that she would come back the next day, and he said that he would wait "
    "for her. They wanted to find out how the machine worked, so they opened it and "
    "looked inside. Every part had a number, and every number had a meaning. The story "
    "is about a young man who leaves his village to see the city for the first time. "
    "He meets a woman who works in a library, and she shows him the books that changed "
    "her life. Together they read about the history of the country, the kings and the "
    "wars, the farmers and the workers, and the long road that led to the present day. "
    "Computers are machines that follow instructions. A program is a list of "
    "instructions, and a programmer is a person who writes programs. The computer "
    "stores numbers in memory and moves them between memory and the processor, where "
    "they are added, multiplied and compared. Modern processors can do billions of "
    "operations every second, and graphics processors can do even more when the same "
    "operation is applied to many numbers at once. Language models are large programs "
    "of this kind: they multiply a vector by a matrix, again and again, layer after "
    "layer, until the last layer gives a score for every token in the vocabulary. "
    "The token with the highest score is the most likely next token. What would you "
    "like to do today? I think that we should go for a walk, because the weather is "
    "nice and there is nothing else that we have to do. Would you like some tea or "
    "coffee? Thank you very much, that is very kind of you. Please let me know if there "
    "is anything else that I can do for you. Where are you going? I am going to the "
    "station to meet my brother, who is coming home from the university. He has been "
    "studying there for three years, and this summer he will finish his studies. After "
    "that he wants to travel around the world and see as many countries as he can.";

#define MKVOCAB_MAX_MERGES 640

static const char *const special_tokens[MKVOCAB_N_SPECIAL] = {"<|begin_of_text|>",
                                                              "<|end_of_text|>"};

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to
// 256, 257, ... in byte order.
static unsigned byte_to_codepoint(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
        return b;
    unsigned n = 0;
    for (unsigned c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255)))
            n++;
    return 256 + n;
}

// Appends the UTF-8 encoding of cp (< 0x800) to s (which has room).
static size_t put_utf8(char *s, unsigned cp) {
    if (cp < 0x80) {
        s[0] = (char)cp;
        return 1;
    }
    s[0] = (char)(0xC0 | (cp >> 6));
    s[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

static char *str_dup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

static char *str_cat2(const char *a, const char *sep, const char *b) {
    size_t na = strlen(a), ns = strlen(sep), nb = strlen(b);
    char *d = malloc(na + ns + nb + 1);
    if (!d)
        return NULL;
    memcpy(d, a, na);
    memcpy(d + na, sep, ns);
    memcpy(d + na + ns, b, nb + 1);
    return d;
}

// --- a string set (open addressing) used to keep token texts unique ---------

struct strset {
    const char **slot; // [cap] borrowed pointers, NULL = empty
    int32_t *id;       // [cap]
    size_t cap, n;
};

static uint64_t str_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; // FNV-1a
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int strset_init(struct strset *ss, size_t expect) {
    ss->cap = 64;
    while (ss->cap < expect * 2)
        ss->cap *= 2;
    ss->n = 0;
    ss->slot = calloc(ss->cap, sizeof *ss->slot);
    ss->id = calloc(ss->cap, sizeof *ss->id);
    return ss->slot && ss->id ? 0 : -1;
}

static void strset_free(struct strset *ss) {
    free(ss->slot);
    free(ss->id);
}

// Id of s, or -1.
static int32_t strset_get(const struct strset *ss, const char *s) {
    for (size_t i = str_hash(s) & (ss->cap - 1);; i = (i + 1) & (ss->cap - 1)) {
        if (!ss->slot[i])
            return -1;
        if (!strcmp(ss->slot[i], s))
            return ss->id[i];
    }
}

// Precondition: s is not in the set and the set is less than half full.
static void strset_put(struct strset *ss, const char *s, int32_t id) {
    size_t i = str_hash(s) & (ss->cap - 1);
    while (ss->slot[i])
        i = (i + 1) & (ss->cap - 1);
    ss->slot[i] = s;
    ss->id[i] = id;
    ss->n++;
}

// --- the BPE trainer -----------------------------------------------------------

struct word {
    int32_t *sym; // [n] token ids
    int n;
    int count;
};

struct pair_count {
    int32_t a, b;
    int count;
};

static int pair_cmp(const void *pa, const void *pb) {
    const struct pair_count *x = pa, *y = pb;
    if (x->a != y->a)
        return x->a < y->a ? -1 : 1;
    if (x->b != y->b)
        return x->b < y->b ? -1 : 1;
    return 0;
}

static void words_free(struct word *w, int n) {
    for (int i = 0; i < n; i++)
        free(w[i].sym);
    free(w);
}

// Splits the sample like GPT-2's pre-tokenizer does for letters: an optional
// single leading space followed by a run of ASCII letters. Everything else
// (digits, punctuation, other spaces) is left out of training.
static int sample_words(struct word **out, int *n_out) {
    int cap = 64, n = 0;
    struct word *w = malloc(sizeof *w * (size_t)cap);
    if (!w)
        return -1;
    const char *s = vocab_sample;
    while (*s) {
        const char *start = s;
        if (*s == ' ' && ((s[1] | 32) >= 'a' && (s[1] | 32) <= 'z'))
            s++;
        if (!((*s | 32) >= 'a' && (*s | 32) <= 'z')) {
            s = start + 1;
            continue;
        }
        while ((*s | 32) >= 'a' && (*s | 32) <= 'z')
            s++;
        int len = (int)(s - start);
        int found = -1;
        for (int i = 0; i < n && found < 0; i++) {
            if (w[i].n != len)
                continue;
            int same = 1;
            for (int k = 0; k < len && same; k++)
                same = w[i].sym[k] == (unsigned char)start[k];
            if (same)
                found = i;
        }
        if (found >= 0) {
            w[found].count++;
            continue;
        }
        if (n == cap) {
            cap *= 2;
            struct word *nw = realloc(w, sizeof *w * (size_t)cap);
            if (!nw) {
                words_free(w, n);
                return -1;
            }
            w = nw;
        }
        w[n].sym = malloc(sizeof(int32_t) * (size_t)len);
        if (!w[n].sym) {
            words_free(w, n);
            return -1;
        }
        for (int k = 0; k < len; k++)
            w[n].sym[k] = (unsigned char)start[k];
        w[n].n = len;
        w[n].count = 1;
        n++;
    }
    *out = w;
    *n_out = n;
    return 0;
}

void mkvocab_free(struct mkvocab *v) {
    if (!v)
        return;
    for (int i = 0; i < v->n_tokens; i++)
        free(v->tokens[i]);
    for (int i = 0; i < v->n_merges; i++)
        free(v->merges[i]);
    free(v->tokens);
    free(v->token_type);
    free(v->merges);
    memset(v, 0, sizeof *v);
}

// Adds a token (taking ownership of text); -1 on allocation failure.
static int mkvocab_push(struct mkvocab *v, int *cap, char *text, int32_t type) {
    if (!text)
        return -1;
    if (v->n_tokens == *cap) {
        int nc = *cap ? *cap * 2 : 1024;
        char **nt = realloc(v->tokens, sizeof *nt * (size_t)nc);
        if (!nt) {
            free(text);
            return -1;
        }
        v->tokens = nt;
        int32_t *ny = realloc(v->token_type, sizeof *ny * (size_t)nc);
        if (!ny) {
            free(text);
            return -1;
        }
        v->token_type = ny;
        *cap = nc;
    }
    v->tokens[v->n_tokens] = text;
    v->token_type[v->n_tokens] = type;
    v->n_tokens++;
    return 0;
}

// Builds the vocabulary without padding.
static int mkvocab_build_base(struct mkvocab *v, int *cap) {
    memset(v, 0, sizeof *v);
    *cap = 0;
    for (unsigned b = 0; b < 256; b++) {
        char buf[4];
        size_t k = put_utf8(buf, byte_to_codepoint(b));
        buf[k] = '\0';
        if (mkvocab_push(v, cap, str_dup(buf), MKVOCAB_TOKEN_NORMAL))
            return -1;
    }

    struct word *words;
    int n_words;
    if (sample_words(&words, &n_words))
        return -1;
    v->merges = malloc(sizeof *v->merges * MKVOCAB_MAX_MERGES);
    size_t max_pairs = 0;
    for (int i = 0; i < n_words; i++)
        max_pairs += (size_t)words[i].n;
    struct pair_count *pc = malloc(sizeof *pc * (max_pairs + 1));
    if (!v->merges || !pc) {
        free(pc);
        words_free(words, n_words);
        return -1;
    }
    int rc = 0;
    while (v->n_merges < MKVOCAB_MAX_MERGES) {
        size_t np = 0;
        for (int i = 0; i < n_words; i++)
            for (int k = 0; k + 1 < words[i].n; k++)
                pc[np++] =
                    (struct pair_count){words[i].sym[k], words[i].sym[k + 1], words[i].count};
        if (np == 0)
            break;
        qsort(pc, np, sizeof *pc, pair_cmp);
        // The most frequent pair; ties go to the smallest (a, b) so the result
        // is the same on every platform.
        struct pair_count best = {0, 0, 0};
        for (size_t i = 0; i < np;) {
            size_t j = i;
            int c = 0;
            while (j < np && pc[j].a == pc[i].a && pc[j].b == pc[i].b)
                c += pc[j++].count;
            if (c > best.count)
                best = (struct pair_count){pc[i].a, pc[i].b, c};
            i = j;
        }
        if (best.count < 2)
            break;
        char *merged = str_cat2(v->tokens[best.a], "", v->tokens[best.b]);
        char *rule = str_cat2(v->tokens[best.a], " ", v->tokens[best.b]);
        if (!merged || !rule) {
            free(merged);
            free(rule);
            rc = -1;
            break;
        }
        // Two merge paths can spell the same text; the token is kept once.
        int32_t id = -1;
        for (int t = 256; t < v->n_tokens && id < 0; t++)
            if (!strcmp(v->tokens[t], merged))
                id = t;
        if (id < 0) {
            id = v->n_tokens;
            if (mkvocab_push(v, cap, merged, MKVOCAB_TOKEN_NORMAL)) {
                free(rule);
                rc = -1;
                break;
            }
        } else {
            free(merged);
        }
        v->merges[v->n_merges++] = rule;
        for (int i = 0; i < n_words; i++) {
            int o = 0;
            for (int k = 0; k < words[i].n; k++) {
                if (k + 1 < words[i].n && words[i].sym[k] == best.a &&
                    words[i].sym[k + 1] == best.b) {
                    words[i].sym[o++] = id;
                    k++;
                } else {
                    words[i].sym[o++] = words[i].sym[k];
                }
            }
            words[i].n = o;
        }
    }
    free(pc);
    words_free(words, n_words);
    if (rc)
        return rc;
    v->bos_id = v->n_tokens;
    v->eos_id = v->n_tokens + 1;
    for (int i = 0; i < MKVOCAB_N_SPECIAL; i++)
        if (mkvocab_push(v, cap, str_dup(special_tokens[i]), MKVOCAB_TOKEN_CONTROL))
            return -1;
    return 0;
}

int mkvocab_base_size(void) {
    struct mkvocab v;
    int cap;
    int rc = mkvocab_build_base(&v, &cap);
    int n = rc ? -1 : v.n_tokens;
    mkvocab_free(&v);
    return n;
}

int mkvocab_generate(struct mkvocab *v, int n_vocab) {
    int cap;
    if (mkvocab_build_base(v, &cap)) {
        mkvocab_free(v);
        return -1;
    }
    if (n_vocab <= v->n_tokens)
        return 0;
    struct strset ss;
    if (strset_init(&ss, (size_t)n_vocab)) {
        strset_free(&ss);
        mkvocab_free(v);
        return -1;
    }
    for (int i = 0; i < v->n_tokens; i++)
        strset_put(&ss, v->tokens[i], i);
    static const char cons[] = "bdfgklmnprstvz";
    static const char vows[] = "aeiou";
    const int n_syl = (int)(sizeof cons - 1) * (int)(sizeof vows - 1);
    // Pad word k spells k in bijective base n_syl, one consonant-vowel
    // syllable per digit: every k gets a distinct word.
    for (int64_t k = 0; v->n_tokens < n_vocab; k++) {
        char buf[64];
        size_t len = put_utf8(buf, byte_to_codepoint(' '));
        for (int64_t x = k; x >= 0 && len + 2 < sizeof buf; x = x / n_syl - 1) {
            int s = (int)(x % n_syl);
            buf[len++] = cons[s / (int)(sizeof vows - 1)];
            buf[len++] = vows[s % (int)(sizeof vows - 1)];
        }
        buf[len] = '\0';
        if (strset_get(&ss, buf) >= 0)
            continue;
        char *text = str_dup(buf);
        if (mkvocab_push(v, &cap, text, MKVOCAB_TOKEN_NORMAL)) {
            strset_free(&ss);
            mkvocab_free(v);
            return -1;
        }
        strset_put(&ss, text, v->n_tokens - 1);
    }
    strset_free(&ss);
    return 0;
}
