/* matmul_avx512_plant4.c - matmul_avx512.c with planted defect 4 inside its vector loops (canonical reduction drops the sums 16..31),
 * run only by `drama contract` as a control (path DR_CPU_AVX512_PLANT4). */
#define PLANT 4
#define AVX512_NAME(f) dr_cpu_avx512p4_##f
#include "backend/cpu/matmul_avx512.c"
