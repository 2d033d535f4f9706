// verr: the error report every vela library fills in.
//
// Contract: a library function that can fail returns an int status (0 = ok,
// a negative VERR_* code otherwise) and, when it fails and `err` is not NULL,
// writes one human-readable line into err->msg saying what went wrong, where
// (file, byte offset, tensor or key name, flag) and what was expected.
// Libraries never print and never exit; tools/ decides what to do.
#ifndef VELA_VERR_H
#define VELA_VERR_H

#include <stddef.h>

enum verr_code {
    VERR_OK = 0,
    VERR_IO = -1,       // open/read/mmap/write failed
    VERR_FORMAT = -2,   // malformed input file or data
    VERR_RANGE = -3,    // a value outside what is allowed
    VERR_NOMEM = -4,    // allocation failed (host or device)
    VERR_NOTFOUND = -5, // key, tensor or device missing
    VERR_TYPE = -6,     // a value of another type than expected
    VERR_UNSUPPORTED = -7,
    VERR_BACKEND = -8,  // CUDA / cuBLAS / NCCL error
    VERR_FULL = -9,     // no room (KV cache full, batch too large)
};

struct verr {
    int code;
    char msg[1024];
};

// Sets err (when not NULL) and returns `code`, so callers can write
// `return verr_set(err, VERR_FORMAT, "%s: offset %zu: ...", path, off);`.
int verr_set(struct verr *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

// Prefixes err->msg with "<prefix>: " (adds context on the way up).
int verr_wrap(struct verr *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

const char *verr_code_name(int code);

#endif
