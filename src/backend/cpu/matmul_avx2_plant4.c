/* matmul_avx2_plant4.c - matmul_avx2.c with planted defect 4 inside its vector loops (canonical reduction drops the fourth accumulator),
 * run only by `drama contract` as a control (path DR_CPU_AVX2_PLANT4). */
#define PLANT 4
#define AVX2_NAME(f) dr_cpu_avx2p4_##f
#include "backend/cpu/matmul_avx2.c"
