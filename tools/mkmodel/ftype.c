// llama.cpp's file types and llama-quantize's per-tensor choice
// (tools/mkmodel/ftype.h).
#include "tools/mkmodel/ftype.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gguf/quant.h"

// LLAMA_FTYPE ids (llama.h).
enum {
    FT_F32 = 0,
    FT_F16 = 1,
    FT_Q4_0 = 2,
    FT_Q4_1 = 3,
    FT_Q8_0 = 7,
    FT_Q5_0 = 8,
    FT_Q5_1 = 9,
    FT_Q2_K = 10,
    FT_Q3_K_S = 11,
    FT_Q3_K_M = 12,
    FT_Q3_K_L = 13,
    FT_Q4_K_S = 14,
    FT_Q4_K_M = 15,
    FT_Q5_K_S = 16,
    FT_Q5_K_M = 17,
    FT_Q6_K = 18,
    FT_IQ4_NL = 25,
    FT_IQ4_XS = 30,
    FT_BF16 = 32,
    FT_MXFP4_MOE = 38,
};

// The file types vela can write (every base has a quantizer), in
// llama-quantize's order of its list. Not here: the IQ types but IQ4_NL and
// IQ4_XS (no quantizers) and Q2_K_S, which llama-quantize makes only with an
// importance matrix.
static const struct ftype_info ftypes[] = {
    {"Q4_0", FT_Q4_0, GGML_TYPE_Q4_0, "Q4_0"},
    {"Q4_1", FT_Q4_1, GGML_TYPE_Q4_1, "Q4_1"},
    {"MXFP4_MOE", FT_MXFP4_MOE, GGML_TYPE_MXFP4, "MXFP4 MoE"},
    {"Q5_0", FT_Q5_0, GGML_TYPE_Q5_0, "Q5_0"},
    {"Q5_1", FT_Q5_1, GGML_TYPE_Q5_1, "Q5_1"},
    {"Q2_K", FT_Q2_K, GGML_TYPE_Q2_K, "Q2_K - Medium"},
    {"Q3_K_S", FT_Q3_K_S, GGML_TYPE_Q3_K, "Q3_K - Small"},
    {"Q3_K_M", FT_Q3_K_M, GGML_TYPE_Q3_K, "Q3_K - Medium"},
    {"Q3_K_L", FT_Q3_K_L, GGML_TYPE_Q3_K, "Q3_K - Large"},
    {"Q4_K_S", FT_Q4_K_S, GGML_TYPE_Q4_K, "Q4_K - Small"},
    {"Q4_K_M", FT_Q4_K_M, GGML_TYPE_Q4_K, "Q4_K - Medium"},
    {"Q5_K_S", FT_Q5_K_S, GGML_TYPE_Q5_K, "Q5_K - Small"},
    {"Q5_K_M", FT_Q5_K_M, GGML_TYPE_Q5_K, "Q5_K - Medium"},
    {"Q6_K", FT_Q6_K, GGML_TYPE_Q6_K, "Q6_K"},
    {"IQ4_NL", FT_IQ4_NL, GGML_TYPE_IQ4_NL, "IQ4_NL - 4.5 bpw"},
    {"IQ4_XS", FT_IQ4_XS, GGML_TYPE_IQ4_XS, "IQ4_XS - 4.25 bpw"},
    {"Q8_0", FT_Q8_0, GGML_TYPE_Q8_0, "Q8_0"},
    {"F16", FT_F16, GGML_TYPE_F16, "F16"},
    {"BF16", FT_BF16, GGML_TYPE_BF16, "BF16"},
    {"F32", FT_F32, GGML_TYPE_F32, "all F32"},
};
#define N_FTYPES (sizeof ftypes / sizeof ftypes[0])

// llama-quantize's short names for the _M types.
static const struct {
    const char *alias, *name;
} aliases[] = {{"Q3_K", "Q3_K_M"}, {"Q4_K", "Q4_K_M"}, {"Q5_K", "Q5_K_M"}};

