// Pre-tokenizers: split text (as code points) into the words byte-level BPE
// merges within.
//
// llama.cpp describes each pre-tokenizer as a list of regular expressions
// applied in turn: every regex splits every word the previous ones produced,
// and both its matches and the unmatched stretches between them become words.
// Some of those regexes (GPT-2's and Llama 3's) run as hand-written code in
// llama.cpp; the others run through std::regex (ECMAScript: leftmost match,
// alternatives tried in order, greedy quantifiers with backtracking) on a
// copy of the text in which
//   - regexes that use \p{..} classes see every non-ASCII code point as one
//     stand-in byte for its class (whitespace, letter, number, punctuation,
//     mark, symbol, other), ASCII as itself, and
//   - regexes without \p{..} see the code points themselves, except that
//     non-ASCII whitespace reads as U+000B (so \s matches it and literal
//     ranges such as [ࠀ-一] do not).
// Here every regex is a matcher over code points that reproduces exactly
// that behaviour; the two hand-written ones are reproduced with their quirks.
#include <stdlib.h>
#include <string.h>

#include "host/tokenizer/tokenizer.h"
#include "host/tokenizer/unicode.h"

// ---------------------------------------------------------------------------
// Word lists: lengths in code points, consecutive.

struct lens {
    size_t *v;
    size_t n, cap;
    bool oom;
};

static void lens_push(struct lens *l, size_t x) {
    if (l->oom)
        return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        size_t *v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            l->oom = true;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
}

// ---------------------------------------------------------------------------
// Character classes

#define WS UNICODE_WHITESPACE
#define LET UNICODE_LETTER
#define NUM UNICODE_NUMBER

static inline bool is_ws(uint32_t c) {
    return unicode_flags(c) & WS;
}
static inline bool is_letter(uint32_t c) {
    return unicode_flags(c) & LET;
}
static inline bool is_number(uint32_t c) {
    return unicode_flags(c) & NUM;
}
static inline bool is_punct(uint32_t c) {
    return unicode_flags(c) & UNICODE_PUNCT;
}
static inline bool is_ascii_digit(uint32_t c) {
    return c >= '0' && c <= '9';
}
static inline bool in_ascii_set(uint32_t c, const char *set) {
    return c > 0 && c < 128 && strchr(set, (int)c) != NULL;
}

// What a regex without \p{..} sees: non-ASCII whitespace reads as U+000B.
static inline uint32_t wide(uint32_t c) {
    return (c >= 0x80 && is_ws(c)) ? 0x0B : c;
}

struct cp_range {
    uint32_t lo, hi;
};

static bool in_ranges(uint32_t c, const struct cp_range *r, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (c >= r[i].lo && c <= r[i].hi)
            return true;
    return false;
}

