// The CUDA backend: struct backend_ops over the kernels of cuda/*.cu.
//
// One stream per backend; every op enqueues on it and returns (ops->sync
// waits and reports faults raised inside kernels). Host-side argument checks
// happen here, before anything is enqueued, so a bad call fails with a
// message instead of a device fault. A single scratch buffer (stream-ordered
// allocation, grown on demand) serves the GEMM path (f16 activations and
// decoded weight slices) and split-K attention (partial results); ops run
// one after another on the stream, so they never use it at the same time.
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "cuda/attention.h"
#include "cuda/backend_cuda.h"
#include "cuda/elementwise.h"
#include "cuda/hadamard.h"
#include "cuda/matmul.h"
#include "cuda/matmul_tc.h"
#include "cuda/matvec.h"
#include "cuda/matvec_q8.h"
#include "cuda/moe.h"
#include "cuda/norm.h"
#include "cuda/rope.h"
#include "cuda/sample.h"
#include "gguf/quant.h"
#include "gguf/quant_q8.h"
#include "host/ops/backend.h"
#include "host/ops/transport.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

// A q8_1 copy of src's rows x n floats (cuda_backend.xq), left by an op for
// the mat-vec op right after it (act_q8). src NULL: none.
struct cu_xq {
    const float *src; // [rows][n]
    int rows;
    int64_t n;
    bool copied; // false: no copy was made (not a decode batch, act_q8 off)
    bool strict; // rms_norm_q8's, attention's with out_q8: the next op must be a
                 // mat-vec reading src
};

struct cuda_backend {
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *scratch; // device, stream-ordered (cudaMallocAsync)
    size_t scratch_bytes;
    uint64_t scratch_gen; // bumped whenever scratch moves: graphs recorded before are stale
    bool recording;       // between graph_begin and graph_end
    int sm_count;
    // upload_async's slots: event k is recorded after the last copy of slot
    // k (created on first use; recorded[k] false until then).
    cudaEvent_t upload_ev[BACKEND_UPLOAD_SLOTS];
    bool upload_recorded[BACKEND_UPLOAD_SLOTS];
    // act_q8: rms_norm_q8 (the fused op) and attention with out_q8 (for the
    // output projection) write their output of a decode batch as q8_1 into xq too
    // and describe it in xq_left; cu_enter hands it to the next op alone
    // (xq_offer), which takes those blocks instead of quantizing x again
    // when it reads that very output.
    void *xq; // device, xq_bytes (not the scratch: the next op may use that)
    size_t xq_bytes;
    struct cu_xq xq_left, xq_offer;
    // decode attention's split-K plan (cuda_attn); 0: defaults. Variants
    // under test: backend_cuda_set_attn_split (cuda/backend_cuda.h).
    int attn_split_blocks_per_sm, attn_split_min_cells;
    // the decode attention kernel (cuda_attn.decode; backend_cuda_set_attn_decode)
    // and the counters its one-launch split combine uses (cuda_attn.sync:
    // zeroed when allocated, left zero by every launch)
    int attn_decode;
    unsigned int *attn_sync;
    int attn_sync_n;
    // the quantized K/V store's error word (cu_kvq_bad_word) and its host copy
    int *kvq_bad, *kvq_bad_host;
    // the dp4a mat-vec's kernel (cuda_matvec_q8_segs); the one-pass kernel
    // unless backend_cuda_set_matvec_q8 picked another. mvq.pdl: whether the
    // decode chain's kernels (norm, quantize, mat-vecs, RoPE/KV store,
    // argmax) launch with programmatic dependent launch (backend_cuda_set_pdl);
    // attention, MoE and the rest launch without, which is safe beside them
    // (cuda/launch.cuh).
    struct cuda_mvq_plan mvq;
    // the f32-activation mat-vec's kernel for F16/BF16 weights
    // (cuda_matvec_plan_segs): the one-warp-per-row kernel unless
    // backend_cuda_set_matvec_f16 picked the streaming one.
    struct cuda_mv_plan mvf;
    int cc_major, cc_minor; // compute capability: PDL needs 9.0
};

static struct cuda_backend *cb_of(struct backend *be) {
    return (struct cuda_backend *)be->impl;
}

#define CU_CHECK(be, stmt)                                                                         \
    do {                                                                                           \
        cudaError_t e_ = (stmt);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return verr_set(&(be)->err, VERR_BACKEND, "%s: %s (%s:%d)", #stmt,                     \
                            cudaGetErrorString(e_), __FILE__, __LINE__);                           \
    } while (0)

// Every op starts here. The q8_1 copy the op before left is offered to
// this op and no other (struct cuda_backend.xq_offer). x, n_tok: what a
// mat-vec op reads (NULL for any other op), held to the contract of
// rms_norm_q8 and attention's out_q8 (host/ops/backend.h): right after them
// only a mat-vec of their output may run. And ops may be called from a thread whose current device
// is another GPU.
static int cu_enter(struct backend *be, const float *x, int n_tok, const char *op) {
    struct cuda_backend *cb = cb_of(be);
    cb->xq_offer = cb->xq_left;
    cb->xq_left = (struct cu_xq){0};
    const struct cu_xq *o = &cb->xq_offer;
    if (o->strict && (x != o->src || n_tok != o->rows))
        return verr_set(
            &be->err, VERR_RANGE,
            "%s right after an op that hands its output to a mat-vec (rms_norm_q8, "
            "hadamard_q8, attention with out_q8): the op after it must be a mat-vec reading its "
            "output [%d][%lld]",
            op, o->rows, (long long)o->n);
    CU_CHECK(be, cudaSetDevice(be->device));
    return VERR_OK;
}

#define CU_ENTER_READING(be, x, n_tok)                                                             \
    do {                                                                                           \
        int re_ = cu_enter((be), (x), (n_tok), __func__);                                          \
        if (re_)                                                                                   \
            return re_;                                                                            \
    } while (0)
#define CU_ENTER(be) CU_ENTER_READING(be, NULL, 0)

_Static_assert(CUDA_ATTN_PLAN_CELLS % BACKEND_KV_BUCKET == 0,
               "a bucket of n_kv must not straddle two attention plans");

// Ops that cannot be recorded into a graph (they synchronise, read host
// memory when they run, or allocate) refuse while recording.
static int cu_refuse_recording(struct backend *be, const char *what) {
    if (!cb_of(be)->recording)
        return VERR_OK;
    return verr_set(&be->err, VERR_UNSUPPORTED, "%s cannot be recorded into a CUDA graph", what);
}

#define CU_NOT_RECORDING(be, what)                                                                 \
    do {                                                                                           \
        int rr_ = cu_refuse_recording((be), (what));                                               \
        if (rr_)                                                                                   \
            return rr_;                                                                            \
    } while (0)

// --- memory ------------------------------------------------------------------

static int cu_alloc(struct backend *be, size_t bytes, void **out) {
    *out = NULL;
    CU_NOT_RECORDING(be, "alloc");
    CU_ENTER(be);
    // A zero-byte request still gets a distinct, freeable pointer (as the CPU
    // backend gives), so callers can treat NULL as "not allocated".
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        *out = NULL;
        (void)cudaGetLastError();
        return verr_set(&be->err, e == cudaErrorMemoryAllocation ? VERR_NOMEM : VERR_BACKEND,
                        "cudaMalloc(%zu bytes) on device %d: %s (%s:%d)", bytes, be->device,
                        cudaGetErrorString(e), __FILE__, __LINE__);
    }
    return VERR_OK;
}

static void cu_free(struct backend *be, void *ptr) {
    if (!ptr)
        return;
    if (cudaSetDevice(be->device) == cudaSuccess)
        (void)cudaFree(ptr); // synchronizes: no enqueued op still uses ptr
}

// Returns once src has been read (kv/ reuses its arrays right away): a
// pageable source is staged by the runtime before cudaMemcpyAsync returns;
// a pinned one is copied by DMA later, so wait for it.
static int cu_upload(struct backend *be, void *dst, const void *src, size_t bytes) {
    CU_NOT_RECORDING(be, "upload");
    CU_ENTER(be);
    if (bytes == 0)
        return VERR_OK;
    struct cuda_backend *cb = cb_of(be);
    CU_CHECK(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cb->stream));
    struct cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, src) != cudaSuccess) {
        (void)cudaGetLastError();
        attr.type = cudaMemoryTypeUnregistered;
    }
    if (attr.type == cudaMemoryTypeHost)
        CU_CHECK(be, cudaStreamSynchronize(cb->stream));
    return VERR_OK;
}

static int cu_download(struct backend *be, void *dst, const void *src, size_t bytes) {
    CU_NOT_RECORDING(be, "download");
    CU_ENTER(be);
    if (bytes == 0)
        return VERR_OK;
    CU_CHECK(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cb_of(be)->stream));
    return VERR_OK;
}

static int cu_memset_zero(struct backend *be, void *dst, size_t bytes) {
    CU_ENTER(be);
    if (bytes == 0)
        return VERR_OK;
    CU_CHECK(be, cudaMemsetAsync(dst, 0, bytes, cb_of(be)->stream));
    return VERR_OK;
}

// With a block-quantized KV cache in use, also reads the stores' error word
// (cu_kvq_bad_word): a K or V value they could not encode fails the sync,
// once, and clears the word.
static int cu_sync(struct backend *be) {
    CU_NOT_RECORDING(be, "sync");
    CU_ENTER(be);
    struct cuda_backend *cb = cb_of(be);
    if (cb->kvq_bad)
        CU_CHECK(be, cudaMemcpyAsync(cb->kvq_bad_host, cb->kvq_bad, sizeof(int),
                                     cudaMemcpyDeviceToHost, cb->stream));
    CU_CHECK(be, cudaStreamSynchronize(cb->stream));
    if (cb->kvq_bad && *cb->kvq_bad_host) {
        const int t = INT_MAX - *cb->kvq_bad_host;
        *cb->kvq_bad_host = 0;
        CU_CHECK(be, cudaMemsetAsync(cb->kvq_bad, 0, sizeof(int), cb->stream));
        return verr_set(&be->err, VERR_RANGE,
                        "rope_kv_store: token %d of a batch has a K or V value that is not finite: "
                        "a block-quantized KV cache cannot hold it",
                        t);
    }
    return VERR_OK;
}

