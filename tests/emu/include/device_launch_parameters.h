// vela CUDA emulator: threadIdx & co. come from cuda_emu.h.
