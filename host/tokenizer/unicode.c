// Unicode helpers; see unicode.h for the contracts.
#include "host/tokenizer/unicode.h"

uint16_t unicode_flags(uint32_t cp) {
    if (cp < 128)
        return unicode_ascii_flags[cp];
    if (cp >= UNICODE_MAX_CP)
        return UNICODE_UNDEFINED;
    // Last range whose first code point is <= cp.
    size_t lo = 0, hi = unicode_ranges_count;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (unicode_ranges[mid].first <= cp)
            lo = mid;
        else
            hi = mid;
    }
    return unicode_ranges[lo].flags;
}

uint32_t unicode_tolower(uint32_t cp) {
    if (cp < 128)
        return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
    size_t lo = 0, hi = unicode_lower_map_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (unicode_lower_map[mid].cp < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < unicode_lower_map_count && unicode_lower_map[lo].cp == cp)
        return unicode_lower_map[lo].mapped;
    return cp;
}

static inline bool is_cont(uint8_t b) {
    return (b & 0xC0) == 0x80;
}

uint32_t unicode_utf8_decode(const char *str, size_t len, size_t *pos) {
    const uint8_t *s = (const uint8_t *)str;
    size_t p = *pos;
    uint8_t b0 = s[p];
    if (!(b0 & 0x80)) {
        *pos = p + 1;
        return b0;
    }
    if (b0 & 0x40) {
        if (!(b0 & 0x20)) {
            if (p + 1 < len && is_cont(s[p + 1])) {
                *pos = p + 2;
                return ((uint32_t)(b0 & 0x1F) << 6) | (s[p + 1] & 0x3F);
            }
        } else if (!(b0 & 0x10)) {
            if (p + 2 < len && is_cont(s[p + 1]) && is_cont(s[p + 2])) {
                *pos = p + 3;
                return ((uint32_t)(b0 & 0x0F) << 12) | ((uint32_t)(s[p + 1] & 0x3F) << 6) |
                       (s[p + 2] & 0x3F);
            }
        } else if (!(b0 & 0x08)) {
            if (p + 3 < len && is_cont(s[p + 1]) && is_cont(s[p + 2]) && is_cont(s[p + 3])) {
                uint32_t cp = ((uint32_t)(b0 & 0x07) << 18) | ((uint32_t)(s[p + 1] & 0x3F) << 12) |
                              ((uint32_t)(s[p + 2] & 0x3F) << 6) | (s[p + 3] & 0x3F);
                // llama.cpp decodes these and then fails to re-encode them;
                // we call them malformed instead.
                if (cp < UNICODE_MAX_CP) {
                    *pos = p + 4;
                    return cp;
                }
            }
        }
    }
    *pos = p + 1;
    return UNICODE_REPLACEMENT;
}

size_t unicode_utf8_encode(uint32_t cp, char *out) {
    uint8_t *o = (uint8_t *)out;
    if (cp <= 0x7F) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp <= 0x7FF) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp >= UNICODE_MAX_CP)
        cp = UNICODE_REPLACEMENT;
    if (cp <= 0xFFFF) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

size_t unicode_utf8_to_cpts(const char *s, size_t len, uint32_t *out) {
    size_t n = 0, pos = 0;
    while (pos < len)
        out[n++] = unicode_utf8_decode(s, len, &pos);
    return n;
}

// GPT-2's table: bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for
// themselves; the 68 others (0x00..0x20, 0x7F..0xA0, 0xAD) take U+0100 +
// their rank among them.
static uint32_t byte_to_cp(uint8_t b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)
        return b;
    if (b <= 0x20)
        return 0x100u + b;
    if (b <= 0xA0)
        return 0x100u + 33 + (b - 0x7Fu);
    return 0x100u + 67; // 0xAD
}

size_t unicode_byte_encode(uint8_t b, char *out) {
    return unicode_utf8_encode(byte_to_cp(b), out);
}

int unicode_byte_decode(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp < 0x100 || cp >= 0x100 + 68)
        return -1;
    uint32_t n = cp - 0x100;
    if (n <= 0x20)
        return (int)n;
    if (n < 67)
        return (int)(0x7F + (n - 33));
    return 0xAD;
}

bool unicode_is_han(uint32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
           (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
           (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
           (cp >= 0x2CEB0 && cp <= 0x2EBEF) || (cp >= 0xF900 && cp <= 0xFAFF) ||
           (cp >= 0x2F800 && cp <= 0x2FA1F);
}
