// The grammar and JSON schema fuzz targets (tests/fuzz/fuzz_grammar.c,
// fuzz_json_schema.c) run briefly in the test suite without libFuzzer: a
// seeded mutator (flips, inserts, deletes, splices) over seed grammars and
// schemas, 20,000 inputs each. The targets abort on a broken
// property; the sanitize label runs this under ASan and UBSan. The seed is
// fixed so a failure replays; libFuzzer (tests/fuzz/README.md) goes further.
#include <criterion/criterion.h>
#include <stdint.h>

#define VELA_FUZZ_NO_MAIN
#include "tests/fuzz/fuzz_grammar.c"
#include "tests/fuzz/fuzz_json_schema.c"
#include "tests/grammar_helpers.h"
#include "tests/rng_splitmix.h"

#define FUZZ_ITERS 20000
#define FUZZ_MAX 4096

static const char SEED_TAIL[] = "\xff{\"a\": [1, \"x\"]}";

// One mutation of buf[0..*n) in place (at most FUZZ_MAX bytes).
static void mutate(uint8_t *buf, size_t *n, const char *const *pool, int n_pool) {
    const uint64_t r = rng_u64();
    const size_t at = *n ? (size_t)(r >> 8) % *n : 0;
    static const char tokens[] = "()[]{}|*+?.\"\\-^#:=<>!,0123456789azAZ \n\xc3\xa9\xff";
    switch (r % 5) {
    case 0: // flip a byte
        if (*n)
            buf[at] ^= (uint8_t)(1u << ((r >> 40) % 8));
        break;
    case 1: // insert a syntax byte
        if (*n < FUZZ_MAX) {
            memmove(buf + at + 1, buf + at, *n - at);
            buf[at] = (uint8_t)tokens[(r >> 32) % (sizeof tokens - 1)];
            (*n)++;
        }
        break;
    case 2: { // delete a run
        const size_t k = 1 + (r >> 32) % 8;
        if (at + k <= *n) {
            memmove(buf + at, buf + at + k, *n - at - k);
            *n -= k;
        }
        break;
    }
    case 3: { // splice in a piece of another seed
        const char *s = pool[(r >> 32) % (uint64_t)n_pool];
        const size_t sl = strlen(s), from = sl ? (size_t)(r >> 16) % sl : 0;
        const size_t k = sl - from < 24 ? sl - from : 24;
        if (*n + k <= FUZZ_MAX) {
            memmove(buf + at + k, buf + at, *n - at);
            memcpy(buf + at, s + from, k);
            *n += k;
        }
        break;
    }
    default: // duplicate a run (repetitions, nesting)
        if (*n + 16 <= FUZZ_MAX && at + 16 <= *n) {
            memmove(buf + at + 16, buf + at, *n - at);
            *n += 16;
        }
        break;
    }
}

static void run(int (*one)(const uint8_t *, size_t), const char *const *seeds, int n_seeds,
                uint64_t seed) {
    static uint8_t buf[FUZZ_MAX + 64];
    rng_seed(seed);
    for (int it = 0; it < FUZZ_ITERS; it++) {
        const char *s = seeds[it % n_seeds];
        size_t n = strlen(s) < FUZZ_MAX ? strlen(s) : FUZZ_MAX;
        memcpy(buf, s, n);
        const int n_mut = irand(1, 6);
        for (int m = 0; m < n_mut; m++)
            mutate(buf, &n, seeds, n_seeds);
        one(buf, n);
    }
}

Test(fuzz_quick, grammar_parser_and_matcher, .timeout = 300) {
    static char with_text[sizeof GH_JSON + sizeof SEED_TAIL];
    snprintf(with_text, sizeof with_text, "%s%s", GH_JSON, SEED_TAIL);
    const char *seeds[] = {with_text,
                           GH_ARITHMETIC,
                           GH_LIST,
                           GH_CHESS,
                           GH_JAPANESE,
                           "root ::= \"a\"{2,5} [^x-z]* | <[3]> (\"b\" | c)+\nc ::= \"c\"?\xff"
                           "aab"};
    run(fuzz_grammar_one, seeds, 6, 0x33u);
}

Test(fuzz_quick, json_schema_converter, .timeout = 300) {
    const char *seeds[] = {
        "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\", \"maxLength\": "
        "5}, "
        "\"age\": {\"type\": \"integer\"}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": "
        "\"string\"}, \"minItems\": 1, \"maxItems\": 3}}, \"required\": [\"name\"], "
        "\"additionalProperties\": {\"type\": \"number\"}}",
        "{\"$ref\": \"#/$defs/n\", \"$defs\": {\"n\": {\"anyOf\": [{\"$ref\": \"#/$defs/n\"}, "
        "{\"type\": [\"null\", \"boolean\"]}]}}}",
        "{\"enum\": [\"a\\\"b\", 1.5, null, [1], {\"k\": \"v\\n\"}]}",
        "{\"type\": \"string\", \"format\": \"date-time\"}",
        "{\"type\": \"array\", \"items\": [{\"const\": \"x\"}, {\"format\": \"uuid\"}]}",
        "{\"properties\": {\"a\": {}, \"ab\": true, \"\\u00e9~/\": {\"type\": \"object\"}}, "
        "\"additionalProperties\": true}"};
    run(fuzz_json_schema_one, seeds, 6, 0x34u);
}
