// The byte-level BPE vocabulary mkmodel generates (see mkmodel_vocab.c for the
// layout of the ids). Internal to tools/mkmodel/mkmodel.c and its tests.
#ifndef VELA_TOOLS_MKMODEL_VOCAB_H
#define VELA_TOOLS_MKMODEL_VOCAB_H

#include <stdint.h>

// llama.cpp's llama_token_type values stored in tokenizer.ggml.token_type.
#define MKVOCAB_TOKEN_NORMAL 1
#define MKVOCAB_TOKEN_CONTROL 3
#define MKVOCAB_N_SPECIAL 2

struct mkvocab {
    char **tokens;       // [n_tokens] UTF-8 texts in GPT-2's byte mapping
    int32_t *token_type; // [n_tokens]
    int n_tokens;
    char **merges; // [n_merges] "left right"
    int n_merges;
    int bos_id, eos_id;
};

// Builds the vocabulary padded to max(n_vocab, base size) tokens. Returns 0,
// or -1 when out of memory (then *v is empty).
int mkvocab_generate(struct mkvocab *v, int n_vocab);
void mkvocab_free(struct mkvocab *v);
// Tokens before padding, or -1 when out of memory.
int mkvocab_base_size(void);

#endif
