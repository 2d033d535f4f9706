#include "tools/common.h"

#include <stdlib.h>

enum tools_flag tools_flag_shared(const char *cmd, void (*usage)(FILE *), struct args_model *am,
                                  struct sampler_params *sp, int argc, char **argv, int *i,
                                  int *status) {
    *status = 0;
    if (args_is(argv[*i], "-h", "--help")) {
        usage(stdout);
        return TOOLS_FLAG_EXIT;
    }
    struct verr err = {0};
    int rc = args_parse_model(am, argc, argv, i, &err);
    if (rc == 0 && sp)
        rc = args_parse_sampler(sp, argc, argv, i, &err);
    if (rc == 0)
        return TOOLS_FLAG_OWN;
    if (rc < 0) {
        fprintf(stderr, "vela %s: %s\n", cmd, err.msg);
        *status = 2;
        return TOOLS_FLAG_EXIT;
    }
    return TOOLS_FLAG_TAKEN;
}

int tools_unknown_option(const char *cmd, const char *arg) {
    fprintf(stderr, "vela %s: unknown option '%s' (see 'vela %s --help')\n", cmd, arg, cmd);
    return 2;
}

char *tools_read_file(const char *path, size_t *len_out) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (len + 1 >= cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
    }
    fclose(f);
    if (!buf)
        return NULL;
    buf[len] = '\0';
    *len_out = len;
    return buf;
}
