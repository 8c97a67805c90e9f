/* matmul_avx2_plant2.c - matmul_avx2.c with planted defect 2 inside its vector loops (FP8 fast path: scale 2^121 s instead of 2^120 s),
 * run only by `drama contract` as a control (path DR_CPU_AVX2_PLANT2). */
#define PLANT 2
#define AVX2_NAME(f) dr_cpu_avx2p2_##f
#include "backend/cpu/matmul_avx2.c"
