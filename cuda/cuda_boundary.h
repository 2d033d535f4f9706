// What every per-op header of cuda/ (attention.h, matvec.h, ...) shares: the
// plain C boundary between the host (C11) and the kernels (CUDA C++), and
// its contract.
//
// Contract for every entry point:
// - every pointer is device memory unless named otherwise; shapes are written
//   next to each pointer, the last index varying fastest;
// - work is enqueued on `stream` and the call returns without waiting;
// - returns 0, or a negative VERR_* code with err filled (VERR_BACKEND names
//   the failing CUDA/cuBLAS statement, its error string, file and line;
//   VERR_RANGE / VERR_UNSUPPORTED for arguments the kernels cannot take).
// - `pdl` (where an entry point takes it): launch its kernels with
//   programmatic dependent launch (cuda/launch.cuh); true only on devices of
//   compute capability 9.0 and up.
// Arguments are validated by cuda/backend_cuda.c before it calls in here;
// the entry points re-check only what would make a kernel read out of bounds.
#ifndef VELA_CUDA_BOUNDARY_H
#define VELA_CUDA_BOUNDARY_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
#define VELA_CUDA_BEGIN extern "C" {
#define VELA_CUDA_END }
#else
#define VELA_CUDA_BEGIN
#define VELA_CUDA_END
#endif

// C headers without extern "C" guards of their own.
VELA_CUDA_BEGIN
#include "gguf/types.h"
#include "gguf/verr.h"
VELA_CUDA_END

#endif