static int cu_mem_info(struct backend *be, size_t *free_bytes, size_t *total_bytes) {
    return backend_cuda_mem_info(be->device, free_bytes, total_bytes, &be->err);
}

// Page-locked staging for upload_async: the DMA engine reads it while the
// host fills the other buffer of the ring (host/model/model.c).
static int cu_alloc_host_pinned(struct backend *be, size_t bytes, void **out) {
    *out = NULL;
    CU_ENTER(be);
    cudaError_t e = cudaHostAlloc(out, bytes ? bytes : 256, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        *out = NULL;
        (void)cudaGetLastError();
        return verr_set(&be->err, e == cudaErrorMemoryAllocation ? VERR_NOMEM : VERR_BACKEND,
                        "cudaHostAlloc(%zu bytes): %s (%s:%d)", bytes, cudaGetErrorString(e),
                        __FILE__, __LINE__);
    }
    return VERR_OK;
}

static void cu_free_host_pinned(struct backend *be, void *ptr) {
    if (!ptr)
        return;
    (void)be;
    (void)cudaFreeHost(ptr); // synchronizes with the device: no copy still reads ptr
    (void)cudaGetLastError();
}

static int cu_upload_check_slot(struct backend *be, int slot) {
    if (slot < 0 || slot >= BACKEND_UPLOAD_SLOTS)
        return verr_set(&be->err, VERR_RANGE, "upload slot %d outside [0, %d)", slot,
                        BACKEND_UPLOAD_SLOTS);
    return VERR_OK;
}

// Contract (host/ops/backend.h): returns without waiting; src must stay
// untouched until upload_wait(slot).
static int cu_upload_async(struct backend *be, void *dst, const void *src, size_t bytes, int slot) {
    CU_NOT_RECORDING(be, "upload_async");
    CU_ENTER(be);
    int rc = cu_upload_check_slot(be, slot);
    if (rc)
        return rc;
    if (bytes == 0)
        return VERR_OK;
    struct cuda_backend *cb = cb_of(be);
    if (!cb->upload_ev[slot])
        CU_CHECK(be, cudaEventCreateWithFlags(&cb->upload_ev[slot], cudaEventDisableTiming));
    CU_CHECK(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cb->stream));
    CU_CHECK(be, cudaEventRecord(cb->upload_ev[slot], cb->stream));
    cb->upload_recorded[slot] = true;
    return VERR_OK;
}

static int cu_upload_wait(struct backend *be, int slot) {
    CU_NOT_RECORDING(be, "upload_wait");
    CU_ENTER(be);
    int rc = cu_upload_check_slot(be, slot);
    if (rc)
        return rc;
    struct cuda_backend *cb = cb_of(be);
    if (!cb->upload_recorded[slot])
        return VERR_OK;
    CU_CHECK(be, cudaEventSynchronize(cb->upload_ev[slot]));
    return VERR_OK;
}

