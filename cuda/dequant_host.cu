// The device decoders of dequant.cuh run on the host: lets a machine without
// a GPU check them, bit for bit, against gguf/quant.c (tests/gpu/
// test_cuda_decode.c). Not used on any inference path.
#include "cuda/dequant.cuh"
#include "cuda/dequant_host.h"

template <int T> static void dequant_host_row(const uint8_t *row, int64_t n, float *out) {
    for (int64_t sb = 0; sb < n / 32; sb++)
        dequant_sub32<T>(row, sb, out + sb * 32);
}

template <int T> static void dequant_host_plain(const uint8_t *row, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++)
        out[i] = load_plain<T>(row, i);
}

extern "C" int cuda_dequant_row_host(enum ggml_type type, const void *row, int64_t n, float *out,
                                     struct verr *err) {
    if (ggml_row_bytes(type, n) == 0)
        return verr_set(err, VERR_RANGE, "dequant: %s row of %lld elements is not whole blocks",
                        ggml_type_name(type), (long long)n);
    const uint8_t *r = (const uint8_t *)row;
    // What the decoders' loads need of one row (a 16-byte aligned matrix gives
    // every row this): 4 bytes for the types read with 4-byte loads, none for
    // MXFP4 (byte loads; its rows are 17 bytes a block), else 2.
    const bool a4 = type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_1 || type == GGML_TYPE_Q2_K ||
                    type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K || type == GGML_TYPE_IQ4_XS ||
                    type == GGML_TYPE_F32;
    const unsigned align = a4 ? 4u : type == GGML_TYPE_MXFP4 ? 1u : 2u;
    if (((uintptr_t)row & (align - 1u)) != 0)
        return verr_set(err, VERR_RANGE, "dequant: %s row %p is not %u-byte aligned",
                        ggml_type_name(type), row, align);
    auto plain = [&](auto tc) -> int {
        dequant_host_plain<decltype(tc)::value>(r, n, out);
        return VERR_OK;
    };
    auto quant = [&](auto tc) -> int {
        dequant_host_row<decltype(tc)::value>(r, n, out);
        return VERR_OK;
    };
    const int rc = vela_is_plain(type) ? VELA_DISPATCH_PLAIN(type, plain, 1)
                                       : VELA_DISPATCH_QTYPE_MX(type, quant, 1);
    if (rc == 1)
        return verr_set(err, VERR_UNSUPPORTED, "dequant: type %s is not supported",
                        ggml_type_name(type));
    return rc;
}
