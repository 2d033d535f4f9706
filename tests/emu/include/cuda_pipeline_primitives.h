// vela CUDA emulator: __pipeline_memcpy_async / __pipeline_commit /
// __pipeline_wait_prior (cp.async) live in cuda_emu.h (C++ only).
