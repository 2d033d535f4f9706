// backend_cuda_device_info: what benchmarks report about a GPU (host/ops/backend.h).
// The memory clock comes from cudaDeviceGetAttribute: CUDA 13 dropped
// memoryClockRate from cudaDeviceProp.
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "host/ops/backend.h"

int backend_cuda_device_info(int device, struct backend_device_info *out, struct verr *err) {
    memset(out, 0, sizeof *out);
    const int n = backend_cuda_device_count();
    if (device < 0 || device >= n)
        return verr_set(err, VERR_NOTFOUND, "CUDA device %d not found (%d usable device%s)", device,
                        n, n == 1 ? "" : "s");
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return verr_set(err, VERR_BACKEND, "cudaGetDeviceProperties(%d): %s (%s:%d)", device,
                        cudaGetErrorString(e), __FILE__, __LINE__);
    }
    snprintf(out->name, sizeof out->name, "%.*s", (int)sizeof p.name, p.name);
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    out->sm_count = p.multiProcessorCount;
    out->mem_bytes = p.totalGlobalMem;
    out->l2_bytes = (size_t)p.l2CacheSize;
    out->bus_width_bits = p.memoryBusWidth;
    if (cudaDeviceGetAttribute(&out->mem_clock_khz, cudaDevAttrMemoryClockRate, device) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        out->mem_clock_khz = 0;
    }
    if (cudaDriverGetVersion(&out->driver_version) != cudaSuccess)
        out->driver_version = 0;
    if (cudaRuntimeGetVersion(&out->runtime_version) != cudaSuccess)
        out->runtime_version = 0;
    (void)cudaGetLastError();
    // Double data rate (GDDR and HBM alike): two transfers per clock.
    out->peak_bw_gbs = 2.0 * out->mem_clock_khz * 1e3 * (out->bus_width_bits / 8.0) / 1e9;
    return VERR_OK;
}
