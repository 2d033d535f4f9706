// Stop strings for one generated text: the text of each sampled token is
// pushed as it comes; what can be shown is handed back, and generation is
// over when the text contains one of the stop strings. As llama-server's
// stop words:
//   - a stop string is found across token boundaries (it may begin in the
//     text of one token and end in the text of another);
//   - the stop string itself, and anything after it, is never handed back;
//   - text that could still become the start of a stop string (a suffix of
//     the text that is a prefix of a stop string) is held back until it is
//     clearly not one, or handed back by stop_flush when generation ends for
//     another reason;
//   - the text ends at the first stop string to be complete: later text
//     cannot move the end earlier (a stream cannot take back what it sent);
//     when one piece completes several, the one that starts first wins (the
//     earlier in the list when two start at the same byte).
// UTF-8: the text handed back never ends inside a character: an incomplete
// sequence at the end is held back until its remaining bytes come (so a
// client never sees half a character, even from pieces that split one).
//
// Contract: one matcher per generated text, used by one thread at a time.
// Functions returning int give 0 or a negative VERR_* code with a message.
#ifndef VELA_HOST_ENGINE_STOP_H
#define VELA_HOST_ENGINE_STOP_H

#include <stdbool.h>
#include <stddef.h>

#include "gguf/verr.h"

#define STOP_MAX_STRINGS 64 // stop strings per matcher
#define STOP_MAX_LEN 1024   // bytes per stop string

struct stop_matcher;

// Copies stops[0..n) (NUL-terminated; n may be 0: nothing ever stops). An
// empty stop string, more than STOP_MAX_STRINGS or one longer than
// STOP_MAX_LEN is VERR_RANGE.
int stop_new(struct stop_matcher **out, const char *const *stops, int n, struct verr *err);
void stop_free(struct stop_matcher *m);

// Appends text[0..len) to the generated text. *show / *show_len: the bytes
// that can be shown now (maybe none), valid until the next call on m. Once a
// stop string has been found (stop_hit >= 0) nothing more is handed back.
int stop_push(struct stop_matcher *m, const char *text, size_t len, const char **show,
              size_t *show_len, struct verr *err);

// Generation ended without a stop string: hands back the text held back
// (incomplete UTF-8 included, as it is). Nothing after a stop string.
void stop_flush(struct stop_matcher *m, const char **show, size_t *show_len);

// The index of the stop string found, or -1.
int stop_hit(const struct stop_matcher *m);

// Bytes held back now (tests, and callers that report them).
size_t stop_held(const struct stop_matcher *m);

// Forgets the text so far (the stop strings stay): for a new generation.
void stop_reset(struct stop_matcher *m);

// The length of the longest prefix of s[0..n) that does not end inside a
// UTF-8 character: n less an incomplete sequence at the end (at most 3
// bytes). Bytes that are not UTF-8 at all count as complete.
size_t stop_utf8_complete(const char *s, size_t n);

#endif
