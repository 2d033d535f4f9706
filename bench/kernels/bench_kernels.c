// vela-bench-kernels: times the production CUDA kernels, called through the
// backend op table (struct backend_ops of the CUDA backend: the same entry
// points the forward pass uses, linked from libvela_cuda, never copied), on
// the layer shapes of Llama-2-7B, Llama-3-8B and Llama-3-70B.
//
// Method: each case runs --warmup times untimed, then -r times, each rep
// timed with CUDA events on the backend's stream around one op call; before
// every call (warm-up and timed) a buffer twice the size of L2 is written
// with cudaMemsetAsync so the op's inputs come from device memory, not L2.
// Reported: mean / min / stddev time, and from the mean the achieved GB/s
// (the bytes the op must move at least: every input read once, every output
// written once), TFLOP/s, and the fraction of the device's peak bandwidth.
//
// Families (--filter matches their names):
//   matvec        matmul op with n_tok <= 8 (the mat-vec kernels), per weight type
//   matmul        matmul op with n_tok = --prefill-tokens (the GEMM path), per type
//   matmul_tc     matmul op with n_tok 16, 64, 128 per quantized type, twice: the
//                 fused tensor-core kernel (matmul_tc.cu) and dequant + cuBLAS
//                 (cuda_matmul_tc_set_max_tok), to find the crossover
//   cublas_f16    plain cublasGemmEx, F16 x F16 -> F32, same shapes (the reference)
//   attn_prefill  attention: the last --prefill-tokens queries of a context of C
//   attn_decode   attention: one query at the end of a context of C
//   attn_se_prefill, attn_se_decode: the same with K cached unrotated and exact
//                 self-extend (G 4, W 1024: host/ops/selfextend.h) inside the
//                 kernel; same bytes as attn_*, the GB/s and TFLOP/s columns
//                 count the ordinary work (the rotations are the extra cost)
//   attn_se_mixed G and W per token (attn_args.q_se): 8 and --prefill-tokens
//                 queries, q_se uniform (G 4) and with G 2, 3, 4, 8 in turn
//                 (every block mixes four G): what mixing costs
//   rope          rope op on Q;  rope_kv_store: fused rope + K/V store into an F16 cache
//   kv_shift      kv_shift op over all layers of a cache of C cells
//   rms_norm, argmax
//   moe_route     moe_route op (softmax + top-k + renorm) at the router's shape
//   moe_ffn       moe_ffn op: every token through its k experts (expert
//                 mat-vecs for --matvec-tok tokens, q8 and f32 activations;
//                 the grouped GEMM at --prefill-tokens); only the mixture-of-
//                 experts shapes (--models qwen3-30b-a3b), which run nothing else
//
// Without a CUDA device the program says so and exits 0 (CI runs it).
//
// Built against the CUDA emulator (tests/emu, VELA_EMU: vela-bench-kernels-emu)
// nothing is timed: each case runs once, without the L2 flush, with its
// launches labelled in the emulator's traffic records (emu_traffic_case: the
// family, model, shape, type and the op's minimum bytes), which
// bench/kernels/emu_report.py folds into bench/results/kernels-emulated.json.
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "cuda/attention.h"
#include "cuda/backend_cuda.h"
#include "cuda/matmul_tc.h"
#include "cuda/matvec.h"
#include "cuda/matvec_q8.h"
#include "gguf/quant.h"
#include "gguf/quant_q8.h"
#include "gguf/types.h"
#include "host/ops/backend.h"

#ifdef VELA_EMU
#include "vela_emu.h" // tests/emu/include: emu_traffic_case
#endif

#include "vela_commit.h" // generated at build time (cmake/vela_commit.cmake)

// --- model shapes --------------------------------------------------------------

struct shape_model {
    const char *name;
    int n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_layer;
    float rope_base;
    int n_expert, k_expert; // mixture of experts (n_ff: one expert's), 0 for dense
};

static const struct shape_model shape_models[] = {
    {"llama2-7b", 4096, 32, 32, 128, 11008, 32000, 32, 10000.0f, 0, 0},
    {"llama3-8b", 4096, 32, 8, 128, 14336, 128256, 32, 500000.0f, 0, 0},
    {"llama3-70b", 8192, 64, 8, 128, 28672, 128256, 80, 500000.0f, 0, 0},
    // Not a model: Llama-3's head size and grouping (GQA 8) at a width small
    // enough for the emulated CI gate (tests/emu, emu_traffic_gate); only
    // when named with --models.
    {"ci-small", 1024, 8, 1, 128, 2816, 8192, 2, 500000.0f, 0, 0},
    // Qwen3-30B-A3B's experts (only the moe_* families; when named).
    {"qwen3-30b-a3b", 2048, 32, 4, 128, 768, 151936, 48, 1000000.0f, 128, 8},
};
#define N_DEFAULT_MODELS 3
#define N_SHAPE_MODELS (int)(sizeof shape_models / sizeof shape_models[0])

// The weight types the CUDA backend takes.
static const enum ggml_type all_types[] = {
    GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q8_0,   GGML_TYPE_Q4_0,
    GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q2_K,   GGML_TYPE_Q3_K,
    GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS,
};
#define N_ALL_TYPES (int)(sizeof all_types / sizeof all_types[0])

#define MAX_LIST 16

struct options {
    const char *json_path;
    const char *filter; // substring of the family name, or NULL
    bool model_on[N_SHAPE_MODELS];
    enum ggml_type types[MAX_LIST];
    int n_types;
    int ctxs[MAX_LIST];
    int n_ctxs;
    int tc_tok[MAX_LIST]; // matmul_tc token counts
    int n_tc_tok;
    int matvec_tok[MAX_LIST];
    int n_matvec_tok;
    int prefill_tok;
    int reps, warmup, device;
    bool act[2];     // mat-vec activations to time: [0] f32, [1] q8 (backend.act_q8)
    bool tc_path[2]; // matmul_tc paths: [0] fused, [1] dequant + cuBLAS
    // The kernel variants under test (cuda/backend_cuda.h), as given
    // (--attn-kernel dec|splitk, --attn-split BxC, --matvec-q8 pass|pipe[:B]|stream[:B],
    // --matvec-f16 pass|stream[:B]) and parsed; attn_split names both: "dec",
    // "4x64", "splitk", "splitk:4x64".
    char attn_split[48], matvec_q8[32], matvec_f16[32];
    int split_blocks_per_sm, split_min_cells; // 0, 0: the default plan
    int attn_decode;                          // CUDA_ATTN_DECODE_*; 0: the default
    int mvq_kernel, mvq_blocks_per_sm;        // enum cuda_mvq_kernel; 0: its default
    int mvf_kernel, mvf_blocks_per_sm;        // enum cuda_mv_kernel; 0: its default
};

// --- context --------------------------------------------------------------------

struct bench {
    struct options opt;
    struct backend *be;
    cudaStream_t stream;
    cudaEvent_t ev0, ev1;
    cublasHandle_t cublas;
    void *flush;
    size_t flush_bytes;
    struct backend_device_info dev;
    cJSON *results;
    int n_failed;
    char err[1200];
};

#define CUDA_OK(b, stmt)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (stmt);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            snprintf((b)->err, sizeof(b)->err, "%s: %s (%s:%d)", #stmt, cudaGetErrorString(e_),    \
                     __FILE__, __LINE__);                                                          \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

// A backend op's status: its message goes to b->err.
static int op_rc(struct bench *b, int rc) {
    if (rc)
        snprintf(b->err, sizeof b->err, "%s", b->be->err.msg);
    return rc;
}

static int dev_alloc(struct bench *b, size_t bytes, void **out) {
    *out = NULL;
    return op_rc(b, b->be->ops->alloc(b->be, bytes, out));
}

static void dev_free(struct bench *b, void *p) {
    if (p)
        b->be->ops->free(b->be, p);
}

