/* select.c - see select.h. */
#include "backend/select/select.h"

#include <string.h>

#include "backend/cpu/cpu_backend.h"
#ifdef DRAMA_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_codec.h"
#include "backend/cuda/cuda_seam.h"
#endif

drama_status dr_backend_parse(const char *name, dr_backend_want *out, drama_error *err) {
    if (name && !strcmp(name, "cpu")) *out = DR_WANT_CPU;
    else if (name && !strcmp(name, "cuda")) *out = DR_WANT_CUDA;
    else if (name && !strcmp(name, "auto")) *out = DR_WANT_AUTO;
    else return dr_fail(err, DRAMA_EINVAL, "backend: expected cpu, cuda or auto, got '%s'", name ? name : "(null)");
    return DRAMA_OK;
}

const char *dr_backend_want_name(dr_backend_want w) {
    return w == DR_WANT_CPU ? "cpu" : w == DR_WANT_CUDA ? "cuda" : "auto";
}

/* Opens the CUDA backend on `device`; 0 when it cannot, with the reason in err. */
static drama_status cuda_open(int device, dr_backend **out, drama_error *err) {
    *out = NULL;
#ifdef DRAMA_HAVE_CUDA
    char why[256] = "";
    int count = dr_cuda_device_count(why, sizeof why);
    if (count <= 0) return dr_fail(err, DRAMA_EUNSUPPORTED, "no CUDA device: %s", why[0] ? why : "none found");
    if (device < 0 || device >= count)
        return dr_fail(err, DRAMA_EINVAL, "--device %d: this machine has %d CUDA device%s (0..%d)", device, count,
                       count == 1 ? "" : "s", count - 1);
    return dr_backend_cuda_create(device, out, err);
#else
    (void)device;
    return dr_fail(err, DRAMA_EUNSUPPORTED, "cuda backend: this build has no CUDA support (built without nvcc)");
#endif
}

drama_status dr_backend_open(const dr_backend_choice *c, dr_pool *pool, dr_backend **out, drama_error *err) {
    *out = NULL;
    dr_backend_choice def = {DR_WANT_AUTO, 0};
    if (!c) c = &def;
    if (c->want == DR_WANT_CUDA) return cuda_open(c->device, out, err);
    if (c->want == DR_WANT_AUTO) {
        drama_error quiet = {0};
        if (cuda_open(c->device, out, &quiet) == DRAMA_OK) return DRAMA_OK;
    }
    return dr_backend_cpu_create(pool, out, err);
}

drama_status dr_backend_codec_attach(const dr_backend_choice *ch, dr_codec *c, const char **where, drama_error *err) {
    dr_backend_choice def = {DR_WANT_AUTO, 0};
    if (!ch) ch = &def;
    if (where) *where = dr_codec_decoder_name(c);
    if (ch->want == DR_WANT_CPU || !strcmp(dr_codec_decoder_name(c), "cuda")) return DRAMA_OK;
    drama_error quiet = {0}; /* auto: the CPU when the device cannot, and err stays untouched */
    drama_error *e = ch->want == DR_WANT_AUTO ? &quiet : err;
#ifdef DRAMA_HAVE_CUDA
    char why[256] = "";
    int count = dr_cuda_device_count(why, sizeof why);
    drama_status st;
    if (count <= 0)
        st = dr_fail(e, DRAMA_EUNSUPPORTED, "codec on cuda: no CUDA device: %s", why[0] ? why : "none found");
    else if (ch->device < 0 || ch->device >= count)
        st = dr_fail(e, DRAMA_EINVAL, "--device %d: this machine has %d CUDA device%s (0..%d)", ch->device, count,
                     count == 1 ? "" : "s", count - 1);
    else
        st = dr_cuda_codec_attach(c, ch->device, e);
    if (where) *where = dr_codec_decoder_name(c);
    return ch->want == DR_WANT_AUTO ? DRAMA_OK : st;
#else
    if (ch->want == DR_WANT_AUTO) return DRAMA_OK;
    return dr_fail(e, DRAMA_EUNSUPPORTED, "codec on cuda: this build has no CUDA support (built without nvcc)");
#endif
}