// Grows the scratch buffer to at least `bytes` (stream-ordered: the old one is
// released after every op already enqueued that uses it). Graphs recorded
// with the old buffer become stale (graph_current). While recording it
// refuses to grow: the step runs eagerly once, which grows it, and the next
// recording fits.
static int cu_scratch_reserve(struct backend *be, size_t bytes) {
    struct cuda_backend *cb = cb_of(be);
    if (bytes <= cb->scratch_bytes)
        return VERR_OK;
    CU_NOT_RECORDING(be, "growing the scratch");
    cb->scratch_gen++;
    size_t want = bytes + bytes / 4;
    want = (want + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
    if (cb->scratch) {
        CU_CHECK(be, cudaFreeAsync(cb->scratch, cb->stream));
        cb->scratch = NULL;
        cb->scratch_bytes = 0;
    }
    cudaError_t e = cudaMallocAsync(&cb->scratch, want, cb->stream);
    if (e != cudaSuccess) {
        cb->scratch = NULL;
        (void)cudaGetLastError();
        return verr_set(&be->err, e == cudaErrorMemoryAllocation ? VERR_NOMEM : VERR_BACKEND,
                        "cudaMallocAsync(%zu bytes) for scratch: %s (%s:%d)", want,
                        cudaGetErrorString(e), __FILE__, __LINE__);
    }
    cb->scratch_bytes = want;
    return VERR_OK;
}

// Grows decode attention's split counters to at least n (zeroed; graphs
// recorded with the old ones are stale). While recording it leaves them:
// attention then merges its splits in a second launch, with the same bits.
static int cu_attn_sync_reserve(struct backend *be, int n) {
    struct cuda_backend *cb = cb_of(be);
    if (n <= cb->attn_sync_n || cb->recording)
        return VERR_OK;
    cb->scratch_gen++;
    const int want = n < 4096 ? 4096 : n;
    if (cb->attn_sync) {
        CU_CHECK(be, cudaFreeAsync(cb->attn_sync, cb->stream));
        cb->attn_sync = NULL;
        cb->attn_sync_n = 0;
    }
    CU_CHECK(be, cudaMallocAsync((void **)&cb->attn_sync, (size_t)want * sizeof(unsigned int),
                                 cb->stream));
    CU_CHECK(be,
             cudaMemsetAsync(cb->attn_sync, 0, (size_t)want * sizeof(unsigned int), cb->stream));
    cb->attn_sync_n = want;
    return VERR_OK;
}

// --- argument checks -----------------------------------------------------------

static int cu_check_weight(struct backend *be, const struct backend_weight *w, const char *what) {
    if (!w || !w->data)
        return verr_set(&be->err, VERR_RANGE, "%s: weight is NULL", what);
    // Every matmul form and moe_ffn take every type quant_type_supported
    // names; embed refuses MXFP4 tables itself (cuda_embed_rows).
    if (!quant_type_supported(w->type))
        return verr_set(&be->err, VERR_UNSUPPORTED,
                        "%s: weight type %s is not supported by the "
                        "CUDA backend",
                        what, ggml_type_name(w->type));
    if (w->n_in <= 0 || w->n_out <= 0 || ggml_row_bytes(w->type, w->n_in) == 0)
        return verr_set(&be->err, VERR_RANGE,
                        "%s: %s weight of %lld x %lld (n_in must be a "
                        "positive multiple of the block size)",
                        what, ggml_type_name(w->type), (long long)w->n_out, (long long)w->n_in);
    return VERR_OK;
}

// The float steps of llama.cpp's ggml_rope_yarn_corr_dim (same as host/backend/rope.c).
static float cu_corr_dim(int n_rot, int n_ctx_orig, float n_turns, float base) {
    return n_rot * logf(n_ctx_orig / (n_turns * 2 * (float)M_PI)) / (2 * logf(base));
}

// rp -> device constants; magnitude == false: pure rotation (mscale 1).
static int cu_rope_prepare(struct backend *be, struct cuda_rope *c, const struct rope_params *rp,
                           int head_dim, bool magnitude, const char *what) {
    if (!rp)
        return verr_set(&be->err, VERR_RANGE, "%s: rope params are NULL", what);
    if (rp->mode != ROPE_MODE_NORMAL && rp->mode != ROPE_MODE_NEOX)
        return verr_set(&be->err, VERR_UNSUPPORTED, "%s: rope mode %d (0 normal, 2 NeoX)", what,
                        (int)rp->mode);
    if (rp->n_rot < 2 || rp->n_rot % 2 != 0 || rp->n_rot > head_dim)
        return verr_set(&be->err, VERR_RANGE, "%s: n_rot %d must be even and in [2, %d]", what,
                        rp->n_rot, head_dim);
    if (!(rp->freq_base > 0.0f) || !(rp->freq_scale > 0.0f))
        return verr_set(&be->err, VERR_RANGE, "%s: freq_base %g and freq_scale %g must be > 0",
                        what, (double)rp->freq_base, (double)rp->freq_scale);
    c->mode = (int)rp->mode;
    c->n_rot = rp->n_rot;
    c->theta_scale = powf(rp->freq_base, -2.0f / rp->n_rot);
    c->freq_scale = rp->freq_scale;
    c->ext_factor = rp->ext_factor;
    const float start =
        floorf(cu_corr_dim(rp->n_rot, rp->n_ctx_orig, rp->beta_fast, rp->freq_base));
    const float end = ceilf(cu_corr_dim(rp->n_rot, rp->n_ctx_orig, rp->beta_slow, rp->freq_base));
    c->corr_lo = 0 > start ? 0 : start;
    c->corr_hi = (float)(rp->n_rot - 1) < end ? (float)(rp->n_rot - 1) : end;
    float mscale = 1.0f;
    if (magnitude) {
        mscale = rp->attn_factor;
        if (rp->ext_factor != 0.0f)
            mscale *= 1.0f + 0.1f * logf(1.0f / rp->freq_scale);
    }
    c->mscale = mscale;
    c->freq_factors = rp->freq_factors;
    return VERR_OK;
}

// --- ops -----------------------------------------------------------------------

static int cu_embed(struct backend *be, float *out, const struct backend_weight *table,
                    const int32_t *tokens, int n_tok) {
    CU_ENTER(be);
    int rc = cu_check_weight(be, table, "embed");
    if (rc)
        return rc;
    return cuda_embed_rows(out, table->data, table->type, table->n_in, table->n_out, tokens, n_tok,
                           cb_of(be)->stream, &be->err);
}

// act_q8: whether an op writing rows x n floats should also write them as
// q8_1 for the next mat-vec (a decode batch, whole q8_1 blocks), and the
// buffer for it in *xq (NULL: no copy). The buffer grows to the largest
// decode batch at once; growing refuses graph recording (the first decode
// step is recorded at once: the forward then runs it eagerly and records the
// next one with the buffer in place).
static int cu_xq_for(struct backend *be, int rows, int64_t n, void **xq) {
    struct cuda_backend *cb = cb_of(be);
    *xq = NULL;
    if (!be->act_q8 || rows < 1 || rows > CUDA_MATVEC_MAX_TOK || n <= 0 || n % 32 != 0)
        return VERR_OK;
    const size_t need = (size_t)CUDA_MATVEC_MAX_TOK * (size_t)quant_q8_1_row_bytes(n);
    if (need > cb->xq_bytes) {
        CU_NOT_RECORDING(be, "allocating the q8_1 copy of an activation");
        if (cb->xq)
            CU_CHECK(be, cudaFreeAsync(cb->xq, cb->stream));
        cb->xq = NULL;
        cb->xq_bytes = 0;
        CU_CHECK(be, cudaMallocAsync(&cb->xq, need, cb->stream));
        cb->xq_bytes = need;
        cb->scratch_gen++; // graphs recorded with the old buffer are stale
    }
    *xq = cb->xq;
    return VERR_OK;
}

static int cu_rms_norm(struct backend *be, float *out, const float *x, const float *w, int n_rows,
                       int n, float eps) {
    CU_ENTER(be);
    return cuda_rms_norm_apply(out, x, w, n_rows, n, eps, NULL, cb_of(be)->mvq.pdl,
                               cb_of(be)->stream, &be->err);
}

// The fused op: the norm kernel writes out's q8_1 copy in the same pass,
// offered to the mat-vec op that must come next (cu_enter).
static int cu_rms_norm_q8(struct backend *be, float *out, const float *x, const float *w,
                          int n_rows, int n, float eps) {
    CU_ENTER(be);
    void *xq = NULL;
    int rc = cu_xq_for(be, n_rows, n, &xq);
    if (!rc)
        rc = cuda_rms_norm_apply(out, x, w, n_rows, n, eps, xq, cb_of(be)->mvq.pdl,
                                 cb_of(be)->stream, &be->err);
    if (!rc)
        cb_of(be)->xq_left = (struct cu_xq){out, n_rows, n, xq != NULL, true};
    return rc;
}

_Static_assert(BACKEND_ACT_Q8_MAX_TOK == CUDA_MATVEC_MAX_TOK,
               "act_q8 covers exactly the mat-vec batches");

// The decode mat-vec of segments sharing x: f32 activations, or with act_q8
// (backend.h) x quantized to q8_1 in the scratch first and the dp4a kernels.
// x as q8_1 blocks for the act_q8 mat-vec: the copy the op just before
// wrote (rms_norm_q8, attention) when it is x, else x quantized into dst
// (NULL: the scratch).
static int cu_xq_into(struct backend *be, const float *x, int n_tok, int64_t n_in, void *dst,
                      const void **xq) {
    struct cuda_backend *cb = cb_of(be);
    const struct cu_xq *o = &cb->xq_offer;
    if (o->copied && x == o->src && n_tok == o->rows && n_in == o->n) {
        *xq = cb->xq;
        return VERR_OK;
    }
    if (o->strict && o->copied)
        return verr_set(&be->err, VERR_RANGE,
                        "mat-vec after rms_norm_q8 reads rows of %lld, the norm wrote %lld",
                        (long long)n_in, (long long)o->n);
    const int64_t row = quant_q8_1_row_bytes(n_in);
    if (row <= 0)
        return verr_set(&be->err, VERR_RANGE, "matmul: n_in %lld is not a multiple of 32",
                        (long long)n_in);
    int rc = dst ? VERR_OK : cu_scratch_reserve(be, (size_t)n_tok * (size_t)row);
    if (!dst)
        dst = cb->scratch;
    if (!rc)
        rc = cuda_quantize_q8_1(dst, x, n_tok, n_in, cb->mvq.pdl, cb->stream, &be->err);
    *xq = dst;
    return rc;
}

static int cu_xq_of(struct backend *be, const float *x, int n_tok, int64_t n_in, const void **xq) {
    return cu_xq_into(be, x, n_tok, n_in, NULL, xq);
}

// One decode mat-vec launch over segments of one type sharing x; xq: x as
// q8_1 (cu_xq_of) when act_q8 applies to the type, else unused (NULL: get it).
static int cu_matvec(struct backend *be, const struct cuda_mv_seg *segs, int n_seg,
                     enum ggml_type type, int64_t n_in, const float *x, const void *xq, int n_tok,
                     enum cuda_mv_epilogue epi) {
    struct cuda_backend *cb = cb_of(be);
    if (!be->act_q8 || !quant_q8_1_dot_supported(type))
        return cuda_matvec_plan_segs(segs, n_seg, type, n_in, x, n_tok, epi, &cb->mvf, cb->mvq.pdl,
                                     cb->stream, &be->err);
    int rc = xq ? VERR_OK : cu_xq_of(be, x, n_tok, n_in, &xq);
    if (!rc)
        rc = cuda_matvec_q8_segs(segs, n_seg, type, n_in, xq, n_tok, epi, &cb->mvq, cb->stream,
                                 &be->err);
    return rc;
}

// The matmul op's work, also for the fused ops' unfused paths (no cu_enter:
// they are inside one op).
static int cu_matmul_one(struct backend *be, float *out, const struct backend_weight *w,
                         const float *x, const float *bias, int n_tok) {
    int rc = cu_check_weight(be, w, "matmul");
    if (rc)
        return rc;
    if (n_tok <= 0)
        return VERR_OK;
    if ((const void *)out == (const void *)x)
        return verr_set(&be->err, VERR_RANGE, "matmul: out must not alias x");
    struct cuda_backend *cb = cb_of(be);
    if (n_tok <= CUDA_MATVEC_MAX_TOK) {
        const struct cuda_mv_seg seg = {out, w->data, bias, w->n_out};
        return cu_matvec(be, &seg, 1, w->type, w->n_in, x, NULL, n_tok, CUDA_MV_STORE);
    }
    rc = cu_scratch_reserve(be, cuda_matmul_scratch_bytes(w->type, w->n_in, w->n_out, n_tok));
    if (rc)
        return rc;
    return cuda_matmul_apply(cb->cublas, out, w->data, w->type, w->n_in, w->n_out, x, bias, n_tok,
                             0, cb->scratch, cb->scratch_bytes, cb->stream, &be->err);
}

static int cu_matmul(struct backend *be, float *out, const struct backend_weight *w, const float *x,
                     const float *bias, int n_tok) {
    CU_ENTER_READING(be, x, n_tok);
    return cu_matmul_one(be, out, w, x, bias, n_tok);
}

// Decode batches: one mat-vec launch per weight type among the matrices
// (Q4_K_M-like files keep V in Q6_K: Q and K share a launch), with x
// quantized once for all of them under act_q8; larger batches: one matmul
// each.
static int cu_matmul_multi(struct backend *be, const struct backend_mm *mm, int n, const float *x,
                           int n_tok) {
    CU_ENTER_READING(be, x, n_tok);
    if (!mm || n < 1 || n > BACKEND_MM_MAX || n > CUDA_MV_MAX_SEGS)
        return verr_set(&be->err, VERR_RANGE, "matmul_multi: %d matrices (1 to %d)", n,
                        BACKEND_MM_MAX);
    for (int i = 0; i < n; i++) {
        int rc = cu_check_weight(be, mm[i].w, "matmul_multi");
        if (rc)
            return rc;
        if (mm[i].w->n_in != mm[0].w->n_in)
            return verr_set(&be->err, VERR_RANGE,
                            "matmul_multi: matrix %d has n_in %lld, matrix 0 has %lld", i,
                            (long long)mm[i].w->n_in, (long long)mm[0].w->n_in);
        if ((const void *)mm[i].out == (const void *)x)
            return verr_set(&be->err, VERR_RANGE, "matmul_multi: out %d aliases x", i);
    }
    if (n_tok <= 0)
        return VERR_OK;
    if (n_tok <= CUDA_MATVEC_MAX_TOK) {
        const int64_t n_in = mm[0].w->n_in;
        const void *xq = NULL;
        bool done[BACKEND_MM_MAX] = {false};
        for (int i = 0; i < n; i++) {
            if (done[i])
                continue;
            const enum ggml_type t = mm[i].w->type;
            struct cuda_mv_seg segs[CUDA_MV_MAX_SEGS];
            int n_seg = 0;
            for (int j = i; j < n; j++)
                if (!done[j] && mm[j].w->type == t) {
                    segs[n_seg++] =
                        (struct cuda_mv_seg){mm[j].out, mm[j].w->data, mm[j].bias, mm[j].w->n_out};
                    done[j] = true;
                }
            int rc = VERR_OK;
            if (be->act_q8 && quant_q8_1_dot_supported(t) && !xq)
                rc = cu_xq_of(be, x, n_tok, n_in, &xq);
            if (!rc)
                rc = cu_matvec(be, segs, n_seg, t, n_in, x, xq, n_tok, CUDA_MV_STORE);
            if (rc)
                return rc;
        }
        return VERR_OK;
    }
    for (int i = 0; i < n; i++) {
        int rc = cu_matmul_one(be, mm[i].out, mm[i].w, x, mm[i].bias, n_tok);
        if (rc)
            return rc;
    }
    return VERR_OK;
}

static int cu_matmul_add(struct backend *be, float *y, const struct backend_weight *w,
                         const float *x, int n_tok) {
    CU_ENTER_READING(be, x, n_tok);
    int rc = cu_check_weight(be, w, "matmul_add");
    if (rc)
        return rc;
    if (n_tok <= 0)
        return VERR_OK;
    if ((const void *)y == (const void *)x)
        return verr_set(&be->err, VERR_RANGE, "matmul_add: y must not alias x");
    struct cuda_backend *cb = cb_of(be);
    if (n_tok <= CUDA_MATVEC_MAX_TOK) {
        const struct cuda_mv_seg seg = {y, w->data, NULL, w->n_out};
        return cu_matvec(be, &seg, 1, w->type, w->n_in, x, NULL, n_tok, CUDA_MV_ADD);
    }
    rc = cu_scratch_reserve(be, cuda_matmul_scratch_bytes(w->type, w->n_in, w->n_out, n_tok));
    if (rc)
        return rc;
    return cuda_matmul_apply(cb->cublas, y, w->data, w->type, w->n_in, w->n_out, x, NULL, n_tok, 1,
                             cb->scratch, cb->scratch_bytes, cb->stream, &be->err);
}

// matmul_swiglu / matmul_geglu: one gated mat-vec launch for decode
// batches, else two matmuls and the elementwise op (epi: CUDA_MV_SWIGLU or
// CUDA_MV_GEGLU; `what` names the op in messages).
static int cu_matmul_gated(struct backend *be, float *out, float *up_tmp,
                           const struct backend_weight *w_gate, const struct backend_weight *w_up,
                           const float *x, int n_tok, enum cuda_mv_epilogue epi, const char *what) {
    int rc = cu_check_weight(be, w_gate, what);
    if (!rc)
        rc = cu_check_weight(be, w_up, what);
    if (rc)
        return rc;
    if (w_gate->n_in != w_up->n_in || w_gate->n_out != w_up->n_out)
        return verr_set(&be->err, VERR_RANGE,
                        "%s: gate [%lld, %lld] and up [%lld, %lld] differ in shape", what,
                        (long long)w_gate->n_in, (long long)w_gate->n_out, (long long)w_up->n_in,
                        (long long)w_up->n_out);
    if (n_tok <= 0)
        return VERR_OK;
    if (n_tok <= CUDA_MATVEC_MAX_TOK && w_gate->type == w_up->type) {
        if ((const void *)out == (const void *)x)
            return verr_set(&be->err, VERR_RANGE, "%s: out aliases x", what);
        const struct cuda_mv_seg segs[2] = {{out, w_gate->data, NULL, w_gate->n_out},
                                            {out, w_up->data, NULL, w_up->n_out}};
        return cu_matvec(be, segs, 2, w_gate->type, w_gate->n_in, x, NULL, n_tok, epi);
    }
    rc = cu_matmul_one(be, out, w_gate, x, NULL, n_tok);
    if (!rc)
        rc = cu_matmul_one(be, up_tmp, w_up, x, NULL, n_tok);
    const int64_t n = (int64_t)n_tok * w_gate->n_out;
    if (!rc)
        rc = epi == CUDA_MV_GEGLU
                 ? cuda_geglu_apply(out, out, up_tmp, n, cb_of(be)->stream, &be->err)
                 : cuda_swiglu_apply(out, out, up_tmp, n, cb_of(be)->stream, &be->err);
    return rc;
}

static int cu_matmul_swiglu(struct backend *be, float *out, float *up_tmp,
                            const struct backend_weight *w_gate, const struct backend_weight *w_up,
                            const float *x, int n_tok) {
    CU_ENTER_READING(be, x, n_tok);
    return cu_matmul_gated(be, out, up_tmp, w_gate, w_up, x, n_tok, CUDA_MV_SWIGLU,
                           "matmul_swiglu");
}

static int cu_matmul_geglu(struct backend *be, float *out, float *up_tmp,
                           const struct backend_weight *w_gate, const struct backend_weight *w_up,
                           const float *x, int n_tok) {
    CU_ENTER_READING(be, x, n_tok);
    return cu_matmul_gated(be, out, up_tmp, w_gate, w_up, x, n_tok, CUDA_MV_GEGLU, "matmul_geglu");
}

static int cu_rope(struct backend *be, float *x, const int32_t *pos, int n_tok, int n_head,
                   int head_dim, const struct rope_params *rp) {
    CU_ENTER(be);
    struct cuda_rope c;
    int rc = cu_rope_prepare(be, &c, rp, head_dim, true, "rope");
    if (rc)
        return rc;
    return cuda_rope_apply(x, pos, n_tok, n_head, head_dim, &c, NULL, NULL, GGML_TYPE_F32, NULL,
                           GGML_TYPE_F32, NULL, 0, NULL, 0, NULL, cb_of(be)->mvq.pdl,
                           cb_of(be)->stream, &be->err);
}

// The cache types the CUDA ops take: the floats and every quantized one
// (backend_cache_type_quantized): the store encodes, kv_shift re-encodes and
// attention decodes them (cuda/kv_quant.cuh).
static bool cu_is_cache_type(enum ggml_type t) {
    return backend_cache_type_ok(t) || backend_cache_type_quantized(t);
}

// The word a K/V store into a block-quantized cache marks when it meets a
// non-finite value (cuda_rope_apply's `bad`), for cu_sync to report as the
// CPU store does at once (*bad NULL for float caches). Allocated at the
// first such store, outside graph recording (a recorded step has run
// eagerly before, which allocated it).
static int cu_kvq_bad_word(struct backend *be, enum ggml_type tk, enum ggml_type tv, void **bad) {
    struct cuda_backend *cb = cb_of(be);
    *bad = NULL;
    if (!backend_cache_type_blocks(tk) && !backend_cache_type_blocks(tv))
        return VERR_OK;
    if (!cb->kvq_bad) {
        CU_NOT_RECORDING(be, "allocating the quantized K/V store's error word");
        CU_CHECK(be, cudaHostAlloc((void **)&cb->kvq_bad_host, sizeof(int), cudaHostAllocDefault));
        *cb->kvq_bad_host = 0;
        CU_CHECK(be, cudaMallocAsync((void **)&cb->kvq_bad, sizeof(int), cb->stream));
        CU_CHECK(be, cudaMemsetAsync(cb->kvq_bad, 0, sizeof(int), cb->stream));
        cb->scratch_gen++; // graphs recorded before stored without it
    }
    *bad = cb->kvq_bad;
    return VERR_OK;
}

static int cu_rope_kv_store(struct backend *be, float *q, int n_head, float *k, const float *v,
                            void *k_cache, enum ggml_type type_k, void *v_cache,
                            enum ggml_type type_v, const int32_t *pos, const int32_t *cells,
                            int n_tok, int n_head_kv, int head_dim, int head_dim_v,
                            const struct rope_params *rp) {
    CU_ENTER(be);
    if (!cu_is_cache_type(type_k) || !cu_is_cache_type(type_v))
        return verr_set(&be->err, VERR_UNSUPPORTED,
                        "rope_kv_store: cache types %s/%s (a float or quantized cache type)",
                        ggml_type_name(type_k), ggml_type_name(type_v));
    if (!k_cache || !v_cache || !cells || !v)
        return verr_set(&be->err, VERR_RANGE, "rope_kv_store: NULL cache, cells or v");
    if (q && n_head <= 0)
        return verr_set(&be->err, VERR_RANGE, "rope_kv_store: q with %d heads", n_head);
    struct cuda_rope c = {0}; // rp NULL: n_rot 0, a plain store (the unrotated cache)
    int rc = rp ? cu_rope_prepare(be, &c, rp, head_dim, true, "rope_kv_store") : VERR_OK;
    void *bad = NULL;
    if (!rc)
        rc = cu_kvq_bad_word(be, type_k, type_v, &bad);
    if (rc)
        return rc;
    return cuda_rope_apply(k, pos, n_tok, n_head_kv, head_dim, &c, v, k_cache, type_k, v_cache,
                           type_v, cells, head_dim_v, rp ? q : NULL, n_head, bad,
                           cb_of(be)->mvq.pdl, cb_of(be)->stream, &be->err);
}

static int cu_rope_kv_store_rot(struct backend *be, float *q, int n_head, float *k, float *v,
                                void *k_cache, enum ggml_type type_k, void *v_cache,
                                enum ggml_type type_v, const int32_t *pos, const int32_t *cells,
                                int n_tok, int n_head_kv, int head_dim, int head_dim_v,
                                const struct rope_params *rp, int rot_k, int rot_v) {
    CU_ENTER(be);
    if (!cu_is_cache_type(type_k) || !cu_is_cache_type(type_v))
        return verr_set(&be->err, VERR_UNSUPPORTED,
                        "rope_kv_store_rot: cache types %s/%s (a float or quantized cache type)",
                        ggml_type_name(type_k), ggml_type_name(type_v));
    if (!k || !k_cache || !v_cache || !cells || !v || !pos)
        return verr_set(&be->err, VERR_RANGE, "rope_kv_store_rot: NULL k, v, cache, pos or cells");
    struct cuda_rope c = {0}; // rp NULL: n_rot 0, no RoPE (the unrotated cache)
    int rc = rp ? cu_rope_prepare(be, &c, rp, head_dim, true, "rope_kv_store_rot") : VERR_OK;
    void *bad = NULL;
    if (!rc)
        rc = cu_kvq_bad_word(be, type_k, type_v, &bad);
    if (rc)
        return rc;
    return cuda_rope_store_rotated(k, pos, n_tok, n_head_kv, head_dim, &c, v, k_cache, type_k,
                                   v_cache, type_v, cells, head_dim_v, q, n_head, rot_k, rot_v, bad,
                                   cb_of(be)->stream, &be->err);
}

static int cu_attention(struct backend *be, const struct attn_args *a) {
    CU_ENTER(be);
    if (a->sinks && a->rope)
        return verr_set(&be->err, VERR_UNSUPPORTED,
                        "attention: sinks with RoPE inside (the unrotated cache of self-extend)");
    if (!cu_is_cache_type(a->type_k) || !cu_is_cache_type(a->type_v))
        return verr_set(&be->err, VERR_UNSUPPORTED,
                        "attention: cache types %s/%s (a float or quantized cache type)",
                        ggml_type_name(a->type_k), ggml_type_name(a->type_v));
    if (a->n_head_kv <= 0 || a->n_head % a->n_head_kv != 0)
        return verr_set(&be->err, VERR_RANGE,
                        "attention: n_head %d is not a multiple of n_head_kv %d", a->n_head,
                        a->n_head_kv);
    if (a->head_dim < 1 || a->head_dim > CUDA_ATTN_MAX_HEAD_DIM || a->head_dim_v < 1 ||
        a->head_dim_v > CUDA_ATTN_MAX_HEAD_DIM)
        return verr_set(&be->err, VERR_UNSUPPORTED,
                        "attention: head dims %d/%d (the CUDA kernels take up to %d)", a->head_dim,
                        a->head_dim_v, CUDA_ATTN_MAX_HEAD_DIM);
    struct cuda_backend *cb = cb_of(be);
    struct cuda_attn ca = {
        .out = a->out,
        .q = a->q,
        .k = a->k,
        .v = a->v,
        .type_k = a->type_k,
        .type_v = a->type_v,
        .cell_pos = a->cell_pos,
        .cell_seq = a->cell_seq,
        .seq_words = a->seq_words,
        .q_pos = a->q_pos,
        .q_seq = a->q_seq,
        .n_tok = a->n_tok,
        .n_kv = a->n_kv,
        .n_head = a->n_head,
        .n_head_kv = a->n_head_kv,
        .head_dim = a->head_dim,
        .head_dim_v = a->head_dim_v,
        .scale = a->scale,
        .window = a->window,
        .split_blocks_per_sm = cb->attn_split_blocks_per_sm,
        .split_min_cells = cb->attn_split_min_cells,
        .decode = cb->attn_decode,
    };
    if (a->rope) { // the unrotated cache: attn_kernel rotates q and K
        int rc_rope = cu_rope_prepare(be, &ca.rope, a->rope, a->head_dim, true, "attention");
        if (rc_rope)
            return rc_rope;
        ca.rope_on = 1;
        ca.se_g = a->se_g;
        ca.se_w = a->se_w;
        ca.q_se = a->q_se; // each token's own G and W, or NULL
    }
    int rc = cu_scratch_reserve(be, cuda_attention_scratch_bytes(&ca, cb->sm_count));
    if (!rc)
        rc = cu_attn_sync_reserve(be, cuda_attention_sync_count(&ca, cb->sm_count));
    ca.sync = cb->attn_sync;
    ca.sync_n = cb->attn_sync_n;
    const int64_t n_out = (int64_t)a->n_head * a->head_dim_v;
    if (!rc && a->out_q8 && a->head_dim_v % 32 == 0)
        rc = cu_xq_for(be, a->n_tok, n_out, &ca.xq);
    // Attention launches without PDL (cuda/launch.cuh): it waits for the
    // mat-vec or RoPE before it, and the op after it waits for it.
    if (!rc)
        rc = cuda_attention_apply(&ca, a->sinks, cb->sm_count, cb->scratch, cb->scratch_bytes,
                                  cb->stream, &be->err);
    if (!rc && a->out_q8)
        cb->xq_left = (struct cu_xq){a->out, a->n_tok, n_out, ca.xq != NULL, true};
    return rc;
}

static int cu_kv_shift(struct backend *be, void *k_cache, enum ggml_type type_k,
                       const int32_t *delta, int n_layer, int n_ctx, int n_head_kv, int head_dim,
                       const struct rope_params *rp, int rot_block) {
    CU_ENTER(be);
    if (!cu_is_cache_type(type_k))
        return verr_set(&be->err, VERR_UNSUPPORTED,
                        "kv_shift: cache type %s (a float or quantized cache type)",
                        ggml_type_name(type_k));
    struct cuda_rope c;
    int rc = cu_rope_prepare(be, &c, rp, head_dim, false, "kv_shift");
    if (rc)
        return rc;
    return cuda_rope_shift_kv(k_cache, type_k, delta, n_layer, n_ctx, n_head_kv, head_dim, &c,
                              rot_block, cb_of(be)->stream, &be->err);
}

static int cu_hadamard(struct backend *be, float *x, int64_t n_rows, int n, int block) {
    CU_ENTER(be);
    return cuda_hadamard_apply(x, n_rows, n, block, NULL, cb_of(be)->stream, &be->err);
}

// The fused op: the rotated rows' q8_1 copy offered to the mat-vec op that
// must come next (cu_enter), as cu_rms_norm_q8's.
static int cu_hadamard_q8(struct backend *be, float *x, int64_t n_rows, int n, int block) {
    CU_ENTER(be);
    if (n_rows > INT_MAX)
        return verr_set(&be->err, VERR_RANGE, "hadamard_q8: %lld rows", (long long)n_rows);
    void *xq = NULL;
    int rc = cu_xq_for(be, (int)n_rows, n, &xq);
    if (!rc)
        rc = cuda_hadamard_apply(x, n_rows, n, block, xq, cb_of(be)->stream, &be->err);
    if (!rc)
        cb_of(be)->xq_left = (struct cu_xq){x, (int)n_rows, n, xq != NULL, true};
    return rc;
}

static int cu_swiglu(struct backend *be, float *out, const float *gate, const float *up,
                     int64_t n) {
    CU_ENTER(be);
    return cuda_swiglu_apply(out, gate, up, n, cb_of(be)->stream, &be->err);
}

static int cu_geglu(struct backend *be, float *out, const float *gate, const float *up, int64_t n) {
    CU_ENTER(be);
    return cuda_geglu_apply(out, gate, up, n, cb_of(be)->stream, &be->err);
}

static int cu_scale(struct backend *be, float *x, float s, int64_t n) {
    CU_ENTER(be);
    return cuda_scale_apply(x, s, n, cb_of(be)->stream, &be->err);
}

static int cu_add(struct backend *be, float *x, const float *y, int64_t n) {
    CU_ENTER(be);
    return cuda_add_apply(x, y, n, cb_of(be)->stream, &be->err);
}

static int cu_add_sigmoid_scaled(struct backend *be, float *y, const float *s, const float *g,
                                 int n_tok, int n) {
    CU_ENTER(be);
    const int rc = backend_check_add_sigmoid_scaled(be, "cuda", y, s, g, n_tok, n);
    if (rc)
        return rc;
    return cuda_add_sigmoid_scaled(y, s, g, n_tok, n, cb_of(be)->stream, &be->err);
}

static int cu_get_rows(struct backend *be, float *out, const float *x, const int32_t *rows,
                       int n_out_rows, int n) {
    CU_ENTER(be);
    return cuda_get_rows(out, x, rows, n_out_rows, n, cb_of(be)->stream, &be->err);
}

static int cu_argmax(struct backend *be, int32_t *out, const float *logits, int n_rows,
                     int n_vocab) {
    CU_ENTER(be);
    return cuda_argmax_rows(out, logits, n_rows, n_vocab, cb_of(be)->mvq.pdl, cb_of(be)->stream,
                            &be->err);
}

// min_p's logf is taken here, in C with the host's libm, as host/backend/sampler.c
// takes it: the threshold max + logf(min_p) is then the same float on both.
static int cu_sample(struct backend *be, int32_t *out, const float *logits, int n_rows, int n_vocab,
                     const struct sample_params *sp) {
    CU_NOT_RECORDING(be, "sample (its rows are host memory)");
    CU_ENTER(be);
    if (n_rows < 0 || n_vocab <= 0)
        return verr_set(&be->err, VERR_RANGE, "sample: shape %d x %d", n_rows, n_vocab);
    if (n_rows == 0)
        return VERR_OK;
    if (!out || !logits || !sp)
        return verr_set(&be->err, VERR_RANGE, "sample: NULL pointer");
    struct cuda_sample_row *rows = malloc((size_t)n_rows * sizeof *rows);
    if (!rows)
        return verr_set(&be->err, VERR_NOMEM, "sample: out of host memory");
    int rc = VERR_OK;
    for (int r = 0; r < n_rows && !rc; r++) {
        const struct sample_params *p = &sp[r];
        if (!(p->u >= 0.0 && p->u < 1.0))
            rc = verr_set(&be->err, VERR_RANGE, "sample: row %d: u %g is not in [0, 1)", r, p->u);
        rows[r] = (struct cuda_sample_row){
            .temp = p->temp,
            .top_p = p->top_p,
            .min_p = p->min_p,
            .log_min_p = p->min_p <= 0.0f ? 0.0f : logf(p->min_p),
            .top_k = p->top_k,
            .u = p->u,
        };
    }
    size_t need = 0;
    if (!rc)
        rc = cuda_sample_scratch_bytes(n_rows, n_vocab, rows, &need, &be->err);
    if (!rc)
        rc = cu_scratch_reserve(be, need);
    if (!rc) {
        struct cuda_backend *cb = cb_of(be);
        rc = cuda_sample_rows(out, logits, n_rows, n_vocab, rows, cb->scratch, cb->scratch_bytes,
                              cb->stream, &be->err);
    }
    free(rows);
    return rc;
}

// --- mixture of experts ----------------------------------------------------------

static int cu_moe_route(struct backend *be, int32_t *ids, float *weights, const float *logits,
                        int n_tok, int n_expert, int k, enum moe_gating gating) {
    CU_ENTER(be);
    return cuda_moe_route(ids, weights, logits, n_tok, n_expert, k, (int)gating, cb_of(be)->stream,
                          &be->err);
}
_Static_assert((int)MOE_GATING_SOFTMAX == CUDA_MOE_SOFTMAX &&
                   (int)MOE_GATING_SOFTMAX_RENORM == CUDA_MOE_SOFTMAX_RENORM &&
                   (int)MOE_GATING_SOFTMAX_WEIGHT == CUDA_MOE_SOFTMAX_WEIGHT,
               "cuda_moe_route takes enum moe_gating's values");
_Static_assert((int)MOE_ACT_SWIGLU == CUDA_MOE_SWIGLU &&
                   (int)MOE_ACT_SWIGLU_OAI == CUDA_MOE_SWIGLU_OAI,
               "cuda_moe_glu takes enum moe_act's values");

// The host-side checks of moe_ffn (the ids are device memory: the kernels
// clamp them instead).
static int cu_moe_check(struct backend *be, const struct moe_args *a) {
    if (!a || a->n_tok < 0 || a->n_expert < 1 || a->n_expert > CUDA_MOE_MAX_EXPERT || a->k < 1 ||
        a->k > a->n_expert)
        return verr_set(&be->err, VERR_RANGE,
                        "moe_ffn: %d tokens, %d experts, k %d (need 1 <= k <= n_expert <= %d)",
                        a ? a->n_tok : 0, a ? a->n_expert : 0, a ? a->k : 0, CUDA_MOE_MAX_EXPERT);
    int rc = cu_check_weight(be, a->gate, "moe_ffn gate");
    if (!rc)
        rc = cu_check_weight(be, a->up, "moe_ffn up");
    if (!rc)
        rc = cu_check_weight(be, a->down, "moe_ffn down");
    if (rc)
        return rc;
    const struct backend_weight *g = a->gate, *u = a->up, *d = a->down;
    if (g->n_out % a->n_expert || d->n_out % a->n_expert || g->n_in != u->n_in ||
        g->n_out != u->n_out || g->type != u->type || d->n_in != g->n_out / a->n_expert ||
        d->n_out / a->n_expert != g->n_in)
        return verr_set(&be->err, VERR_RANGE,
                        "moe_ffn: expert stacks gate %lld x %lld (%s), up %lld x %lld (%s), down "
                        "%lld x %lld do not fit %d experts",
                        (long long)g->n_out, (long long)g->n_in, ggml_type_name(g->type),
                        (long long)u->n_out, (long long)u->n_in, ggml_type_name(u->type),
                        (long long)d->n_out, (long long)d->n_in, a->n_expert);
    if (a->n_tok > 0 && (!a->out || !a->x || !a->ids || !a->weights || !a->tmp))
        return verr_set(&be->err, VERR_RANGE, "moe_ffn: NULL pointer");
    if (a->act != MOE_ACT_SWIGLU && a->act != MOE_ACT_SWIGLU_OAI)
        return verr_set(&be->err, VERR_RANGE, "moe_ffn: act %d (swiglu 0 or swiglu_oai 1)",
                        (int)a->act);
    if ((const void *)a->out == (const void *)a->x || a->out == a->tmp)
        return verr_set(&be->err, VERR_RANGE, "moe_ffn: out aliases x or tmp");
    if ((int64_t)a->n_tok * a->k > INT32_MAX / 2)
        return verr_set(&be->err, VERR_RANGE, "moe_ffn: %d tokens x %d experts are too many",
                        a->n_tok, a->k);
    return VERR_OK;
}

static size_t cu_align16(size_t bytes) {
    return (bytes + 15) & ~(size_t)15;
}

// One expert-mode mat-vec over every pair (cuda/matvec.h): q8_1 activations
// under act_q8 where the type has a dp4a kernel (x quantized into xq_buf,
// or the copy the op before left), else f32 (the dense matmul's choice).
static int cu_moe_matvec(struct backend *be, const struct cuda_mv_seg *segs, int n_seg,
                         enum ggml_type type, int64_t n_in, const float *x, int n_x_rows,
                         const struct cuda_mv_experts *ex, enum cuda_mv_epilogue epi,
                         void *xq_buf) {
    struct cuda_backend *cb = cb_of(be);
    if (!be->act_q8 || !quant_q8_1_dot_supported(type))
        return cuda_matvec_plan_experts(segs, n_seg, type, n_in, x, ex, epi, &cb->mvf, cb->stream,
                                        &be->err);
    const void *xq = NULL;
    int rc = cu_xq_into(be, x, n_x_rows, n_in, xq_buf, &xq);
    if (!rc)
        rc = cuda_matvec_q8_experts(segs, n_seg, type, n_in, xq, ex, epi, &cb->mvq, cb->stream,
                                    &be->err);
    return rc;
}

// h = act(gate + gate_b, up + up_b) over the pairs (gate, up [n_pairs][n_ff]
// the experts' outputs; h may be gate).
static int cu_moe_glu(struct backend *be, const struct moe_args *a, float *h, const float *gate,
                      const float *up) {
    const int64_t n_ff = a->gate->n_out / a->n_expert;
    return cuda_moe_glu(h, gate, up, a->gate_b, a->up_b, a->ids, a->n_tok * a->k, a->n_expert, n_ff,
                        (int)a->act, a->alpha, a->limit, cb_of(be)->stream, &be->err);
}

// Whether gate and up take the fused SwiGLU epilogue of the expert mat-vec:
// plain SwiGLU without their biases (otherwise both are stored, then
// cu_moe_glu).
static bool cu_moe_fused_glu(const struct moe_args *a) {
    return a->act == MOE_ACT_SWIGLU && !a->gate_b && !a->up_b;
}

// h = act(gate_e x + gate_b, up_e x + up_b) for every pair through the
// expert mat-vecs: the fused SwiGLU epilogue, or gate into h and up into up
// stored, then cu_moe_glu.
static int cu_moe_gate_up(struct backend *be, const struct moe_args *a, float *h, float *up,
                          const struct cuda_mv_experts *ex, void *xq) {
    const int64_t n_embd = a->gate->n_in, n_ff = a->gate->n_out / a->n_expert;
    const enum ggml_type t = a->gate->type;
    if (cu_moe_fused_glu(a)) {
        const struct cuda_mv_seg gu[2] = {{h, a->gate->data, NULL, n_ff},
                                          {h, a->up->data, NULL, n_ff}};
        return cu_moe_matvec(be, gu, 2, t, n_embd, a->x, a->n_tok, ex, CUDA_MV_SWIGLU, xq);
    }
    const struct cuda_mv_seg g = {h, a->gate->data, NULL, n_ff};
    const struct cuda_mv_seg u = {up, a->up->data, NULL, n_ff};
    int rc = cu_moe_matvec(be, &g, 1, t, n_embd, a->x, a->n_tok, ex, CUDA_MV_STORE, xq);
    if (!rc)
        rc = cu_moe_matvec(be, &u, 1, t, n_embd, a->x, a->n_tok, ex, CUDA_MV_STORE, xq);
    return rc ? rc : cu_moe_glu(be, a, h, h, up);
}

// The mat-vec path (decode batches, and prompt batches the grouped GEMM
// does not take): every (token, slot) pair through its expert's rows.
// tmp: h [n_pairs][n_ff], y [n_pairs][n_embd], without the fused epilogue
// up [n_pairs][n_ff], then the q8_1 activations.
static int cu_moe_ffn_matvec(struct backend *be, const struct moe_args *a) {
    const int64_t n_embd = a->gate->n_in, n_ff = a->gate->n_out / a->n_expert;
    const int n_pairs = a->n_tok * a->k;
    const bool fused = cu_moe_fused_glu(a);
    float *h = a->tmp;
    float *y = h + (size_t)n_pairs * n_ff;
    float *up = y + (size_t)n_pairs * n_embd;
    const size_t used =
        cu_align16((size_t)n_pairs * (n_ff + n_embd + (fused ? 0 : n_ff)) * sizeof(float));
    const int64_t xq_row = quant_q8_1_row_bytes(n_ff > n_embd ? n_ff : n_embd);
    const size_t xq_bytes = xq_row > 0 ? (size_t)n_pairs * (size_t)xq_row : 0;
    if (used + xq_bytes > BACKEND_MOE_TMP(a->n_tok, a->k, n_embd, n_ff) * sizeof(float))
        return verr_set(&be->err, VERR_RANGE,
                        "moe_ffn: n_ff %lld and n_embd %lld do not fit the mat-vec path's scratch",
                        (long long)n_ff, (long long)n_embd);
    void *xq = (char *)a->tmp + used;
    struct cuda_mv_experts ex = {a->ids, n_pairs, a->n_expert, a->k};
    int rc = cu_moe_gate_up(be, a, h, up, &ex, xq);
    if (rc)
        return rc;
    cb_of(be)->xq_offer = (struct cu_xq){0}; // h is not the norm's output
    const struct cuda_mv_seg dn = {y, a->down->data, NULL, n_embd};
    ex.x_div = 1;
    rc = cu_moe_matvec(be, &dn, 1, a->down->type, n_ff, h, n_pairs, &ex, CUDA_MV_STORE, xq);
    if (!rc)
        rc = cuda_moe_combine(a->out, y, a->weights, a->down_b, a->ids, a->n_tok, a->k, n_embd,
                              a->n_expert, cb_of(be)->stream, &be->err);
    return rc;
}

// Tokens per tile of the grouped GEMM for these stacks, or 0 where it does
// not take them: the smallest power of two >= the mean group (16..64; a
// tile past a group's end is work thrown away), as far as both kernels fit.
static int cu_moe_tile(const struct moe_args *a) {
    const int n_pairs = a->n_tok * a->k;
    int want = 16;
    while (want < 64 && (int64_t)want * a->n_expert < n_pairs)
        want *= 2;
    const int tg = cuda_matmul_tc_group_tpb(a->gate->type, want);
    const int td = cuda_matmul_tc_group_tpb(a->down->type, want);
    return tg < td ? tg : td;
}

// The grouped path (prompt batches, quantized stacks): pairs sorted by
// expert on the device, each expert's group through the tensor-core GEMM
// (f16 activations, as the dense GEMM path computes matmul). tmp: A
// [n_pairs][max(n_ff, n_embd)] (gate, then h, then y), U [n_pairs][n_ff]
// (up, then h as f16), x as f16, order, offsets, tiles. Returns 1 without
// enqueueing anything when the tables do not fit (tiny n_embd with many
// experts): the caller takes the mat-vec path.
static int cu_moe_ffn_grouped(struct backend *be, const struct moe_args *a, int tpb) {
    struct cuda_backend *cb = cb_of(be);
    const int64_t n_embd = a->gate->n_in, n_ff = a->gate->n_out / a->n_expert;
    const int n_pairs = a->n_tok * a->k;
    const int n_tiles = cuda_moe_max_tiles(n_pairs, a->n_expert, tpb);
    const size_t wide = (size_t)(n_ff > n_embd ? n_ff : n_embd);
    char *base = (char *)a->tmp;
    size_t off = 0;
    float *A = (float *)(base + off);
    off = cu_align16(off + (size_t)n_pairs * wide * sizeof(float));
    float *U = (float *)(base + off);
    off = cu_align16(off + (size_t)n_pairs * n_ff * sizeof(float));
    uint16_t *x16 = (uint16_t *)(base + off);
    off = cu_align16(off + (size_t)a->n_tok * n_embd * sizeof(uint16_t));
    int32_t *order = (int32_t *)(base + off);
    off += (size_t)n_pairs * sizeof(int32_t);
    int32_t *offsets = (int32_t *)(base + off);
    off += (size_t)(a->n_expert + 1) * sizeof(int32_t);
    int32_t *tiles = (int32_t *)(base + off);
    off += (size_t)n_tiles * 2 * sizeof(int32_t);
    if (off > BACKEND_MOE_TMP(a->n_tok, a->k, n_embd, n_ff) * sizeof(float) || n_tiles > 65535)
        return 1;
    int rc = cuda_convert_f16(x16, a->x, (int64_t)a->n_tok * n_embd, cb->stream, &be->err);
    if (!rc)
        rc = cuda_moe_group(order, offsets, tiles, a->ids, n_pairs, a->n_expert, tpb, n_tiles,
                            cb->stream, &be->err);
    struct cuda_tc_groups g = {tiles, offsets, order, n_tiles, tpb, a->k};
    if (!rc)
        rc = cuda_matmul_q_tc_grouped(A, a->gate->data, a->gate->type, n_embd, n_ff, x16, &g,
                                      cb->stream, &be->err);
    if (!rc)
        rc = cuda_matmul_q_tc_grouped(U, a->up->data, a->up->type, n_embd, n_ff, x16, &g,
                                      cb->stream, &be->err);
    const int64_t n_h = (int64_t)n_pairs * n_ff;
    if (!rc)
        rc = cu_moe_fused_glu(a) ? cuda_swiglu_apply(A, A, U, n_h, cb->stream, &be->err)
                                 : cu_moe_glu(be, a, A, A, U);
    uint16_t *h16 = (uint16_t *)U; // U is read by the swiglu before
    if (!rc)
        rc = cuda_convert_f16(h16, A, n_h, cb->stream, &be->err);
    g.x_div = 1;
    if (!rc) // y over A: h lives on as h16
        rc = cuda_matmul_q_tc_grouped(A, a->down->data, a->down->type, n_ff, n_embd, h16, &g,
                                      cb->stream, &be->err);
    if (!rc)
        rc = cuda_moe_combine(a->out, A, a->weights, a->down_b, a->ids, a->n_tok, a->k, n_embd,
                              a->n_expert, cb->stream, &be->err);
    return rc;
}

// Decode batches (n_tok <= CUDA_MATVEC_MAX_TOK): the expert mat-vecs, which
// give each pair exactly what the dense mat-vec gives it. Larger batches:
// the grouped tensor-core GEMM for quantized stacks, else the expert
// mat-vecs over every pair. Nothing here reads the ids on the host or
// allocates, so the op records into a CUDA graph.
static int cu_moe_ffn(struct backend *be, const struct moe_args *a) {
    CU_ENTER_READING(be, a ? a->x : NULL, a ? a->n_tok : 0);
    int rc = cu_moe_check(be, a);
    if (rc || a->n_tok == 0)
        return rc;
    if (a->n_tok > CUDA_MATVEC_MAX_TOK) {
        const int tpb = cu_moe_tile(a);
        if (tpb > 0) {
            rc = cu_moe_ffn_grouped(be, a, tpb);
            if (rc != 1)
                return rc;
        }
    }
    return cu_moe_ffn_matvec(be, a);
}

// --- graphs --------------------------------------------------------------------

struct cu_graph {
    cudaGraphExec_t exec;
    uint64_t scratch_gen; // cb->scratch_gen when recorded
};

// Thread-local capture mode: an unsafe call from this thread (cudaMalloc, a
// synchronous copy) spoils the recording with an error instead of silently
// synchronising; other threads (other stages' backends) are unaffected.
static int cu_graph_begin(struct backend *be) {
    CU_ENTER(be);
    struct cuda_backend *cb = cb_of(be);
    if (cb->recording)
        return verr_set(&be->err, VERR_RANGE, "graph_begin: already recording");
    CU_CHECK(be, cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal));
    cb->recording = true;
    return VERR_OK;
}

