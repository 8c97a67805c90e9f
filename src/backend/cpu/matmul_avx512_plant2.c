/* matmul_avx512_plant2.c - matmul_avx512.c with planted defect 2 inside its vector loops (FP8 loop: scale 2^121 s instead of 2^120 s),
 * run only by `drama contract` as a control (path DR_CPU_AVX512_PLANT2). */
#define PLANT 2
#define AVX512_NAME(f) dr_cpu_avx512p2_##f
#include "backend/cpu/matmul_avx512.c"