const struct ftype_info *ftype_by_id(int id) {
    for (size_t i = 0; i < N_FTYPES; i++)
        if (ftypes[i].id == id)
            return &ftypes[i];
    return NULL;
}

const struct ftype_info *ftype_find(const char *name) {
    if (!name || !*name)
        return NULL;
    char *end = NULL;
    const long id = strtol(name, &end, 10);
    if (*end == '\0')
        return ftype_by_id((int)id);
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcasecmp(name, aliases[i].alias))
            name = aliases[i].name;
    for (size_t i = 0; i < N_FTYPES; i++)
        if (!strcasecmp(name, ftypes[i].name))
            return &ftypes[i];
    return NULL;
}

const char *ftype_names(char *buf, size_t cap) {
    if (cap == 0)
        return buf;
    buf[0] = '\0';
    for (size_t i = 0; i < N_FTYPES; i++) {
        strncat(buf, i ? ", " : "", cap - strlen(buf) - 1);
        strncat(buf, ftypes[i].name, cap - strlen(buf) - 1);
    }
    return buf;
}

int ftype_id_of_type(enum ggml_type type) {
    switch (type) {
    case GGML_TYPE_Q3_K:
        return FT_Q3_K_S; // the _S types are the nearest to "all of one type"
    case GGML_TYPE_Q4_K:
        return FT_Q4_K_S;
    case GGML_TYPE_Q5_K:
        return FT_Q5_K_S;
    default:
        break;
    }
    for (size_t i = 0; i < N_FTYPES; i++)
        if (ftypes[i].base == type)
            return ftypes[i].id; // Q2_K, Q6_K, the legacy and float types
    return -1;
}

static bool ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

enum ftype_role ftype_role_of(const char *name, uint32_t n_dims) {
    // llama.cpp quantizes 2-D (and expert 3-D) tensors whose names end in
    // "weight", except norms and the MoE router.
    if (n_dims < 2 || n_dims > 3 || !ends_with(name, "weight") || strstr(name, "_norm.weight") ||
        strstr(name, "ffn_gate_inp.weight"))
        return FTYPE_ROLE_KEEP;
    if (!strcmp(name, "output.weight"))
        return FTYPE_ROLE_OUTPUT;
    if (!strcmp(name, "token_embd.weight"))
        return FTYPE_ROLE_TOKEN_EMBD;
    if (strstr(name, "attn_qkv.weight") || strstr(name, "attn_v.weight"))
        return FTYPE_ROLE_ATTN_V;
    if (strstr(name, "attn_k.weight"))
        return FTYPE_ROLE_ATTN_K;
    if (strstr(name, "attn_output.weight"))
        return FTYPE_ROLE_ATTN_O;
    if (strstr(name, "ffn_down"))
        return FTYPE_ROLE_FFN_DOWN;
    return FTYPE_ROLE_OTHER;
}

// llama.cpp's choice of layers that get more bits in the _M mixes: the first
// and last eighth, and every third layer between.
static bool use_more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static int n_gqa(const struct ftype_model *m) {
    return m->n_head > 0 && m->n_head_kv > 0 ? m->n_head / m->n_head_kv : 1;
}

// llama.cpp's LLM_TYPE_70B, as its loaders set it: llama with 80 layers and
// grouped KV heads (without, it is LLaMA-1 65B), qwen2, deci and olmo with
// 80 layers, jais2 with 68.
static bool is_70b(const struct ftype_model *m) {
    const char *a = m->arch ? m->arch : "";
    if (!strcmp(a, "llama"))
        return m->n_layer == 80 && n_gqa(m) > 1;
    if (!strcmp(a, "qwen2") || !strcmp(a, "deci") || !strcmp(a, "olmo"))
        return m->n_layer == 80;
    return !strcmp(a, "jais2") && m->n_layer == 68;
}

