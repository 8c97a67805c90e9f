/* cuda_codec.h - the codec decoder (codes -> 44.1 kHz samples, CODEC.md 2 and 6) on a CUDA device.
 *
 * dr_cuda_codec_attach uploads a loaded decoder's weights once (fp32, the CPU's folded values) and
 * attaches a device decoder to the dr_codec (dr_codec_set_accel): streams created afterwards run
 * every layer on the device (VQ table sums, post_module with its KV window, upsampling ConvNeXt
 * blocks, the decoder's convs with Snake / residual / tanh fused into their epilogues) and copy only
 * the samples back. Each output value is one fixed-order sum whatever the chunk, the tile or the
 * split, so any chunking of a stream gives the device's whole decode bit for bit; device and CPU
 * results differ by rounding (docs/cuda.md "Codec decoder" states the bounds).
 * Feeds are serialised by a mutex (one stream of the device at a time). */
#ifndef DRAMA_BACKEND_CUDA_CUDA_CODEC_H
#define DRAMA_BACKEND_CUDA_CUDA_CODEC_H

#ifdef __cplusplus
extern "C" {
#endif

#include "base/error.h"
#include "codec/codec.h"

/* Upload the decoder of c (loaded with DR_CODEC_LOAD_DECODER) to device `device` and attach it.
 * No device, no decoder, or a layer the device path lacks (grouped convs other than depthwise):
 * an error naming why, and c is left on the CPU. */
drama_status dr_cuda_codec_attach(dr_codec *c, int device, drama_error *err);
/* Device bytes the attached decoder holds (weights), 0 when none is attached. */
size_t dr_cuda_codec_weight_bytes(const dr_codec *c);

/* Kernel-level entries for `drama contract` (contract_cuda_codec.c): one conv call
 * y[o][t] = epi(b[o] + sum_i sum_k w[o][i][k] x[i][t + k*dil]) on device buffers, x with H = (K-1)*dil
 * history columns in front ([cin][H + L]); act: 0 none, 1 Snake (alpha, inv), 2 tanh;
 * res (may be NULL) added last; splits: the fixed split of the input channels (1, 2, 4, ...);
 * plant: 0, or a planted defect inside the tiled loop (1: the last tap skipped). */
drama_status dr_cuda_codec_conv_test(const float *w, const float *b, const float *x, int cin, int cout, int K, int dil,
                                     int64_t L, int act, const float *alpha, const float *inv, const float *res,
                                     int splits, int plant, float *y, drama_error *err);

#ifdef __cplusplus
}
#endif

#endif
