// vela quantize: rewrites a GGUF model with its weight matrices in the types
// llama.cpp's llama-quantize gives a file type ("Q4_K_M", "Q8_0", ...).
//
// What changes: every tensor ftype_role_of calls a matrix (2-D "*weight"
// or a 3-D expert stack, not a norm, not a router) takes the type
// ftype_tensor_type picks for the file type:
// the base type, Q6_K for the head, more bits for some attn_v/ffn_down
// layers in the K-quant mixes (tools/mkmodel/ftype.h); with `pure`, the base
// type everywhere. A matrix whose rows do not fit that type's block size
// gets llama.cpp's fallback type (ftype_fallback). Everything else -- 1-D
// tensors (norms, biases, rope factors), every metadata key, the alignment
// and the tensor order -- is copied as it is, except general.file_type (the
// file type's id) and general.quantization_version (2 when the output holds
// block types).
//
// Conversion: each row is decoded to float32 (gguf/quant.c, bit-exact with
// ggml) and encoded with vela's quantizers (gguf/quant.h), rows spread over
// n_threads (the bytes do not depend on it); a tensor already in its target
// type is copied byte for byte. Converting a tensor that is
// already quantized to another type loses precision twice, so it is refused
// unless allow_requantize is set (llama-quantize's --allow-requantize).
#ifndef VELA_TOOLS_QUANTIZE_H
#define VELA_TOOLS_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf/types.h"
#include "gguf/verr.h"
#include "tools/mkmodel/ftype.h"

struct quantize_opts {
    const char *in, *out;           // GGUF paths; out must not be in (it is written, then renamed)
    const struct ftype_info *ftype; // the file type (ftype_find)
    bool pure;                      // every matrix in ftype->base (llama-quantize --pure)
    bool keep_output;               // output.weight as it is (--leave-output-tensor)
    int type_embd;                  // token_embd.weight's type, or -1: the file type's choice
    int type_output;                // output.weight's type, or -1: the file type's choice
    bool allow_requantize;
    int n_threads; // rows are converted in parallel; <= 0: the physical cores
    // Called as tensor data is written (done output bytes of total, done
    // rising to total), or NULL.
    void (*progress)(void *user, uint64_t done, uint64_t total);
    void *progress_user;
};

struct quantize_stats {
    int n_tensors, n_converted, n_copied, n_fallback;
    int n_of_type[GGML_TYPE_COUNT]; // tensors written in each type
    uint64_t bytes_in, bytes_out;   // tensor data
};

// Writes o->out. On failure nothing is left at o->out (an existing file
// there is kept) and err says what and where (the tensor's name).
int quantize_file(const struct quantize_opts *o, struct quantize_stats *stats, struct verr *err);

#endif
