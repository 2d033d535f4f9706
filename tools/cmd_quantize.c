// vela quantize: command line of tools/quantize.h.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/types.h"
#include "tools/args.h"
#include "tools/cmds.h"
#include "tools/common.h"
#include "tools/progress.h"
#include "tools/quantize.h"

static void usage(FILE *out) {
    char names[256];
    fprintf(out,
            "usage: vela quantize [options] INPUT.gguf OUTPUT.gguf TYPE\n"
            "\n"
            "Writes INPUT with its weight matrices in the types llama.cpp's llama-quantize\n"
            "gives the file type TYPE (a name or llama.cpp's number; case does not matter):\n"
            "  %s\n"
            "(Q3_K, Q4_K and Q5_K mean Q3_K_M, Q4_K_M and Q5_K_M, as in llama-quantize.)\n"
            "The matrices take TYPE's base type, output.weight Q6_K (Q8_0 stays Q8_0), and\n"
            "the K-quant mixes give attn_v / ffn_down / attn_output of some layers more bits,\n"
            "by llama.cpp's rules; MXFP4_MOE: expert stacks MXFP4, every other matrix and\n"
            "the head Q8_0. Matrices whose rows do not fit a type's blocks get\n"
            "llama.cpp's fallback type (Q4_K -> Q5_0, ...); norms, biases and every metadata\n"
            "key are copied as they are.\n"
            "Quantizers: vela's own (K-quants: least-squares scale search), not bit-identical\n"
            "to llama.cpp's; the legacy types and MXFP4 are.\n"
            "\n",
            ftype_names(names, sizeof names));
    flags_help(out, &cli_flags, CLI_QUANTIZE);
    fprintf(out,
            "\nExit status: 0, 1 (the conversion failed: nothing is left at OUTPUT), 2 (usage).\n");
}

static int bad(const char *msg, const char *arg) {
    fprintf(stderr, "vela quantize: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    fprintf(stderr, "(vela quantize --help for usage)\n");
    return 2;
}

int cmd_quantize(int argc, char **argv) {
    static struct cli c; // large: off the stack
    cli_defaults(&c);
    int status = tools_parse("quantize", CLI_QUANTIZE, usage, &c, argc, argv, 3);
    if (status >= 0)
        return status;
    struct quantize_opts o = c.quant.o;
    const bool quiet = c.quant.quiet;
    const char *const *pos = c.pos;
    const int n_pos = c.n_pos;
    if (n_pos < 3)
        return bad("need INPUT.gguf OUTPUT.gguf TYPE", NULL);
    if (!(o.ftype = ftype_find(pos[2]))) {
        char names[256], msg[400];
        snprintf(msg, sizeof msg, "unknown file type '%s' (known: %s)", pos[2],
                 ftype_names(names, sizeof names));
        return bad(msg, NULL);
    }
    if (o.keep_output && o.type_output >= 0)
        return bad("--leave-output-tensor and --output-tensor-type both set output.weight; "
                   "give one of them",
                   NULL);
    o.in = pos[0];
    o.out = pos[1];
    struct load_progress lp;
    load_progress_init(&lp, "vela quantize", quiet);
    lp.what = "quantizing";
    o.progress = load_progress_update;
    o.progress_user = &lp;
    struct quantize_stats st;
    struct verr err = {0};
    if (quantize_file(&o, &st, &err)) {
        fprintf(stderr, "vela quantize: %s\n", err.msg);
        return 1;
    }
    if (!quiet) {
        char types[512] = "";
        for (int t = 0; t < GGML_TYPE_COUNT; t++)
            if (st.n_of_type[t]) {
                const size_t k = strlen(types);
                snprintf(types + k, sizeof types - k, "%s%s %d", k ? ", " : "",
                         ggml_type_name((uint32_t)t), st.n_of_type[t]);
            }
        fprintf(stderr,
                "vela quantize: %s (%s%s): %d tensors, %d converted (%d to a fallback type), %d "
                "copied; %.2f MiB -> %.2f MiB\n"
                "vela quantize: types: %s\n",
                o.out, o.ftype->name, o.pure ? ", pure" : "", st.n_tensors, st.n_converted,
                st.n_fallback, st.n_copied, (double)st.bytes_in / 1048576.0,
                (double)st.bytes_out / 1048576.0, types);
    }
    return 0;
}
