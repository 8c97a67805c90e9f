/* matmul_avx2_plant3.c - matmul_avx2.c with planted defect 3 inside its vector loops (NVFP4 block table: E2M1 magnitudes 1.0 and 1.5 swapped),
 * run only by `drama contract` as a control (path DR_CPU_AVX2_PLANT3). */
#define PLANT 3
#define AVX2_NAME(f) dr_cpu_avx2p3_##f
#include "backend/cpu/matmul_avx2.c"
