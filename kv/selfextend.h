// Self-extend (grouped attention, arXiv 2401.01325): the ga_i / ga_n / ga_w
// loop of llama.cpp's llama-cli, run before each batch of one sequence. It
// regroups the positions of that sequence's cells with seq_add / seq_div so
// that positions past the trained context map back into it
// (shared/seeds/000_* walks through it with concrete values).
//
// Per round, while n_past >= ga_i + ga_w:
//   ib = ga_n*ga_i / ga_w;  bd = ga_w/ga_n * (ga_n-1);  dd = ga_w/ga_n - ib*bd - ga_w
//   seq_add(ga_i, n_past, +ib*bd)
//   seq_div(ga_i + ib*bd, ga_i + ib*bd + ga_w, ga_n)
//   seq_add(ga_i + ib*bd + ga_w, n_past + ib*bd, dd)
//   n_past -= bd;  ga_i += ga_w/ga_n
// The shifts stay pending in the cache until kv_prepare applies them to K.
#ifndef VELA_KV_SELFEXTEND_H
#define VELA_KV_SELFEXTEND_H

#include <stdint.h>

#include "gguf/verr.h"
#include "kv/kv.h"

// Receives one log line, without a trailing newline.
typedef void (*kv_log_fn)(void *user, const char *line);

struct kv_selfextend {
    int ga_n;          // group factor, >= 1; 1 disables self-extend
    int ga_w;          // group width, a multiple of ga_n, <= n_ctx
    int ga_i;          // start of the next window; 0 at first, advanced by the driver
    int seq;           // the sequence whose positions it regroups
    kv_log_fn log;     // optional: gets llama-cli's "shift:" / "div:" lines, 3 per
                       // round, each right before its op runs
    void *log_user;
};

// Fills *se (ga_i = 0, no log callback) after checking ga_n >= 1,
// ga_w >= 1, ga_w % ga_n == 0, ga_w <= kv's n_ctx and seq in range;
// VERR_RANGE with a message otherwise (*se untouched).
int kv_selfextend_init(struct kv_selfextend *se, const struct kv_cache *kv, int ga_n, int ga_w,
                       int seq, struct verr *err);

// Runs the rounds due at *n_past (none when ga_n == 1) and lowers *n_past by
// bd per round: the position of the next token. Checks *se as
// kv_selfextend_init does (VERR_RANGE, nothing changed).
int kv_selfextend_apply(struct kv_selfextend *se, struct kv_cache *kv, int32_t *n_past,
                        struct verr *err);

#endif