static int cu_graph_end(struct backend *be, void **exec) {
    struct cuda_backend *cb = cb_of(be);
    if (exec)
        *exec = NULL;
    if (!cb->recording)
        return verr_set(&be->err, VERR_RANGE, "graph_end: not recording");
    cb->recording = false;
    (void)cudaSetDevice(be->device);
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(cb->stream, &graph);
    if (e != cudaSuccess || !graph) {
        (void)cudaGetLastError(); // capture errors are not sticky; clear them
        if (graph)
            (void)cudaGraphDestroy(graph);
        if (!exec)
            return VERR_OK;
        return verr_set(&be->err, VERR_BACKEND, "cudaStreamEndCapture: %s (%s:%d)",
                        cudaGetErrorString(e), __FILE__, __LINE__);
    }
    if (!exec) {
        (void)cudaGraphDestroy(graph);
        return VERR_OK;
    }
    struct cu_graph *g = calloc(1, sizeof *g);
    if (!g) {
        (void)cudaGraphDestroy(graph);
        return verr_set(&be->err, VERR_NOMEM, "graph_end: out of host memory");
    }
    e = cudaGraphInstantiate(&g->exec, graph, 0);
    (void)cudaGraphDestroy(graph); // the exec keeps its own copy
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        free(g);
        return verr_set(&be->err, VERR_BACKEND, "cudaGraphInstantiate: %s (%s:%d)",
                        cudaGetErrorString(e), __FILE__, __LINE__);
    }
    g->scratch_gen = cb->scratch_gen;
    *exec = g;
    return VERR_OK;
}

