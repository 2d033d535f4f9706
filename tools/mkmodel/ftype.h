// llama.cpp's file types (llama_ftype: "Q4_K_M", written as
// general.file_type) and the type llama-quantize gives each tensor of a
// model for one of them.
//
// A file type is a base weight type plus rules ("mixes"): the output head
// gets Q6_K, and for the K-quant _S/_M/_L types the attention V and FFN down
// matrices of some layers (and attn_output for Q2_K/Q3_K_M/Q3_K_L) get more
// bits. ftype_tensor_type() is that choice, written from llama.cpp's
// llama_tensor_get_type for the non-Falcon models vela runs, experts
// included (3-D _exps stacks are quantized as matrices; the 8-expert rules
// of Mixtral): the same tensor names in the same order give the same types.
//
// Used by `vela quantize` (real files) and `vela mkmodel --mix` (synthetic
// ones), so that both agree with llama-quantize and with each other.
#ifndef VELA_TOOLS_FTYPE_H
#define VELA_TOOLS_FTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/types.h"

struct ftype_info {
    const char *name;    // llama-quantize's name, e.g. "Q4_K_M"
    int id;              // LLAMA_FTYPE_* (general.file_type)
    enum ggml_type base; // the type of every matrix no rule moves
    const char *desc;    // llama.cpp's llama_model_ftype_name, e.g. "Q4_K - Medium"
};

// By llama-quantize's name (case-insensitive; "Q3_K", "Q4_K", "Q5_K" are its
// aliases of the _M types) or its number ("15"); NULL when unknown.
const struct ftype_info *ftype_find(const char *name);
// By LLAMA_FTYPE id; NULL when not in the table.
const struct ftype_info *ftype_by_id(int id);
// The names ftype_find takes, for messages: "F32, F16, ..., Q6_K" (truncated
// to cap); returns buf.
const char *ftype_names(char *buf, size_t cap);

// llama.cpp's LLAMA_FTYPE id for a file whose matrices are all `type`
// (2 for Q4_0, 14 for Q4_K: Q4_K_S is the nearest), or -1 (no such id).
int ftype_id_of_type(enum ggml_type type);

// What a tensor is to the rules, from its name (llama.cpp matches names,
// not architectures: "blk.3.attn_v.weight" is FTYPE_ROLE_ATTN_V in any
// model).
enum ftype_role {
    FTYPE_ROLE_OTHER = 0, // a matrix no rule names: the base type
    FTYPE_ROLE_TOKEN_EMBD,
    FTYPE_ROLE_OUTPUT,
    FTYPE_ROLE_ATTN_V, // attn_v, and the fused attn_qkv
    FTYPE_ROLE_ATTN_K, // attn_k (a rule of 8-expert models only)
    FTYPE_ROLE_ATTN_O,
    FTYPE_ROLE_FFN_DOWN, // ffn_down, and the experts' ffn_down_exps / ffn_down_shexp
    FTYPE_ROLE_KEEP,     // not quantized at all: norms, vectors, expert routers
};
// n_dims is the tensor's; anything but a 2-D or 3-D (expert stack)
// "*weight" is FTYPE_ROLE_KEEP, and so are the routers (ffn_gate_inp).
enum ftype_role ftype_role_of(const char *name, uint32_t n_dims);

// The model as the rules see it.
struct ftype_model {
    const char *arch;      // general.architecture (NULL: unknown), for the 70B rule
    int n_layer;           // {arch}.block_count: the count of ffn_down rules
    int n_attn_v;          // attn_v/attn_qkv tensors in the file (usually n_layer)
    int n_head, n_head_kv; // for n_gqa = n_head / n_head_kv (0: unknown, taken as 1)
    bool tied;             // no output.weight: token_embd is the head too
    int n_expert;          // {arch}.expert_count (0: dense); with > 1, an ffn_down's layer
                           // is the one its name says (llama.cpp's layer_info)
};

// Running state over a model's tensors, visited in file order.
struct ftype_plan {
    const struct ftype_info *ft;
    struct ftype_model m;
    bool pure;                  // llama-quantize --pure: no rules, every matrix `base`
    int type_embd, type_output; // overrides (--token-embedding-type, ...), or -1
    int i_attn_v, i_ffn_down;   // counts of those seen so far
};

// The type tensor `name` (n_dims, rows of ne0 elements, ne2 matrices: its
// third dimension, 1 for a plain matrix; now in `cur`) is written in;
// advances p's counters. A kept tensor returns `cur`; a matrix
// whose rows do not fit the chosen type's blocks gets ftype_fallback's type
// and *fell_back (when not NULL) is set true, else false.
enum ggml_type ftype_tensor_type(struct ftype_plan *p, const char *name, uint32_t n_dims,
                                 int64_t ne0, int64_t ne2, enum ggml_type cur, bool *fell_back);

// The rule alone for the tensor in `role`, the i-th of n of its kind (layer
// i of n for FTYPE_ROLE_FFN_DOWN, the i-th attn_v of n_attn_v), before the
// block-size fallback; ne2 as ftype_tensor_type's (MXFP4_MOE's experts).
enum ggml_type ftype_rule(const struct ftype_info *ft, const struct ftype_model *m,
                          enum ftype_role role, int i, int64_t ne0, int64_t ne2);

// The type a matrix of rows of ne0 elements gets when `t` cannot hold them
// (ne0 not a multiple of its block size), llama.cpp's choice: Q2_K/Q3_K ->
// Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL, else F16
// (also when the fallback cannot hold them either or vela has no quantizer
// for it); `t` itself when it fits.
enum ggml_type ftype_fallback(enum ggml_type t, int64_t ne0);

#endif
