// Attention sinks (the sinks argument of cuda_attention_apply; host/ops/
// backend.h, struct attn_args.sinks) where a kernel finishes a row: included
// by attention.cu and attention_decode.cu, used only by their sink instances.
#ifndef VELA_CUDA_ATTENTION_SINK_CUH
#define VELA_CUDA_ATTENTION_SINK_CUH

// A row's sink joined to its softmax state once its visible cells left the
// running max m and the sum l > 0 of exp(s - m): the state moves to the max
// m' = max(m, sink), its unnormalized outputs times *f = exp(m - m'), and
// its sum becomes l f + exp(sink - m') (returned). exp is e^x, or with BASE2
// 2^x for the kernels that keep their scores in base 2 (sink then times
// log2(e)). The sink joins once per row, whatever the split of the cells.
template <bool BASE2>
static __device__ __forceinline__ float attn_sink_join(float m, float l, float sink, float *f) {
    const float ms = fmaxf(m, sink);
    *f = BASE2 ? exp2f(m - ms) : expf(m - ms);
    return l * *f + (BASE2 ? exp2f(sink - ms) : expf(sink - ms));
}

// What the row's unnormalized outputs are multiplied by with the sink in the
// denominator: f / (l f + exp(sink - m')).
template <bool BASE2>
static __device__ __forceinline__ float attn_sink_inv(float m, float l, float sink) {
    float f;
    const float lf = attn_sink_join<BASE2>(m, l, sink, &f);
    return f / lf;
}

#endif
