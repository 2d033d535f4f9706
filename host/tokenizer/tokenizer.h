// The tokenizer: text <-> token ids with a model's vocabulary, matching
// llama.cpp's llama_tokenize / llama_token_to_piece / llama_detokenize.
//
// Two vocabulary kinds are supported, chosen by tokenizer.ggml.model:
//   "llama"  SentencePiece BPE: spaces become U+2581, pieces merge by score,
//            characters not in the vocabulary fall back to <0xXX> byte tokens;
//   "gpt2"   byte-level BPE: text is split into words by the pre-tokenizer
//            named in tokenizer.ggml.pre, each word's bytes are mapped to
//            printable code points and merged by the rank of
//            tokenizer.ggml.merges.
// Special tokens (control, user-defined, unknown) are cut out of the text
// before that, longest first: user-defined ones always, control and unknown
// ones only when parse_special is set.
//
// Contract: a loaded tokenizer is immutable; every function taking a const
// tokenizer may run concurrently from many threads. Token ids are int32_t;
// TOKENIZER_NULL (-1) means "no such token". Functions returning int give 0
// or a negative VERR_* code with a message in err (when err is not NULL).
#ifndef VELA_HOST_TOKENIZER_H
#define VELA_HOST_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/verr.h"

struct gguf_file;
struct tokenizer;

#define TOKENIZER_NULL (-1)

enum tokenizer_type {
    TOKENIZER_SPM = 1, // tokenizer.ggml.model = "llama"
    TOKENIZER_BPE = 2, // tokenizer.ggml.model = "gpt2"
};

// Pre-tokenizers (how byte-level BPE splits text into words). Each is one of
// llama.cpp's regex lists, implemented as matching code over code points.
// Several tokenizer.ggml.pre names share one (see tokenizer_pre_from_name).
enum tokenizer_pre {
    TOKENIZER_PRE_DEFAULT = 0,    // "default" and files without the key
    TOKENIZER_PRE_LLAMA3,         // llama3, llama-bpe, dbrx, smaug-bpe, chatglm-bpe, ...
    TOKENIZER_PRE_QWEN2,          // qwen2, stablelm2, deepseek-r1-qwen, megrez, ...
    TOKENIZER_PRE_GPT2,           // gpt-2, mpt, olmo, phi-2, jais, ...
    TOKENIZER_PRE_DEEPSEEK_LLM,   // deepseek-llm
    TOKENIZER_PRE_DEEPSEEK_CODER, // deepseek-coder
    TOKENIZER_PRE_FALCON,         // falcon
    TOKENIZER_PRE_STARCODER,      // starcoder, refact, command-r, smollm, codeshell, ...
    TOKENIZER_PRE_GPT4O,          // gpt-4o (o200k: gpt-oss), llama4, minimax-m2, ...
    TOKENIZER_PRE_COUNT
};

// Values of tokenizer.ggml.token_type.
enum tokenizer_token_type {
    TOKEN_TYPE_UNDEFINED = 0,
    TOKEN_TYPE_NORMAL = 1,
    TOKEN_TYPE_UNKNOWN = 2,
    TOKEN_TYPE_CONTROL = 3,
    TOKEN_TYPE_USER_DEFINED = 4,
    TOKEN_TYPE_UNUSED = 5,
    TOKEN_TYPE_BYTE = 6,
};

// Token attributes (bit set), llama.cpp's llama_token_attr.
enum tokenizer_attr {
    TOKEN_ATTR_UNDEFINED = 0,
    TOKEN_ATTR_UNKNOWN = 1 << 0,
    TOKEN_ATTR_UNUSED = 1 << 1,
    TOKEN_ATTR_NORMAL = 1 << 2,
    TOKEN_ATTR_CONTROL = 1 << 3,
    TOKEN_ATTR_USER_DEFINED = 1 << 4,
    TOKEN_ATTR_BYTE = 1 << 5,
    TOKEN_ATTR_NORMALIZED = 1 << 6,
    TOKEN_ATTR_LSTRIP = 1 << 7, // spaces left of the token are eaten when it is cut out
    TOKEN_ATTR_RSTRIP = 1 << 8, // spaces right of it likewise
    TOKEN_ATTR_SINGLE_WORD = 1 << 9,
};

