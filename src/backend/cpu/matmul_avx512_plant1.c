/* matmul_avx512_plant1.c - matmul_avx512.c with planted defect 1 inside its vector loops (affine loops: 4-bit nibbles swapped, 8-bit scale x2),
 * run only by `drama contract` as a control (path DR_CPU_AVX512_PLANT1). */
#define PLANT 1
#define AVX512_NAME(f) dr_cpu_avx512p1_##f
#include "backend/cpu/matmul_avx512.c"
