/* gdn_chunk_plant.c - gdn_chunk.c with a planted defect inside both vecmat loops (AVX2 and
 * portable: the last coefficient of a run replaced by the one before), run only by
 * `drama contract` as a control. */
#define PLANT 1
#define GDN_CHUNK_NAME dr_op_gdn_chunk_planted
#include "backend/cpu/gdn_chunk.c"
