// vela CUDA emulator: a semantic nvcuda::wmma (tensor core) shim, m16n16k16
// with __half inputs and float accumulators, the shape and types vela's
// kernels use. C++ only; included by device code after cuda_emu.h.
//
// Semantics (what kernels may rely on, as on hardware):
//   - every call except fill_fragment is warp-collective: all 32 lanes of
//     the warp must call it with the same pointer, ldm and layout (checked:
//     a lane missing, waiting elsewhere or passing other arguments is a
//     kernel fault, like a divergent warp intrinsic);
//   - load_matrix_sync / store_matrix_sync do not order memory between
//     lanes: a load reads before the warp synchronises and a store writes
//     after, so a missing __syncwarp/__syncthreads between a lane's writes
//     and another lane's fragment load (or a store and another lane's reads)
//     gives stale data here, as it may on a GPU;
//   - mma_sync: D = A * B + C, d[i][j] = c[i][j] + sum_k a[i][k] * b[k][j]
//     computed in float, k ascending from 0 to 15, each product exact
//     (f16 x f16 fits a float). Hardware adds in an unspecified order with
//     its own rounding; results agree to float rounding, not bit for bit;
//   - pointers must be 32-byte (256-bit) aligned; ldm a multiple of 8 for
//     __half and of 4 for float elements (checked: hardware needs it).
// Fragments are lane-distributed: lane l holds num_elements = 8 elements,
// element i being tile element e = i * 32 + l in row-major order of the
// logical matrix (A: M x K, B: K x N, accumulator: M x N). That layout is
// NOT the hardware's (which is unspecified and differs per architecture):
// use .x[] / num_elements only for element-wise operations (scaling,
// conversion, clamping), never to find a row or column.
#ifndef VELA_EMU_MMA_H
#define VELA_EMU_MMA_H

#include <stdint.h>
#include <float.h>
#include <stdio.h>

#include <cmath>

#include <type_traits>

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace emu {
enum { TILE = 16, LANES = 32, PER_LANE = TILE * TILE / LANES };

static inline float to_f(float v) { return v; }
static inline float to_f(__half v) { return __half2float(v); }
template <typename T> static inline T from_f(float v);
template <> inline float from_f<float>(float v) { return v; }
template <> inline __half from_f<__half>(float v) { return __float2half_rn(v); }

static inline int lane_id(void) {
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    return (int)(t % LANES);
}
static inline int warp_id(void) {
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    return (int)(t / LANES);
}

// A warp-collective step: every lane of the warp arrives with the same key
// (call kind and arguments), or the kernel faults.
static inline void collective(uint64_t key, const char *what) {
    const unsigned m =
        (unsigned)emu_barrier(EMU_W_MATCH_ANY, key, 0, 32, 0xffffffffu, what, nullptr);
    if (m != 0xffffffffu) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s called by lanes 0x%08x of the warp with other arguments "
                                  "than the rest (warp-collective)", what, m);
        emu_trap(msg);
    }
}
static inline uint64_t key_of(int kind, const void *p, unsigned ldm, int layout) {
    uint64_t h = (uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ull;
    h ^= ((uint64_t)ldm << 8 | (uint64_t)layout << 4 | (uint64_t)kind) * 0xbf58476d1ce4e5b9ull;
    return h;
}
template <typename T> static inline void check_ptr(const void *p, unsigned ldm, const char *what) {
    const unsigned mult = sizeof(T) == 2 ? 8 : 4;
    if (((uintptr_t)p & 31) != 0 || ldm % mult != 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s: pointer %p not 32-byte aligned or ldm %u not a multiple "
                                  "of %u", what, p, ldm, mult);
        emu_trap(msg);
    }
}
} // namespace emu

template <typename Use, int M, int N, int K, typename T, typename Layout = void> class fragment {
    static_assert(M == 16 && N == 16 && K == 16, "emulated wmma: m16n16k16 only");
    static_assert((std::is_same<Use, accumulator>::value && std::is_same<T, float>::value &&
                   std::is_same<Layout, void>::value) ||
                      (!std::is_same<Use, accumulator>::value && std::is_same<T, __half>::value &&
                       (std::is_same<Layout, row_major>::value ||
                        std::is_same<Layout, col_major>::value)),
                  "emulated wmma: __half row/col-major A and B, float accumulator");

  public:
    typedef T element_type;
    typedef T storage_element_type;
    enum { num_elements = emu::PER_LANE };
    T x[num_elements];
};

