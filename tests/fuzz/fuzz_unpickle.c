/* libFuzzer target: the restricted unpickler and the torch-zip reader. Inputs starting with
 * "PK" are whole archives (dr_pth_open_memory), "{" a codec.json (parsed, validated and its
 * expected inventory listed), anything else is a bare pickle (dr_pk_load).
 * Any input must end in DRAMA_OK or a named error; sanitizers catch the rest. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "codec/codec.h"
#include "io/torchzip.h"
#include "io/unpickle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void count(void *ctx, const char *name, int ndim, const int64_t *shape) {
    (void)name, (void)ndim, (void)shape;
    ++*(int64_t *)ctx;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    drama_error err = {0};
    if (size >= 2 && data[0] == 'P' && data[1] == 'K') {
        dr_pth *p = NULL;
        if (dr_pth_open_memory(data, size, "fuzz.pth", &p, &err) == DRAMA_OK) {
            for (int64_t i = 0; i < dr_pth_count(p); i++) {
                const dr_tensor *t = dr_pth_at(p, i);
                volatile uint8_t sink = 0;
                if (t->nbytes) sink ^= t->data[0] ^ t->data[t->nbytes - 1];
                (void)sink;
            }
            dr_pth_close(p);
        } else if (!err.message[0]) {
            abort(); /* a failure must name its cause */
        }
        return 0;
    }
    if (size >= 1 && data[0] == '{') {
        dr_codec_config c;
        dr_codec_config_default(&c);
        int64_t n = 0;
        if (dr_codec_config_parse((const char *)data, size, "fuzz.json", &c, &err) == DRAMA_OK &&
            dr_codec_config_validate(&c, &err) == DRAMA_OK)
            dr_codec_expected(&c, count, &n, &err);
        else if (!err.message[0])
            abort(); /* a refused codec.json names its cause */
        return 0;
    }
    dr_pk_limits lim = {.max_values = 1 << 16, .max_stack = 1 << 12, .max_memo = 1 << 14};
    dr_pk *pk = NULL;
    const dr_pk_value *root = NULL;
    if (dr_pk_load(data, size, "fuzz.pkl", &lim, &pk, &root, &err) == DRAMA_OK) dr_pk_free(pk);
    else if (!err.message[0]) abort();
    return 0;
}
