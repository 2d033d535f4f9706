// vela's default model: what `vela run` (and chat / serve) use without -m.
// SmolLM2-135M-Instruct in Q4_1, fetched once by tools/model_cache.sh into
// the cache folder ($VELA_CACHE, else ~/.cache/vela), which checks its
// SHA-256; here its size is checked, which catches a partial copy.
#ifndef VELA_TOOLS_DEFAULT_MODEL_H
#define VELA_TOOLS_DEFAULT_MODEL_H

#include <stdbool.h>
#include <stddef.h>

#define TOOLS_DEFAULT_MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"
#define TOOLS_DEFAULT_MODEL_BYTES 98362432LL
#define TOOLS_DEFAULT_MODEL_SHA256                                                                 \
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

// The cache folder and the default model's path in it, into buf. Returns -1
// when neither $VELA_CACHE nor $HOME is set or the path does not fit.
int tools_cache_dir(char *buf, size_t cap);
int tools_default_model_path(char *buf, size_t cap);

// For a command given no -m: points *model_path at the cached default model
// (a static buffer) and says on stderr which file it uses; when the file is
// missing or has the wrong size, prints how to fetch it and returns 2 (the
// usage-error status). "vela CMD: " prefixes every line.
int tools_use_default_model(const char *cmd, const char **model_path);

// Whether the GGUF at path is a synthetic model with random weights
// (general.name "vela-synthetic-...", written by vela mkmodel); false when it
// cannot be read.
bool tools_model_is_synthetic(const char *path);

// What the note says after the path.
#define TOOLS_SYNTHETIC_NOTE                                                                       \
    "is a synthetic model with random weights (vela mkmodel): every stage runs, the text is "      \
    "meaningless"

// Prints "vela CMD: note: PATH is a synthetic model with random weights ..."
// on stderr when it is one.
void tools_note_synthetic(const char *cmd, const char *path);

#endif
