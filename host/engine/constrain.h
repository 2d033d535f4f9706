// Grammar-constrained sampling for the engine's model: the grammar
// vocabulary of its tokenizer (built once per model, shared by every
// request's sampler through sampler_params.grammar_vocab) and grammar
// parsing that resolves <text> token elements with that tokenizer.
#ifndef VELA_HOST_ENGINE_CONSTRAIN_H
#define VELA_HOST_ENGINE_CONSTRAIN_H

#include <stddef.h>

#include "gguf/verr.h"
#include "host/grammar/grammar.h"
#include "host/tokenizer/tokenizer.h"

// Token i's bytes are what the engine's text stream shows for it
// (tokenizer_piece without special rendering: a control token's are empty,
// so only a token element can name it); end-of-generation tokens are
// tokenizer_is_eog's. The trie then lets a grammar see exactly the text the
// client gets.
int constrain_vocab_new(struct grammar_vocab **out, const struct tokenizer *t, struct verr *err);

// grammar_parse of text[0..len) from rule root (NULL: "root"), a <text>
// token element naming the token whose vocabulary text is exactly text
// (t may be NULL: then only <[id]> may name tokens).
int constrain_parse(struct grammar **out, const struct tokenizer *t, const char *text, size_t len,
                    const char *root, struct verr *err);

#endif
