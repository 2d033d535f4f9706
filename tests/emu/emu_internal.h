// vela CUDA emulator (tests/emu): what emu_runtime.cpp shares with the other
// parts of the emulated runtime (emu_nccl.cpp). C++ only, not for cuda/*.
#ifndef VELA_EMU_INTERNAL_H
#define VELA_EMU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_runtime_api.h"

#define EMU_MAX_DEVICES 16
// Opt-in dynamic shared memory per block (227 KiB, as on H100/H200).
#define EMU_SMEM_OPTIN 232448
// Red zones before and after every device allocation: an access there is
// out of bounds of that allocation (memcheck), where it would otherwise hit
// a neighbouring allocation or the allocator's own bytes.
#define EMU_ALLOC_RZ 1024

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

// --- the sanitizer checks (emu_check.cpp, tests/emu/README.md) ---
// Called with the runtime's g_mu held (kernels run under it).
void emu_chk_alloc(void *base, size_t bytes);
void emu_chk_free(void *base);
// The same, taking the runtime's lock (also declared in cuda_emu.h for the
// shims): bytes written outside kernels, and a read that needs them written
// (else a sticky fault naming `what`).
void emu_mark_written(const void *p, size_t n);
void emu_check_written(const void *p, size_t n, const char *what);
// Bytes written outside kernels (copies, memsets, GEMMs, NCCL): initialised.
void emu_chk_host_write(const void *dst, size_t n);
// A copy reading device memory: false, with the report in msg, when it
// reads bytes never written since cudaMalloc.
bool emu_chk_host_read(const void *src, size_t n, char *msg, size_t msg_size);
void emu_chk_launch_begin(const char *kernel, const void *fn, dim3 grid, dim3 block,
                          const void *stacks, size_t stacks_bytes, const void *sh, size_t sh_bytes,
                          const void *dyn, size_t dyn_bytes, size_t dyn_redzone, bool random);
void emu_chk_block_begin(uint64_t linear_block);
void emu_chk_block_barrier(void);
// A warp barrier released for the lanes of mask (present: the warp's lanes).
void emu_chk_warp_barrier(int warp, unsigned mask, unsigned present);
void emu_chk_launch_end(void);
// VELA_EMU_SAMPLE_BLOCKS (read once): 0 runs every block; N >= 2: a launch
// of more than N blocks runs N of them, evenly spaced (README.md, Traffic).
uint64_t emu_sample_blocks(void);
// The launch about to end ran `run` of its `total` blocks.
void emu_chk_launch_blocks(uint64_t run, uint64_t total);
// The runtime's side: a fault of the running block (sticky), the running
// thread (linear index in the block), the random schedule's generator and
// a yield of the running thread (VELA_EMU_SCHEDULE=random).
void emu_kernel_fault(const char *msg);
int emu_cur_thread(void);
uint64_t emu_rand(void);
void emu_yield(void);

#endif
