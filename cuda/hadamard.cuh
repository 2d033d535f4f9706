// The hadamard op's transform on values in shared memory (host/ops/backend.h,
// backend_ops.hadamard), for cuda/hadamard.cu and the K shift of a rotated
// quantized cache (cuda/rope.cu).
#ifndef VELA_CUDA_HADAMARD_CUH
#define VELA_CUDA_HADAMARD_CUH

// s [n] = H s for each run of `block` values (block a power of two dividing
// n), by threads tid, tid + n_thr, ... of the thread block: the CPU op's
// butterflies in its order, then each value times scale (1.0f /
// sqrtf(block), computed on the host so both backends use the same float).
// Every thread of the block calls it: it synchronizes them before each
// stage and at the end.
static __device__ void hadamard_shared(float *s, int n, int block, float scale, int tid,
                                       int n_thr) {
    for (int h = 1; h < block; h *= 2) {
        __syncthreads();
        for (int p = tid; p < n / 2; p += n_thr) {
            const int i = (p / h) * 2 * h + p % h; // pairs (i, i + h) never cross a block
            const float a = s[i], b = s[i + h];
            s[i] = a + b;
            s[i + h] = a - b;
        }
    }
    __syncthreads();
    for (int i = tid; i < n; i += n_thr)
        s[i] *= scale;
    __syncthreads();
}

#endif