// ---------------------------------------------------------------------------
// Building

#define TOKENIZER_ID_UNSET INT64_MIN

// Everything a tokenizer is built from, as the tokenizer.ggml.* keys hold it.
// tokenizer_load fills one from a GGUF file; tests fill one by hand.
// Strings need not be NUL-terminated when their lengths are given.
struct tokenizer_desc {
    const char *model; // "llama" or "gpt2" (required)
    const char *pre;   // tokenizer.ggml.pre; NULL: absent (-> default)
    const char *name;  // general.name (model-specific fixes); may be NULL
    uint32_t n_tokens;
    const char *const *tokens;  // [n_tokens]
    const size_t *token_lens;   // [n_tokens], or NULL: the tokens are NUL-terminated
    const float *scores;        // [n_tokens], or NULL: all 0
    const int32_t *token_types; // [n_tokens] enum tokenizer_token_type, or NULL: all normal
    uint32_t n_merges;          // gpt2 only: "left right" pairs, rank = index
    const char *const *merges;  // [n_merges]
    const size_t *merge_lens;   // [n_merges], or NULL: NUL-terminated
    // Special token ids; TOKENIZER_ID_UNSET keeps the model kind's default
    // (llama: bos 1, eos 2, unk 0; gpt2: bos = eos = 11), and ids outside the
    // vocabulary are ignored, as llama.cpp does.
    int64_t bos, eos, eot, eom, unk, sep, pad;
    int64_t fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
    // -1: the default for the model kind / pre-tokenizer; 0 false; 1 true.
    int add_bos, add_eos, add_space_prefix;
};

// Sets every field to "absent" (ids unset, flags -1, pointers NULL).
void tokenizer_desc_init(struct tokenizer_desc *d);

// Builds a tokenizer; copies everything it needs from d. Fails on an
// unknown model or pre-tokenizer name, duplicate tokens, add_bos / add_eos
// without the token, or an allocation failure.
int tokenizer_build(struct tokenizer **out, const struct tokenizer_desc *d, struct verr *err);

// Reads tokenizer.ggml.* (and general.name) from a GGUF file and builds the
// tokenizer. The file may be closed afterwards.
int tokenizer_load(struct tokenizer **out, const struct gguf_file *f, struct verr *err);

void tokenizer_free(struct tokenizer *t);

// ---------------------------------------------------------------------------
// Encoding

// Tokenizes text[0..len) (UTF-8; malformed bytes are read as U+FFFD).
// add_special: add BOS / EOS where the vocabulary asks for them
// (tokenizer_add_bos / tokenizer_add_eos). parse_special: also cut control
// tokens (e.g. "<|im_start|>") out of the text; user-defined tokens are cut
// out either way.
// Writes at most max ids to out and the full count to *n_out. When the full
// count exceeds max, returns VERR_FULL (out holds the first max ids): call
// again with a buffer of *n_out entries.
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t *out, int max, int *n_out, struct verr *err);

// As tokenizer_encode into a malloc'd array the caller frees (*out is NULL
// when *n_out is 0).
int tokenizer_encode_alloc(const struct tokenizer *t, const char *text, size_t len,
                           bool add_special, bool parse_special, int32_t **out, int *n_out,
                           struct verr *err);

// ---------------------------------------------------------------------------
// Decoding

// The bytes token id stands for: SentencePiece pieces with U+2581 turned
// back into spaces, byte tokens as their one byte, byte-level BPE pieces
// mapped back to their bytes, user-defined tokens as written. Control and
// unknown tokens give "" unless special is set, then their text. A piece may
// be a fragment of a UTF-8 sequence (byte tokens, byte-level BPE): print
// through a tokenizer_stream. *piece points into the tokenizer (valid until
// tokenizer_free) and is not NUL-terminated. Fails (VERR_RANGE) for an id
// outside the vocabulary.
int tokenizer_piece(const struct tokenizer *t, int32_t id, bool special, const char **piece,
                    size_t *len, struct verr *err);

