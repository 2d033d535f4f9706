// The log of `vela serve`: its own lines, libmicrohttpd's messages and one
// access line per request, in one place (stderr, or --log-file) and one
// shape (--log-format text|json), as llama-server's log.
//
// text: "vela serve: MESSAGE" (warnings "vela serve: warning: ...");
// access lines "vela serve: access: POST /v1/completions 200 127.0.0.1
// in 12 out 30 412.3 ms".
// json: one object a line: {"ts": "2026-11-27T13:40:01.123Z", "level":
// "info", "msg": "..."}; access lines {"ts", "level", "event": "access",
// "method", "path", "status", "remote", "tokens_in", "tokens_out", "ms"}.
// Debug lines (libmicrohttpd's messages among them) are written with -v only.
//
// One log per process (the server is one per process); every function may
// be called from any thread, and before srv_log_open (stderr, text).
#ifndef VELA_TOOLS_SERVE_LOG_H
#define VELA_TOOLS_SERVE_LOG_H

#include <stdarg.h>
#include <stdbool.h>

#include "gguf/verr.h"

enum srv_log_level { SRV_LOG_ERROR, SRV_LOG_WARN, SRV_LOG_INFO, SRV_LOG_DEBUG };
enum srv_log_format { SRV_LOG_TEXT, SRV_LOG_JSON };

struct srv_log_config {
    const char *path; // --log-file (appended to); NULL: stderr
    enum srv_log_format format;
    bool verbose; // -v: debug lines too
    bool access;  // one line per request (off: --no-access-log)
};

// VERR_IO when the file cannot be opened for appending.
int srv_log_open(const struct srv_log_config *c, struct verr *err);
// Closes the file (back to stderr, text).
void srv_log_close(void);

void srv_log(enum srv_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void srv_log_va(enum srv_log_level level, const char *fmt, va_list ap);

// One request as it ended. tokens_* < 0: not a completion (left out).
struct srv_access {
    const char *method;
    const char *path;
    const char *remote; // the client's address
    int status;         // the HTTP status sent; 0: none (the client left first)
    int tokens_in, tokens_out;
    double ms; // from the request's first byte to its last one sent
};
// Writes the access line unless access lines are off.
void srv_log_access(const struct srv_access *a);

#endif