static uint64_t rng_state = 0x853c49e6748fea9bull;
static float rnd_uniform(void) { // [-1, 1)
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t r = rng_state * 2685821657736338717ull;
    return (float)((double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

// Fills dev (n_rows rows of row_len elements of `type`) with values in
// [-scale, scale): up to 16 distinct rows made on the host, tiled on the
// device. The values do not change the timing; L2 is flushed anyway.
static int fill_rows(struct bench *b, void *dev, enum ggml_type type, int64_t row_len,
                     int64_t n_rows, float scale) {
    const size_t rb = ggml_row_bytes(type, row_len);
    if (rb == 0) {
        snprintf(b->err, sizeof b->err, "%s: row of %lld is not whole blocks", ggml_type_name(type),
                 (long long)row_len);
        return -1;
    }
    const int64_t hr = n_rows < 16 ? n_rows : 16;
    float *src = malloc((size_t)row_len * sizeof *src);
    uint8_t *buf = malloc(rb * (size_t)hr);
    int rc = 0;
    if (!src || !buf) {
        snprintf(b->err, sizeof b->err, "out of host memory");
        rc = -1;
    }
    struct verr ve = {0};
    for (int64_t r = 0; !rc && r < hr; r++) {
        for (int64_t i = 0; i < row_len; i++)
            src[i] = scale * rnd_uniform();
        if (quant_quantize_row(type, src, buf + (size_t)r * rb, row_len, &ve)) {
            snprintf(b->err, sizeof b->err, "quantize %s: %s", ggml_type_name(type), ve.msg);
            rc = -1;
        }
    }
    if (!rc)
        rc = op_rc(b, b->be->ops->upload(b->be, dev, buf, rb * (size_t)hr));
    free(src);
    free(buf);
    if (rc)
        return rc;
#ifdef VELA_EMU
    // Emulated with VELA_EMU_SAMPLE_BLOCKS (initcheck off, few blocks run):
    // past 64 MiB the rest keeps the emulator's fill bytes (0xa5: finite
    // f16 / scales) instead of being tiled, which would touch every byte and
    // its shadow; the values steer no load or store of the kernels measured.
    const char *sample = getenv("VELA_EMU_SAMPLE_BLOCKS");
    if (sample && atoi(sample) >= 2 && rb * (size_t)n_rows > ((size_t)64 << 20))
        n_rows = hr;
#endif
    for (int64_t done = hr; done < n_rows;) {
        const int64_t n = done < n_rows - done ? done : n_rows - done;
        CUDA_OK(b, cudaMemcpyAsync((uint8_t *)dev + (size_t)done * rb, dev, (size_t)n * rb,
                                   cudaMemcpyDeviceToDevice, b->stream));
        done += n;
    }
    CUDA_OK(b, cudaStreamSynchronize(b->stream));
    return 0;
}

static int alloc_fill(struct bench *b, void **out, enum ggml_type type, int64_t row_len,
                      int64_t n_rows, float scale) {
    int rc = dev_alloc(b, ggml_row_bytes(type, row_len) * (size_t)n_rows, out);
    if (!rc)
        rc = fill_rows(b, *out, type, row_len, n_rows, scale);
    return rc;
}

static int alloc_i32(struct bench *b, int32_t **out, const int32_t *host, int64_t n) {
    int rc = dev_alloc(b, (size_t)n * sizeof(int32_t), (void **)out);
    if (!rc)
        rc = op_rc(b, b->be->ops->upload(b->be, *out, host, (size_t)n * sizeof(int32_t)));
    if (!rc)
        rc = op_rc(b, b->be->ops->sync(b->be));
    return rc;
}

// --- cases ------------------------------------------------------------------------

enum family {
    FAM_MATVEC,
    FAM_MATMUL,
    FAM_MATVEC_QKV,
    FAM_MATVEC_SWIGLU,
    FAM_MATVEC_ADD,
    FAM_CUBLAS,
    FAM_ATTN_PREFILL,
    FAM_ATTN_DECODE,
    FAM_ROPE,
    FAM_ROPE_KV_STORE,
    FAM_KV_SHIFT,
    FAM_RMS_NORM,
    FAM_ARGMAX,
    FAM_MATMUL_TC,
    FAM_ATTN_SE_PREFILL,
    FAM_ATTN_SE_DECODE,
    FAM_SAMPLE,
    FAM_ATTN_SE_MIXED,
    FAM_MOE_ROUTE,
    FAM_MOE_FFN,
};

static const char *family_name[] = {
    "matvec",         "matmul",       "matvec_qkv",    "matvec_swiglu", "matvec_add",
    "cublas_f16",     "attn_prefill", "attn_decode",   "rope",          "rope_kv_store",
    "kv_shift",       "rms_norm",     "argmax",        "matmul_tc",     "attn_se_prefill",
    "attn_se_decode", "sample",       "attn_se_mixed", "moe_route",     "moe_ffn"};

enum { ACT_NA = 0, ACT_Q8 = 1, ACT_F32 = 2, ACT_SKIP = -1 };

// One op call with everything it needs; fields are used per family.
struct kcase {
    enum family fam;
    const struct shape_model *sm;
    char shape[64];      // "4096x11008", "ctx 4096", ...
    enum ggml_type type; // weight / cache type
    int act;             // mat-vec families: ACT_Q8 or ACT_F32 (backend.act_q8); else ACT_NA
    int fused;           // matmul_tc: 1 the fused kernel, 0 dequant + cuBLAS
    int n_tok;
    int n_ctx;
    double bytes, flops;

    struct backend_weight w;
    float *x, *out; // matmul, rms_norm (x), argmax (x = logits)
    // fused mat-vecs: K and V (qkv) or up (swiglu) beside w; out2/out3 theirs
    struct backend_weight w2, w3;
    float *out2, *out3;
    struct sample_params sp; // sample: every row the same (host memory)
    void *x16;               // cublas: f16 activations
    struct attn_args a;
    struct rope_params rp;
    int32_t *pos, *cells, *delta, *amax;
    float *k, *v, *norm_w;
    void *k_cache, *v_cache;
    struct moe_args moe; // moe_ffn (its weights: w, w2, w3; ids in amax, weights in norm_w)
};

static int run_case(struct bench *b, const struct kcase *k) {
    struct backend *be = b->be;
    be->act_q8 = k->act == ACT_Q8;
    switch (k->fam) {
    case FAM_MATVEC:
    case FAM_MATMUL:
        return op_rc(b, be->ops->matmul(be, k->out, &k->w, k->x, NULL, k->n_tok));
    case FAM_MATMUL_TC: {
        cuda_matmul_tc_set_max_tok(k->fused ? INT32_MAX : 0);
        const int rc = op_rc(b, be->ops->matmul(be, k->out, &k->w, k->x, NULL, k->n_tok));
        cuda_matmul_tc_set_max_tok(-1);
        return rc;
    }
    case FAM_MATVEC_QKV: {
        const struct backend_mm mm[3] = {
            {k->out, &k->w, NULL}, {k->out2, &k->w2, NULL}, {k->out3, &k->w3, NULL}};
        return op_rc(b, be->ops->matmul_multi(be, mm, 3, k->x, k->n_tok));
    }
    case FAM_MATVEC_SWIGLU:
        return op_rc(b, be->ops->matmul_swiglu(be, k->out, k->out2, &k->w, &k->w2, k->x, k->n_tok));
    case FAM_MATVEC_ADD:
        return op_rc(b, be->ops->matmul_add(be, k->out, &k->w, k->x, k->n_tok));
    case FAM_CUBLAS: {
        // out[t][o] = sum_i W[o][i] x[t][i]: column-major out (n_out x n_tok) = W^T x
        const float alpha = 1.0f, beta = 0.0f;
        cublasStatus_t s = cublasGemmEx(
            b->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)k->w.n_out, k->n_tok, (int)k->w.n_in, &alpha,
            k->w.data, CUDA_R_16F, (int)k->w.n_in, k->x16, CUDA_R_16F, (int)k->w.n_in, &beta,
            k->out, CUDA_R_32F, (int)k->w.n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS) {
            snprintf(b->err, sizeof b->err, "cublasGemmEx: %s", cublasGetStatusString(s));
            return -1;
        }
        return 0;
    }
    case FAM_ATTN_PREFILL:
    case FAM_ATTN_DECODE:
    case FAM_ATTN_SE_PREFILL:
    case FAM_ATTN_SE_DECODE:
    case FAM_ATTN_SE_MIXED:
        return op_rc(b, be->ops->attention(be, &k->a));
    case FAM_ROPE:
        return op_rc(
            b, be->ops->rope(be, k->x, k->pos, k->n_tok, k->sm->n_head, k->sm->head_dim, &k->rp));
    case FAM_ROPE_KV_STORE:
        return op_rc(b, be->ops->rope_kv_store(be, k->x, k->sm->n_head, k->k, k->v, k->k_cache,
                                               GGML_TYPE_F16, k->v_cache, GGML_TYPE_F16, k->pos,
                                               k->cells, k->n_tok, k->sm->n_head_kv,
                                               k->sm->head_dim, k->sm->head_dim, &k->rp));
    case FAM_KV_SHIFT:
        return op_rc(b, be->ops->kv_shift(be, k->k_cache, GGML_TYPE_F16, k->delta, k->sm->n_layer,
                                          k->n_ctx, k->sm->n_head_kv, k->sm->head_dim, &k->rp, 0));
    case FAM_RMS_NORM:
        return op_rc(
            b, be->ops->rms_norm(be, k->out, k->x, k->norm_w, k->n_tok, k->sm->n_embd, 1e-5f));
    case FAM_ARGMAX:
        return op_rc(b, be->ops->argmax(be, k->amax, k->x, k->n_tok, k->sm->n_vocab));
    case FAM_MOE_ROUTE:
        return op_rc(b, be->ops->moe_route(be, k->amax, k->out, k->x, k->n_tok, k->sm->n_expert,
                                           k->sm->k_expert, MOE_GATING_SOFTMAX_RENORM));
    case FAM_MOE_FFN:
        return op_rc(b, be->ops->moe_ffn(be, &k->moe));
    case FAM_SAMPLE: {
        struct sample_params sp[64];
        for (int r = 0; r < k->n_tok && r < 64; r++)
            sp[r] = k->sp;
        return op_rc(b, be->ops->sample(be, k->amax, k->x, k->n_tok, k->sm->n_vocab, sp));
    }
    }
    return -1;
}

static void kcase_free(struct bench *b, struct kcase *k) {
    void *p[] = {(void *)k->w.data,
                 (void *)k->w2.data,
                 (void *)k->w3.data,
                 k->out2,
                 k->out3,
                 k->x,
                 k->out,
                 k->x16,
                 k->pos,
                 k->cells,
                 k->delta,
                 k->amax,
                 k->k,
                 k->v,
                 k->norm_w,
                 k->k_cache,
                 k->v_cache,
                 (void *)k->a.q,
                 (void *)k->a.cell_pos,
                 (void *)k->a.cell_seq,
                 (void *)k->a.q_pos,
                 (void *)k->a.q_seq,
                 k->moe.tmp};
    // attention reuses out / k_cache / v_cache through k->a: free each pointer once
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
        if (!p[i])
            continue;
        bool seen = false;
        for (size_t j = 0; j < i; j++)
            seen |= p[j] == p[i];
        if (!seen)
            dev_free(b, p[i]);
    }
    memset(k, 0, sizeof *k);
}

static int flush_l2(struct bench *b, int salt) {
    CUDA_OK(b, cudaMemsetAsync(b->flush, salt & 0xff, b->flush_bytes, b->stream));
    return 0;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, c = *(const double *)y;
    return (a > c) - (a < c);
}

#ifdef VELA_EMU
// The case as the JSON object that labels its launches in the emulator's
// traffic records (bench/kernels/emu_report.py reads it back).
static void emu_label(const struct kcase *k) {
    char buf[512];
    snprintf(buf, sizeof buf,
             "{\"family\": \"%s\", \"model\": \"%s\", \"shape\": \"%s\", \"type\": \"%s\", "
             "\"act\": \"%s\", \"path\": \"%s\", \"n_tok\": %d, \"n_ctx\": %d, "
             "\"bytes_necessary\": %.0f}",
             family_name[k->fam], k->sm->name, k->shape, ggml_type_name(k->type),
             k->act == ACT_Q8    ? "q8"
             : k->act == ACT_F32 ? "f32"
                                 : "",
             k->fam != FAM_MATMUL_TC ? ""
             : k->fused              ? "fused"
                                     : "dequant+cublas",
             k->n_tok, k->n_ctx, k->bytes);
    emu_traffic_case(buf);
}
#endif

// Times k and records the result (or the failure) in b->results.
static void time_case(struct bench *b, struct kcase *k, int setup_rc) {
    const int reps = b->opt.reps;
    double *ms = calloc((size_t)reps, sizeof *ms);
    int rc = setup_rc;
    if (!rc && !ms) {
        snprintf(b->err, sizeof b->err, "out of host memory");
        rc = -1;
    }
    for (int i = 0; !rc && i < b->opt.warmup; i++) {
        rc = b->flush ? flush_l2(b, i) : 0;
        if (!rc)
            rc = run_case(b, k);
    }
#ifdef VELA_EMU
    if (!rc)
        emu_label(k);
#endif
    for (int i = 0; !rc && i < reps; i++) {
        float t = 0;
        if (b->flush && (rc = flush_l2(b, i + 1)))
            break;
        cudaError_t e = cudaEventRecord(b->ev0, b->stream);
        if (e == cudaSuccess && (rc = run_case(b, k)) != 0)
            break;
        if (e == cudaSuccess)
            e = cudaEventRecord(b->ev1, b->stream);
        if (e == cudaSuccess)
            e = cudaEventSynchronize(b->ev1);
        if (e == cudaSuccess)
            e = cudaEventElapsedTime(&t, b->ev0, b->ev1);
        if (e != cudaSuccess) {
            snprintf(b->err, sizeof b->err, "timing: %s", cudaGetErrorString(e));
            rc = -1;
            break;
        }
        ms[i] = t;
    }
    if (!rc && b->be->ops->sync(b->be))
        rc = op_rc(b, -1);
#ifdef VELA_EMU
    emu_traffic_case(NULL);
#endif

    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kernel", family_name[k->fam]);
    cJSON_AddStringToObject(o, "model", k->sm->name);
    cJSON_AddStringToObject(o, "shape", k->shape);
    cJSON_AddStringToObject(o, "type", ggml_type_name(k->type));
    cJSON_AddNumberToObject(o, "n_tok", k->n_tok);
    if (k->act != ACT_NA)
        cJSON_AddStringToObject(o, "act", k->act == ACT_Q8 ? "q8" : "f32");
    if (k->fam == FAM_MATMUL_TC)
        cJSON_AddStringToObject(o, "path", k->fused ? "fused" : "dequant+cublas");
    cJSON_AddNumberToObject(o, "n_ctx", k->n_ctx);
    printf("| %-13s | %-10s | %-22s | %-5s | %5d | %6d |", family_name[k->fam], k->sm->name,
           k->shape, ggml_type_name(k->type), k->n_tok, k->n_ctx);
    if (rc) {
        // An op the backend does not take (yet) is a skip, anything else a failure.
        const bool unsupported = strstr(b->err, "not supported") || strstr(b->err, "unsupported") ||
                                 strstr(b->be->err.msg, "not supported");
        cJSON_AddStringToObject(o, unsupported ? "skipped" : "error", b->err);
        printf(" %s: %s\n", unsupported ? "skipped" : "FAILED", b->err);
        if (!unsupported)
            b->n_failed++;
    } else {
        double sum = 0, sq = 0;
        for (int i = 0; i < reps; i++)
            sum += ms[i];
        const double mean = sum / reps;
        for (int i = 0; i < reps; i++)
            sq += (ms[i] - mean) * (ms[i] - mean);
        const double sd = reps > 1 ? sqrt(sq / (reps - 1)) : 0;
        qsort(ms, (size_t)reps, sizeof *ms, cmp_double);
        const double gbs = k->bytes / (mean * 1e-3) / 1e9;
        const double tflops = k->flops / (mean * 1e-3) / 1e12;
        const double frac = b->dev.peak_bw_gbs > 0 ? gbs / b->dev.peak_bw_gbs : 0;
        cJSON_AddNumberToObject(o, "us_mean", mean * 1e3);
        cJSON_AddNumberToObject(o, "us_min", ms[0] * 1e3);
        cJSON_AddNumberToObject(o, "us_median", ms[reps / 2] * 1e3);
        cJSON_AddNumberToObject(o, "us_stddev", sd * 1e3);
        cJSON_AddNumberToObject(o, "bytes", k->bytes);
        cJSON_AddNumberToObject(o, "flops", k->flops);
        cJSON_AddNumberToObject(o, "gbs", gbs);
        cJSON_AddNumberToObject(o, "tflops", tflops);
        if (b->dev.peak_bw_gbs > 0)
            cJSON_AddNumberToObject(o, "bw_frac", frac);
        else
            cJSON_AddNullToObject(o, "bw_frac");
        printf(" %10.2f | %8.2f | %8.1f | %8.2f | %6.1f%% |\n", mean * 1e3, sd * 1e3, gbs, tflops,
               100.0 * frac);
    }
    fflush(stdout);
    cJSON_AddItemToArray(b->results, o);
    free(ms);
    // A fault inside a kernel poisons the context; clear what can be cleared.
    (void)cudaGetLastError();
    kcase_free(b, k);
}

// --filter is a comma list of family names, matched exactly.
static bool want_family(const struct bench *b, enum family f) {
    if (!b->opt.filter)
        return true;
    const size_t n = strlen(family_name[f]);
    for (const char *p = b->opt.filter; p;) {
        if (!strncmp(p, family_name[f], n) && (p[n] == ',' || p[n] == '\0'))
            return true;
        p = strchr(p, ',');
        if (p)
            p++;
    }
    return false;
}

static struct rope_params rope_of(const struct shape_model *sm) {
    struct rope_params rp = {
        .mode = ROPE_MODE_NORMAL,
        .n_rot = sm->head_dim,
        .n_ctx_orig = 8192,
        .freq_base = sm->rope_base,
        .freq_scale = 1.0f,
        .ext_factor = 0.0f,
        .attn_factor = 1.0f,
        .beta_fast = 32.0f,
        .beta_slow = 1.0f,
        .freq_factors = NULL,
    };
    return rp;
}

// --- families -----------------------------------------------------------------------

struct mat_shape {
    const char *what;
    int64_t n_in, n_out;
};

// The distinct weight shapes of one layer, and the output head.
static int layer_shapes(const struct shape_model *sm, struct mat_shape *out) {
    const int64_t q = (int64_t)sm->n_head * sm->head_dim,
                  kv = (int64_t)sm->n_head_kv * sm->head_dim;
    int n = 0;
    out[n++] = (struct mat_shape){"attn_q", sm->n_embd, q};
    if (kv != q)
        out[n++] = (struct mat_shape){"attn_k", sm->n_embd, kv};
    out[n++] = (struct mat_shape){"attn_output", q, sm->n_embd};
    out[n++] = (struct mat_shape){"ffn_up", sm->n_embd, sm->n_ff};
    out[n++] = (struct mat_shape){"ffn_down", sm->n_ff, sm->n_embd};
    out[n++] = (struct mat_shape){"output", sm->n_embd, sm->n_vocab};
    return n;
}

// The activation mode of pass `pass` (0, 1) of a case: for a mat-vec family
// with a quantized type, ACT_Q8 then ACT_F32 as --matvec-act asks; ACT_NA on
// pass 0 otherwise; ACT_SKIP: no case on this pass.
static int matvec_act_of(const struct bench *b, bool matvec, enum ggml_type type, int pass) {
    if (!matvec || !quant_q8_1_dot_supported(type))
        return pass == 0 ? ACT_NA : ACT_SKIP;
    if (pass == 0)
        return b->opt.act[1] ? ACT_Q8 : ACT_SKIP;
    return b->opt.act[0] ? ACT_F32 : ACT_SKIP;
}

static const char *act_tag(int act) {
    return act == ACT_Q8 ? " q8" : act == ACT_F32 ? " f32" : "";
}

static void bench_matmul(struct bench *b, const struct shape_model *sm, enum family fam) {
    struct mat_shape shapes[8];
    const int n_shapes = layer_shapes(sm, shapes);
    const int *toks = fam == FAM_MATVEC      ? b->opt.matvec_tok
                      : fam == FAM_MATMUL_TC ? b->opt.tc_tok
                                             : &b->opt.prefill_tok;
    const int n_toks = fam == FAM_MATVEC      ? b->opt.n_matvec_tok
                       : fam == FAM_MATMUL_TC ? b->opt.n_tc_tok
                                              : 1;
    const int n_types = fam == FAM_CUBLAS ? 1 : b->opt.n_types;
    for (int s = 0; s < n_shapes; s++)
        for (int ti = 0; ti < n_types; ti++)
            for (int nt = 0; nt < n_toks * 2; nt++) {
                const enum ggml_type type = fam == FAM_CUBLAS ? GGML_TYPE_F16 : b->opt.types[ti];
                // matmul_tc: pass 0 fused, pass 1 dequant + cuBLAS; the fused kernel's types only
                const bool tc = fam == FAM_MATMUL_TC;
                if (tc && !b->opt.tc_path[nt % 2])
                    continue;
                if (tc) {
                    cuda_matmul_tc_set_max_tok(INT32_MAX);
                    const bool takes = cuda_matmul_tc_takes(type, 1);
                    cuda_matmul_tc_set_max_tok(-1);
                    if (!takes)
                        continue;
                }
                const int act = tc ? ACT_NA : matvec_act_of(b, fam == FAM_MATVEC, type, nt % 2);
                if (act == ACT_SKIP)
                    continue;
                const struct mat_shape *ms = &shapes[s];
                struct kcase k = {.fam = fam,
                                  .sm = sm,
                                  .type = type,
                                  .act = act,
                                  .fused = tc && nt % 2 == 0,
                                  .n_tok = toks[nt / 2]};
                snprintf(k.shape, sizeof k.shape, "%s %lldx%lld%s%s", ms->what, (long long)ms->n_in,
                         (long long)ms->n_out, act_tag(act),
                         !tc       ? ""
                         : k.fused ? " fused"
                                   : " cublas");
                const double wbytes = (double)ggml_row_bytes(type, ms->n_in) * (double)ms->n_out;
                const double xsz = fam == FAM_CUBLAS ? 2.0 : 4.0;
                k.bytes = wbytes + (double)k.n_tok * ((double)ms->n_in * xsz + ms->n_out * 4.0);
                k.flops = 2.0 * (double)ms->n_in * (double)ms->n_out * k.n_tok;
                void *w = NULL;
                // scale 1/sqrt(n_in) keeps |out| ~ 1, as real weights do
                int rc =
                    alloc_fill(b, &w, type, ms->n_in, ms->n_out, 1.0f / sqrtf((float)ms->n_in));
                k.w = (struct backend_weight){w, type, ms->n_in, ms->n_out};
                if (!rc && fam == FAM_CUBLAS)
                    rc = alloc_fill(b, &k.x16, GGML_TYPE_F16, ms->n_in, k.n_tok, 1.0f);
                else if (!rc)
                    rc = alloc_fill(b, (void **)&k.x, GGML_TYPE_F32, ms->n_in, k.n_tok, 1.0f);
                if (!rc)
                    rc = dev_alloc(b, (size_t)k.n_tok * (size_t)ms->n_out * sizeof(float),
                                   (void **)&k.out);
                time_case(b, &k, rc);
            }
}

// The fused decode mat-vecs of one layer (backend.h): Q/K/V in one call,
// gate/up + swiglu, and the down projection with the residual add. Compare
// with the matvec rows of the same shapes for what fusion saves.
static void bench_matvec_fused(struct bench *b, const struct shape_model *sm, enum family fam) {
    const int64_t q = (int64_t)sm->n_head * sm->head_dim,
                  kv = (int64_t)sm->n_head_kv * sm->head_dim;
    // matvec_add: ffn_down (n_ff -> n_embd), then attn_output (q -> n_embd):
    // the forward pass folds the residual add into both
    const int n_in_cases = fam == FAM_MATVEC_ADD ? 2 : 1;
    for (int ic = 0; ic < n_in_cases; ic++)
        for (int ti = 0; ti < b->opt.n_types; ti++)
            for (int nt = 0; nt < b->opt.n_matvec_tok * 2; nt++) {
                const enum ggml_type type = b->opt.types[ti];
                const int act = matvec_act_of(b, true, type, nt % 2);
                if (act == ACT_SKIP)
                    continue;
                struct kcase k = {.fam = fam,
                                  .sm = sm,
                                  .type = type,
                                  .act = act,
                                  .n_tok = b->opt.matvec_tok[nt / 2]};
                const int64_t n_in = fam == FAM_MATVEC_ADD ? (ic == 0 ? sm->n_ff : q) : sm->n_embd;
                int64_t outs[3] = {q, kv, kv};
                int n_w = 3;
                if (fam == FAM_MATVEC_SWIGLU) {
                    outs[0] = outs[1] = sm->n_ff;
                    n_w = 2;
                } else if (fam == FAM_MATVEC_ADD) {
                    outs[0] = sm->n_embd;
                    n_w = 1;
                }
                snprintf(k.shape, sizeof k.shape, "%s %lldx%lld%s", family_name[fam] + 7,
                         (long long)n_in, (long long)(outs[0] + (n_w == 3 ? 2 * kv : 0)),
                         act_tag(act));
                struct backend_weight *ws[3] = {&k.w, &k.w2, &k.w3};
                float **os[3] = {&k.out, &k.out2, &k.out3};
                int rc = 0;
                k.bytes = (double)k.n_tok * n_in * 4.0;
                for (int i = 0; i < n_w && !rc; i++) {
                    void *w = NULL;
                    rc = alloc_fill(b, &w, type, n_in, outs[i], 1.0f / sqrtf((float)n_in));
                    *ws[i] = (struct backend_weight){w, type, n_in, outs[i]};
                    k.bytes += (double)ggml_row_bytes(type, n_in) * (double)outs[i];
                    k.flops += 2.0 * (double)n_in * (double)outs[i] * k.n_tok;
                    // matvec_add reads y (y += W x): it must hold values
                    if (!rc && fam == FAM_MATVEC_ADD)
                        rc = alloc_fill(b, (void **)os[i], GGML_TYPE_F32, outs[i], k.n_tok, 1.0f);
                    else if (!rc)
                        rc = dev_alloc(b, (size_t)k.n_tok * (size_t)outs[i] * sizeof(float),
                                       (void **)os[i]);
                }
                // outputs written: q+k+v, n_ff (swiglu), n_embd read and written (add)
                k.bytes += (double)k.n_tok * 4.0 *
                           (fam == FAM_MATVEC_QKV      ? (double)(q + 2 * kv)
                            : fam == FAM_MATVEC_SWIGLU ? (double)sm->n_ff
                                                       : 2.0 * sm->n_embd);
                if (!rc)
                    rc = alloc_fill(b, (void **)&k.x, GGML_TYPE_F32, n_in, k.n_tok, 1.0f);
                time_case(b, &k, rc);
            }
}

// How an attention case gives each query its exact self-extend (G, W).
enum se_mix {
    SE_CALL = 0,    // the call's se_g / se_w (q_se NULL): G 4, W 1024
    SE_UNIFORM = 1, // q_se with G 4, W 1024 for every token
    SE_MIXED = 2,   // q_se with G 2, 3, 4, 8 in turn (W 1024): blocks mix four G
};

// q_se for n_tok tokens as mix says (malloc'd host memory).
static int32_t *se_mix_table(enum se_mix mix, int n_tok) {
    static const int gs[4] = {2, 3, 4, 8};
    int32_t *t = malloc((size_t)n_tok * 2 * sizeof *t);
    for (int i = 0; t && i < n_tok; i++) {
        t[2 * i] = mix == SE_MIXED ? gs[i % 4] : 4;
        t[2 * i + 1] = 1024;
    }
    return t;
}

// One attention case: n_tok queries at the end of a context of ctx cells
// (one sequence, F16 cache); se: K unrotated, exact self-extend inside the
// kernel with G and W as mix says.
static void attention_case(struct bench *b, const struct shape_model *sm, enum family fam, int ctx,
                           int n_tok, bool se, enum se_mix mix) {
    const int hd = sm->head_dim;
    struct kcase k = {.fam = fam,
                      .sm = sm,
                      .type = GGML_TYPE_F16,
                      .n_tok = n_tok,
                      .n_ctx = ctx,
                      .rp = rope_of(sm)};
    snprintf(k.shape, sizeof k.shape, "%d/%d heads, dim %d%s", sm->n_head, sm->n_head_kv, hd,
             mix == SE_MIXED     ? ", 4 G mixed"
             : mix == SE_UNIFORM ? ", q_se uniform"
                                 : "");
    // queries at positions ctx - n_tok .. ctx - 1: query t sees ctx - n_tok + t + 1 cells
    const double visible = (double)n_tok * (ctx - n_tok) + (double)n_tok * (n_tok + 1) / 2.0;
    const double kv_bytes = 2.0 * ctx * sm->n_head_kv * hd * 2.0; // K and V, f16
    const double qo_bytes = 2.0 * n_tok * sm->n_head * hd * 4.0;  // q in, out
    k.bytes = kv_bytes + qo_bytes + ctx * (4.0 + 8.0) + n_tok * 8.0;
    k.flops = 4.0 * sm->n_head * hd * visible;

    int32_t *h_pos = malloc((size_t)ctx * sizeof *h_pos);
    uint64_t *h_seq = malloc((size_t)ctx * sizeof *h_seq);
    int32_t *h_qseq = calloc((size_t)n_tok, sizeof *h_qseq);
    int32_t *h_se = mix != SE_CALL ? se_mix_table(mix, n_tok) : NULL;
    int rc = 0;
    if (!h_pos || !h_seq || !h_qseq || (mix != SE_CALL && !h_se)) {
        snprintf(b->err, sizeof b->err, "out of host memory");
        rc = -1;
    }
    for (int c = 0; !rc && c < ctx; c++) {
        h_pos[c] = c;
        h_seq[c] = 1; // sequence 0
    }
    void *q = NULL, *cell_seq = NULL;
    int32_t *cell_pos = NULL, *q_pos = NULL, *q_seq = NULL, *q_se = NULL;
    if (!rc)
        rc = alloc_fill(b, &q, GGML_TYPE_F32, (int64_t)sm->n_head * hd, n_tok, 1.0f);
    if (!rc)
        rc = alloc_fill(b, &k.k_cache, GGML_TYPE_F16, (int64_t)sm->n_head_kv * hd, ctx, 1.0f);
    if (!rc)
        rc = alloc_fill(b, &k.v_cache, GGML_TYPE_F16, (int64_t)sm->n_head_kv * hd, ctx, 1.0f);
    if (!rc)
        rc = dev_alloc(b, (size_t)n_tok * sm->n_head * hd * sizeof(float), (void **)&k.out);
    if (!rc)
        rc = alloc_i32(b, &cell_pos, h_pos, ctx);
    if (!rc && (rc = dev_alloc(b, (size_t)ctx * sizeof(uint64_t), &cell_seq)) == 0)
        rc = op_rc(b, b->be->ops->upload(b->be, cell_seq, h_seq, (size_t)ctx * sizeof(uint64_t)));
    if (!rc)
        rc = alloc_i32(b, &q_pos, h_pos + (ctx - n_tok), n_tok);
    if (!rc)
        rc = alloc_i32(b, &q_seq, h_qseq, n_tok);
    if (!rc && h_se)
        rc = alloc_i32(b, &q_se, h_se, 2 * n_tok);
    k.a = (struct attn_args){
        .out = k.out,
        .q = q,
        .k = k.k_cache,
        .v = k.v_cache,
        .type_k = GGML_TYPE_F16,
        .type_v = GGML_TYPE_F16,
        .cell_pos = cell_pos,
        .cell_seq = cell_seq,
        .seq_words = 1,
        .q_pos = q_pos,
        .q_seq = q_seq,
        .n_tok = n_tok,
        .n_kv = ctx,
        .n_head = sm->n_head,
        .n_head_kv = sm->n_head_kv,
        .head_dim = hd,
        .head_dim_v = hd,
        .scale = 1.0f / sqrtf((float)hd),
        .rope = se ? &k.rp : NULL,
        .se_g = 4,
        .se_w = 1024,
        .q_se = q_se,
    };
    free(h_pos);
    free(h_seq);
    free(h_qseq);
    free(h_se);
    time_case(b, &k, rc);
}

// se: K unrotated, exact self-extend inside the kernel (G 4, W 1024).
static void bench_attention(struct bench *b, const struct shape_model *sm, bool prefill, bool se) {
    for (int ci = 0; ci < b->opt.n_ctxs; ci++) {
        const int ctx = b->opt.ctxs[ci];
        const int n_tok = prefill ? (b->opt.prefill_tok < ctx ? b->opt.prefill_tok : ctx) : 1;
        const enum family fam = se ? (prefill ? FAM_ATTN_SE_PREFILL : FAM_ATTN_SE_DECODE)
                                   : (prefill ? FAM_ATTN_PREFILL : FAM_ATTN_DECODE);
        attention_case(b, sm, fam, ctx, n_tok, se, SE_CALL);
    }
}

// Exact self-extend with G and W per token (attn_args.q_se): 8 tokens (the
// SIMT kernel) and --prefill-tokens (tensor cores), each uniform and with
// four G mixed in every block, to show what mixing costs.
static void bench_attention_mixed(struct bench *b, const struct shape_model *sm) {
    for (int ci = 0; ci < b->opt.n_ctxs; ci++) {
        const int ctx = b->opt.ctxs[ci];
        const int toks[2] = {8, b->opt.prefill_tok < ctx ? b->opt.prefill_tok : ctx};
        for (int ti = 0; ti < 2; ti++)
            for (int mix = SE_UNIFORM; mix <= SE_MIXED; mix++)
                attention_case(b, sm, FAM_ATTN_SE_MIXED, ctx, toks[ti] < ctx ? toks[ti] : ctx, true,
                               (enum se_mix)mix);
    }
}

static void bench_rope(struct bench *b, const struct shape_model *sm, bool fused) {
    const int hd = sm->head_dim;
    const int toks[2] = {1, b->opt.prefill_tok};
    for (int ti = 0; ti < 2; ti++) {
        const int n_tok = toks[ti];
        const int cache_ctx = n_tok > 4096 ? n_tok : 4096;
        struct kcase k = {.fam = fused ? FAM_ROPE_KV_STORE : FAM_ROPE,
                          .sm = sm,
                          .type = fused ? GGML_TYPE_F16 : GGML_TYPE_F32,
                          .n_tok = n_tok,
                          .n_ctx = fused ? cache_ctx : 0,
                          .rp = rope_of(sm)};
        int32_t *h = malloc((size_t)n_tok * sizeof *h);
        int rc = h ? 0 : -1;
        for (int t = 0; h && t < n_tok; t++)
            h[t] = 100 + t; // positions; cells 100.. too
        if (rc)
            snprintf(b->err, sizeof b->err, "out of host memory");
        if (!rc)
            rc = alloc_i32(b, &k.pos, h, n_tok);
        if (!fused) {
            snprintf(k.shape, sizeof k.shape, "q %d heads, dim %d", sm->n_head, hd);
            const double n = (double)n_tok * sm->n_head * hd;
            k.bytes = 2.0 * n * 4.0 + n_tok * 4.0;
            k.flops = n * 3.0; // each rotated element: 2 mul + 1 add
            if (!rc)
                rc = alloc_fill(b, (void **)&k.x, GGML_TYPE_F32, (int64_t)sm->n_head * hd, n_tok,
                                1.0f);
        } else {
            snprintf(k.shape, sizeof k.shape, "q %d, k,v %d heads, dim %d", sm->n_head,
                     sm->n_head_kv, hd);
            const double n = (double)n_tok * sm->n_head_kv * hd,
                         nq = (double)n_tok * sm->n_head * hd;
            // q and k read + written back, v read, k and v stored as f16
            k.bytes = nq * 8.0 + n * (4.0 + 4.0 + 4.0) + n * (2.0 + 2.0) + n_tok * 8.0;
            k.flops = (nq + n) * 3.0;
            if (!rc)
                rc = alloc_fill(b, (void **)&k.x, GGML_TYPE_F32, (int64_t)sm->n_head * hd, n_tok,
                                1.0f);
            const int64_t row = (int64_t)sm->n_head_kv * hd;
            if (!rc)
                rc = alloc_i32(b, &k.cells, h, n_tok);
            if (!rc)
                rc = alloc_fill(b, (void **)&k.k, GGML_TYPE_F32, row, n_tok, 1.0f);
            if (!rc)
                rc = alloc_fill(b, (void **)&k.v, GGML_TYPE_F32, row, n_tok, 1.0f);
            if (!rc)
                rc = dev_alloc(b, (size_t)cache_ctx * row * 2, &k.k_cache);
            if (!rc)
                rc = dev_alloc(b, (size_t)cache_ctx * row * 2, &k.v_cache);
        }
        free(h);
        time_case(b, &k, rc);
    }
}

static void bench_kv_shift(struct bench *b, const struct shape_model *sm) {
    for (int ci = 0; ci < b->opt.n_ctxs; ci++) {
        const int ctx = b->opt.ctxs[ci];
        struct kcase k = {.fam = FAM_KV_SHIFT,
                          .sm = sm,
                          .type = GGML_TYPE_F16,
                          .n_tok = 0,
                          .n_ctx = ctx,
                          .rp = rope_of(sm)};
        snprintf(k.shape, sizeof k.shape, "%d layers, %d heads", sm->n_layer, sm->n_head_kv);
        const double n = (double)sm->n_layer * ctx * sm->n_head_kv * sm->head_dim;
        k.bytes = n * 2.0 * 2.0 + ctx * 4.0; // every K element read and written (f16)
        k.flops = n * 3.0;
        int32_t *h = malloc((size_t)ctx * sizeof *h);
        int rc = h ? 0 : -1;
        if (rc)
            snprintf(b->err, sizeof b->err, "out of host memory");
        for (int c = 0; h && c < ctx; c++)
            h[c] = 1; // every cell moves
        if (!rc)
            rc = alloc_i32(b, &k.delta, h, ctx);
        free(h);
        if (!rc)
            rc = alloc_fill(b, &k.k_cache, GGML_TYPE_F16, (int64_t)sm->n_head_kv * sm->head_dim,
                            (int64_t)sm->n_layer * ctx, 1.0f);
        time_case(b, &k, rc);
    }
}

static void bench_rms_norm(struct bench *b, const struct shape_model *sm) {
    const int rows[2] = {1, b->opt.prefill_tok};
    for (int ri = 0; ri < 2; ri++) {
        struct kcase k = {.fam = FAM_RMS_NORM, .sm = sm, .type = GGML_TYPE_F32, .n_tok = rows[ri]};
        snprintf(k.shape, sizeof k.shape, "n_embd %d", sm->n_embd);
        const double n = (double)k.n_tok * sm->n_embd;
        k.bytes = 2.0 * n * 4.0 + sm->n_embd * 4.0;
        k.flops = 4.0 * n;
        int rc = alloc_fill(b, (void **)&k.x, GGML_TYPE_F32, sm->n_embd, k.n_tok, 1.0f);
        if (!rc)
            rc = alloc_fill(b, (void **)&k.norm_w, GGML_TYPE_F32, sm->n_embd, 1, 1.0f);
        if (!rc)
            rc = dev_alloc(b, (size_t)n * sizeof(float), (void **)&k.out);
        time_case(b, &k, rc);
    }
}

// argmax (1 and 64 rows) or, with sample, the sampling op: top-k 40, top-p
// 0.95, min-p 0.05, temperature 0.8 (llama.cpp's defaults), 1 and 8 rows;
// both read n_vocab logits per row.
static void bench_argmax(struct bench *b, const struct shape_model *sm, bool sample) {
    const int rows[2] = {1, sample ? 8 : 64};
    for (int ri = 0; ri < 2; ri++) {
        struct kcase k = {.fam = sample ? FAM_SAMPLE : FAM_ARGMAX,
                          .sm = sm,
                          .type = GGML_TYPE_F32,
                          .n_tok = rows[ri]};
        k.sp = (struct sample_params){
            .temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .u = 0.5};
        snprintf(k.shape, sizeof k.shape, "n_vocab %d%s", sm->n_vocab, sample ? " top-k 40" : "");
        k.bytes = (double)k.n_tok * sm->n_vocab * 4.0 + k.n_tok * 4.0;
        k.flops = (double)k.n_tok * sm->n_vocab;
        int rc = alloc_fill(b, (void **)&k.x, GGML_TYPE_F32, sm->n_vocab, k.n_tok, 4.0f);
        if (!rc)
            rc = dev_alloc(b, (size_t)k.n_tok * sizeof(int32_t), (void **)&k.amax);
        time_case(b, &k, rc);
    }
}

// The router of a mixture-of-experts layer: n_tok rows of n_expert logits.
static void bench_moe_route(struct bench *b, const struct shape_model *sm) {
    for (int nt = 0; nt < b->opt.n_matvec_tok; nt++) {
        struct kcase k = {
            .fam = FAM_MOE_ROUTE, .sm = sm, .type = GGML_TYPE_F32, .n_tok = b->opt.matvec_tok[nt]};
        snprintf(k.shape, sizeof k.shape, "route %dx%d k %d", k.n_tok, sm->n_expert, sm->k_expert);
        k.bytes = (double)k.n_tok * (sm->n_expert * 4.0 + sm->k_expert * 8.0);
        int rc = alloc_fill(b, (void **)&k.x, GGML_TYPE_F32, sm->n_expert, k.n_tok, 2.0f);
        if (!rc)
            rc = dev_alloc(b, (size_t)k.n_tok * sm->k_expert * sizeof(float), (void **)&k.out);
        if (!rc)
            rc = dev_alloc(b, (size_t)k.n_tok * sm->k_expert * sizeof(int32_t), (void **)&k.amax);
        time_case(b, &k, rc);
    }
}

// A mixture-of-experts FFN: stacks of n_expert gate/up (n_embd -> n_ff) and
// down matrices, every token routed to k distinct experts spread over the
// stack (token t, slot j: expert (t * 37 + j * 13) mod n_expert, weight
// 1/k). Minimum bytes: the distinct experts' matrices once, x, out.
static void bench_moe_ffn(struct bench *b, const struct shape_model *sm) {
    const int E = sm->n_expert, K = sm->k_expert;
    const int64_t n_embd = sm->n_embd, n_ff = sm->n_ff;
    for (int ti = 0; ti < b->opt.n_types; ti++)
        for (int nt = 0; nt <= b->opt.n_matvec_tok * 2; nt++) {
            const enum ggml_type type = b->opt.types[ti];
            // passes: the decode token counts (q8, f32), then one prompt batch
            const bool prompt = nt == b->opt.n_matvec_tok * 2;
            const int act = prompt ? ACT_NA : matvec_act_of(b, true, type, nt % 2);
            if (act == ACT_SKIP)
                continue;
            struct kcase k = {.fam = FAM_MOE_FFN,
                              .sm = sm,
                              .type = type,
                              .act = act,
                              .n_tok = prompt ? b->opt.prefill_tok : b->opt.matvec_tok[nt / 2]};
            snprintf(k.shape, sizeof k.shape, "experts %lldx%lld e%d k%d%s", (long long)n_embd,
                     (long long)n_ff, E, K, act_tag(act));
            const int n_pairs = k.n_tok * K;
            int32_t *ids = malloc((size_t)n_pairs * sizeof *ids);
            float *wts = malloc((size_t)n_pairs * sizeof *wts);
            bool *used = calloc((size_t)E, sizeof *used);
            int n_used = 0, rc = ids && wts && used ? 0 : -1;
            if (rc)
                snprintf(b->err, sizeof b->err, "out of host memory");
            for (int t = 0; !rc && t < k.n_tok; t++)
                for (int j = 0; j < K; j++) {
                    const int e = (t * 37 + j * 13) % E;
                    ids[t * K + j] = e;
                    wts[t * K + j] = 1.0f / K;
                    n_used += !used[e];
                    used[e] = true;
                }
            const double per_expert = 2.0 * ggml_row_bytes(type, n_embd) * (double)n_ff +
                                      ggml_row_bytes(type, n_ff) * (double)n_embd;
            k.bytes = n_used * per_expert + (double)k.n_tok * n_embd * 8.0;
            k.flops = 6.0 * (double)n_embd * (double)n_ff * n_pairs;
            void *w = NULL;
            if (!rc)
                rc = alloc_fill(b, &w, type, n_embd, E * n_ff, 1.0f / sqrtf((float)n_embd));
            k.w = (struct backend_weight){w, type, n_embd, E * n_ff};
            w = NULL;
            if (!rc)
                rc = alloc_fill(b, &w, type, n_embd, E * n_ff, 1.0f / sqrtf((float)n_embd));
            k.w2 = (struct backend_weight){w, type, n_embd, E * n_ff};
            w = NULL;
            if (!rc)
                rc = alloc_fill(b, &w, type, n_ff, E * n_embd, 1.0f / sqrtf((float)n_ff));
            k.w3 = (struct backend_weight){w, type, n_ff, E * n_embd};
            if (!rc)
                rc = alloc_fill(b, (void **)&k.x, GGML_TYPE_F32, n_embd, k.n_tok, 1.0f);
            if (!rc)
                rc = dev_alloc(b, (size_t)k.n_tok * n_embd * sizeof(float), (void **)&k.out);
            if (!rc)
                rc = alloc_i32(b, &k.amax, ids, n_pairs);
            if (!rc)
                rc = dev_alloc(b, (size_t)n_pairs * sizeof(float), (void **)&k.norm_w);
            if (!rc)
                rc = op_rc(
                    b, b->be->ops->upload(b->be, k.norm_w, wts, (size_t)n_pairs * sizeof(float)));
            if (!rc)
                rc = dev_alloc(b, BACKEND_MOE_TMP(k.n_tok, K, n_embd, n_ff) * sizeof(float),
                               (void **)&k.moe.tmp);
            k.moe = (struct moe_args){.out = k.out,
                                      .x = k.x,
                                      .ids = k.amax,
                                      .weights = k.norm_w,
                                      .gate = &k.w,
                                      .up = &k.w2,
                                      .down = &k.w3,
                                      .n_expert = E,
                                      .k = K,
                                      .n_tok = k.n_tok,
                                      .tmp = k.moe.tmp};
            free(ids);
            free(wts);
            free(used);
            time_case(b, &k, rc);
        }
}

// --- command line ---------------------------------------------------------------------

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: vela-bench-kernels [options]\n\n"
        "Times vela's CUDA kernels through the backend op table on the layer shapes of\n"
        "Llama-2-7B, Llama-3-8B and Llama-3-70B: CUDA events, L2 flushed before every\n"
        "call, mean over -r repetitions after --warmup calls. Prints a table; --json\n"
        "writes every result. Without a CUDA device it prints a note and exits 0.\n\n"
        "options:\n"
        "  --json FILE            write the results as JSON to FILE\n"
        "  --filter LIST          only these kernels (comma list): matvec, matmul,\n"
        "                         matmul_tc, cublas_f16, attn_prefill, attn_decode, rope,\n"
        "                         rope_kv_store, kv_shift, rms_norm, argmax, sample,\n"
        "                         matvec_qkv, matvec_swiglu, matvec_add, attn_se_prefill,\n"
        "                         attn_se_decode, attn_se_mixed, moe_route, moe_ffn\n"
        "  --models LIST          shapes: llama2-7b,llama3-8b,llama3-70b (default: these\n"
        "                         three), ci-small (1024 wide, GQA 8: the emulated CI gate),\n"
        "                         qwen3-30b-a3b (128 experts of 2048x768, k 8: moe_* only)\n"
        "  --types LIST           weight types for matvec/matmul (default: f32,f16,bf16,\n"
        "                         q8_0,q4_0,q4_1,q5_0,q5_1,q2_K,q3_K,q4_K,q5_K,q6_K)\n"
        "  --ctx LIST             attention / kv_shift contexts (default: 512,4096,16384,32768)\n"
        "  --matvec-tok LIST      tokens per mat-vec call (default: 1,8)\n"
        "  --prefill-tokens N     tokens of the prefill cases (default: 512)\n"
        "  --tc-tok LIST          tokens of the matmul_tc cases (default: 16,64,128)\n"
        "  --tc-path LIST         matmul_tc paths: fused, cublas (default: both)\n"
        "  --matvec-act LIST      activations of the mat-vec families: q8 (the CUDA\n"
        "                         default, dp4a), f32 (default: q8,f32; F32/F16/BF16\n"
        "                         weights always f32)\n"
        "  --matvec-q8 KERNEL     the dp4a mat-vec's kernel, a variant under test: pass\n"
        "                         (the default: one block per row pair), pipe[:B]\n"
        "                         (pipelined) or stream[:B] (persistent blocks, a warp\n"
        "                         per row pair); B blocks per SM, 1..64, default 4\n"
        "  --matvec-f16 KERNEL    the F16/BF16 mat-vec's kernel, a variant under test:\n"
        "                         pass (the default: one warp per row) or stream[:B]\n"
        "                         (persistent blocks, a warp streams whole rows); B\n"
        "                         blocks per SM, 1..64, default 4\n"
        "  --attn-kernel KERNEL   decode attention's kernel, a variant under test: dec\n"
        "                         (the default: cells split for >= 2 blocks per SM,\n"
        "                         combine fused) or splitk (attn_kernel + combine)\n"
        "  --attn-split BxC       decode attention's split plan, a variant under test:\n"
        "                         aim at B blocks per SM (1..64), at least C cells per\n"
        "                         split (8..65536, a multiple of 8); default 2x8 (dec),\n"
        "                         2x256 (splitk)\n"
        "  -r, --reps N           timed repetitions (default: 10)\n"
        "  --warmup N             untimed calls first (default: 2)\n"
        "  --device N             CUDA device (default: 0)\n"
        "  --quick                llama3-8b, types f16,q8_0,q4_0,q4_K,q6_K, ctx 512,4096,\n"
        "                         3 repetitions: a smoke run in seconds\n"
        "  -h, --help             this help\n");
}

