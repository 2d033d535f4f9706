// vela CUDA emulator: __half and friends live in cuda_emu.h (C++ only).
#ifdef __cplusplus
#include "../cuda_emu_types.h"
#endif
