// The ggml type table against llama.cpp's ids, block sizes and block bytes.
#include <criterion/criterion.h>

#include "gguf/types.h"

Test(types, known_sizes) {
    // {id, block size, bytes per block} as llama.cpp's ggml type traits.
    static const struct { int id; uint32_t bs, bb;
    } want[] = {
        {GGML_TYPE_F32, 1, 4},      {GGML_TYPE_F16, 1, 2},      {GGML_TYPE_BF16, 1, 2},
        {GGML_TYPE_Q4_0, 32, 18},   {GGML_TYPE_Q4_1, 32, 20},   {GGML_TYPE_Q5_0, 32, 22},
        {GGML_TYPE_Q5_1, 32, 24},   {GGML_TYPE_Q8_0, 32, 34},   {GGML_TYPE_Q2_K, 256, 84},
        {GGML_TYPE_Q3_K, 256, 110}, {GGML_TYPE_Q4_K, 256, 144}, {GGML_TYPE_Q5_K, 256, 176},
        {GGML_TYPE_Q6_K, 256, 210}, {GGML_TYPE_IQ4_NL, 32, 18}, {GGML_TYPE_MXFP4, 32, 17},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const struct ggml_type_info *t = ggml_type_get(want[i].id);
        cr_assert_not_null(t, "type %d missing", want[i].id);
        cr_expect_eq(t->block_size, want[i].bs, "%s block size", t->name);
        cr_expect_eq(t->block_bytes, want[i].bb, "%s block bytes", t->name);
    }
    cr_expect_null(ggml_type_get(4), "Q4_2 was removed");
    cr_expect_null(ggml_type_get(GGML_TYPE_COUNT));
    cr_expect_eq(ggml_type_from_name("Q4_K"), GGML_TYPE_Q4_K);
    cr_expect_eq(ggml_type_from_name("MXFP4"), 39, "llama.cpp's GGML_TYPE_MXFP4");
    cr_expect_str_eq(ggml_type_name(GGML_TYPE_MXFP4), "mxfp4");
    cr_expect_eq(ggml_row_bytes(GGML_TYPE_MXFP4, 2880), 2880 / 32 * 17, "a gpt-oss-20b row");
    cr_expect_eq(ggml_type_from_name("nope"), -1);
    cr_expect_eq(ggml_row_bytes(GGML_TYPE_Q4_0, 4096), 4096 / 32 * 18);
    cr_expect_eq(ggml_row_bytes(GGML_TYPE_Q4_0, 33), 0, "not a multiple of the block");
}