// Splits a comma list; each item goes to fn (returns 0 or prints and returns -1).
static int parse_list(const char *flag, const char *s, int (*fn)(struct options *, const char *),
                      struct options *o) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        if (fn(o, tok)) {
            fprintf(stderr, "vela-bench-kernels: %s: bad item '%s'\n", flag, tok);
            return -1;
        }
    return 0;
}

static int parse_pos_int(const char *s, long max, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < 1 || v > max)
        return -1;
    *out = (int)v;
    return 0;
}

// --attn-split BxC (the ranges are the backend's: backend_cuda_set_attn_split
// checks them again).
static int parse_attn_split(struct options *o, const char *s) {
    char b[16];
    const char *x = strpbrk(s, "xX");
    if (!x || (size_t)(x - s) >= sizeof b)
        return -1;
    memcpy(b, s, (size_t)(x - s));
    b[x - s] = '\0';
    if (parse_pos_int(b, 64, &o->split_blocks_per_sm) ||
        parse_pos_int(x + 1, 65536, &o->split_min_cells) || o->split_min_cells % 8 ||
        o->split_min_cells < 8)
        return -1;
    snprintf(o->attn_split, sizeof o->attn_split, "%s", s);
    return 0;
}

// --matvec-q8 pass|pipe|pipe:B|stream|stream:B
static int parse_matvec_q8(struct options *o, const char *s) {
    if (backend_cuda_parse_matvec(s, true, &o->mvq_kernel, &o->mvq_blocks_per_sm))
        return -1;
    snprintf(o->matvec_q8, sizeof o->matvec_q8, "%s", s);
    return 0;
}