// deepseek-llm's letter class (cased letters of many scripts, from the
// model's tokenizer.json), as code point ranges.
static const struct cp_range dsllm_letters[] = {
    {0x0041, 0x005A},   {0x0061, 0x007A},   {0x00B5, 0x00B5},   {0x00C0, 0x00D6},
    {0x00D8, 0x00F6},   {0x00F8, 0x01BA},   {0x01BC, 0x01BF},   {0x01C4, 0x0293},
    {0x0295, 0x02AF},   {0x0370, 0x0373},   {0x0376, 0x0377},   {0x037B, 0x037D},
    {0x037F, 0x037F},   {0x0386, 0x0386},   {0x0388, 0x038A},   {0x038C, 0x038C},
    {0x038E, 0x03A1},   {0x03A3, 0x03F5},   {0x03F7, 0x0481},   {0x048A, 0x052F},
    {0x0531, 0x0556},   {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},
    {0x1C90, 0x1CBA},   {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},
    {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},   {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},
    {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},   {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},
    {0x1FD6, 0x1FDB},   {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},
    {0x2102, 0x2102},   {0x2107, 0x2107},   {0x210A, 0x2113},   {0x2115, 0x2115},
    {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},   {0x2128, 0x2128},
    {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},
    {0x2C7E, 0x2CE4},   {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},
    {0xA680, 0xA69B},   {0xA722, 0xA76F},   {0xA771, 0xA787},   {0xA78B, 0xA78E},
    {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},   {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};

// deepseek-llm's punctuation class: ASCII ! to / and : to ~ (letters
// included), their full-width forms, curly quotes, U+3000..U+3002.
static const struct cp_range dsllm_punct[] = {
    {0x21, 0x2F},     {0x3A, 0x7E},     {0xFF01, 0xFF0F},
    {0xFF1A, 0xFF5E}, {0x2018, 0x201F}, {0x3000, 0x3002},
};

// CJK ideographs, U+0800..U+4E00 and Hangul, shared by both deepseek models.
static const struct cp_range deepseek_cjk[] = {
    {0x4E00, 0x9FA5},
    {0x0800, 0x4E00},
    {0xAC00, 0xD7FF},
};

#define N_RANGES(a) (sizeof(a) / sizeof((a)[0]))

// ---------------------------------------------------------------------------
// Regex matchers: length of the match starting exactly at pos (0 = none);
// the word being split is c[..end).

typedef size_t (*match_fn)(const uint32_t *c, size_t pos, size_t end);

// [\p{P}\$\+<=>\^~\|]+ (default)
static size_t m_punct_default(const uint32_t *c, size_t pos, size_t end) {
    size_t i = pos;
    while (i < end && (is_punct(c[i]) || in_ascii_set(c[i], "$+<=>^~|")))
        i++;
    return i - pos;
}

// [\p{P}\$\+<=>\^~\|`]+ (falcon)
static size_t m_punct_falcon(const uint32_t *c, size_t pos, size_t end) {
    size_t i = pos;
    while (i < end && (is_punct(c[i]) || in_ascii_set(c[i], "$+<=>^~|`")))
        i++;
    return i - pos;
}

// \p{N}+
static size_t m_numbers(const uint32_t *c, size_t pos, size_t end) {
    size_t i = pos;
    while (i < end && is_number(c[i]))
        i++;
    return i - pos;
}

// \p{N}
static size_t m_number(const uint32_t *c, size_t pos, size_t end) {
    (void)end;
    return is_number(c[pos]) ? 1 : 0;
}

// [0-9][0-9][0-9]
static size_t m_three_digits(const uint32_t *c, size_t pos, size_t end) {
    if (end - pos >= 3 && is_ascii_digit(c[pos]) && is_ascii_digit(c[pos + 1]) &&
        is_ascii_digit(c[pos + 2]))
        return 3;
    return 0;
}

// [\r\n]
static size_t m_newline(const uint32_t *c, size_t pos, size_t end) {
    (void)end;
    return (c[pos] == '\r' || c[pos] == '\n') ? 1 : 0;
}

// \s?X+ with X given as a predicate: the optional space is taken only when
// an X follows it (backtracking otherwise).
static size_t match_opt_space_run(const uint32_t *c, size_t pos, size_t end, bool (*x)(uint32_t)) {
    size_t i = pos;
    if (is_ws(c[i]) && i + 1 < end && x(c[i + 1]))
        i++;
    else if (!x(c[i]))
        return 0;
    while (i < end && x(c[i]))
        i++;
    return i - pos;
}

static bool x_letter(uint32_t c) {
    return is_letter(c);
}
static bool x_punct(uint32_t c) {
    return is_punct(c);
}
static bool x_dsllm_letter(uint32_t c) {
    return in_ranges(wide(c), dsllm_letters, N_RANGES(dsllm_letters));
}
static bool x_dsllm_punct(uint32_t c) {
    return in_ranges(wide(c), dsllm_punct, N_RANGES(dsllm_punct));
}

// \s?\p{L}+
static size_t m_space_letters(const uint32_t *c, size_t pos, size_t end) {
    return match_opt_space_run(c, pos, end, x_letter);
}
// \s?\p{P}+
static size_t m_space_punct(const uint32_t *c, size_t pos, size_t end) {
    return match_opt_space_run(c, pos, end, x_punct);
}
// \s?[A-Za-zµÀ-ÖØ-ö...]+ (deepseek-llm)
static size_t m_dsllm_letters(const uint32_t *c, size_t pos, size_t end) {
    return match_opt_space_run(c, pos, end, x_dsllm_letter);
}
// \s?[!-/:-~！-／：-～‘-‟　-。]+ (deepseek-llm)
static size_t m_dsllm_punct(const uint32_t *c, size_t pos, size_t end) {
    return match_opt_space_run(c, pos, end, x_dsllm_punct);
}

// [一-龥ࠀ-一가-퟿]+
static size_t m_cjk(const uint32_t *c, size_t pos, size_t end) {
    size_t i = pos;
    while (i < end && in_ranges(wide(c[i]), deepseek_cjk, N_RANGES(deepseek_cjk)))
        i++;
    return i - pos;
}

// ---------------------------------------------------------------------------
// Split steps: in -> out.

// std::regex_iterator semantics for a regex whose matches are never empty:
// search for the leftmost match, emit the gap before it and the match,
// continue after it.
static void split_regex(const uint32_t *c, const struct lens *in, struct lens *out, match_fn m) {
    size_t start = 0;
    for (size_t w = 0; w < in->n; w++) {
        size_t end = start + in->v[w], gap = start, pos = start;
        while (pos < end) {
            size_t k = m(c, pos, end);
            if (k) {
                if (pos > gap)
                    lens_push(out, pos - gap);
                lens_push(out, k);
                pos += k;
                gap = pos;
            } else {
                pos++;
            }
        }
        if (gap < end)
            lens_push(out, end - gap);
        start = end;
    }
}

// \s+$ : the only possible match is the whitespace run that ends the word.
static void split_trailing_space(const uint32_t *c, const struct lens *in, struct lens *out) {
    size_t start = 0;
    for (size_t w = 0; w < in->n; w++) {
        size_t end = start + in->v[w], t = end;
        while (t > start && is_ws(c[t - 1]))
            t--;
        if (t > start)
            lens_push(out, t - start);
        if (t < end)
            lens_push(out, end - t);
        start = end;
    }
}

// llama.cpp's hand-written GPT-2 regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Past the word's end the flags read as 0 (no class at all).
static void split_gpt2(const uint32_t *c, const struct lens *in, struct lens *out) {
    size_t start = 0;
    for (size_t w = 0; w < in->n; w++) {
        const size_t end = start + in->v[w];
#define FL(p) ((p) < end ? unicode_flags(c[p]) : 0)
        size_t pos = start;
        while (pos < end) {
            const size_t at = pos;
            const uint32_t cp = c[pos];
            const uint16_t f = FL(pos);
            if (cp == '\'' && pos + 1 < end) {
                uint32_t n1 = c[pos + 1];
                if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
                    lens_push(out, 2);
                    pos += 2;
                    continue;
                }
                if (pos + 2 < end) {
                    uint32_t n2 = c[pos + 2];
                    if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') ||
                        (n1 == 'l' && n2 == 'l')) {
                        lens_push(out, 3);
                        pos += 3;
                        continue;
                    }
                }
            }
            uint16_t f2 = cp == ' ' ? FL(pos + 1) : f;
            if (f2 & LET) {
                pos += cp == ' ';
                while (FL(pos) & LET)
                    pos++;
                lens_push(out, pos - at);
                continue;
            }
            if (f2 & NUM) {
                pos += cp == ' ';
                while (FL(pos) & NUM)
                    pos++;
                lens_push(out, pos - at);
                continue;
            }
            if (!(f2 & (WS | LET | NUM)) && f2) {
                pos += cp == ' ';
                for (uint16_t g = FL(pos); !(g & (WS | LET | NUM)) && g; g = FL(pos))
                    pos++;
                lens_push(out, pos - at);
                continue;
            }
            size_t nws = 0;
            while (FL(pos + nws) & WS)
                nws++;
            if (nws > 1 && pos + nws < end) { // \s+(?!\S): leave the last space to the next word
                pos += nws - 1;
                lens_push(out, pos - at);
                continue;
            }
            if (nws > 0) {
                pos += nws;
                lens_push(out, pos - at);
                continue;
            }
            pos++;
            lens_push(out, 1);
        }
#undef FL
        start = end;
    }
}

