#include "gguf/types.h"

#include <strings.h>

static const struct ggml_type_info type_table[GGML_TYPE_COUNT] = {
    [GGML_TYPE_F32] = {"f32", 1, 4, false},
    [GGML_TYPE_F16] = {"f16", 1, 2, false},
    [GGML_TYPE_Q4_0] = {"q4_0", 32, 18, true},
    [GGML_TYPE_Q4_1] = {"q4_1", 32, 20, true},
    [GGML_TYPE_Q5_0] = {"q5_0", 32, 22, true},
    [GGML_TYPE_Q5_1] = {"q5_1", 32, 24, true},
    [GGML_TYPE_Q8_0] = {"q8_0", 32, 34, true},
    [GGML_TYPE_Q8_1] = {"q8_1", 32, 36, true},
    [GGML_TYPE_Q2_K] = {"q2_K", 256, 84, true},
    [GGML_TYPE_Q3_K] = {"q3_K", 256, 110, true},
    [GGML_TYPE_Q4_K] = {"q4_K", 256, 144, true},
    [GGML_TYPE_Q5_K] = {"q5_K", 256, 176, true},
    [GGML_TYPE_Q6_K] = {"q6_K", 256, 210, true},
    [GGML_TYPE_Q8_K] = {"q8_K", 256, 292, true},
    [GGML_TYPE_IQ2_XXS] = {"iq2_xxs", 256, 66, true},
    [GGML_TYPE_IQ2_XS] = {"iq2_xs", 256, 74, true},
    [GGML_TYPE_IQ3_XXS] = {"iq3_xxs", 256, 98, true},
    [GGML_TYPE_IQ1_S] = {"iq1_s", 256, 50, true},
    [GGML_TYPE_IQ4_NL] = {"iq4_nl", 32, 18, true},
    [GGML_TYPE_IQ3_S] = {"iq3_s", 256, 110, true},
    [GGML_TYPE_IQ2_S] = {"iq2_s", 256, 82, true},
    [GGML_TYPE_IQ4_XS] = {"iq4_xs", 256, 136, true},
    [GGML_TYPE_I8] = {"i8", 1, 1, false},
    [GGML_TYPE_I16] = {"i16", 1, 2, false},
    [GGML_TYPE_I32] = {"i32", 1, 4, false},
    [GGML_TYPE_I64] = {"i64", 1, 8, false},
    [GGML_TYPE_F64] = {"f64", 1, 8, false},
    [GGML_TYPE_IQ1_M] = {"iq1_m", 256, 56, true},
    [GGML_TYPE_BF16] = {"bf16", 1, 2, false},
    [GGML_TYPE_TQ1_0] = {"tq1_0", 256, 54, true},
    [GGML_TYPE_TQ2_0] = {"tq2_0", 256, 66, true},
    [GGML_TYPE_MXFP4] = {"mxfp4", 32, 17, true},
};

const struct ggml_type_info *ggml_type_get(uint32_t type) {
    if (type >= GGML_TYPE_COUNT || type_table[type].name == NULL)
        return NULL;
    return &type_table[type];
}

const char *ggml_type_name(uint32_t type) {
    const struct ggml_type_info *t = ggml_type_get(type);
    return t ? t->name : "unknown";
}

int ggml_type_from_name(const char *name) {
    for (int i = 0; i < GGML_TYPE_COUNT; i++)
        if (type_table[i].name && strcasecmp(type_table[i].name, name) == 0)
            return i;
    return -1;
}

size_t ggml_row_bytes(uint32_t type, int64_t n) {
    const struct ggml_type_info *t = ggml_type_get(type);
    if (!t || n < 0 || n % t->block_size != 0)
        return 0;
    return (size_t)(n / t->block_size) * t->block_bytes;
}
