// libFuzzer target for the JSON schema -> GBNF converter (tools/serve/json_schema.c),
// which vela serve feeds with clients' response_format schemas. Any bytes
// as a schema; aborts when a refused schema leaves no message, or when an
// accepted schema's grammar does not parse: the converter must only ever
// write well-formed grammars (the parser may still refuse one for left
// recursion, a schema that refers to itself before any text, or its limits).
//
// Build and run: see tests/fuzz/README.md (target fuzz_json_schema);
// tests/test_fuzz_quick.c runs it briefly in the test suite.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "host/grammar/grammar.h"
#include "tools/serve/json_schema.h"

int fuzz_json_schema_one(const uint8_t *data, size_t size);
int fuzz_json_schema_one(const uint8_t *data, size_t size) {
    char *gbnf = NULL;
    struct verr err = {0};
    if (json_schema_text_to_gbnf((const char *)data, size, &gbnf, &err)) {
        if (!err.msg[0] || gbnf)
            abort();
        return 0;
    }
    struct grammar *g = NULL;
    if (grammar_parse(&g, gbnf, strlen(gbnf), NULL, &err) != 0 && err.code != VERR_FULL &&
        err.code != VERR_UNSUPPORTED)
        abort();
    grammar_free(g);
    free(gbnf);
    return 0;
}

#ifndef VELA_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fuzz_json_schema_one(data, size);
}
#endif