// llama.cpp's hand-written Llama 3 regex
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//    ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// With max_digits 1 it is exactly Qwen2's regex (\p{N} instead of
// \p{N}{1,3}), which llama.cpp runs through std::regex: for this regex the
// two agree on every input.
static void split_llama3(const uint32_t *c, const struct lens *in, struct lens *out,
                         size_t max_digits) {
    size_t start = 0;
    for (size_t w = 0; w < in->n; w++) {
        const size_t end = start + in->v[w];
#define FL(p) ((p) < end ? unicode_flags(c[p]) : 0)
#define CP(p) ((p) < end ? c[p] : 0xFFFFFFFFu)
        size_t pos = start;
        while (pos < end) {
            const size_t at = pos;
            const uint32_t cp = c[pos];
            const uint16_t f = FL(pos);
            if (cp == '\'' && pos + 1 < end) {
                uint32_t n1 = unicode_tolower(c[pos + 1]);
                if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
                    lens_push(out, 2);
                    pos += 2;
                    continue;
                }
                if (pos + 2 < end) {
                    uint32_t n2 = unicode_tolower(c[pos + 2]);
                    if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') ||
                        (n1 == 'l' && n2 == 'l')) {
                        lens_push(out, 3);
                        pos += 3;
                        continue;
                    }
                }
            }
            // [^\r\n\p{L}\p{N}]?\p{L}+
            if (!(cp == '\r' || cp == '\n' || (f & NUM))) {
                if ((f & LET) || (FL(pos + 1) & LET)) {
                    pos++;
                    while (FL(pos) & LET)
                        pos++;
                    lens_push(out, pos - at);
                    continue;
                }
            }
            // \p{N}{1,max_digits}
            if (f & NUM) {
                size_t ini = pos;
                while (FL(pos) & NUM) {
                    if (++pos - ini >= max_digits) {
                        lens_push(out, pos - ini);
                        ini = pos;
                    }
                }
                if (pos > ini)
                    lens_push(out, pos - ini);
                continue;
            }
            // ' ?[^\s\p{L}\p{N}]+[\r\n]*' (llama.cpp tests the flags of the
            // first code point, not the one after the space, for "in range")
            uint16_t f2 = cp == ' ' ? FL(pos + 1) : f;
            if (!(f2 & (WS | LET | NUM)) && f) {
                pos += cp == ' ';
                for (uint16_t g = FL(pos); !(g & (WS | LET | NUM)) && g; g = FL(pos))
                    pos++;
                while (CP(pos) == '\r' || CP(pos) == '\n')
                    pos++;
                lens_push(out, pos - at);
                continue;
            }
            size_t nws = 0, last_nl_end = 0;
            while (FL(pos + nws) & WS) {
                uint32_t c2 = c[pos + nws];
                if (c2 == '\r' || c2 == '\n')
                    last_nl_end = pos + nws + 1;
                nws++;
            }
            if (last_nl_end > 0) { // \s*[\r\n]+
                pos = last_nl_end;
                lens_push(out, pos - at);
                continue;
            }
            if (nws > 1 && pos + nws < end) { // \s+(?!\S)
                pos += nws - 1;
                lens_push(out, pos - at);
                continue;
            }
            if (nws > 0) { // \s+
                pos += nws;
                lens_push(out, pos - at);
                continue;
            }
            pos++;
            lens_push(out, 1);
        }