// Joins the pieces of ids into a malloc'd NUL-terminated string, as
// llama_detokenize: one leading space of the first piece is dropped where
// SentencePiece adds one in front of the text; remove_special drops a
// leading BOS / trailing EOS the vocabulary adds (and then, like llama.cpp,
// keeps that leading space); unparse_special renders control tokens; and
// byte-level vocabularies that ask for it get llama.cpp's clean-up of spaces
// before punctuation and contractions. The result may hold invalid UTF-8 if
// the ids cut a character in half.
int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, int n, bool remove_special,
                     bool unparse_special, char **out, size_t *len, struct verr *err);

// Streaming detokenizer for generation: pushes one token at a time and hands
// back only complete UTF-8, holding back the start of a character whose
// remaining bytes are still to come. Bytes that can never form valid UTF-8
// come out as U+FFFD, so everything returned is valid UTF-8.
struct tokenizer_stream;

int tokenizer_stream_new(struct tokenizer_stream **out, const struct tokenizer *t, bool special,
                         struct verr *err);
void tokenizer_stream_free(struct tokenizer_stream *s);
// Appends the piece of id; *text / *len: the bytes ready to print now (maybe
// none), valid until the next call on s.
int tokenizer_stream_push(struct tokenizer_stream *s, int32_t id, const char **text, size_t *len,
                          struct verr *err);
// Ends the text: a held-back incomplete character comes out as U+FFFD. The
// stream can then be used for a new text.
void tokenizer_stream_flush(struct tokenizer_stream *s, const char **text, size_t *len);

// ---------------------------------------------------------------------------
// Accessors

enum tokenizer_type tokenizer_get_type(const struct tokenizer *t);
enum tokenizer_pre tokenizer_get_pre(const struct tokenizer *t);
int32_t tokenizer_n_vocab(const struct tokenizer *t);
int32_t tokenizer_n_merges(const struct tokenizer *t);
int32_t tokenizer_bos(const struct tokenizer *t); // TOKENIZER_NULL when none
int32_t tokenizer_eos(const struct tokenizer *t);
int32_t tokenizer_eot(const struct tokenizer *t);
int32_t tokenizer_unk(const struct tokenizer *t);
int32_t tokenizer_pad(const struct tokenizer *t);
int32_t tokenizer_nl(const struct tokenizer *t); // the token of "\n"
bool tokenizer_add_bos(const struct tokenizer *t);
bool tokenizer_add_eos(const struct tokenizer *t);
// End of generation: eos, eot, eom and the other tokens llama.cpp recognises
// by their text ("<|im_end|>", "<end_of_turn>", ...).
bool tokenizer_is_eog(const struct tokenizer *t, int32_t id);
bool tokenizer_is_control(const struct tokenizer *t, int32_t id);
uint32_t tokenizer_token_attr(const struct tokenizer *t, int32_t id); // 0 outside the vocabulary
float tokenizer_token_score(const struct tokenizer *t, int32_t id);
// The vocabulary text of a token (NUL-terminated), NULL outside the vocabulary.
const char *tokenizer_token_text(const struct tokenizer *t, int32_t id, size_t *len);
// The id whose vocabulary text is exactly text[0..len), or TOKENIZER_NULL.
int32_t tokenizer_find(const struct tokenizer *t, const char *text, size_t len);

// ---------------------------------------------------------------------------
// Pre-tokenizers (exposed for tests and tools)

// Maps a tokenizer.ggml.pre value to its pre-tokenizer; VERR_UNSUPPORTED
// for names vela does not implement.
int tokenizer_pre_from_name(const char *name, enum tokenizer_pre *pre, struct verr *err);
const char *tokenizer_pre_name(enum tokenizer_pre pre);

// Splits n code points into words: writes a malloc'd array of word lengths
// (in code points, each > 0, summing to n) to *lens and its size to *n_words.
int tokenizer_pre_split(enum tokenizer_pre pre, const uint32_t *cpts, size_t n, size_t **lens,
                        size_t *n_words, struct verr *err);

#endif