static enum ggml_type rule_attn_v(int ft, const struct ftype_model *m, int i, enum ggml_type t) {
    const int n = m->n_attn_v;
    if (ft == FT_Q2_K)
        t = n_gqa(m) >= 4 ? GGML_TYPE_Q4_K : GGML_TYPE_Q3_K;
    else if (ft == FT_Q3_K_M)
        t = i < 2 ? GGML_TYPE_Q5_K : GGML_TYPE_Q4_K;
    else if (ft == FT_Q3_K_L)
        t = GGML_TYPE_Q5_K;
    else if ((ft == FT_IQ4_NL || ft == FT_IQ4_XS) && n_gqa(m) >= 4)
        t = GGML_TYPE_Q5_K;
    else if ((ft == FT_Q4_K_M || ft == FT_Q5_K_M) && use_more_bits(i, n))
        t = GGML_TYPE_Q6_K;
    else if (ft == FT_Q4_K_S && i < 4)
        t = GGML_TYPE_Q5_K;
    // 70B models share each V matrix among 8 heads: it is 8x smaller than
    // Q's, so more bits cost little.
    if (is_70b(m) && (t == GGML_TYPE_Q3_K || t == GGML_TYPE_Q4_K))
        t = GGML_TYPE_Q5_K;
    // 8-expert models (Mixtral): "bumping this to Q8_0 trades just ~128MB"
    if (m->n_expert == 8)
        t = GGML_TYPE_Q8_0;
    return t;
}

static enum ggml_type rule_ffn_down(int ft, const struct ftype_model *m, int i, enum ggml_type t) {
    const int n = m->n_layer;
    switch (ft) {
    case FT_Q2_K:
        return GGML_TYPE_Q3_K;
    case FT_Q3_K_M:
        return i < n / 16 ? GGML_TYPE_Q5_K : GGML_TYPE_Q4_K;
    case FT_Q3_K_L:
        return GGML_TYPE_Q5_K;
    case FT_Q4_K_M:
    case FT_Q5_K_M:
        return use_more_bits(i, n) ? GGML_TYPE_Q6_K : t;
    case FT_Q4_K_S:
    case FT_IQ4_NL: // (llama.cpp: when no importance matrix is given)
    case FT_IQ4_XS:
        return i < n / 8 ? GGML_TYPE_Q5_K : t;
    default:
        return t;
    }
}

static enum ggml_type rule_attn_o(int ft, const struct ftype_model *m, enum ggml_type t) {
    if (m->n_expert == 8) {
        switch (ft) {
        case FT_Q2_K:
        case FT_Q3_K_S:
        case FT_Q3_K_M:
        case FT_IQ4_NL:
        case FT_Q4_K_S:
        case FT_Q4_K_M:
        case FT_IQ4_XS:
            return GGML_TYPE_Q5_K;
        default:
            return t;
        }
    }
    switch (ft) {
    case FT_Q2_K:
        return GGML_TYPE_Q3_K;
    case FT_Q3_K_M:
        return GGML_TYPE_Q4_K;
    case FT_Q3_K_L:
        return GGML_TYPE_Q5_K;
    default:
        return t;
    }
}

enum ggml_type ftype_rule(const struct ftype_info *ft, const struct ftype_model *m,
                          enum ftype_role role, int i, int64_t ne0, int64_t ne2) {
    const enum ggml_type base = ft->base;
    if (!ggml_type_get(base)->quantized)
        return base; // F32/F16/BF16 files have no rules
    if (role == FTYPE_ROLE_OUTPUT || (role == FTYPE_ROLE_TOKEN_EMBD && m->tied)) {
        // The head: Q6_K (Q8_0 stays Q8_0), or Q8_0 when the base type's
        // blocks do not fit its rows or the file is MXFP4_MOE.
        if (ne0 % ggml_type_get(base)->block_size != 0 || ft->id == FT_MXFP4_MOE)
            return GGML_TYPE_Q8_0;
        return base == GGML_TYPE_Q8_0 ? base : GGML_TYPE_Q6_K;
    }
    // MXFP4_MOE: expert stacks (more than one matrix) in MXFP4, every other
    // matrix, the untied token_embd too, in Q8_0.
    if (ft->id == FT_MXFP4_MOE)
        return ne2 > 1 ? GGML_TYPE_MXFP4 : GGML_TYPE_Q8_0;
    switch (role) {
    case FTYPE_ROLE_ATTN_V:
        return rule_attn_v(ft->id, m, i, base);
    case FTYPE_ROLE_FFN_DOWN:
        return rule_ffn_down(ft->id, m, i, base);
    case FTYPE_ROLE_ATTN_K:
        return m->n_expert == 8 ? GGML_TYPE_Q8_0 : base;
    case FTYPE_ROLE_ATTN_O:
        return rule_attn_o(ft->id, m, base);
    default:
        return base;
    }
}