#undef FL
#undef CP
        start = end;
    }
}

// llama.cpp's gpt-4o (o200k) regex, which it runs through std::regex on the
// stand-in text:
//   [^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+C?|
//   [^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*C?|
//   \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with C = '[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]. Every
// non-ASCII letter is the same stand-in byte there, so it counts both as
// "upper" (a letter outside a-z) and "lower" (a letter outside A-Z), and
// combining marks are not letters. Every code point starts some match, so
// the words cover the text without gaps.

static inline bool gpt4o_upper(uint32_t c) {
    return is_letter(c) && !(c >= 'a' && c <= 'z');
}
static inline bool gpt4o_lower(uint32_t c) {
    return is_letter(c) && !(c >= 'A' && c <= 'Z');
}

// C at pos: its length, 0 if none.
static size_t gpt4o_contraction(const uint32_t *c, size_t pos, size_t end) {
    if (pos + 1 >= end || c[pos] != '\'')
        return 0;
    // | 0x20 folds A-Z onto a-z and never maps a code point >= 0x80 there.
    uint32_t a = c[pos + 1] | 0x20, b = pos + 2 < end ? c[pos + 2] | 0x20 : 0;
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

// The two letter alternatives at pos: the match length, 0 if neither
// matches. The first tries its upper run longest first and takes the
// first length after which a lower letter follows; the second is reached
// only when no such length exists, so its run is all A-Z and no lower
// letter follows it.
static size_t gpt4o_letters(const uint32_t *c, size_t pos, size_t end) {
    size_t s = pos;
    if (!is_letter(c[s])) { // [^\r\n\p{L}\p{N}]? is only kept before a letter
        if (c[s] == '\r' || c[s] == '\n' || is_number(c[s]) || s + 1 >= end || !is_letter(c[s + 1]))
            return 0;
        s++;
    }
    size_t u = s;
    while (u < end && gpt4o_upper(c[u]))
        u++;
    size_t e = u;
    for (size_t k = u + 1; k-- > s;) {
        if (k < end && gpt4o_lower(c[k])) {
            e = k;
            while (e < end && gpt4o_lower(c[e]))
                e++;
            break;
        }
    }
    return e - pos + gpt4o_contraction(c, e, end);
}

static void split_gpt4o(const uint32_t *c, const struct lens *in, struct lens *out) {
    size_t start = 0;
    for (size_t w = 0; w < in->n; w++) {
        const size_t end = start + in->v[w];
        size_t pos = start;
        while (pos < end) {
            const size_t at = pos;
            size_t k = gpt4o_letters(c, pos, end);
            if (k) {
                lens_push(out, k);
                pos += k;
                continue;
            }
            if (is_number(c[pos])) { // \p{N}{1,3}
                while (pos < end && pos - at < 3 && is_number(c[pos]))
                    pos++;
                lens_push(out, pos - at);
                continue;
            }
            // ' ?[^\s\p{L}\p{N}]+[\r\n/]*'
            size_t q = pos + (c[pos] == ' ');
            if (q < end && !is_ws(c[q]) && !is_letter(c[q]) && !is_number(c[q])) {
                while (q < end && !is_ws(c[q]) && !is_letter(c[q]) && !is_number(c[q]))
                    q++;
                while (q < end && (c[q] == '\r' || c[q] == '\n' || c[q] == '/'))
                    q++;
                lens_push(out, q - at);
                pos = q;
                continue;
            }
            size_t nws = 0, last_nl_end = 0;
            while (pos + nws < end && is_ws(c[pos + nws])) {
                if (c[pos + nws] == '\r' || c[pos + nws] == '\n')
                    last_nl_end = pos + nws + 1;
                nws++;
            }
            if (last_nl_end > 0) // \s*[\r\n]+
                pos = last_nl_end;
            else if (nws > 1 && pos + nws < end) // \s+(?!\S)
                pos += nws - 1;
            else // \s+
                pos += nws ? nws : 1;
            lens_push(out, pos - at);
        }
        start = end;
    }
}

// ---------------------------------------------------------------------------
// Pre-tokenizers as lists of steps.

enum step_kind {
    STEP_END = 0,
    STEP_REGEX,
    STEP_GPT2,
    STEP_LLAMA3,
    STEP_QWEN2,
    STEP_GPT4O,
    STEP_TRAILING_SPACE
};

struct step {
    enum step_kind kind;
    match_fn m;
};

#define MAX_STEPS 6

static const struct step pre_steps[TOKENIZER_PRE_COUNT][MAX_STEPS + 1] = {
    [TOKENIZER_PRE_DEFAULT] =
        {
            {STEP_REGEX, m_punct_default},
            {STEP_GPT2, NULL},
            {STEP_REGEX, m_numbers},
            {STEP_REGEX, m_three_digits},
        },
    [TOKENIZER_PRE_LLAMA3] = {{STEP_LLAMA3, NULL}},
    [TOKENIZER_PRE_QWEN2] = {{STEP_QWEN2, NULL}},
    [TOKENIZER_PRE_GPT4O] = {{STEP_GPT4O, NULL}},
    [TOKENIZER_PRE_GPT2] = {{STEP_GPT2, NULL}},
    [TOKENIZER_PRE_DEEPSEEK_LLM] =
        {
            {STEP_REGEX, m_newline},
            {STEP_REGEX, m_dsllm_letters},
            {STEP_REGEX, m_dsllm_punct},
            {STEP_TRAILING_SPACE, NULL},
            {STEP_REGEX, m_cjk},
            {STEP_REGEX, m_numbers},
        },
    [TOKENIZER_PRE_DEEPSEEK_CODER] =
        {
            {STEP_REGEX, m_newline},
            {STEP_REGEX, m_space_letters},
            {STEP_REGEX, m_space_punct},
            {STEP_REGEX, m_cjk},
            {STEP_REGEX, m_number},
        },
    [TOKENIZER_PRE_FALCON] =
        {
            {STEP_REGEX, m_punct_falcon},
            {STEP_GPT2, NULL},
            {STEP_REGEX, m_three_digits},
        },
    [TOKENIZER_PRE_STARCODER] =
        {
            {STEP_REGEX, m_number},
            {STEP_GPT2, NULL},
        },
};

int tokenizer_pre_split(enum tokenizer_pre pre, const uint32_t *cpts, size_t n, size_t **lens_out,
                        size_t *n_words, struct verr *err) {
    *lens_out = NULL;
    *n_words = 0;
    if ((unsigned)pre >= TOKENIZER_PRE_COUNT)
        return verr_set(err, VERR_RANGE, "pre-tokenizer %d: no such pre-tokenizer", (int)pre);
    if (n == 0)
        return 0;
    struct lens a = {0}, b = {0};
    lens_push(&a, n);
    const struct step *steps = pre_steps[pre];
    for (int s = 0; s < MAX_STEPS && steps[s].kind != STEP_END; s++) {
        b.n = 0;
        switch (steps[s].kind) {
        case STEP_END:
            break;
        case STEP_REGEX:
            split_regex(cpts, &a, &b, steps[s].m);
            break;
        case STEP_GPT2:
            split_gpt2(cpts, &a, &b);
            break;
        case STEP_LLAMA3:
            split_llama3(cpts, &a, &b, 3);
            break;
        case STEP_QWEN2:
            split_llama3(cpts, &a, &b, 1);
            break;
        case STEP_GPT4O:
            split_gpt4o(cpts, &a, &b);
            break;
        case STEP_TRAILING_SPACE:
            split_trailing_space(cpts, &a, &b);
            break;
        }
        struct lens t = a;
        a = b;
        b = t;
        if (a.oom || b.oom) {
            free(a.v);
            free(b.v);
            return verr_set(err, VERR_NOMEM,
                            "pre-tokenizer: out of memory splitting %zu code points", n);
        }
    }
    free(b.v);
    *lens_out = a.v;
    *n_words = a.n;
    return 0;
}
