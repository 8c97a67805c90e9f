/* codec_kernels.cuh - the codec decoder's device kernels (codec_kernels.cu) and their launch
 * arguments, shared with the host side (codec_dec.cu). C++ only. Activations are [channels][time]
 * fp32 as on the CPU (codec/internal.h). Every fp32 step outside the conv's fmaf chain is spelled
 * with round-to-nearest intrinsics, so nvcc never contracts it differently in two instances. */
#ifndef DRAMA_BACKEND_CUDA_CODEC_KERNELS_CUH
#define DRAMA_BACKEND_CUDA_CODEC_KERNELS_CUH

#include <cuda_runtime.h>
#include <stdint.h>

enum { CK_ACT_NONE = 0, CK_ACT_SNAKE = 1, CK_ACT_TANH = 2, CK_ACT_GELU = 3, CK_ACT_SILU_MUL = 4 };

/* A conv's epilogue: v = acc + bias; v = act(v); v = gamma * v; v = res + v; store at
 * y[o * ldy + column] (res and aux are read at the same index); column = t * phases + phase. */
struct ck_epi {
    const float *bias;         /* [cout] or NULL */
    int act;                   /* CK_ACT_* */
    const float *alpha, *inv;  /* Snake: [cout] */
    const float *aux;          /* SILU_MUL: v = silu(v) * aux */
    const float *gamma;        /* [cout] or NULL */
    const float *res;          /* or NULL (may equal y) */
    float *y;
    int64_t ldy;
};

/* One stride-1 conv call, or all `phases` output phases of a transposed conv (phase q: weights at
 * w + q * phase_len, output columns t * phases + q). Input column c of channel i is
 * c < H ? hist[i * H + c] : x[i * L + c - H]; output t reads columns t + k * dil, k < K. The input
 * channels are cut into `splits` equal parts; with splits > 1 each part's sum goes to
 * part[q][s][cout][L] and ck_reduce adds them in order s = 0, 1, ... and runs the epilogue. */
struct ck_conv {
    const float *w;     /* per phase [cin][K][cout]: the tile loads read consecutive outputs (coalesced) */
    int phases;
    int64_t phase_len;
    const float *in_alpha, *in_inv; /* a Snake applied to every input value as it is staged, or NULL */
    const float *hist;  /* [cin][H] or NULL (H 0) */
    const float *x;     /* [cin][L] */
    int cin, cout, K, dil, H;
    int64_t L;
    int splits, bki;    /* bki: channels per shared-memory stage (0: ck_conv_launch picks) */
    float *part;
    ck_epi e;
    int plant;          /* drama contract: 1 = skip the last tap inside the tiled loop */
};

cudaError_t ck_conv_launch(const ck_conv *p, cudaStream_t s);
/* Sums of the splits in order, then the epilogue: y from part [phases][splits][cout][L] */
cudaError_t ck_reduce_launch(const float *part, int splits, int phases, int cout, int64_t L, const ck_epi *e,
                             cudaStream_t s);
/* keep[i][j] = column L + j of the conv input (hist + x), j < H: the history of the next call
 * (keep is the other buffer of the stream's pair, never hist itself) */
cudaError_t ck_hist_next(const float *hist, const float *x, int cin, int H, int64_t L, float *keep, cudaStream_t s);
/* y = snake(x) per channel, [C][L] (y may be x) */
cudaError_t ck_snake(const float *x, float *y, const float *alpha, const float *inv, int C, int64_t L, cudaStream_t s);
/* depthwise conv with history (ConvNeXt): y[c][t] = b[c] + sum_k w[c][k] xin[c][t + k*dil] */
cudaError_t ck_dwconv(const float *w, const float *b, const float *hist, const float *x, int C, int K, int dil, int H,
                      int64_t L, float *y, cudaStream_t s);
/* ConvNeXt LayerNorm over channels per time step, in place */
cudaError_t ck_layernorm(float *x, int C, int64_t L, const float *w, const float *b, float eps, cudaStream_t s);
/* y = x / sqrt(mean(x^2) + eps) * w per time step */
cudaError_t ck_rmsnorm(const float *x, float *y, int D, int64_t L, const float *w, float eps, cudaStream_t s);
/* codes [T][K] (clamped) -> z [Q][T] = table0[c0] + (table1[c1] + ...) */
#define CK_MAX_BOOKS 32
struct ck_tables {
    const float *t[CK_MAX_BOOKS];
};
cudaError_t ck_vq_sum(const ck_tables *tab, int K, const int32_t *codes, int Q, int T, float *z, cudaStream_t s);
/* RoPE on rows [row0, row0 + H*hd) of qkv [rows][L], positions pos0 + t (codec/transformer.c) */
cudaError_t ck_rope(float *qkv, int row0, int H, int hd, float base, int bf16, int64_t L, int64_t pos0,
                    cudaStream_t s);
/* K, V rows of qkv [3*Dq][L] -> ring [cap][Dq] at (pos0 + t) % cap */
cudaError_t ck_kv_store(const float *qkv, int Dq, int64_t L, float *rk, float *rv, int cap, int64_t pos0,
                        cudaStream_t s);
/* windowed causal attention: query t (absolute pos0 + t) sees positions max(0, p - W + 1) .. p of
 * the ring; q = rows [0, Dq) of qkv [3Dq][L]; out [Dq][L] */
size_t ck_attend_smem(int W, int hd); /* shared bytes of ck_attend: at most 48 KiB */
cudaError_t ck_attend(const float *qkv, const float *rk, const float *rv, int cap, int H, int hd, int W, int64_t L,
                      int64_t pos0, float *out, cudaStream_t s);

#endif
