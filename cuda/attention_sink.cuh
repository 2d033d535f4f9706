// Attention sinks (struct cuda_attn.sinks; host/ops/backend.h, struct
// attn_args.sinks) where a kernel finishes a row: included by attention.cu
// and attention_decode.cu.
#ifndef VELA_CUDA_ATTENTION_SINK_CUH
#define VELA_CUDA_ATTENTION_SINK_CUH

// What a row's unnormalized output is multiplied by once its visible cells
// left the running max m and the sum l > 0 of exp(s - m): with the sink in
// the denominator, f / (l f + exp(sink - m')), m' = max(m, sink), f =
// exp(m - m'). exp is e^x, or with BASE2 2^x for the kernels that keep their
// scores in base 2 (sink then times log2(e)). The sink joins once per row,
// here, whatever the split of the cells.
template <bool BASE2>
static __device__ __forceinline__ float attn_sink_inv(float m, float l, float sink) {
    const float ms = fmaxf(m, sink);
    const float f = BASE2 ? exp2f(m - ms) : expf(m - ms);
    return f / (l * f + (BASE2 ? exp2f(sink - ms) : expf(sink - ms)));
}

#endif