static int cu_graph_launch(struct backend *be, void *exec) {
    CU_NOT_RECORDING(be, "graph_launch");
    CU_ENTER(be);
    struct cu_graph *g = exec;
    if (!g)
        return verr_set(&be->err, VERR_RANGE, "graph_launch: NULL graph");
    if (g->scratch_gen != cb_of(be)->scratch_gen)
        return verr_set(&be->err, VERR_RANGE, "graph_launch: stale graph (the scratch moved)");
    CU_CHECK(be, cudaGraphLaunch(g->exec, cb_of(be)->stream));
    return VERR_OK;
}

static bool cu_graph_current(struct backend *be, const void *exec) {
    const struct cu_graph *g = exec;
    return g && g->scratch_gen == cb_of(be)->scratch_gen;
}

// A replay still in flight keeps running: cudaGraphExecDestroy defers the
// release until it completes.
static void cu_graph_destroy(struct backend *be, void *exec) {
    struct cu_graph *g = exec;
    if (!g)
        return;
    if (cudaSetDevice(be->device) == cudaSuccess)
        (void)cudaGraphExecDestroy(g->exec);
    (void)cudaGetLastError();
    free(g);
}

static void cu_release(struct cuda_backend *cb) {
    if (cb->recording) {
        cudaGraph_t graph = NULL;
        if (cudaStreamEndCapture(cb->stream, &graph) == cudaSuccess && graph)
            (void)cudaGraphDestroy(graph);
        cb->recording = false;
    }
    if (cb->stream)
        (void)cudaStreamSynchronize(cb->stream);
    if (cb->scratch)
        (void)cudaFree(cb->scratch); // stream-ordered memory may be freed synchronously too
    if (cb->xq)
        (void)cudaFree(cb->xq);
    if (cb->attn_sync)
        (void)cudaFree(cb->attn_sync);
    if (cb->kvq_bad)
        (void)cudaFree(cb->kvq_bad);
    if (cb->kvq_bad_host)
        (void)cudaFreeHost(cb->kvq_bad_host);
    for (int k = 0; k < BACKEND_UPLOAD_SLOTS; k++)
        if (cb->upload_ev[k])
            (void)cudaEventDestroy(cb->upload_ev[k]);
    if (cb->cublas)
        (void)cublasDestroy(cb->cublas);
    if (cb->stream)
        (void)cudaStreamDestroy(cb->stream);
    (void)cudaGetLastError();
    free(cb);
}

