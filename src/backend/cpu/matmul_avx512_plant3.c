/* matmul_avx512_plant3.c - matmul_avx512.c with planted defect 3 inside its vector loops (NVFP4 block table: E2M1 magnitudes 1.0 and 1.5 swapped),
 * run only by `drama contract` as a control (path DR_CPU_AVX512_PLANT3). */
#define PLANT 3
#define AVX512_NAME(f) dr_cpu_avx512p3_##f
#include "backend/cpu/matmul_avx512.c"
