/* matmul_avx2_plant1.c - matmul_avx2.c with planted defect 1 inside its vector loops (affine 4-bit fused loop: the two nibbles of each byte swapped),
 * run only by `drama contract` as a control (path DR_CPU_AVX2_PLANT1). */
#define PLANT 1
#define AVX2_NAME(f) dr_cpu_avx2p1_##f
#include "backend/cpu/matmul_avx2.c"
