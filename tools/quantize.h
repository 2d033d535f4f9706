// vela quantize: rewrites a GGUF model with its weight matrices in another
// type, as llama.cpp's llama-quantize does for a plain type.
//
// What changes: every 2-D tensor named "*.weight" (the matrices and the
// token embedding) is converted to `type` (or to type_embd / type_output for
// token_embd.weight / output.weight when set); a matrix whose rows do not
// fit the type's block size gets llama.cpp's fallback type
// (mkmodel_type_fallback). Everything else -- 1-D tensors (norms, biases,
// rope factors), every metadata key, the alignment and the tensor order --
// is copied as it is, except general.file_type (llama.cpp's id of `type`)
// and general.quantization_version (2 when the output holds block types).
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

struct quantize_opts {
    const char *in, *out; // GGUF paths; out must not be in (it is written, then renamed)
    enum ggml_type type;  // F32, F16, BF16 or a type quant_can_quantize takes
    int type_embd;        // token_embd.weight's type, or -1: `type`
    int type_output;      // output.weight's type, or -1: `type`
    bool allow_requantize;
    int n_threads; // rows are converted in parallel; <= 0: the physical cores
};

struct quantize_stats {
    int n_tensors, n_converted, n_copied, n_fallback;
    uint64_t bytes_in, bytes_out; // tensor data
};

// Writes o->out. On failure nothing is left at o->out (an existing file
// there is kept) and err says what and where (the tensor's name).
int quantize_file(const struct quantize_opts *o, struct quantize_stats *stats, struct verr *err);

#endif