// --matvec-f16 pass|stream|stream:B
static int parse_matvec_f16(struct options *o, const char *s) {
    if (backend_cuda_parse_matvec(s, false, &o->mvf_kernel, &o->mvf_blocks_per_sm))
        return -1;
    snprintf(o->matvec_f16, sizeof o->matvec_f16, "%s", s);
    return 0;
}

static int add_model(struct options *o, const char *s) {
    for (int i = 0; i < N_SHAPE_MODELS; i++)
        if (!strcmp(s, shape_models[i].name)) {
            o->model_on[i] = true;
            return 0;
        }
    return -1;
}

static int add_type(struct options *o, const char *s) {
    int t = ggml_type_from_name(s);
    if (t < 0 || o->n_types == MAX_LIST)
        return -1;
    o->types[o->n_types++] = (enum ggml_type)t;
    return 0;
}

static int add_ctx(struct options *o, const char *s) {
    if (o->n_ctxs == MAX_LIST)
        return -1;
    return parse_pos_int(s, 1 << 20, &o->ctxs[o->n_ctxs++]);
}

static int add_mvtok(struct options *o, const char *s) {
    if (o->n_matvec_tok == MAX_LIST)
        return -1;
    return parse_pos_int(s, 64, &o->matvec_tok[o->n_matvec_tok++]);
}

