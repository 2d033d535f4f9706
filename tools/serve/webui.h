// The chat page of `vela serve` at / (tools/serve/webui/: HTML, CSS and
// JavaScript, embedded in the binary at build time by
// cmake/embed_webui.cmake; no build step, no network: it works offline).
//
// Served without the API key, as llama-server serves its page: the page
// asks for the key and sends it with its API requests. --no-webui turns it
// off (404, as llama-server). Every answer carries a Content-Security-Policy
// that allows scripts, styles and requests from the server alone (no inline
// script, no other origin), and an ETag; a browser revalidates each load
// (Cache-Control: no-cache) and gets 304 while the build is the same.
#ifndef VELA_TOOLS_SERVE_WEBUI_H
#define VELA_TOOLS_SERVE_WEBUI_H

#include <stddef.h>

#include <microhttpd.h>

struct webui_file {
    const char *name; // "index.html", "app.js", ...
    const unsigned char *data;
    size_t len;
    const char *etag; // quoted, as the header carries it
};

// The embedded files (generated: webui_files.c in the build folder).
extern const struct webui_file webui_files[];
extern const size_t webui_n_files;

// The page's file for a GET or HEAD of url: "/" and "/index.html" are the
// page, "/webui/NAME" its other files; NULL for anything else (the query
// string is not part of url).
const struct webui_file *webui_find(const char *url, const char *method);

// Answers c with f: 200, or 304 when the request's If-None-Match names f's
// ETag.
enum MHD_Result webui_send(struct MHD_Connection *c, const struct webui_file *f);

#endif
