/* contract_ev.h - running error bounds for the references of fused kernels (`drama contract`,
 * docs/contract.md "Fused CUDA kernels"). A reference value is computed in float64 alongside a
 * bound e on |fp32 pipeline - exact| for the kernel's operation sequence, propagated op by op with
 * the standard first-order rules plus the products of errors (a running error analysis): every
 * rounding to fp32 adds u|result|, libm-style functions add their stated ulp error, sums formed in
 * double add n 2^-53 sum|terms|. The tolerance is 2 e (+ a subnormal floor), never an observed
 * error. Inputs are fp32 values (e = 0). */
#ifndef DRAMA_TOOLS_CONTRACT_EV_H
#define DRAMA_TOOLS_CONTRACT_EV_H

#include <math.h>

#include "tools/contract_internal.h"

#define EV_U CT_U32
#define EV_D 0x1p-53 /* unit roundoff of double */

typedef struct ev {
    double v, e;
} ev;

static inline ev ev_in(double v) { return (ev){v, 0.0}; }
/* the value rounded to fp32 once more (a stored fp32 intermediate computed in double) */
static inline ev ev_round(ev a) { return (ev){a.v, a.e + EV_U * fabs(a.v)}; }
static inline ev ev_add(ev a, ev b) { return ev_round((ev){a.v + b.v, a.e + b.e}); }
static inline ev ev_sub(ev a, ev b) { return ev_round((ev){a.v - b.v, a.e + b.e}); }
static inline ev ev_mul(ev a, ev b) {
    return ev_round((ev){a.v * b.v, fabs(a.v) * b.e + fabs(b.v) * a.e + a.e * b.e});
}
static inline ev ev_div(ev a, ev b) {
    double r = a.v / b.v, den = fabs(b.v) - b.e;
    double e = den > 0 ? (a.e + fabs(r) * b.e) / den : INFINITY;
    return ev_round((ev){r, e});
}
/* exp with the device expf (CUDA: 2 ulp <= 4u relative) */
static inline ev ev_exp(ev a) {
    double r = exp(a.v);
    return (ev){r, r * expm1(a.e) + 4 * EV_U * r};
}
/* 1 / (1 + exp(-x)) and x / (1 + exp(-x)); below -87 the fp32 exp overflows (sigmoid 0, silu -0):
 * the exact value is then under 2^-125 |x|, which the bound covers */
static inline ev ev_sigmoid(ev x) {
    if (-x.v > 87.0) return (ev){1.0 / (1.0 + exp(-x.v)), 0x1p-125 + x.e};
    return ev_div(ev_in(1.0), ev_add(ev_in(1.0), ev_exp((ev){-x.v, x.e})));
}
static inline ev ev_silu(ev x) {
    if (-x.v > 87.0) return (ev){x.v / (1.0 + exp(-x.v)), 0x1p-120 * fabs(x.v) + x.e};
    return ev_div(x, ev_add(ev_in(1.0), ev_exp((ev){-x.v, x.e})));
}
/* softplus as torch (threshold 20), device log1pf 1 ulp (2u) */
static inline ev ev_softplus(ev x) {
    if (x.v > 20.0) return (ev){x.v + log1p(exp(-x.v)), x.e + exp(-x.v)}; /* the op returns x */
    double t = exp(x.v), r = log1p(t);
    double sig = t / (1.0 + t); /* d softplus / dx */
    double et = t * expm1(x.e) + 4 * EV_U * t; /* the fp32 exp's error */
    return (ev){r, sig * x.e + et / (1.0 + t) + 2 * EV_U * r + EV_U * r};
}
/* fp32(1 / sqrt(s)) of a sum s formed in double: the root of a perturbed sum, one rounding */
static inline ev ev_rsqrt_of(ev s) {
    double r = 1.0 / sqrt(s.v), lo = s.v - s.e;
    double e = lo > 0 ? 0.5 * r * s.e / lo * 1.0000001 : INFINITY;
    return ev_round((ev){r, e});
}

/* sum over n terms in double (any order): value, propagated errors, n 2^-53 sum|t| */
typedef struct ev_acc {
    double v, e, mag;
    int64_t n;
} ev_acc;
static inline void ev_acc_add(ev_acc *s, ev t) {
    s->v += t.v;
    s->e += t.e;
    s->mag += fabs(t.v);
    s->n++;
}
static inline ev ev_acc_get(const ev_acc *s) { return (ev){s->v, s->e + (double)(s->n + 2) * EV_D * s->mag}; }
/* the same sum formed in fp32, in some order: (n + 1) u sum|t| on top */
static inline ev ev_acc_get_f32(const ev_acc *s) { return (ev){s->v, s->e + (double)(s->n + 1) * EV_U * s->mag}; }

/* RMS norm of x[0..n) with weight w (NULL = 1): y_i = x_i r w_i, r = fp32(1/sqrt(mean x^2 + eps)) */
static inline ev ev_rms_r(const ev *x, int64_t n, double eps) {
    ev_acc s = {0};
    for (int64_t i = 0; i < n; i++) ev_acc_add(&s, (ev){x[i].v * x[i].v, 2 * fabs(x[i].v) * x[i].e + x[i].e * x[i].e});
    ev ss = ev_acc_get(&s);
    return ev_rsqrt_of((ev){ss.v / (double)n + eps, ss.e / (double)n + EV_D * (ss.v / (double)n + eps)});
}

/* Tolerance of a result: twice the bound, plus a floor below any fp32 normal. */
static inline double ev_tol(ev a) { return 2.0 * a.e + 0x1p-140; }

#endif
