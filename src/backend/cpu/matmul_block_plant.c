/* matmul_block_plant.c - matmul_block.c with a planted defect inside its AVX2 and AVX-512 tile
 * loops (the last weight row of a tile loads the previous row), run only by `drama contract` as a
 * control (dr_cpu_block_kernel(isa, 1)). */
#define PLANT 1
#define BLOCK_NAME(f) dr_cpu_blockp_##f
#include "backend/cpu/matmul_block.c"
