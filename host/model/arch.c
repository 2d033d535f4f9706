// The registry of architectures and what their tables share.
#include "host/model/arch.h"

#include <stdio.h>
#include <string.h>

#include "host/model/layout.h"

// Registering an architecture: its id in enum model_arch (arch.h), its
// table's declaration here and its line in `archs`.
extern const struct arch arch_llama;
extern const struct arch arch_qwen2;
extern const struct arch arch_qwen3;
extern const struct arch arch_gemma3;
extern const struct arch arch_qwen3moe;
extern const struct arch arch_qwen2moe;
extern const struct arch arch_gptoss;

static const struct arch *const archs[MODEL_ARCH_COUNT] = {
    [MODEL_ARCH_LLAMA] = &arch_llama,       [MODEL_ARCH_QWEN2] = &arch_qwen2,
    [MODEL_ARCH_QWEN3] = &arch_qwen3,       [MODEL_ARCH_GEMMA3] = &arch_gemma3,
    [MODEL_ARCH_QWEN3MOE] = &arch_qwen3moe, [MODEL_ARCH_QWEN2MOE] = &arch_qwen2moe,
    [MODEL_ARCH_GPTOSS] = &arch_gptoss,
};

const struct arch *arch_get(enum model_arch id) {
    if ((int)id < 0 || id >= MODEL_ARCH_COUNT)
        return NULL;
    return archs[id];
}

const struct arch *arch_find(const char *name) {
    for (int i = 0; i < MODEL_ARCH_COUNT; i++)
        if (archs[i] && !strcmp(archs[i]->name, name))
            return archs[i];
    return NULL;
}

const char *arch_names(char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < MODEL_ARCH_COUNT && len < cap; i++)
        if (archs[i])
            len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", archs[i]->name);
    return buf;
}

void arch_dims_make(struct arch_dims *dims, int n_embd, int n_vocab, int n_ff, int n_head,
                    int n_head_kv, int head_dim, int head_dim_v, int n_rot) {
    int64_t *d = dims->d;
    d[ARCH_DIM_1] = 1;
    d[ARCH_DIM_N_EMBD] = n_embd;
    d[ARCH_DIM_N_VOCAB] = n_vocab;
    d[ARCH_DIM_N_FF] = n_ff;
    d[ARCH_DIM_N_Q] = (int64_t)n_head * head_dim;
    d[ARCH_DIM_N_K] = (int64_t)n_head_kv * head_dim;
    d[ARCH_DIM_N_V] = (int64_t)n_head_kv * head_dim_v;
    d[ARCH_DIM_N_O] = (int64_t)n_head * head_dim_v;
    d[ARCH_DIM_HEAD_DIM] = head_dim;
    d[ARCH_DIM_N_ROT_HALF] = n_rot / 2;
    d[ARCH_DIM_N_HEAD] = n_head;
    arch_dims_set_moe(dims, 0, 0, 0);
}

void arch_dims_set_moe(struct arch_dims *dims, int n_expert, int n_ff_exp, int n_ff_shexp) {
    dims->d[ARCH_DIM_N_EXPERT] = n_expert;
    dims->d[ARCH_DIM_N_FF_EXP] = n_ff_exp;
    dims->d[ARCH_DIM_N_FF_SHEXP] = n_ff_shexp;
}

#define M_(f) offsetof(struct model, f)

// In the order the loader has always checked them.
const struct arch_tensor arch_globals_llama[] = {
    {"token_embd.weight",
     ARCH_MATRIX,
     {ARCH_DIM_N_EMBD, ARCH_DIM_N_VOCAB, ARCH_DIM_1},
     false,
     ARCH_PLACE_FIRST,
     ARCH_ROLE_TOKEN_EMBD,
     M_(tok_embd)},
    {"output_norm.weight",
     ARCH_VECTOR,
     {ARCH_DIM_N_EMBD, ARCH_DIM_1, ARCH_DIM_1},
     false,
     ARCH_PLACE_LAST,
     ARCH_ROLE_OUTPUT_NORM,
     M_(output_norm)},
    {"output.weight",
     ARCH_MATRIX,
     {ARCH_DIM_N_EMBD, ARCH_DIM_N_VOCAB, ARCH_DIM_1},
     true,
     ARCH_PLACE_LAST,
     ARCH_ROLE_OUTPUT,
     M_(output)},
    {"rope_freqs.weight",
     ARCH_VECTOR,
     {ARCH_DIM_N_ROT_HALF, ARCH_DIM_1, ARCH_DIM_1},
     true,
     ARCH_PLACE_EVERY,
     ARCH_ROLE_ROPE_FREQS,
     M_(rope_freqs)},
    {0},
};