static void cu_destroy(struct backend *be) {
    if (!be)
        return;
    if (be->impl) {
        (void)cudaSetDevice(be->device);
        cu_release(cb_of(be));
    }
    free(be);
}

static const struct backend_ops cuda_ops = {
    .name = "cuda",
    .alloc = cu_alloc,
    .free = cu_free,
    .upload = cu_upload,
    .download = cu_download,
    .memset_zero = cu_memset_zero,
    .sync = cu_sync,
    .embed = cu_embed,
    .rms_norm = cu_rms_norm,
    .rms_norm_q8 = cu_rms_norm_q8,
    .matmul = cu_matmul,
    .matmul_multi = cu_matmul_multi,
    .matmul_add = cu_matmul_add,
    .matmul_swiglu = cu_matmul_swiglu,
    .matmul_geglu = cu_matmul_geglu,
    .rope = cu_rope,
    .rope_kv_store = cu_rope_kv_store,
    .rope_kv_store_rot = cu_rope_kv_store_rot,
    .attention = cu_attention,
    .kv_shift = cu_kv_shift,
    .hadamard = cu_hadamard,
    .hadamard_q8 = cu_hadamard_q8,
    .cache_type_supported = cu_is_cache_type,
    .swiglu = cu_swiglu,
    .geglu = cu_geglu,
    .scale = cu_scale,
    .add = cu_add,
    .get_rows = cu_get_rows,
    .argmax = cu_argmax,
    .sample = cu_sample,
    .moe_route = cu_moe_route,
    .moe_ffn = cu_moe_ffn,
    .add_sigmoid_scaled = cu_add_sigmoid_scaled,
    .mem_info = cu_mem_info,
    .alloc_host_pinned = cu_alloc_host_pinned,
    .free_host_pinned = cu_free_host_pinned,
    .upload_async = cu_upload_async,
    .upload_wait = cu_upload_wait,
    .graph_begin = cu_graph_begin,
    .graph_end = cu_graph_end,
    .graph_launch = cu_graph_launch,
    .graph_current = cu_graph_current,
    .graph_destroy = cu_graph_destroy,
    .destroy = cu_destroy,
};

