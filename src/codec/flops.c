/* flops.c - floating-point operations of one frame of decode or encode, counted from the loaded
 * codec's layers (the benchmark's GFLOP/s). A multiply-add counts 2. Conv: 2 cout (cin/groups) k
 * per output step; transposed conv: 2 cin cout k per input step (the products the layer defines;
 * zero taps of a phase when k is not a multiple of the stride are not counted); transformer per
 * position: 2 x its weights (wqkv, wo, w1, w2, w3) + 4 n_head head_dim W (scores and values
 * over a full window W). Elementwise work (Snake, norms, GELU, tanh, table sums) is left out;
 * encode adds the VQ search, 2 n dim per code and codebook. */
#include "codec/internal.h"

/* conv on `steps` input steps per frame: flops, and the output steps per frame */
static double conv_flops(const cd_conv *cv, double *steps) {
    double in = *steps, f;
    if (cv->transposed) {
        f = 2.0 * cv->cin * cv->cout * cv->k * in;
        *steps = in * cv->stride;
    } else {
        *steps = in / cv->stride;
        f = 2.0 * cv->cout * (double)(cv->cin / cv->groups) * cv->k * *steps;
    }
    return f;
}

static double tf_flops(const cd_tf *tf, double steps) {
    const dr_codec_tf_config *cf = &tf->cfg;
    if (cf->n_layer <= 0) return 0;
    double D = cf->dim, Dq = (double)cf->n_head * cf->head_dim, F = cf->intermediate_size;
    double per_layer = 2.0 * (D * 3 * Dq + Dq * D + 3 * D * F) + 4.0 * Dq * cf->window_size;
    return per_layer * cf->n_layer * steps;
}

static double ru_flops(const cd_ru *ru, double steps) {
    double s = steps;
    double f = conv_flops(&ru->c1, &s);
    return f + conv_flops(&ru->c2, &s);
}

static double cnx_flops(const cd_convnext *b, double steps) {
    double s = steps;
    double f = conv_flops(&b->dw, &s);
    f += conv_flops(&b->pw1, &s);
    return f + conv_flops(&b->pw2, &s);
}

/* decode FLOPs per frame of each stage (DR_CODEC_N_STAGES, the stages of dr_codec_stream_set_profile) */
static double decode_stage_flops(const dr_codec *c, double *stage) {
    const dr_codec_config *cf = &c->cfg;
    double s = 1, f = 0; /* latent steps per frame */
    for (int i = 0; i < DR_CODEC_N_STAGES; i++) stage[i] = 0;
    stage[0] = tf_flops(&c->post, s);
    for (int i = 0; i < cf->n_down; i++) {
        stage[1] += conv_flops(&c->up[i], &s);
        stage[1] += cnx_flops(&c->up_cnx[i], s);
    }
    stage[2] = conv_flops(&c->dec_in, &s);
    for (int b = 0; b < cf->n_decoder_rates; b++) {
        int st = 3 + 2 * (b < DR_CODEC_MAX_RATES ? b : DR_CODEC_MAX_RATES - 1);
        stage[st] += conv_flops(&c->dec[b].up, &s);
        for (int r = 0; r < cf->n_dilations; r++) stage[st + 1] += ru_flops(&c->dec[b].ru[r], s);
    }
    stage[DR_CODEC_N_STAGES - 1] = conv_flops(&c->dec_out, &s);
    for (int i = 0; i < DR_CODEC_N_STAGES; i++) f += stage[i];
    return f;
}

double dr_codec_stage_flops_per_frame(const dr_codec *c, int stage) {
    double st[DR_CODEC_N_STAGES];
    decode_stage_flops(c, st);
    return stage >= 0 && stage < DR_CODEC_N_STAGES ? st[stage] : 0;
}

/* encode FLOPs per frame of each stage (DR_CODEC_N_ENC_STAGES, the stages of dr_codec_encode_ex) */
static double encode_stage_flops(const dr_codec *c, double *stage) {
    const dr_codec_config *cf = &c->cfg;
    double s = cf->frame_length, f = 0; /* samples per frame */
    for (int i = 0; i < DR_CODEC_N_ENC_STAGES; i++) stage[i] = 0;
    stage[0] = conv_flops(&c->enc_in, &s);
    for (int b = 0; b < cf->n_encoder_rates; b++) {
        int sb = b < DR_CODEC_MAX_RATES ? b : DR_CODEC_MAX_RATES - 1;
        for (int r = 0; r < cf->n_dilations; r++) stage[CD_ES_RU(sb)] += ru_flops(&c->enc[b].ru[r], s);
        stage[CD_ES_DOWN(sb)] += conv_flops(&c->enc[b].down, &s);
        if (c->enc[b].has_tf) stage[CD_ES_TF] += tf_flops(&c->enc[b].tf, s);
    }
    stage[CD_ES_OUT] = conv_flops(&c->enc_out, &s);
    for (int i = 0; i < cf->n_down; i++) {
        stage[CD_ES_QDOWN] += conv_flops(&c->down[i], &s);
        stage[CD_ES_QDOWN] += cnx_flops(&c->down_cnx[i], s);
    }
    stage[CD_ES_PRE] = tf_flops(&c->pre, s);
    for (int k = 0; k < cf->num_codebooks; k++) {
        double one = s;
        stage[CD_ES_VQ] += conv_flops(&c->vq[k].in_proj, &one) + 2.0 * c->vq[k].n * c->vq[k].dim * s;
    }
    for (int i = 0; i < DR_CODEC_N_ENC_STAGES; i++) f += stage[i];
    return f;
}

double dr_codec_enc_stage_flops_per_frame(const dr_codec *c, int stage) {
    double st[DR_CODEC_N_ENC_STAGES];
    encode_stage_flops(c, st);
    return stage >= 0 && stage < DR_CODEC_N_ENC_STAGES ? st[stage] : 0;
}

double dr_codec_flops_per_frame(const dr_codec *c, int encode) {
    double st[DR_CODEC_N_ENC_STAGES > DR_CODEC_N_STAGES ? DR_CODEC_N_ENC_STAGES : DR_CODEC_N_STAGES];
    return encode ? encode_stage_flops(c, st) : decode_stage_flops(c, st);
}