template <typename Use, int M, int N, int K, typename T, typename L, typename V>
static inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, const V &v) {
    const T t = emu::from_f<T>(emu::to_f(v));
    for (int i = 0; i < f.num_elements; i++)
        f.x[i] = t;
}

// Element (r, c) of the logical tile of matrix `Use` loaded from memory laid
// out as `rowmajor`.
template <typename T>
static inline size_t emu_offset(int r, int c, unsigned ldm, bool rowmajor) {
    return rowmajor ? (size_t)r * ldm + c : (size_t)c * ldm + r;
}

template <typename Use, typename L>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, __half, L> &f, const __half *p,
                                    unsigned ldm) {
    const bool rm = std::is_same<L, row_major>::value;
    emu::check_ptr<__half>(p, ldm, "wmma::load_matrix_sync");
    const int lane = emu::lane_id();
    for (int i = 0; i < f.num_elements; i++) {
        const int e = i * emu::LANES + lane;
        f.x[i] = p[emu_offset<__half>(e / 16, e % 16, ldm, rm)];
    }
    emu::collective(emu::key_of(std::is_same<Use, matrix_a>::value ? 1 : 2, p, ldm, rm),
                    "wmma::load_matrix_sync");
}

static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                                    unsigned ldm, layout_t layout) {
    emu::check_ptr<float>(p, ldm, "wmma::load_matrix_sync");
    const int lane = emu::lane_id();
    for (int i = 0; i < f.num_elements; i++) {
        const int e = i * emu::LANES + lane;
        f.x[i] = p[emu_offset<float>(e / 16, e % 16, ldm, layout == mem_row_major)];
    }
    emu::collective(emu::key_of(3, p, ldm, layout), "wmma::load_matrix_sync");
}

static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                                     unsigned ldm, layout_t layout) {
    emu::check_ptr<float>(p, ldm, "wmma::store_matrix_sync");
    emu::collective(emu::key_of(4, p, ldm, layout), "wmma::store_matrix_sync");
    const int lane = emu::lane_id();
    for (int i = 0; i < f.num_elements; i++) {
        const int e = i * emu::LANES + lane;
        p[emu_offset<float>(e / 16, e % 16, ldm, layout == mem_row_major)] = f.x[i];
    }
}

namespace emu {
// Per warp of the running block (blocks run one at a time on one OS thread):
// where each lane's operands live while the warp is inside mma_sync.
struct mma_args {
    const __half *a, *b;
    const float *c;
};
static inline mma_args *mma_table(void) {
    static mma_args t[1024]; // a block has at most 1024 threads
    return t;
}
} // namespace emu

// Fragments are local memory: not instrumented (no_sanitize_thread), which
// keeps the emulated tensor-core kernels fast under the sanitizer checks.
template <typename LA, typename LB>
static __attribute__((no_sanitize_thread)) void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                            const fragment<matrix_a, 16, 16, 16, __half, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, __half, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c,
                            bool satf = false) {
    const int lane = emu::lane_id(), w = emu::warp_id();
    emu::mma_args *t = emu::mma_table() + w * emu::LANES;
    t[lane] = {a.x, b.x, c.x};
    emu::collective(emu::key_of(5, nullptr, 0, 0), "wmma::mma_sync");
    // Gather the three tiles from the warp's lanes (element e of a tile is
    // x[e / 32] of lane e % 32).
    float A[16][16], B[16][16], C[16][16];
    for (int e = 0; e < 256; e++) {
        const emu::mma_args &s = t[e % emu::LANES];
        A[e / 16][e % 16] = __half2float(s.a[e / emu::LANES]);
        B[e / 16][e % 16] = __half2float(s.b[e / emu::LANES]);
        C[e / 16][e % 16] = s.c[e / emu::LANES];
    }
    float out[emu::PER_LANE];
    for (int i = 0; i < emu::PER_LANE; i++) {
        const int e = i * emu::LANES + lane, r = e / 16, col = e % 16;
        float acc = C[r][col];
        for (int k = 0; k < 16; k++)
            acc += A[r][k] * B[k][col];
        if (satf)
            acc = acc != acc ? 0.0f : std::fmax(-FLT_MAX, std::fmin(FLT_MAX, acc)); // satf: to finite
        out[i] = acc;
    }
    // Every lane has read every operand before any lane writes d (d may be c).
    emu::collective(emu::key_of(6, nullptr, 0, 0), "wmma::mma_sync");
    for (int i = 0; i < emu::PER_LANE; i++)
        d.x[i] = out[i];
}

} // namespace wmma
} // namespace nvcuda

#endif