// For benchmarks (host/ops/backend.h): the stream every op of `be` enqueues on.
void *backend_cuda_stream(struct backend *be) {
    if (!be || be->ops != &cuda_ops || !be->impl)
        return NULL;
    return (void *)cb_of(be)->stream;
}

bool backend_cuda_built(void) {
    return true;
}

// No driver, no GPU, or a driver older than the runtime: all mean "none
// usable", reported as 0 without printing anything.
int backend_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n > 0 ? n : 0;
}

// VELA_PDL (the environment): programmatic dependent launch for the decode
// chain, a variant under test (backend_cuda_set_pdl) that `vela bench` is
// timed with before a GPU run decides; unset, empty or "0": off, "1": on.
static int cu_pdl_env(bool *on, struct verr *err) {
    const char *s = getenv("VELA_PDL");
    *on = s && !strcmp(s, "1");
    if (!s || !*s || *on || !strcmp(s, "0"))
        return VERR_OK;
    return verr_set(err, VERR_RANGE,
                    "VELA_PDL=%.40s: expected 0 or 1 (programmatic dependent launch off or on)", s);
}

int backend_cuda_parse_matvec(const char *s, bool q8, int *kernel, int *blocks_per_sm) {
    const size_t n = q8 && !strncmp(s, "pipe", 4) ? 4 : !strncmp(s, "stream", 6) ? 6 : 0;
    *kernel = n == 4   ? CUDA_MVQ_PIPE
              : n == 6 ? (q8 ? CUDA_MVQ_STREAM : CUDA_MV_STREAM)
                       : (q8 ? CUDA_MVQ_PASS : CUDA_MV_PASS);
    *blocks_per_sm = 0;
    if (!strcmp(s, "pass") || (n && s[n] == '\0'))
        return 0;
    if (!n || s[n] != ':' || s[n + 1] < '1' || s[n + 1] > '9')
        return -1;
    char *end = NULL;
    const long b = strtol(s + n + 1, &end, 10);
    if (*end || b < 1 || b > 64)
        return -1;
    *blocks_per_sm = (int)b;
    return 0;
}

