// Backend lifecycle and device queries shared by every backend.
#include "host/ops/backend.h"

#include "host/backend/cpu_q8.h"

#include <stddef.h>
#include <stdio.h>

int backend_create_device(const struct backend_device *d, const struct backend_settings *s,
                          struct backend **out, struct verr *err) {
    const int n_threads = s ? s->n_threads : 0;
    int rc = d->kind == BACKEND_DEVICE_CPU ? backend_cpu_create(out, n_threads, err)
                                           : backend_cuda_create(out, d->ordinal, err);
    if (rc)
        return rc;
    if (s && s->act != BACKEND_ACT_DEFAULT)
        (*out)->act_q8 = s->act == BACKEND_ACT_Q8;
    else if (d->kind == BACKEND_DEVICE_CPU)
        // The CPU's default: q8 where its SIMD kernels run (cpu_q8.h), as
        // llama.cpp's CPU backend quantizes activations; the reference f32
        // path otherwise (the scalar q8 dots would only be slower).
        (*out)->act_q8 = cpu_q8_isa() != CPU_Q8_ISA_NONE;
    return VERR_OK;
}

void backend_destroy(struct backend *be) {
    if (be && be->ops && be->ops->destroy)
        be->ops->destroy(be);
}

int backend_device_memory(const struct backend_device *d, size_t *free_bytes, size_t *total_bytes,
                          struct verr *err) {
    if (d->kind == BACKEND_DEVICE_CUDA)
        return backend_cuda_mem_info(d->ordinal, free_bytes, total_bytes, err);
    return backend_cpu_mem_info(free_bytes, total_bytes);
}

void backend_device_name(const struct backend_device *d, char *buf, size_t cap) {
    if (d->kind == BACKEND_DEVICE_CPU)
        snprintf(buf, cap, "cpu");
    else
        snprintf(buf, cap, "cuda:%d", d->ordinal);
}