static int add_tctok(struct options *o, const char *s) {
    if (o->n_tc_tok == MAX_LIST)
        return -1;
    return parse_pos_int(s, 1 << 16, &o->tc_tok[o->n_tc_tok++]);
}

// 0: run; 1: exit 0 (help); 2: usage error.
static int parse_args(struct options *o, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    o->prefill_tok = 512;
    o->act[0] = o->act[1] = true;
    o->tc_path[0] = o->tc_path[1] = true;
    snprintf(o->attn_split, sizeof o->attn_split, "dec");
    snprintf(o->matvec_q8, sizeof o->matvec_q8, "pass");
    snprintf(o->matvec_f16, sizeof o->matvec_f16, "pass");
#ifdef VELA_EMU
    o->reps = 1; // emulated: counted, not timed
    o->warmup = 0;
#else
    o->reps = 10;
    o->warmup = 2;
#endif
    bool models = false, quick = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
#define NEED_VALUE                                                                                 \
    do {                                                                                           \
        if (!v) {                                                                                  \
            fprintf(stderr, "vela-bench-kernels: %s: missing value\n", a);                         \
            return 2;                                                                              \
        }                                                                                          \
        i++;                                                                                       \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--json")) {
            NEED_VALUE;
            o->json_path = v;
        } else if (!strcmp(a, "--filter")) {
            NEED_VALUE;
            o->filter = v;
        } else if (!strcmp(a, "--models")) {
            NEED_VALUE;
            models = true;
            if (parse_list(a, v, add_model, o))
                return 2;
        } else if (!strcmp(a, "--types")) {
            NEED_VALUE;
            o->n_types = 0;
            if (parse_list(a, v, add_type, o))
                return 2;
        } else if (!strcmp(a, "--ctx")) {
            NEED_VALUE;
            o->n_ctxs = 0;
            if (parse_list(a, v, add_ctx, o))
                return 2;
        } else if (!strcmp(a, "--matvec-tok")) {
            NEED_VALUE;
            o->n_matvec_tok = 0;
            if (parse_list(a, v, add_mvtok, o))
                return 2;
        } else if (!strcmp(a, "--tc-tok")) {
            NEED_VALUE;
            o->n_tc_tok = 0;
            if (parse_list(a, v, add_tctok, o))
                return 2;
        } else if (!strcmp(a, "--tc-path")) {
            NEED_VALUE;
            o->tc_path[0] = strstr(v, "fused") != NULL;
            o->tc_path[1] = strstr(v, "cublas") != NULL;
            if (!o->tc_path[0] && !o->tc_path[1]) {
                fprintf(stderr,
                        "vela-bench-kernels: --tc-path: '%s' names neither fused nor "
                        "cublas\n",
                        v);
                return 2;
            }
        } else if (!strcmp(a, "--matvec-act")) {
            NEED_VALUE;
            o->act[0] = o->act[1] = false;
            for (const char *p = v; *p;) {
                const size_t n = strcspn(p, ",");
                if (n == 2 && !strncmp(p, "q8", 2))
                    o->act[1] = true;
                else if (n == 3 && !strncmp(p, "f32", 3))
                    o->act[0] = true;
                else {
                    fprintf(stderr, "vela-bench-kernels: --matvec-act: '%.*s' is not q8 or f32\n",
                            (int)n, p);
                    return 2;
                }
                p += n + (p[n] == ',');
            }
        } else if (!strcmp(a, "--attn-split")) {
            NEED_VALUE;
            rc = parse_attn_split(o, v);
        } else if (!strcmp(a, "--attn-kernel")) {
            NEED_VALUE;
            o->attn_decode = !strcmp(v, "dec")      ? CUDA_ATTN_DECODE_DEC
                             : !strcmp(v, "splitk") ? CUDA_ATTN_DECODE_SPLITK
                                                    : -1;
            rc = o->attn_decode < 0 ? -1 : 0;
        } else if (!strcmp(a, "--matvec-q8")) {
            NEED_VALUE;
            rc = parse_matvec_q8(o, v);
        } else if (!strcmp(a, "--matvec-f16")) {
            NEED_VALUE;
            rc = parse_matvec_f16(o, v);
        } else if (!strcmp(a, "--prefill-tokens")) {
            NEED_VALUE;
            rc = parse_pos_int(v, 1 << 16, &o->prefill_tok);
        } else if (!strcmp(a, "-r") || !strcmp(a, "--reps")) {
            NEED_VALUE;
            rc = parse_pos_int(v, 100000, &o->reps);
        } else if (!strcmp(a, "--warmup")) {
            NEED_VALUE;
            if (!strcmp(v, "0"))
                o->warmup = 0;
            else
                rc = parse_pos_int(v, 1000, &o->warmup);
        } else if (!strcmp(a, "--device")) {
            NEED_VALUE;
            if (!strcmp(v, "0"))
                o->device = 0;
            else
                rc = parse_pos_int(v, 1024, &o->device);
        } else if (!strcmp(a, "--quick")) {
            quick = true;
        } else {
            fprintf(stderr, "vela-bench-kernels: unknown option '%s' (see --help)\n", a);
            return 2;
        }
#undef NEED_VALUE
        if (rc) {
            fprintf(stderr, "vela-bench-kernels: %s: bad value '%s'\n", a, v);
            return 2;
        }
    }
    if (quick) {
        if (!models)
            add_model(o, "llama3-8b");
        models = true;
        if (o->n_types == 0)
            parse_list("--types", "f16,q8_0,q4_0,q4_K,q6_K", add_type, o);
        if (o->n_ctxs == 0)
            parse_list("--ctx", "512,4096", add_ctx, o);
        o->reps = o->reps < 3 ? o->reps : 3;
        o->warmup = o->warmup < 1 ? o->warmup : 1;
    }
    if (!models)
        for (int i = 0; i < N_DEFAULT_MODELS; i++)
            o->model_on[i] = true;
    if (o->n_types == 0)
        for (int i = 0; i < N_ALL_TYPES; i++)
            o->types[o->n_types++] = all_types[i];
    if (o->n_ctxs == 0)
        parse_list("--ctx", "512,4096,16384,32768", add_ctx, o);
    if (o->n_matvec_tok == 0)
        parse_list("--matvec-tok", "1,8", add_mvtok, o);
    if (o->n_tc_tok == 0)
        parse_list("--tc-tok", "16,64,128", add_tctok, o);
    if (o->attn_decode == CUDA_ATTN_DECODE_SPLITK) { // the variant's name: splitk[:BxC]
        char plan[sizeof o->attn_split];
        memcpy(plan, o->attn_split, sizeof plan);
        // "splitk:" and at most 40 bytes of the plan fit attn_split
        snprintf(o->attn_split, sizeof o->attn_split, "splitk%s%.40s",
                 o->split_blocks_per_sm ? ":" : "", o->split_blocks_per_sm ? plan : "");
    }
    return 0;
}

