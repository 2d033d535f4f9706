// vela CUDA emulator (tests/emu): what emu_runtime.cpp shares with the other
// parts of the emulated runtime (emu_nccl.cpp). C++ only, not for cuda/*.
#ifndef VELA_EMU_INTERNAL_H
#define VELA_EMU_INTERNAL_H

#include <stddef.h>

#include "cuda_runtime_api.h"

#define EMU_MAX_DEVICES 16

// VELA_EMU_DEVICES (default 1, at most EMU_MAX_DEVICES), read once.
int emu_devices(void);
// The calling host thread's current device (cudaSetDevice).
int emu_current_device(void);
// The device a stream belongs to (NULL / legacy / per-thread: the current
// device's default stream), and whether it is being captured.
int emu_stream_device(cudaStream_t s);
bool emu_stream_capturing(cudaStream_t s);
// The device of the cudaMalloc'ed allocation holding [p, p + n), or -1 when
// no single device allocation holds it.
int emu_ptr_device(const void *p, size_t n);
// The device of the allocation containing p (any byte of it), or -1.
int emu_ptr_owner(const void *p);
// A sticky error (a fault) is pending: device work is skipped.
bool emu_faulted(void);

#endif
