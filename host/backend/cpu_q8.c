// The portable half of the CPU q8 fast path (cpu_q8.h): probing the ISA,
// laying out and filling the prepared activations, and the dispatch. The
// kernels are in cpu_q8_simd.h, compiled once per ISA.
#include "host/backend/cpu_q8.h"

#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"
#include "gguf/quant_q8.h"

static int64_t round_up(int64_t v, int64_t m) {
    return (v + m - 1) / m * m;
}

// The most capable kernels cpu_q8_isa() may report (cpu_q8_pin).
static _Atomic int q8_pin = CPU_Q8_ISA_AVXVNNI;

void cpu_q8_pin(enum cpu_q8_isa max) {
    q8_pin = max;
}

static enum cpu_q8_isa cpu_q8_isa_probe(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        return CPU_Q8_ISA_NONE;
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
    if (__builtin_cpu_supports("avxvnni"))
        return CPU_Q8_ISA_AVXVNNI;
#endif
    return CPU_Q8_ISA_AVX2;
#else
    return CPU_Q8_ISA_NONE;
#endif
}

enum cpu_q8_isa cpu_q8_isa(void) {
    const enum cpu_q8_isa isa = cpu_q8_isa_probe();
    const enum cpu_q8_isa max = (enum cpu_q8_isa)q8_pin;
    return isa < max ? isa : max;
}

const char *cpu_q8_isa_name(enum cpu_q8_isa isa) {
    switch (isa) {
    case CPU_Q8_ISA_AVX2:
        return "avx2";
    case CPU_Q8_ISA_AVXVNNI:
        return "avx-vnni";
    default:
        return "none";
    }
}

// Offsets of the four arrays in the buffer, each 64-byte aligned.
struct x_offsets {
    size_t qs, dx, sq, sqh, total;
};

static int x_layout(int64_t n_in, int n_tok, struct x_offsets *o) {
    if (n_in <= 0 || n_in % QUANT_Q8_1_BLOCK != 0 || n_tok <= 0)
        return -1;
    const size_t n_pad = (size_t)round_up(n_in, CPU_Q8_GROUP), nb = n_pad / QUANT_Q8_1_BLOCK;
    const size_t a = 64;
    o->qs = 0;
    o->dx = (size_t)round_up((int64_t)(n_pad * (size_t)n_tok), a);
    o->sq = o->dx + (size_t)round_up((int64_t)(nb * (size_t)n_tok * sizeof(float)), a);
    o->sqh = o->sq + (size_t)round_up((int64_t)(nb * (size_t)n_tok * sizeof(int32_t)), a);
    o->total = o->sqh + (size_t)round_up((int64_t)(nb * (size_t)n_tok * sizeof(int32_t)), a);
    return 0;
}

size_t cpu_q8_x_bytes(int64_t n_in, int n_tok) {
    struct x_offsets o;
    return x_layout(n_in, n_tok, &o) ? 0 : o.total;
}

void cpu_q8_x_init(struct cpu_q8_x *x, void *buf, int64_t n_in, int n_tok) {
    struct x_offsets o;
    memset(x, 0, sizeof *x);
    if (x_layout(n_in, n_tok, &o))
        return;
    char *b = buf;
    x->qs = (int8_t *)(b + o.qs);
    x->dx = (float *)(b + o.dx);
    x->sq = (int32_t *)(b + o.sq);
    x->sqh = (int32_t *)(b + o.sqh);
    x->n_pad = round_up(n_in, CPU_Q8_GROUP);
    x->nb_pad = x->n_pad / QUANT_Q8_1_BLOCK;
    x->n_tok = n_tok;
}

int cpu_q8_x_fill(enum cpu_q8_isa isa, struct cpu_q8_x *x, int t, const float *xt, int64_t n_in,
                  void *tmp, struct verr *err) {
    if (t < 0 || t >= x->n_tok || n_in > x->n_pad || n_in % QUANT_Q8_1_BLOCK != 0)
        return verr_set(err, VERR_RANGE, "cpu q8: token %d or row of %lld outside the layout", t,
                        (long long)n_in);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
    if (isa == CPU_Q8_ISA_AVXVNNI) {
        cpu_q8_x_fill_avxvnni(x, t, xt, n_in);
        return VERR_OK;
    }
#endif
    if (isa != CPU_Q8_ISA_NONE) {
        cpu_q8_x_fill_avx2(x, t, xt, n_in);
        return VERR_OK;
    }
#endif
    int rc = quant_q8_1_row(xt, n_in, tmp, err);
    if (rc)
        return rc;
    int8_t *qs = x->qs + (size_t)t * (size_t)x->n_pad;
    float *dx = x->dx + (size_t)t * (size_t)x->nb_pad;
    int32_t *sq = x->sq + (size_t)t * (size_t)x->nb_pad,
            *sqh = x->sqh + (size_t)t * (size_t)x->nb_pad;
    const int64_t nb = n_in / QUANT_Q8_1_BLOCK;
    const uint8_t *b = tmp;
    for (int64_t i = 0; i < nb; i++, b += QUANT_Q8_1_BLOCK_BYTES) {
        dx[i] = quant_fp16_to_f32((uint16_t)(b[0] | (b[1] << 8)));
        int s = 0, sh = 0;
        // Block i is sub-block k of group g; its bytes 4m..4m+3 go to dword
        // k of the group's 32-byte row m (the transposed layout, cpu_q8.h).
        int8_t *grp = qs + (i / 8) * CPU_Q8_GROUP + (i % 8) * 4;
        for (int l = 0; l < QUANT_Q8_1_BLOCK; l++) {
            const int q = (int8_t)b[4 + l];
            grp[(l / 4) * 32 + l % 4] = (int8_t)q;
            s += q;
            sh += l >= 16 ? q : 0;
        }
        sq[i] = s;
        sqh[i] = sh;
    }
    // Padding blocks: zero quants and scale, so their terms are exactly 0.
    for (int64_t i = nb; i < x->nb_pad; i++) {
        int8_t *grp = qs + (i / 8) * CPU_Q8_GROUP + (i % 8) * 4;
        for (int m = 0; m < 8; m++)
            memset(grp + 32 * m, 0, 4);
        dx[i] = 0.0f;
        sq[i] = sqh[i] = 0;
    }
    return VERR_OK;
}

void cpu_q8_rows(enum cpu_q8_isa isa, const struct cpu_q8_job *j, int64_t o0, int64_t o1) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
    if (isa == CPU_Q8_ISA_AVXVNNI) {
        cpu_q8_rows_avxvnni(j, o0, o1);
        return;
    }
#endif
    if (isa != CPU_Q8_ISA_NONE)
        cpu_q8_rows_avx2(j, o0, o1);
#else
    (void)isa, (void)j, (void)o0, (void)o1;
#endif
}
