/* ops.c - see ops.h. Inner loops run over contiguous dims so the compiler vectorises them
 * without reassociating any sum (no fast-math). */
#include "backend/cpu/ops.h"

#include <math.h>

#include "num/expf_det.h"

void dr_op_rms_norm(const float *x, const float *w, double eps, int64_t n, float *y) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    float r = (float)(1.0 / sqrt(ss / (double)n + eps));
    if (w)
        for (int64_t i = 0; i < n; i++) y[i] = (x[i] * r) * w[i];
    else
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * r;
}

void dr_op_l2norm(float *x, int64_t n, float eps, float scale) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    float r = (float)(1.0 / sqrt(ss + (double)eps)) * scale;
    for (int64_t i = 0; i < n; i++) x[i] *= r;
}

void dr_op_rope_cos_sin(const float *inv_freq, int half, int64_t pos, float *cos_out, float *sin_out) {
    for (int i = 0; i < half; i++) {
        double a = (double)pos * (double)inv_freq[i];
        cos_out[i] = (float)cos(a);
        sin_out[i] = (float)sin(a);
    }
}

void dr_op_rope_half(float *x, int half, const float *cos_v, const float *sin_v) {
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cos_v[i] - b * sin_v[i];
        x[i + half] = b * cos_v[i] + a * sin_v[i];
    }
}

void dr_op_rope_interleaved(float *x, int half, const float *cos_v, const float *sin_v) {
    for (int i = 0; i < half; i++) {
        float a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = a * cos_v[i] - b * sin_v[i];
        x[2 * i + 1] = b * cos_v[i] + a * sin_v[i];
    }
}

void dr_op_softmax(float *x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    if (mx == -INFINITY) return; /* caller checks for "no finite value" */
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float e = expf(x[i] - mx);
        x[i] = e;
        sum += e;
    }
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void dr_op_attend(const float *q, const float *k_cache, const float *v_cache, int64_t n_pos, int64_t stride,
                  int hd, float scale, float *scratch, float *out) {
    for (int64_t t = 0; t < n_pos; t++) {
        /* 8 fixed lanes, fixed combine order: vectorisable and independent of any split of work */
        const float *k = k_cache + t * stride;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int d = 0;
        for (; d + 8 <= hd; d += 8)
            for (int l = 0; l < 8; l++) acc[l] += q[d + l] * k[d + l];
        float s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
        for (; d < hd; d++) s += q[d] * k[d];
        scratch[t] = s * scale;
    }
    dr_op_softmax(scratch, n_pos);
    for (int d = 0; d < hd; d++) out[d] = 0.0f;
    for (int64_t t = 0; t < n_pos; t++) {
        const float *v = v_cache + t * stride;
        float p = scratch[t];
        for (int d = 0; d < hd; d++) out[d] += p * v[d];
    }
}

void dr_op_attend_f64(const float *q, const float *k_cache, const float *v_cache, int64_t n_pos, int64_t stride,
                      int hd, double scale, float *scratch, float *out) {
    double mx = -INFINITY;
    int64_t t = 0;
    /* four positions at once: four independent add chains (each dot keeps its own order) */
    for (; t + 4 <= n_pos; t += 4) {
        const float *k0 = k_cache + t * stride, *k1 = k0 + stride, *k2 = k1 + stride, *k3 = k2 + stride;
        double d0 = 0, d1 = 0, d2 = 0, d3 = 0;
        for (int i = 0; i < hd; i++) {
            double qi = (double)q[i];
            d0 += qi * k0[i];
            d1 += qi * k1[i];
            d2 += qi * k2[i];
            d3 += qi * k3[i];
        }
        scratch[t] = (float)(d0 * scale);
        scratch[t + 1] = (float)(d1 * scale);
        scratch[t + 2] = (float)(d2 * scale);
        scratch[t + 3] = (float)(d3 * scale);
    }
    for (; t < n_pos; t++) {
        const float *k = k_cache + t * stride;
        double dot = 0;
        for (int i = 0; i < hd; i++) dot += (double)q[i] * k[i];
        scratch[t] = (float)(dot * scale);
    }
    for (t = 0; t < n_pos; t++)
        if (scratch[t] > mx) mx = scratch[t];
    double z = 0;
    for (t = 0; t < n_pos; t++) {
        scratch[t] = (float)exp(scratch[t] - mx);
        z += scratch[t];
    }
    enum { HD_MAX = 256 };
    if (hd > HD_MAX) {
        for (int i = 0; i < hd; i++) {
            double acc = 0;
            for (t = 0; t < n_pos; t++) acc += (double)scratch[t] * v_cache[t * stride + i];
            out[i] = (float)(acc / z);
        }
        return;
    }
    /* positions outer, so each value row is read once, contiguously; every acc[i] still adds its
     * terms in position order, so the bits are those of the per-i loop above */
    double acc[HD_MAX];
    for (int i = 0; i < hd; i++) acc[i] = 0;
    for (t = 0; t < n_pos; t++) {
        const float *v = v_cache + t * stride;
        double p = (double)scratch[t];
        for (int i = 0; i < hd; i++) acc[i] += p * v[i];
    }
    for (int i = 0; i < hd; i++) out[i] = (float)(acc[i] / z);
}

