// The accelerator entry points for a build without CUDA (-DVELA_CUDA=OFF or
// no toolkit). The host libraries call backend_cuda_* and transport_nccl_*
// without knowing which library defines them: the vela binary, the tests
// and the benchmarks link exactly one of vela_cuda (cuda/), vela_cuda_emu
// (tests/emu/, the kernels on the CPU) or vela_nocuda (this file), so the
// host code is compiled once for all three.
#include "host/ops/backend.h"
#include "host/ops/transport.h"

bool backend_cuda_built(void) {
    return false;
}

int backend_cuda_create(struct backend **out, int device, struct verr *err) {
    *out = NULL;
    return verr_set(err, VERR_UNSUPPORTED,
                    "the CUDA backend is not available: vela was built with -DVELA_CUDA=OFF");
}

int backend_cuda_device_count(void) {
    return 0;
}

int backend_cuda_device_info(int device, struct backend_device_info *out, struct verr *err) {
    (void)device;
    *out = (struct backend_device_info){0};
    return verr_set(err, VERR_UNSUPPORTED,
                    "the CUDA backend is not available: vela was built with -DVELA_CUDA=OFF");
}

void *backend_cuda_stream(struct backend *be) {
    (void)be;
    return NULL;
}

int backend_cuda_mem_info(int device, size_t *free_bytes, size_t *total_bytes, struct verr *err) {
    *free_bytes = *total_bytes = 0;
    return verr_set(err, VERR_UNSUPPORTED, "CUDA device %d: vela was built without CUDA", device);
}

int transport_nccl_create(struct transport **out, struct backend *const *be, int n,
                          const void *unique_id, int rank, struct verr *err) {
    *out = NULL;
    return verr_set(err, VERR_UNSUPPORTED, "NCCL: vela was built without CUDA");
}

int transport_nccl_unique_id(void *id, struct verr *err) {
    return verr_set(err, VERR_UNSUPPORTED, "NCCL: vela was built without CUDA");
}
