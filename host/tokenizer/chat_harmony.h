// The text gpt-oss generates in OpenAI's harmony format, split into what a
// client is shown. After the generation prompt <|start|>assistant the model
// writes one or more messages, each a header and a body:
//
//   <|channel|>analysis<|message|>REASONING<|end|>
//   <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>
//
// or, calling a tool, a header naming the recipient (in the channel or in
// the role) and the arguments as the body, ended by <|call|>:
//
//   <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
//   <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>
//
// As llama.cpp's gpt-oss parser (common/parsers/gpt-oss.cpp): the analysis
// channel is reasoning, the final channel and commentary without a recipient
// are content, a functions.NAME recipient is a tool call, and a message to
// another recipient (a built-in tool: browser, python) is dropped. Of two
// <|channel|> in one header the last counts (gpt-oss sometimes writes a
// stray "<|channel|>commentary" first). Text that does not open with a
// header (a model that does not write harmony) is content as it is.
//
// The markers are control tokens: the parser needs their text, so the
// generated tokens must be detokenized with their special text (chat.h's
// gpt-oss template; tokenizer_piece with special set).
//
// Streaming: text may be pushed in pieces of any size, split anywhere; what
// each part receives, concatenated, does not depend on the split (bytes that
// may begin a marker are held back until the next byte says).
//
// Contract: no allocation, no global state; a struct harmony is one
// generation's state.
#ifndef VELA_HOST_TOKENIZER_CHAT_HARMONY_H
#define VELA_HOST_TOKENIZER_CHAT_HARMONY_H

#include <stdbool.h>
#include <stddef.h>

// Where a reasoning model's thoughts go: llama.cpp's --reasoning-format and
// llama-server's reasoning_format. "auto" and "deepseek" split them out
// (llama-server's reasoning_content; the terminal shows them apart); "none"
// leaves the generated text as it is, markers included, all of it content.
enum chat_reasoning {
    CHAT_REASONING_AUTO = 0,
    CHAT_REASONING_NONE,
};

// The names above; -1 for another ("deepseek-legacy" included: not supported).
int chat_reasoning_from_name(const char *name, enum chat_reasoning *out);

enum harmony_part {
    HARMONY_CONTENT = 0, // the answer
    HARMONY_REASONING,   // the analysis channel
    HARMONY_TOOL_NAME,   // a tool call's function name, whole, once per call
    HARMONY_TOOL_ARGS,   // the arguments of the call named last (JSON text)
};

// Receives len bytes of part; a non-zero return stops the push and is
// returned by it.
typedef int (*harmony_emit_fn)(void *user, enum harmony_part part, const char *text, size_t len);

#define HARMONY_HEAD_MAX 256 // longest header kept (a longer one's message is dropped)

struct harmony {
    int state;
    int part;      // the current body's enum harmony_part, or -1: dropped
    char hold[16]; // bytes of a body that may begin a marker
    size_t n_hold;
    char head[HARMONY_HEAD_MAX]; // the current header's text
    size_t n_head;
    bool head_over; // the header outgrew head
};

void harmony_init(struct harmony *h);

// Parses text[0..len) (the generated text after <|start|>assistant).
int harmony_push(struct harmony *h, const char *text, size_t len, harmony_emit_fn emit, void *user);

// The generation ended: bytes held back as a possible marker are body text
// after all; an unfinished header is dropped.
int harmony_flush(struct harmony *h, harmony_emit_fn emit, void *user);

// Whether the model ended its answer (<|return|> or <|call|>): what follows
// is ignored.
bool harmony_done(const struct harmony *h);

#endif