void dr_op_conv_step(float *window, const float *u, const float *w, const float *bias, int K, int64_t C,
                     int64_t c0, int64_t c1, float *y) {
    for (int64_t c = c0; c < c1; c++) {
        const float *wc = w + c * K;
        float acc = bias ? bias[c] : 0.0f;
        for (int j = 0; j < K - 1; j++) acc += wc[j] * window[(int64_t)j * C + c];
        acc += wc[K - 1] * u[c];
        y[c] = acc;
        for (int j = 0; j + 1 < K - 1; j++) window[(int64_t)j * C + c] = window[(int64_t)(j + 1) * C + c];
        if (K > 1) window[(int64_t)(K - 2) * C + c] = u[c];
    }
}

void dr_op_gdn_step(float *S, const float *q, const float *k, const float *v, float g, float beta, int dk, int dv,
                    float *mem, float *o) {
    float decay = expf(g);
    for (int j = 0; j < dv; j++) mem[j] = 0.0f;
    for (int i = 0; i < dk; i++) {
        float *row = S + (int64_t)i * dv;
        float ki = k[i];
        for (int j = 0; j < dv; j++) {
            row[j] *= decay;
            mem[j] += row[j] * ki;
        }
    }
    for (int j = 0; j < dv; j++) mem[j] = (v[j] - mem[j]) * beta;
    for (int j = 0; j < dv; j++) o[j] = 0.0f;
    for (int i = 0; i < dk; i++) {
        float *row = S + (int64_t)i * dv;
        float ki = k[i], qi = q[i];
        for (int j = 0; j < dv; j++) {
            row[j] += ki * mem[j];
            o[j] += row[j] * qi;
        }
    }
}

void dr_op_topk(const float *p, int n, int k, int *ids) {
    for (int r = 0; r < k; r++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            int used = 0;
            for (int q = 0; q < r; q++) used |= ids[q] == e;
            if (used || !(p[e] >= 0.0f)) continue;
            if (best < 0 || p[e] > p[best]) best = e; /* strict: an equal later index never wins */
        }
        ids[r] = best;
    }
}

/* ---- model-level element-wise steps ---- */

void dr_op_silu(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = dr_siluf(x[i]);
}

void dr_op_swiglu(const float *gate, const float *up, int64_t n, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] = dr_siluf(gate[i]) * up[i];
}

void dr_op_sigmoid_mul(float *x, const float *gate, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] *= dr_sigmoidf(gate[i]);
}

void dr_op_gated_rms_norm(float *x, const float *w, const float *z, float eps, int64_t n) {
    dr_op_rms_norm(x, w, eps, n, x);
    for (int64_t i = 0; i < n; i++) x[i] *= dr_siluf(z[i]);
}

void dr_op_gdn_gates(float *a, float *b, const float *neg_A, const float *dt_bias, int64_t n) {
    for (int64_t h = 0; h < n; h++) {
        a[h] = neg_A[h] * dr_softplusf(a[h] + dt_bias[h]);
        b[h] = dr_sigmoidf(b[h]);
    }
}

int dr_op_moe_route(const float *scores, int E, int k, int norm_topk, float *probs, int *ids, float *weights) {
    int eligible = 0;
    for (int e = 0; e < E; e++) {
        probs[e] = isfinite(scores[e]) ? scores[e] : -INFINITY;
        eligible += isfinite(scores[e]) != 0;
    }
    if (eligible > 0) dr_op_softmax(probs, E);
    for (int e = 0; e < E; e++)
        if (!isfinite(scores[e])) probs[e] = -1.0f; /* never selectable, even with fewer eligible than k */
    dr_op_topk(probs, E, k, ids);
    double sum = 0.0;
    for (int r = 0; r < k; r++) sum += ids[r] >= 0 ? probs[ids[r]] : 0.0f;
    for (int r = 0; r < k; r++) {
        float p = ids[r] >= 0 ? probs[ids[r]] : 0.0f;
        weights[r] = norm_topk && sum > 0.0 ? (float)(p / sum) : p;
    }
    return eligible;
}

void dr_op_moe_combine(const float *const *ys, const float *w, int k, const float *y_shared, float shared_gate,
                       int64_t H, float *out) {
    for (int64_t j = 0; j < H; j++) out[j] = 0.0f;
    for (int r = 0; r < k; r++) {
        if (!ys[r]) continue;
        float wr = w[r];
        const float *y = ys[r];
        for (int64_t j = 0; j < H; j++) out[j] += wr * y[j];
    }
    if (!y_shared) return;
    float gs = dr_sigmoidf(shared_gate);
    for (int64_t j = 0; j < H; j++) out[j] += gs * y_shared[j];
}

void dr_op_guidance(const float *cond, const float *uncond, int64_t n, float gamma, float *out) {
    for (int64_t i = 0; i < n; i++) {
        float c = cond[i];
        out[i] = (isinf(c) && c < 0) ? c : c + gamma * (c - uncond[i]);
    }
}

void dr_op_exp_weights(const float *x, int64_t n, float x_max, float temperature, double *q) {
    /* dr_expf_det, not libm: the CUDA sampler computes the same bits (num/expf_det.h) */
    for (int64_t r = 0; r < n; r++) q[r] = (double)dr_expf_det((x[r] - x_max) / temperature);
}

int dr_op_top_p_count(const double *q, int m, double top_p, int keep_crossing) {
    double z = 0;
    for (int r = 0; r < m; r++) z += q[r];
    double cum = 0;
    for (int r = 0; r < m; r++) {
        double cum_prev = cum;
        cum += q[r] / z;
        /* r > 0: the first candidate always survives */
        if (keep_crossing ? (r > 0 && !(cum_prev < top_p)) : (r > 0 && !(cum <= top_p))) return r;
    }
    return m;
}
