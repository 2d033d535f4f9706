// cpu_q8_simd.h's kernels for AVX2 + FMA + F16C (compiled with those flags,
// CMakeLists.txt); run only where cpu_q8_isa() found them.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CPU_Q8_ROWS cpu_q8_rows_avx2
#define CPU_Q8_FILL cpu_q8_x_fill_avx2
#define CPU_Q8_VNNI 0
#include "host/backend/cpu_q8_simd.h"
#endif
