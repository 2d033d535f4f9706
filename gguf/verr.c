#include "gguf/verr.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int verr_set(struct verr *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

int verr_wrap(struct verr *err, const char *fmt, ...) {
    if (!err)
        return VERR_OK;
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    // Messages longer than err->msg are cut at the end, never overflow.
    size_t plen = strlen(prefix), mlen = strnlen(err->msg, sizeof err->msg - 1);
    size_t cap = sizeof err->msg - 1;
    if (plen + 2 > cap)
        plen = cap - 2;
    if (plen + 2 + mlen > cap)
        mlen = cap - plen - 2;
    memmove(err->msg + plen + 2, err->msg, mlen);
    memcpy(err->msg, prefix, plen);
    err->msg[plen] = ':';
    err->msg[plen + 1] = ' ';
    err->msg[plen + 2 + mlen] = '\0';
    return err->code;
}

const char *verr_code_name(int code) {
    switch (code) {
    case VERR_OK: return "ok";
    case VERR_IO: return "i/o error";
    case VERR_FORMAT: return "format error";
    case VERR_RANGE: return "out of range";
    case VERR_NOMEM: return "out of memory";
    case VERR_NOTFOUND: return "not found";
    case VERR_TYPE: return "type mismatch";
    case VERR_UNSUPPORTED: return "unsupported";
    case VERR_BACKEND: return "backend error";
    case VERR_FULL: return "full";
    }
    return "unknown error";
}
