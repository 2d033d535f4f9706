// cpu_q8_simd.h's kernels with AVX-VNNI's byte dot (vpdpbusd), for GCC 11 and
// later (compiled with -mavxvnni, CMakeLists.txt); run only where cpu_q8_isa()
// found AVX-VNNI.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define CPU_Q8_ROWS cpu_q8_rows_avxvnni
#define CPU_Q8_FILL cpu_q8_x_fill_avxvnni
#define CPU_Q8_VNNI 1
#include "host/backend/cpu_q8_simd.h"
#endif
