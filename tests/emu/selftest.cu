// The emulator checks itself (ctest: test_emu_selftest): barriers and warp
// intrinsics give CUDA's results, and the bugs it exists to catch are caught.
// Compiled like cuda/*.cu: cu2cpp.py, then host C++ with cuda_emu.h.
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>
#include <mma.h>

#include "cuda/launch.cuh"

static int g_fail = 0;
#define EXPECT(c, ...)                                                                             \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            g_fail++;                                                                              \
        }                                                                                          \
    } while (0)

__global__ void reduce_kernel(const float *x, float *out, int n) {
    __shared__ float part[8];
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s += x[blockIdx.x * n + i];
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x % 32 == 0)
        part[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int w = 0; w < (int)blockDim.x / 32; w++)
            t += part[w];
        out[blockIdx.x] = t;
    }
}

__global__ void intrinsics_kernel(int *out) {
    const int l = threadIdx.x;
    out[l] = __shfl_up_sync(0xffffffffu, l, 3);
    out[32 + l] = __shfl_down_sync(0xffffffffu, l, 5, 16);
    out[64 + l] = __shfl_sync(0xffffffffu, l * 10, 7);
    out[96 + l] = (int)__ballot_sync(0xffffffffu, l % 3 == 0);
    out[128 + l] = __syncthreads_count(l < 10);
    out[160 + l] = (int)__match_any_sync(0xffffffffu, l / 8);
}

// SIMD byte intrinsics the integer mat-vec (cuda/matvec_q8.cu) relies on:
// __dp4a multiplies the four bytes as SIGNED int8 and adds to c; __byte_perm
// picks bytes of the 8-byte value {y:x} by selector nibbles.
__global__ void byte_simd_kernel(const int *a, const int *b, int *out) {
    const int l = threadIdx.x;
    out[l] = __dp4a(a[l], b[l], l - 16);
    out[32 + l] = (int)__byte_perm((unsigned)a[l], (unsigned)b[l], 0x5432u);
    out[64 + l] = (int)__byte_perm((unsigned)a[l], (unsigned)b[l], 0x3210u);
    out[96 + l] = (int)__byte_perm((unsigned)a[l], (unsigned)b[l], 0x0741u);
}

__global__ void divergent_sync_kernel(int *out) {
    if (threadIdx.x < 16) {
        __syncthreads();
        out[0] = 1;
    } else {
        __syncthreads();
        out[1] = 1;
    }
}

__global__ void early_exit_sync_kernel(int *out) {
    if (threadIdx.x == 5)
        return;
    __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void exited_lane_shfl_kernel(float *out) {
    if (threadIdx.x == 31)
        return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ void smem_overflow_kernel(int n) {
    extern __shared__ float dyn[];
    dyn[threadIdx.x + n] = 1.0f;
}

__global__ void uninit_smem_kernel(float *out) {
    __shared__ float s[64];
    if (threadIdx.x < 32)
        s[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x]; // 32..63 never written
}


// wmma: warp w computes rows 16w..16w+15 of D = 2 * (A * B + C), 32 x 32 x 32,
// A row-major, B row- or column-major (b_col), D's column tile 0 stored
// row-major into d[32][32]'s left half and tile 1 column-major at d + 1024.
using namespace nvcuda;
__global__ void wmma_kernel(const __half *a, const __half *b, const float *c, float *d,
                            int b_col) {
    const int w = threadIdx.x / 32;
    for (int n = 0; n < 2; n++) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::load_matrix_sync(acc, c + w * 16 * 32 + n * 16, 32, wmma::mem_row_major);
        for (int k = 0; k < 2; k++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
            wmma::load_matrix_sync(fa, a + w * 16 * 32 + k * 16, 32);
            if (b_col) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
                wmma::load_matrix_sync(fb, b + n * 16 * 32 + k * 16, 32);
                wmma::mma_sync(acc, fa, fb, acc);
            } else {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
                wmma::load_matrix_sync(fb, b + k * 16 * 32 + n * 16, 32);
                wmma::mma_sync(acc, fa, fb, acc);
            }
        }
        for (int i = 0; i < acc.num_elements; i++)
            acc.x[i] *= 2.0f;
        if (n == 0)
            wmma::store_matrix_sync(d + w * 16 * 32, acc, 32, wmma::mem_row_major);
        else
            wmma::store_matrix_sync(d + 1024 + w * 16, acc, 32, wmma::mem_col_major);
    }
}