// The mat-vec variants under test that the environment picks for `vela
// bench` (VELA_MATVEC_Q8, VELA_MATVEC_F16: backend_cuda_parse_matvec's
// names; unset or empty: the default kernel), as VELA_PDL.
struct cu_mv_env {
    int q8_kernel, q8_blocks, f16_kernel, f16_blocks;
};

static int cu_matvec_env(struct cu_mv_env *e, struct verr *err) {
    *e = (struct cu_mv_env){CUDA_MVQ_PASS, 0, CUDA_MV_PASS, 0};
    const char *q = getenv("VELA_MATVEC_Q8"), *f = getenv("VELA_MATVEC_F16");
    if (q && *q && backend_cuda_parse_matvec(q, true, &e->q8_kernel, &e->q8_blocks))
        return verr_set(err, VERR_RANGE,
                        "VELA_MATVEC_Q8=%.40s: expected pass, pipe, pipe:B, stream or stream:B "
                        "(B blocks per multiprocessor, 1..64)",
                        q);
    if (f && *f && backend_cuda_parse_matvec(f, false, &e->f16_kernel, &e->f16_blocks))
        return verr_set(err, VERR_RANGE,
                        "VELA_MATVEC_F16=%.40s: expected pass, stream or stream:B (B blocks per "
                        "multiprocessor, 1..64)",
                        f);
    return VERR_OK;
}

int backend_cuda_create(struct backend **out, int device, struct verr *err) {
    *out = NULL;
    bool pdl = false;
    struct cu_mv_env mv_env;
    int rc_env = cu_pdl_env(&pdl, err);
    if (!rc_env)
        rc_env = cu_matvec_env(&mv_env, err);
    if (rc_env)
        return rc_env;
    const int n = backend_cuda_device_count();
    if (device < 0 || device >= n)
        return verr_set(err, VERR_NOTFOUND, "CUDA device %d not found (%d usable device%s)", device,
                        n, n == 1 ? "" : "s");
    struct backend *be = calloc(1, sizeof *be);
    struct cuda_backend *cb = calloc(1, sizeof *cb);
    if (!be || !cb) {
        free(be);
        free(cb);
        return verr_set(err, VERR_NOMEM, "CUDA backend: out of host memory");
    }
    const char *what = NULL;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess)
        what = "cudaSetDevice";
    if (!what && (e = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking)) != cudaSuccess)
        what = "cudaStreamCreateWithFlags";
    if (!what && (e = cudaDeviceGetAttribute(&cb->sm_count, cudaDevAttrMultiProcessorCount,
                                             device)) != cudaSuccess)
        what = "cudaDeviceGetAttribute(MultiProcessorCount)";
    if (!what && (e = cudaDeviceGetAttribute(&cb->mvq.smem_per_sm,
                                             cudaDevAttrMaxSharedMemoryPerMultiprocessor,
                                             device)) != cudaSuccess)
        what = "cudaDeviceGetAttribute(MaxSharedMemoryPerMultiprocessor)";
    if (!what && (e = cudaDeviceGetAttribute(&cb->mvq.smem_per_block,
                                             cudaDevAttrMaxSharedMemoryPerBlockOptin, device)) !=
                     cudaSuccess)
        what = "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)";
    if (!what && (e = cudaDeviceGetAttribute(&cb->cc_major, cudaDevAttrComputeCapabilityMajor,
                                             device)) != cudaSuccess)
        what = "cudaDeviceGetAttribute(ComputeCapabilityMajor)";
    if (!what && (e = cudaDeviceGetAttribute(&cb->cc_minor, cudaDevAttrComputeCapabilityMinor,
                                             device)) != cudaSuccess)
        what = "cudaDeviceGetAttribute(ComputeCapabilityMinor)";
    cb->mvq.sm_count = cb->sm_count;
    cb->mvf.sm_count = cb->sm_count;
    cb->mvf.smem_per_sm = cb->mvq.smem_per_sm;
    cb->mvf.smem_per_block = cb->mvq.smem_per_block;
    if (what) {
        int rc = verr_set(err, VERR_BACKEND, "CUDA device %d: %s: %s (%s:%d)", device, what,
                          cudaGetErrorString(e), __FILE__, __LINE__);
        cu_release(cb);
        free(be);
        return rc;
    }
    cublasStatus_t s = cublasCreate(&cb->cublas);
    if (s != CUBLAS_STATUS_SUCCESS)
        cb->cublas = NULL;
    else
        s = cublasSetStream(cb->cublas, cb->stream);
    if (s != CUBLAS_STATUS_SUCCESS) {
        int rc = verr_set(err, VERR_BACKEND, "CUDA device %d: cuBLAS setup: %s (%s:%d)", device,
                          cublasGetStatusString(s), __FILE__, __LINE__);
        cu_release(cb);
        free(be);
        return rc;
    }
    be->ops = &cuda_ops;
    be->device = device;
    // 8-bit activations for decode mat-vecs by default (backend.h): f32
    // activations make the quantized mat-vec compute-bound on GPUs whose
    // bandwidth outruns their float issue rate; --matvec-act f32 turns it off.
    be->act_q8 = true;
    be->impl = cb;
    cb->mvq.kernel = mv_env.q8_kernel;
    cb->mvq.blocks_per_sm = mv_env.q8_blocks;
    cb->mvf.kernel = mv_env.f16_kernel;
    cb->mvf.blocks_per_sm = mv_env.f16_blocks;
    if (pdl && cb->cc_major >= 9) {
        cb->mvq.pdl = true;
    } else if (pdl) {
        static atomic_flag said = ATOMIC_FLAG_INIT;
        if (!atomic_flag_test_and_set(&said))
            fprintf(stderr,
                    "vela: VELA_PDL=1 ignored on CUDA device %d (compute capability %d.%d): "
                    "programmatic dependent launch needs 9.0\n",
                    device, cb->cc_major, cb->cc_minor);
    }
    *out = be;
    return VERR_OK;
}

// Variants under test (cuda/backend_cuda.h).
static int cu_variant_backend(struct backend *be, const char *what, struct verr *err) {
    if (!be || be->ops != &cuda_ops || !be->impl)
        return verr_set(err, VERR_RANGE, "%s: not a CUDA backend", what);
    return VERR_OK;
}

int backend_cuda_set_attn_split(struct backend *be, int blocks_per_sm, int min_cells,
                                struct verr *err) {
    int rc = cu_variant_backend(be, "backend_cuda_set_attn_split", err);
    if (rc)
        return rc;
    const bool dflt = blocks_per_sm == 0 && min_cells == 0;
    if (!dflt && (blocks_per_sm < 1 || blocks_per_sm > 64 || min_cells < 8 || min_cells > 65536 ||
                  min_cells % 8))
        return verr_set(err, VERR_RANGE,
                        "attention split %dx%d: expected B blocks per multiprocessor (1..64) and "
                        "C cells per split (8..65536, a multiple of 8), or 0x0",
                        blocks_per_sm, min_cells);
    cb_of(be)->attn_split_blocks_per_sm = blocks_per_sm;
    cb_of(be)->attn_split_min_cells = min_cells;
    return VERR_OK;
}

int backend_cuda_set_attn_decode(struct backend *be, int kernel, struct verr *err) {
    int rc = cu_variant_backend(be, "backend_cuda_set_attn_decode", err);
    if (rc)
        return rc;
    if (kernel != CUDA_ATTN_DECODE_AUTO && kernel != CUDA_ATTN_DECODE_SPLITK &&
        kernel != CUDA_ATTN_DECODE_DEC)
        return verr_set(err, VERR_RANGE,
                        "attention decode kernel %d: expected 0 (default), 1 (split-K) or 2 (dec)",
                        kernel);
    cb_of(be)->attn_decode = kernel;
    return VERR_OK;
}

int backend_cuda_set_pdl(struct backend *be, int on, struct verr *err) {
    int rc = cu_variant_backend(be, "backend_cuda_set_pdl", err);
    if (rc)
        return rc;
    if (on != 0 && on != 1)
        return verr_set(err, VERR_RANGE,
                        "programmatic dependent launch %d: expected 0 (off) or 1 (on)", on);
    const struct cuda_backend *cb = cb_of(be);
    if (on && cb->cc_major < 9)
        return verr_set(err, VERR_UNSUPPORTED,
                        "programmatic dependent launch needs compute capability 9.0; CUDA device "
                        "%d is %d.%d",
                        be->device, cb->cc_major, cb->cc_minor);
    cb_of(be)->mvq.pdl = on == 1;
    return VERR_OK;
}

int backend_cuda_set_matvec_q8(struct backend *be, int kernel, int blocks_per_sm,
                               struct verr *err) {
    int rc = cu_variant_backend(be, "backend_cuda_set_matvec_q8", err);
    if (rc)
        return rc;
    if (kernel < CUDA_MVQ_PASS || kernel > CUDA_MVQ_STREAM || blocks_per_sm < 0 ||
        blocks_per_sm > 64 || (kernel == CUDA_MVQ_PASS && blocks_per_sm))
        return verr_set(err, VERR_RANGE,
                        "dp4a mat-vec kernel %d (0 one-pass, 1 pipelined, 2 streaming), blocks "
                        "per multiprocessor %d (pipelined, streaming: 0..64, 0 the default; "
                        "one-pass: 0)",
                        kernel, blocks_per_sm);
    cb_of(be)->mvq.kernel = kernel;
    cb_of(be)->mvq.blocks_per_sm = blocks_per_sm;
    return VERR_OK;
}

int backend_cuda_set_matvec_f16(struct backend *be, int kernel, int blocks_per_sm,
                                struct verr *err) {
    int rc = cu_variant_backend(be, "backend_cuda_set_matvec_f16", err);
    if (rc)
        return rc;
    if (kernel < CUDA_MV_PASS || kernel > CUDA_MV_STREAM || blocks_per_sm < 0 ||
        blocks_per_sm > 64 || (kernel == CUDA_MV_PASS && blocks_per_sm))
        return verr_set(err, VERR_RANGE,
                        "F16/BF16 mat-vec kernel %d (0 one warp per row, 1 streaming), blocks "
                        "per multiprocessor %d (streaming: 0..64, 0 the default; otherwise 0)",
                        kernel, blocks_per_sm);
    cb_of(be)->mvf.kernel = kernel;
    cb_of(be)->mvf.blocks_per_sm = blocks_per_sm;
    return VERR_OK;
}
