// vela quantize: command line of tools/quantize.h.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/types.h"
#include "tools/cmds.h"
#include "tools/quantize.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: vela quantize [options] INPUT.gguf OUTPUT.gguf TYPE\n"
            "\n"
            "Writes INPUT with its weight matrices in TYPE, as llama.cpp's llama-quantize does\n"
            "for a plain type: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k q4_k q5_k q6_k.\n"
            "Matrices whose rows do not fit TYPE's blocks get llama.cpp's fallback type (Q4_K\n"
            "-> Q5_0, ...); norms, biases and every metadata key are copied as they are.\n"
            "Quantizers: vela's own (K-quants: least-squares scale search), not bit-identical\n"
            "to llama.cpp's; the legacy types are.\n"
            "\n"
            "options:\n"
            "  --allow-requantize          convert tensors that are already quantized (each\n"
            "                              such tensor is decoded and encoded again: precision\n"
            "                              is lost twice)\n"
            "  --token-embedding-type T    token_embd.weight in T\n"
            "  --output-tensor-type T      output.weight in T\n"
            "  -t, --threads N             converting threads (default: the physical cores)\n"
            "  -q, --quiet                 print nothing but errors\n"
            "  -h, --help                  this help\n"
            "\n"
            "Exit status: 0, 1 (the conversion failed: nothing is left at OUTPUT), 2 (usage).\n");
}

static int bad(const char *msg, const char *arg) {
    fprintf(stderr, "vela quantize: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    fprintf(stderr, "(vela quantize --help for usage)\n");
    return 2;
}

static int type_arg(const char *s, int *out) {
    *out = ggml_type_from_name(s);
    return *out >= 0;
}

int cmd_quantize(int argc, char **argv) {
    struct quantize_opts o = {.type_embd = -1, .type_output = -1};
    const char *pos[3];
    int n_pos = 0, type = -1;
    bool quiet = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--allow-requantize")) {
            o.allow_requantize = true;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = true;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            char *end = NULL;
            const long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : -1;
            if (i + 1 >= argc || *end != '\0' || v < 1 || v > 1024)
                return bad("--threads needs a number from 1 to 1024", i + 1 < argc ? argv[i + 1] : NULL);
            o.n_threads = (int)v;
            i++;
        } else if (!strcmp(a, "--token-embedding-type") || !strcmp(a, "--output-tensor-type")) {
            if (i + 1 >= argc)
                return bad("missing value after", a);
            int *dst = !strcmp(a, "--token-embedding-type") ? &o.type_embd : &o.type_output;
            if (!type_arg(argv[++i], dst))
                return bad("unknown type", argv[i]);
        } else if (a[0] == '-' && a[1] != '\0') {
            return bad("unknown option", a);
        } else if (n_pos < 3) {
            pos[n_pos++] = a;
        } else {
            return bad("too many arguments", a);
        }
    }
    if (n_pos < 3)
        return bad("need INPUT.gguf OUTPUT.gguf TYPE", NULL);
    if (!type_arg(pos[2], &type))
        return bad("unknown type", pos[2]);
    o.in = pos[0];
    o.out = pos[1];
    o.type = (enum ggml_type)type;
    struct quantize_stats st;
    struct verr err = {0};
    if (quantize_file(&o, &st, &err)) {
        fprintf(stderr, "vela quantize: %s\n", err.msg);
        return 1;
    }
    if (!quiet)
        fprintf(stderr,
                "vela quantize: %s: %d tensors, %d converted (%d to a fallback type), %d copied; "
                "%.2f MiB -> %.2f MiB\n",
                o.out, st.n_tensors, st.n_converted, st.n_fallback, st.n_copied,
                (double)st.bytes_in / 1048576.0, (double)st.bytes_out / 1048576.0);
    return 0;
}
