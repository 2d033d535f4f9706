// The chat page's files and their HTTP answers (webui.h).
#include "tools/serve/webui.h"

#include <stdbool.h>
#include <string.h>

// Scripts, styles and requests from this server only: no inline script or
// handler (the model's text cannot run even where escaping failed), no
// other origin, no framing. img data: is the page's empty favicon.
#define WEBUI_CSP                                                                                  \
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "                \
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

static const struct webui_file *by_name(const char *name) {
    for (size_t i = 0; i < webui_n_files; i++)
        if (!strcmp(webui_files[i].name, name))
            return &webui_files[i];
    return NULL;
}

const struct webui_file *webui_find(const char *url, const char *method) {
    if (strcmp(method, "GET") && strcmp(method, "HEAD"))
        return NULL;
    if (!strcmp(url, "/") || !strcmp(url, "/index.html"))
        return by_name("index.html");
    if (strncmp(url, "/webui/", 7) || !strcmp(url + 7, "index.html"))
        return NULL;
    return by_name(url + 7);
}

static const char *content_type(const char *name) {
    const char *dot = strrchr(name, '.');
    if (dot && !strcmp(dot, ".js"))
        return "text/javascript; charset=utf-8";
    if (dot && !strcmp(dot, ".css"))
        return "text/css; charset=utf-8";
    return "text/html; charset=utf-8";
}

enum MHD_Result webui_send(struct MHD_Connection *c, const struct webui_file *f) {
    const char *match = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "If-None-Match");
    const bool fresh = match && strstr(match, f->etag);
    struct MHD_Response *r =
        fresh ? MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT)
              : MHD_create_response_from_buffer(f->len, (void *)f->data, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", content_type(f->name));
    MHD_add_response_header(r, "Content-Security-Policy", WEBUI_CSP);
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "ETag", f->etag);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    enum MHD_Result ok = MHD_queue_response(c, fresh ? MHD_HTTP_NOT_MODIFIED : MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}
