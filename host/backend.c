#include "host/backend.h"

#include <stddef.h>

void backend_destroy(struct backend *be) {
    if (be && be->ops && be->ops->destroy)
        be->ops->destroy(be);
}

#ifndef VELA_HAVE_CUDA
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
#endif
