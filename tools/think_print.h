// The terminal's view of a reasoning model's answer (vela run --chat, vela
// chat), as llama-cli shows it: the reasoning (harmony's analysis channel)
// between a "[Start thinking]" and an "[End thinking]" line, dim on a
// terminal, then the answer. Without splitting (a template that is not
// harmony, --reasoning-format none) the text is printed as it comes.
#ifndef VELA_TOOLS_THINK_PRINT_H
#define VELA_TOOLS_THINK_PRINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "host/tokenizer/chat_harmony.h"
#include "tools/serve/buf.h"

struct think_print {
    FILE *out;
    bool split;    // the text is harmony: parsed
    bool dim;      // out is a terminal: the reasoning in dim text
    bool thinking; // inside the reasoning block
    bool nl;       // the last byte printed was a newline (or nothing was)
    struct harmony hp;
    struct buf *answer; // the answer's text (content only when split) is added here; NULL: not
    int rc;             // the first failure (out of memory)
};

// split: parse the text as harmony (chat_harmony.h).
void think_print_init(struct think_print *p, FILE *out, bool split, struct buf *answer);

// Generated text (the end-of-turn text already cut out). Returns non-zero
// once the harmony answer has ended (<|return|>, <|call|>): generation may
// stop there.
int think_print_text(struct think_print *p, const char *s, size_t n);

// The answer ended: held-back bytes printed, the dim text of a reasoning
// cut off ended (without an "[End thinking]" line).
// Returns 0, or -1 when out of memory.
int think_print_end(struct think_print *p);

#endif