// Lanes pass different pointers to a collective load.
__global__ void wmma_divergent_ptr_kernel(const __half *a) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a + (threadIdx.x % 2) * 16, 32);
}

// Half of the warp skips the mma.
__global__ void wmma_half_warp_kernel(const __half *a, float *d) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, a, 16);
    if (threadIdx.x < 16)
        wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

static bool launch_faults(const char *what) {
    cudaError_t e = cudaDeviceSynchronize();
    const bool f = e != cudaSuccess;
    if (f)
        fprintf(stderr, "(expected) %s: %s\n", what, cudaGetErrorString(e));
    return f;
}

// A fault is sticky, as on a GPU: the process is done after one.
static int child(int which) {
    int *d;
    cudaMalloc((void **)&d, 256 * sizeof(int));
    cudaMemset(d, 0, 256 * sizeof(int)); // initialised: each case shows its own bug only
    switch (which) {
    case 0: divergent_sync_kernel<<<1, 32>>>(d); break;
    case 1: early_exit_sync_kernel<<<1, 64>>>(d); break;
    case 2: exited_lane_shfl_kernel<<<1, 32>>>((float *)d); break;
    case 3: smem_overflow_kernel<<<1, 64, 64 * sizeof(float)>>>(8); break;
    case 4: wmma_divergent_ptr_kernel<<<1, 32>>>((const __half *)d); break;
    case 5: wmma_half_warp_kernel<<<1, 32>>>((const __half *)d, (float *)d); break;
    }
    return launch_faults("fault") ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 2)
        return child(atoi(argv[1]));
    const int rows = 3, n = 1000;
    float *hx = (float *)malloc(sizeof(float) * rows * n), *dx, *dout, hout[3];
    for (int i = 0; i < rows * n; i++)
        hx[i] = (float)(i % 7);
    cudaMalloc((void **)&dx, sizeof(float) * rows * n);
    cudaMalloc((void **)&dout, sizeof(float) * 256);
    cudaMemcpy(dx, hx, sizeof(float) * rows * n, cudaMemcpyHostToDevice);
    reduce_kernel<<<rows, 256>>>(dx, dout, n);
    cudaMemcpy(hout, dout, sizeof hout, cudaMemcpyDeviceToHost);
    for (int r = 0; r < rows; r++) {
        float ref = 0;
        for (int i = 0; i < n; i++)
            ref += hx[r * n + i];
        EXPECT(hout[r] == ref, "reduce row %d: %g != %g", r, hout[r], ref);
    }
    int *di, hi[192];
    cudaMalloc((void **)&di, sizeof hi);
    intrinsics_kernel<<<1, 32>>>(di);
    cudaMemcpy(hi, di, sizeof hi, cudaMemcpyDeviceToHost);
    unsigned ballot = 0;
    for (int l = 0; l < 32; l += 3)
        ballot |= 1u << l;
    for (int l = 0; l < 32; l++) {
        EXPECT(hi[l] == (l >= 3 ? l - 3 : l), "shfl_up lane %d: %d", l, hi[l]);
        EXPECT(hi[32 + l] == ((l % 16) + 5 < 16 ? l + 5 : l), "shfl_down w16 lane %d: %d", l, hi[32 + l]);
        EXPECT(hi[64 + l] == 70, "shfl lane %d: %d", l, hi[64 + l]);
        EXPECT((unsigned)hi[96 + l] == ballot, "ballot lane %d: %x", l, hi[96 + l]);
        EXPECT(hi[128 + l] == 10, "syncthreads_count lane %d: %d", l, hi[128 + l]);
        EXPECT((unsigned)hi[160 + l] == 0xffu << (8 * (l / 8)), "match_any lane %d: %x", l, hi[160 + l]);
    }
    {
        // Byte patterns with 0x80 (-128), 0xff (-1), 0x7f (127) in every lane.
        int ha[32], hb[32], hr[128], *da, *db, *dr;
        const unsigned pat[8] = {0x80ff7f01u, 0x7f7f7f7fu, 0x80808080u, 0xffffffffu,
                                 0x0f0e0d0cu, 0x01800280u, 0xfe7f81ffu, 0x00000000u};
        for (int l = 0; l < 32; l++) {
            ha[l] = (int)(pat[l % 8] ^ (unsigned)(l * 0x01010101u));
            hb[l] = (int)(pat[(l * 3 + 1) % 8] + (unsigned)l);
        }
        cudaMalloc((void **)&da, sizeof ha);
        cudaMalloc((void **)&db, sizeof hb);
        cudaMalloc((void **)&dr, sizeof hr);
        cudaMemcpy(da, ha, sizeof ha, cudaMemcpyHostToDevice);
        cudaMemcpy(db, hb, sizeof hb, cudaMemcpyHostToDevice);
        byte_simd_kernel<<<1, 32>>>(da, db, dr);
        cudaMemcpy(hr, dr, sizeof hr, cudaMemcpyDeviceToHost);
        for (int l = 0; l < 32; l++) {
            int dot = l - 16;
            for (int k = 0; k < 4; k++)
                dot += (int)(signed char)(ha[l] >> (8 * k)) * (int)(signed char)(hb[l] >> (8 * k));
            EXPECT(hr[l] == dot, "dp4a lane %d: %d, want %d", l, hr[l], dot);
            const unsigned x = (unsigned)ha[l], y = (unsigned)hb[l];
            EXPECT((unsigned)hr[32 + l] == ((x >> 16) | (y << 16)), "byte_perm 0x5432 lane %d", l);
            EXPECT((unsigned)hr[64 + l] == x, "byte_perm 0x3210 lane %d", l);
            // selector nibbles 1, 4, 7, 0: x.b1, y.b0, y.b3, x.b0
            const unsigned want = ((x >> 8) & 0xffu) | ((y & 0xffu) << 8) | ((y >> 24) << 16) |
                                  ((x & 0xffu) << 24);
            EXPECT((unsigned)hr[96 + l] == want, "byte_perm 0x0741 lane %d: %08x want %08x", l,
                   (unsigned)hr[96 + l], want);
        }
        // Fixed values: (-128)(-128) * 4 = 65536; 127 * -1 * 4 + 5 = -503.
        EXPECT(__dp4a((int)0x80808080u, (int)0x80808080u, 0) == 65536, "dp4a -128*-128");
        EXPECT(__dp4a(0x7f7f7f7f, -1, 5) == -503, "dp4a 127*-1");
        cudaFree(da);
        cudaFree(db);
        cudaFree(dr);
    }
    float hs[64];
    uninit_smem_kernel<<<1, 64>>>(dout);
    cudaMemcpy(hs, dout, sizeof hs, cudaMemcpyDeviceToHost);
    EXPECT(hs[0] == 1.0f && hs[40] != hs[40], "unwritten shared memory reads as NaN: %g", hs[40]);
    EXPECT(cudaDeviceSynchronize() == cudaSuccess, "no fault so far");
    {
        // cudaLaunchKernelEx through cuda/launch.cuh: with and without PDL the
        // result of the plain launch above, the PDL launch counted; an
        // attribute the emulator does not know, or attrs NULL with numAttrs 1,
        // refused.
        const unsigned long long pdl0 = emu_pdl_launches();
        float h[2][3];
        for (int pdl = 0; pdl < 2; pdl++) {
            cudaMemset(dout, 0, sizeof(float) * 256);
            EXPECT(cuda_launch(pdl == 1, reduce_kernel, dim3(rows), dim3(256), 0, (cudaStream_t)0,
                               (const float *)dx, dout, n) == cudaSuccess,
                   "cuda_launch pdl %d", pdl);
            cudaMemcpy(h[pdl], dout, sizeof h[pdl], cudaMemcpyDeviceToHost);
            for (int r = 0; r < rows; r++)
                EXPECT(h[pdl][r] == hout[r], "cuda_launch pdl %d row %d: %g != %g", pdl, r,
                       h[pdl][r], hout[r]);
            EXPECT(emu_pdl_launches() == pdl0 + (unsigned)pdl, "PDL launches %llu, want %llu",
                   emu_pdl_launches(), pdl0 + (unsigned)pdl);
        }
        cudaLaunchAttribute bad[1] = {};
        bad[0].id = (cudaLaunchAttributeID)99;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(1);
        cfg.blockDim = dim3(32);
        cfg.attrs = bad;
        cfg.numAttrs = 1;
        EXPECT(cudaLaunchKernelEx(&cfg, reduce_kernel, (const float *)dx, dout, n) ==
                   cudaErrorInvalidValue,
               "an unknown launch attribute taken");
        EXPECT(cudaGetLastError() == cudaErrorInvalidValue,
               "its error not left for cudaGetLastError");
        cfg.attrs = nullptr;
        EXPECT(cudaLaunchKernelEx(&cfg, reduce_kernel, (const float *)dx, dout, n) ==
                   cudaErrorInvalidValue,
               "numAttrs 1 with attrs NULL taken");
        (void)cudaGetLastError();
        EXPECT(emu_pdl_launches() == pdl0 + 1, "refused launches counted");
    }
    // wmma: exact against the documented order (c, then k ascending, in float).
    for (int b_col = 0; b_col < 2; b_col++) {
        __half ha[1024], hb[1024];
        float hc[1024], hd[2048], fa[1024], fb[1024]; // fb[k][n]
        for (int i = 0; i < 1024; i++) {
            ha[i] = __float2half_rn((float)((i * 37) % 23 - 11) / 7.0f);
            hb[i] = __float2half_rn((float)((i * 53) % 19 - 9) / 5.0f);
            hc[i] = (float)((i * 11) % 17 - 8) / 3.0f;
            fa[i] = __half2float(ha[i]);
        }
        for (int k = 0; k < 32; k++)
            for (int n = 0; n < 32; n++)
                fb[k * 32 + n] = __half2float(hb[b_col ? n * 32 + k : k * 32 + n]);
        __half *da, *db;
        float *dc, *dd;
        cudaMalloc((void **)&da, sizeof ha);
        cudaMalloc((void **)&db, sizeof hb);
        cudaMalloc((void **)&dc, sizeof hc);
        cudaMalloc((void **)&dd, sizeof hd);
        cudaMemcpy(da, ha, sizeof ha, cudaMemcpyHostToDevice);
        cudaMemcpy(db, hb, sizeof hb, cudaMemcpyHostToDevice);
        cudaMemcpy(dc, hc, sizeof hc, cudaMemcpyHostToDevice);
        cudaMemset(dd, 0, sizeof hd); // the kernel writes half of it; all is copied back
        wmma_kernel<<<1, 64>>>(da, db, dc, dd, b_col);
        cudaMemcpy(hd, dd, sizeof hd, cudaMemcpyDeviceToHost);
        int bad = 0;
        for (int r = 0; r < 32; r++)
            for (int n = 0; n < 32; n++) {
                float acc = hc[r * 32 + n];
                for (int k = 0; k < 32; k++)
                    acc += fa[r * 32 + k] * fb[k * 32 + n];
                acc *= 2.0f;
                const float got = n < 16 ? hd[r * 32 + n] : hd[1024 + (n - 16) * 32 + r];
                bad += got != acc;
            }
        EXPECT(bad == 0, "wmma (B %s-major): %d of 1024 differ", b_col ? "col" : "row", bad);
        cudaFree(da);
        cudaFree(db);
        cudaFree(dc);
        cudaFree(dd);
    }
    EXPECT(cudaDeviceSynchronize() == cudaSuccess, "no fault after wmma");
    // f16/bf16 conversions: round to nearest even, subnormals, overflow.
    EXPECT(__half_as_ushort(__float2half_rn(1.0f + 1.0f / 2048)) == 0x3c00, "f16 tie to even");
    EXPECT(__half_as_ushort(__float2half_rn(1.0f + 3.0f / 2048)) == 0x3c02, "f16 tie up to even");
    EXPECT(__half_as_ushort(__float2half_rn(65519.0f)) == 0x7bff, "f16 65519");
    EXPECT(__half_as_ushort(__float2half_rn(65520.0f)) == 0x7c00, "f16 65520 -> inf");
    EXPECT(__half_as_ushort(__float2half_rn(5.9604645e-8f)) == 0x0001, "f16 min subnormal");
    EXPECT(__half_as_ushort(__float2half_rn(2.9802322e-8f)) == 0x0000, "f16 2^-25 ties to 0");
    EXPECT(__half2float(__ushort_as_half(0x8001)) == -5.9604645e-8f, "f16 -subnormal");
    EXPECT(__bfloat16_as_ushort(__float2bfloat16_rn(1.00390625f)) == 0x3f80, "bf16 tie to even");
    // Each bug in its own process (faults are sticky).
    for (int k = 0; k < 6; k++) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "%s %d", argv[0], k);
        const int rc = system(cmd);
        EXPECT(rc == 0, "bug %d was not reported", k);
    }
    printf("%s\n", g_fail ? "selftest FAILED" : "selftest passed");
    return g_fail != 0;
}