static void iso_date(char *buf, size_t cap) {
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static int write_json(const char *path, cJSON *root) {
    char *text = cJSON_Print(root);
    FILE *f = text ? fopen(path, "w") : NULL;
    int rc = -1;
    if (f) {
        rc = fputs(text, f) < 0 || fputc('\n', f) == EOF ? -1 : 0;
        rc |= fclose(f) ? -1 : 0;
    }
    if (rc)
        fprintf(stderr, "vela-bench-kernels: cannot write %s: %s\n", path, strerror(errno));
    cJSON_free(text);
    return rc;
}

int main(int argc, char **argv) {
    struct bench b;
    memset(&b, 0, sizeof b);
    int prc = parse_args(&b.opt, argc, argv);
    if (prc == 1)
        return 0;
    if (prc)
        return 2;

    char date[32];
    iso_date(date, sizeof date);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "commit", VELA_COMMIT);
    cJSON_AddStringToObject(root, "date", date);

    if (backend_cuda_device_count() <= b.opt.device) {
        printf("vela-bench-kernels: no CUDA device (device %d): skipping the kernel benchmarks\n",
               b.opt.device);
        cJSON_AddStringToObject(root, "skipped", "no CUDA device");
        int rc = b.opt.json_path ? write_json(b.opt.json_path, root) : 0;
        cJSON_Delete(root);
        return rc ? 1 : 0;
    }

    struct verr err = {0};
    if (backend_cuda_device_info(b.opt.device, &b.dev, &err) ||
        backend_cuda_create(&b.be, b.opt.device, &err) ||
        backend_cuda_set_attn_split(b.be, b.opt.split_blocks_per_sm, b.opt.split_min_cells, &err) ||
        backend_cuda_set_attn_decode(b.be, b.opt.attn_decode, &err) ||
        backend_cuda_set_matvec_q8(b.be, b.opt.mvq_kernel, b.opt.mvq_blocks_per_sm, &err) ||
        backend_cuda_set_matvec_f16(b.be, b.opt.mvf_kernel, b.opt.mvf_blocks_per_sm, &err)) {
        fprintf(stderr, "vela-bench-kernels: %s\n", err.msg);
        cJSON_Delete(root);
        return 1;
    }
    b.stream = (cudaStream_t)backend_cuda_stream(b.be);
    // Twice L2 (at least 64 MiB): whatever the last op left there is gone.
    b.flush_bytes = 2 * b.dev.l2_bytes > ((size_t)64 << 20) ? 2 * b.dev.l2_bytes : (size_t)64 << 20;
#ifdef VELA_EMU
    b.flush_bytes = 0; // emulated: no caches to flush
#endif
    cublasStatus_t cs = cublasCreate(&b.cublas);
    if (cs == CUBLAS_STATUS_SUCCESS)
        cs = cublasSetStream(b.cublas, b.stream);
    if (!b.stream || cudaEventCreate(&b.ev0) != cudaSuccess ||
        cudaEventCreate(&b.ev1) != cudaSuccess || cs != CUBLAS_STATUS_SUCCESS ||
        (b.flush_bytes && dev_alloc(&b, b.flush_bytes, &b.flush))) {
        fprintf(stderr, "vela-bench-kernels: setup failed: %s %s\n", b.err,
                cs != CUBLAS_STATUS_SUCCESS ? cublasGetStatusString(cs) : "");
        backend_destroy(b.be);
        cJSON_Delete(root);
        return 1;
    }

    cJSON *dev = cJSON_AddObjectToObject(root, "device");
    char v[32];
    cJSON_AddStringToObject(dev, "name", b.dev.name);
    snprintf(v, sizeof v, "%d.%d", b.dev.driver_version / 1000, (b.dev.driver_version % 1000) / 10);
    cJSON_AddStringToObject(dev, "driver", v);
    snprintf(v, sizeof v, "%d.%d", b.dev.runtime_version / 1000,
             (b.dev.runtime_version % 1000) / 10);
    cJSON_AddStringToObject(dev, "cuda_version", v);
    snprintf(v, sizeof v, "%d.%d", b.dev.cc_major, b.dev.cc_minor);
    cJSON_AddStringToObject(dev, "compute_capability", v);
    cJSON_AddNumberToObject(dev, "sm_count", b.dev.sm_count);
    cJSON_AddNumberToObject(dev, "mem_bytes", (double)b.dev.mem_bytes);
    cJSON_AddNumberToObject(dev, "l2_bytes", (double)b.dev.l2_bytes);
    cJSON_AddNumberToObject(dev, "peak_bw_gbs", b.dev.peak_bw_gbs);
    cJSON *par = cJSON_AddObjectToObject(root, "params");
    cJSON_AddNumberToObject(par, "reps", b.opt.reps);
    cJSON_AddNumberToObject(par, "warmup", b.opt.warmup);
    cJSON_AddNumberToObject(par, "flush_bytes", (double)b.flush_bytes);
    cJSON_AddNumberToObject(par, "prefill_tokens", b.opt.prefill_tok);
    // the kernel variants timed (--attn-kernel, --attn-split, --matvec-q8, --matvec-f16)
    cJSON_AddStringToObject(par, "attn_split", b.opt.attn_split);
    cJSON_AddStringToObject(par, "matvec_q8", b.opt.matvec_q8);
    cJSON_AddStringToObject(par, "matvec_f16", b.opt.matvec_f16);
    b.results = cJSON_AddArrayToObject(root, "results");

    printf("device: %s, %d SMs, L2 %.0f MiB, peak bandwidth %.0f GB/s, driver %d, runtime %d\n\n",
           b.dev.name, b.dev.sm_count, b.dev.l2_bytes / 1048576.0, b.dev.peak_bw_gbs,
           b.dev.driver_version, b.dev.runtime_version);
    printf("| %-13s | %-10s | %-22s | %-5s | %5s | %6s | %10s | %8s | %8s | %8s | %7s |\n",
           "kernel", "model", "shape", "type", "n_tok", "ctx", "us", "+- us", "GB/s", "TFLOP/s",
           "% BW");
    printf("| %.13s | %.10s | %.22s | %.5s | %.5s: | %.6s: | %.10s: | %.8s: | %.8s: | %.8s: | "
           "%.7s: |\n",
           "--------------", "----------", "----------------------", "-----", "-----", "------",
           "----------", "--------", "--------", "--------", "-------");

    for (int mi = 0; mi < N_SHAPE_MODELS; mi++) {
        if (!b.opt.model_on[mi])
            continue;
        const struct shape_model *sm = &shape_models[mi];
        if (sm->n_expert > 0) { // the expert shapes: the mixture-of-experts ops only
            if (want_family(&b, FAM_MOE_ROUTE))
                bench_moe_route(&b, sm);
            if (want_family(&b, FAM_MOE_FFN))
                bench_moe_ffn(&b, sm);
            continue;
        }
        if (want_family(&b, FAM_MATVEC))
            bench_matmul(&b, sm, FAM_MATVEC);
        if (want_family(&b, FAM_MATMUL))
            bench_matmul(&b, sm, FAM_MATMUL);
        if (want_family(&b, FAM_MATMUL_TC))
            bench_matmul(&b, sm, FAM_MATMUL_TC);
        for (enum family f = FAM_MATVEC_QKV; f <= FAM_MATVEC_ADD; f++)
            if (want_family(&b, f))
                bench_matvec_fused(&b, sm, f);
        if (want_family(&b, FAM_CUBLAS))
            bench_matmul(&b, sm, FAM_CUBLAS);
        if (want_family(&b, FAM_ATTN_PREFILL))
            bench_attention(&b, sm, true, false);
        if (want_family(&b, FAM_ATTN_DECODE))
            bench_attention(&b, sm, false, false);
        if (want_family(&b, FAM_ATTN_SE_PREFILL))
            bench_attention(&b, sm, true, true);
        if (want_family(&b, FAM_ATTN_SE_DECODE))
            bench_attention(&b, sm, false, true);
        if (want_family(&b, FAM_ATTN_SE_MIXED))
            bench_attention_mixed(&b, sm);
        if (want_family(&b, FAM_ROPE))
            bench_rope(&b, sm, false);
        if (want_family(&b, FAM_ROPE_KV_STORE))
            bench_rope(&b, sm, true);
        if (want_family(&b, FAM_KV_SHIFT))
            bench_kv_shift(&b, sm);
        if (want_family(&b, FAM_RMS_NORM))
            bench_rms_norm(&b, sm);
        if (want_family(&b, FAM_ARGMAX))
            bench_argmax(&b, sm, false);
        if (want_family(&b, FAM_SAMPLE))
            bench_argmax(&b, sm, true);
    }
    cJSON_AddNumberToObject(root, "n_failed", b.n_failed);

    int status = b.n_failed ? 1 : 0;
    if (b.opt.json_path && write_json(b.opt.json_path, root))
        status = 1;
    cJSON_Delete(root);
    dev_free(&b, b.flush);
    cublasDestroy(b.cublas);
    cudaEventDestroy(b.ev0);
    cudaEventDestroy(b.ev1);
    backend_destroy(b.be);
    if (b.n_failed)
        fprintf(stderr, "vela-bench-kernels: %d case(s) failed\n", b.n_failed);
    return status;
}