// The layer an ffn_down tensor is to the rules: the count of those seen so
// far, or with experts (llama.cpp's layer_info) the one its name says (a
// layer has several: ffn_down_exps and ffn_down_shexp). A name without one
// counts as the next.
static int ffn_down_layer(struct ftype_plan *p, const char *name) {
    int il = 0;
    if (p->m.n_expert > 1 && sscanf(name, "blk.%d.", &il) == 1 && il >= 0) {
        p->i_ffn_down++;
        return il;
    }
    return p->i_ffn_down++;
}

enum ggml_type ftype_tensor_type(struct ftype_plan *p, const char *name, uint32_t n_dims,
                                 int64_t ne0, int64_t ne2, enum ggml_type cur, bool *fell_back) {
    const enum ftype_role role = ftype_role_of(name, n_dims);
    if (fell_back)
        *fell_back = false;
    if (role == FTYPE_ROLE_KEEP)
        return cur;
    enum ggml_type t;
    if (role == FTYPE_ROLE_TOKEN_EMBD && p->type_embd >= 0) {
        t = (enum ggml_type)p->type_embd; // overrides win over the rules
    } else if (role == FTYPE_ROLE_OUTPUT && p->type_output >= 0) {
        t = (enum ggml_type)p->type_output;
    } else {
        int i = 0;
        if (role == FTYPE_ROLE_ATTN_V)
            i = p->i_attn_v++;
        else if (role == FTYPE_ROLE_FFN_DOWN)
            i = ffn_down_layer(p, name);
        // bailingmoe3's other 3-D tensors (its MLA projections) are no
        // experts to MXFP4_MOE (llama.cpp's is_bailingmoe3_expert).
        if (p->m.arch && !strcmp(p->m.arch, "bailingmoe3") && !strstr(name, "ffn_up") &&
            !strstr(name, "ffn_gate") && !strstr(name, "ffn_down"))
            ne2 = 1;
        t = p->pure ? p->ft->base : ftype_rule(p->ft, &p->m, role, i, ne0, ne2);
    }
    const enum ggml_type f = ftype_fallback(t, ne0);
    if (fell_back)
        *fell_back = f != t;
    return f;
}

enum ggml_type ftype_fallback(enum ggml_type t, int64_t ne0) {
    const struct ggml_type_info *ti = ggml_type_get(t);
    if (!ti->quantized || ne0 % ti->block_size == 0)
        return t;
    enum ggml_type f;
    switch (t) {
    case GGML_TYPE_Q2_K:
    case GGML_TYPE_Q3_K:
        f = GGML_TYPE_Q4_0;
        break;
    case GGML_TYPE_Q4_K:
        f = GGML_TYPE_Q5_0;
        break;
    case GGML_TYPE_Q5_K:
        f = GGML_TYPE_Q5_1;
        break;
    case GGML_TYPE_Q6_K:
        f = GGML_TYPE_Q8_0;
        break;
    case GGML_TYPE_IQ4_XS:
        f = GGML_TYPE_IQ4_NL;
        break;
    default:
        f = GGML_TYPE_F16;
        break;
    }
    if (f != GGML_TYPE_F16 && (ne0 % ggml_type_get(f)->block_size != 0 || !quant_can_quantize(f)))
        f = GGML_TYPE_F16;
    return f;
}
