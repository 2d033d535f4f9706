// The log of `vela serve` (see log.h).
#include "tools/serve/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

static struct {
    pthread_mutex_t mu; // one line at a time
    FILE *f;            // NULL: stderr
    struct srv_log_config cfg;
} g_log = {.mu = PTHREAD_MUTEX_INITIALIZER};

static const char *const level_names[] = {"error", "warn", "info", "debug"};

int srv_log_open(const struct srv_log_config *c, struct verr *err) {
    FILE *f = NULL;
    if (c->path && !(f = fopen(c->path, "a")))
        return verr_set(err, VERR_IO, "--log-file '%s': cannot open for appending: %s", c->path,
                        strerror(errno));
    pthread_mutex_lock(&g_log.mu);
    g_log.f = f;
    g_log.cfg = *c;
    pthread_mutex_unlock(&g_log.mu);
    return 0;
}

void srv_log_close(void) {
    pthread_mutex_lock(&g_log.mu);
    if (g_log.f)
        fclose(g_log.f);
    g_log.f = NULL;
    memset(&g_log.cfg, 0, sizeof g_log.cfg);
    pthread_mutex_unlock(&g_log.mu);
}

// "2026-11-27T13:40:01.123Z" into ts[32].
static void timestamp(char ts[32]) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct tm tm;
    gmtime_r(&now.tv_sec, &tm);
    size_t n = strftime(ts, 32, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + n, 32 - n, ".%03ldZ", now.tv_nsec / 1000000L);
}

// Writes one line (text: as it is; json: o printed and deleted), under the lock.
static void emit(const char *text, cJSON *o) {
    char *js = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    pthread_mutex_lock(&g_log.mu);
    FILE *f = g_log.f ? g_log.f : stderr;
    if (js || text) {
        fputs(js ? js : text, f);
        fputc('\n', f);
        fflush(f);
    }
    pthread_mutex_unlock(&g_log.mu);
    cJSON_free(js);
}

// A JSON line's common fields.
static cJSON *json_line(enum srv_log_level level) {
    char ts[32];
    timestamp(ts);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "ts", ts);
    cJSON_AddStringToObject(o, "level", level_names[level]);
    return o;
}

// Control characters (a newline from libmicrohttpd, a hostile path) would
// break a text line in two: they become '?'.
static void printable(char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            *s = '?';
}

void srv_log_va(enum srv_log_level level, const char *fmt, va_list ap) {
    if (level == SRV_LOG_DEBUG && !g_log.cfg.verbose)
        return;
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
        msg[--n] = '\0';
    if (g_log.cfg.format == SRV_LOG_JSON) {
        cJSON *o = json_line(level);
        cJSON_AddStringToObject(o, "msg", msg);
        emit(NULL, o);
        return;
    }
    printable(msg);
    char line[2100];
    snprintf(line, sizeof line, "vela serve: %s%s",
             level == SRV_LOG_WARN    ? "warning: "
             : level == SRV_LOG_DEBUG ? "debug: "
                                      : "",
             msg);
    emit(line, NULL);
}

void srv_log(enum srv_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    srv_log_va(level, fmt, ap);
    va_end(ap);
}

void srv_log_access(const struct srv_access *a) {
    if (!g_log.cfg.access)
        return;
    if (g_log.cfg.format == SRV_LOG_JSON) {
        cJSON *o = json_line(SRV_LOG_INFO);
        cJSON_AddStringToObject(o, "event", "access");
        cJSON_AddStringToObject(o, "method", a->method);
        cJSON_AddStringToObject(o, "path", a->path);
        cJSON_AddNumberToObject(o, "status", a->status);
        cJSON_AddStringToObject(o, "remote", a->remote);
        if (a->tokens_in >= 0) {
            cJSON_AddNumberToObject(o, "tokens_in", a->tokens_in);
            cJSON_AddNumberToObject(o, "tokens_out", a->tokens_out);
        }
        cJSON_AddNumberToObject(o, "ms", (double)(long long)(a->ms * 10 + 0.5) / 10);
        emit(NULL, o);
        return;
    }
    char tokens[48] = "";
    if (a->tokens_in >= 0)
        snprintf(tokens, sizeof tokens, " in %d out %d", a->tokens_in, a->tokens_out);
    char line[512];
    snprintf(line, sizeof line, "vela serve: access: %s %s %d %s%s %.1f ms", a->method, a->path,
             a->status, a->remote, tokens, a->ms);
    printable(line);
    emit(line, NULL);
}
