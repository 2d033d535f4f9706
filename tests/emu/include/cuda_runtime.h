#ifndef VELA_EMU_CUDA_RUNTIME_H
#define VELA_EMU_CUDA_RUNTIME_H
#include "cuda_runtime_api.h"
#ifdef __cplusplus
#include "cuda_fp16.h"
#include "cuda_bf16.h"
#endif
#endif
