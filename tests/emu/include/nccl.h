// vela CUDA emulator (tests/emu): the part of NCCL's C API that
// cuda/nccl_transport.c uses, in-process only, implemented by
// tests/emu/emu_nccl.cpp over the emulated devices (VELA_EMU_DEVICES).
// Names, types and values as in NCCL 2.x's nccl.h. C-compatible.
#ifndef VELA_EMU_NCCL_H
#define VELA_EMU_NCCL_H

#include <stddef.h>

#include "cuda_runtime_api.h"

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 0
#define VELA_EMU_NCCL 1

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm *ncclComm_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

typedef enum {
    ncclInt8 = 0, ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2, ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6, ncclHalf = 6,
    ncclFloat32 = 7, ncclFloat = 7,
    ncclFloat64 = 8, ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclFloat8e4m3 = 10,
    ncclFloat8e5m2 = 11,
    ncclNumTypes = 12
} ncclDataType_t;

const char *ncclGetErrorString(ncclResult_t result);
// The last error's details (NCCL >= 2.13); the emulator's are process-wide.
const char *ncclGetLastError(ncclComm_t comm);

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
// Ranks of one id may join from any threads of this process; a call returns
// at once (the emulator never waits for the other ranks here).
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
// One rank per device of devlist (NULL: 0..ndev-1); devices must be distinct.
ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
ncclResult_t ncclCommDestroy(ncclComm_t comm);

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);

ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

// Emulator extension: bytes delivered by matched send / receive pairs so
// far (tests check that a transfer really went through NCCL).
unsigned long long emu_nccl_bytes_delivered(void);

#ifdef __cplusplus
}
#endif

#endif
