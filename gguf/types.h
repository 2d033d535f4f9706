// The table of ggml tensor types: llama.cpp's numeric ids (as stored in GGUF
// tensor infos), elements per block and bytes per block.
#ifndef VELA_GGUF_TYPES_H
#define VELA_GGUF_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ggml_type {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    // 4 and 5 (Q4_2, Q4_3) were removed from ggml; files carrying them are refused.
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_Q8_K = 15,
    GGML_TYPE_IQ2_XXS = 16,
    GGML_TYPE_IQ2_XS = 17,
    GGML_TYPE_IQ3_XXS = 18,
    GGML_TYPE_IQ1_S = 19,
    GGML_TYPE_IQ4_NL = 20,
    GGML_TYPE_IQ3_S = 21,
    GGML_TYPE_IQ2_S = 22,
    GGML_TYPE_IQ4_XS = 23,
    GGML_TYPE_I8 = 24,
    GGML_TYPE_I16 = 25,
    GGML_TYPE_I32 = 26,
    GGML_TYPE_I64 = 27,
    GGML_TYPE_F64 = 28,
    GGML_TYPE_IQ1_M = 29,
    GGML_TYPE_BF16 = 30,
    GGML_TYPE_TQ1_0 = 34,
    GGML_TYPE_TQ2_0 = 35,
    GGML_TYPE_MXFP4 = 39,
    GGML_TYPE_COUNT = 40, // one past the largest id; not a type
};

struct ggml_type_info {
    const char *name;       // as llama.cpp prints it: "f32", "q4_0", "q4_K", ...
    uint32_t block_size;    // elements per block (1 for plain types)
    uint32_t block_bytes;   // bytes per block
    bool quantized;
};

// NULL for an id that is not a known type (gaps, out of range).
const struct ggml_type_info *ggml_type_get(uint32_t type);
// "f32", ... or "unknown".
const char *ggml_type_name(uint32_t type);
// Looks a type up by its name (case-insensitive, e.g. "Q4_K", "q8_0", "bf16");
// returns -1 when unknown.
int ggml_type_from_name(const char *name);
// Bytes of one row of n elements; 0 when the type is unknown or n is not a
// multiple of the block size.
size_t ggml_row_bytes(uint32_t type, int64_t n);

#endif
