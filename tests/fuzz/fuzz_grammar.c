// libFuzzer target for the GBNF parser and matcher (host/grammar/), which
// vela serve feeds with clients' grammars. The input up to the first 0xFF
// byte is the grammar; the rest is text fed to its matcher a few bytes at a
// time. Aborts when a refused grammar leaves no message, or a message that
// does not start with "grammar"; the sanitizers catch the rest.
//
// Build and run: see tests/fuzz/README.md (target fuzz_grammar);
// tests/test_fuzz_quick.c runs it briefly in the test suite.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "host/grammar/grammar.h"

int fuzz_grammar_one(const uint8_t *data, size_t size);
int fuzz_grammar_one(const uint8_t *data, size_t size) {
    const uint8_t *ff = memchr(data, 0xFF, size);
    const size_t n_text = ff ? (size_t)(ff - data) : size;
    struct grammar *g = NULL;
    struct verr err = {0};
    if (grammar_parse(&g, (const char *)data, n_text, NULL, &err)) {
        if (strncmp(err.msg, "grammar", 7))
            abort();
        return 0;
    }
    struct grammar_state *st = NULL;
    if (grammar_state_new(&st, g, &err) == 0) {
        const uint8_t *in = ff ? ff + 1 : data + size;
        size_t left = (size_t)(data + size - in);
        while (left > 0) {
            const size_t k = left < 3 ? left : 3;
            grammar_state_accept_bytes(st, (const char *)in, k, &err);
            in += k;
            left -= k;
        }
        grammar_state_can_end(st);
        grammar_state_free(st);
    }
    grammar_free(g);
    return 0;
}

#ifndef VELA_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fuzz_grammar_one(data, size);
}
#endif
