/* fuzz_index.c - libFuzzer target: model.safetensors.index.json parsing from memory. An accepted
 * index must have a non-empty map whose shard names are plain *.safetensors file names. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dr_ckpt_index *ix = NULL;
    drama_error err = {0};
    if (dr_ckpt_parse_index((const char *)data, size, "fuzz", &ix, &err) != DRAMA_OK) {
        if (ix || !err.message[0]) abort();
        return 0;
    }
    if (ix->count <= 0 || ix->nshards <= 0 || ix->nshards > ix->count) abort();
    for (int i = 0; i < ix->nshards; i++) {
        const char *s = ix->shards[i];
        size_t n = strlen(s);
        if (strchr(s, '/') || strchr(s, '\\') || n < 12 || strcmp(s + n - 12, ".safetensors")) abort();
    }
    for (int64_t k = 0; k < ix->count; k++)
        if (ix->shard_of[k] < 0 || ix->shard_of[k] >= ix->nshards || !ix->names[k]) abort();
    dr_ckpt_index_free(ix);
    return 0;
}
