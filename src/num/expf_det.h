/* expf_det.h - exp for fp32 arguments, defined by one fixed sequence of IEEE double operations so
 * that the host and a CUDA device compute the same bits (libm expf differs between libraries,
 * versions and CPU variants, and the device's expf differs from all of them). The sampler's
 * weights use it (TEXT.md 5.1 steps 3 and 6), which is what lets the device draw equal the CPU
 * draw bit for bit (docs/cuda.md "Sampling").
 *
 * exp(x) = 2^k exp(r), k = nearest(x / ln 2), r = (x - k ln2_hi) - k ln2_lo (ln2_hi has 21 trailing
 * zero bits, so k ln2_hi is exact for |k| < 2^21), exp(r) by its Taylor series to r^12 (|r| <=
 * 0.35: truncation below 2^-52 relative), 2^k applied exactly, one rounding to fp32 at the end.
 * Accuracy: within 1 ulp of fp32 (checked by `drama contract`'s expf_det entry against float64).
 *
 * Every product and sum is written through DR_DMUL / DR_DADD: on the device they are the
 * round-to-nearest intrinsics (never contracted into an fma); on the host plain operators, which
 * the C11 build (-std=c11, hence -ffp-contract=off) never contracts either. */
#ifndef DRAMA_NUM_EXPF_DET_H
#define DRAMA_NUM_EXPF_DET_H

#include <stdint.h>
#include <string.h>

#ifndef DR_HD
#ifdef __CUDACC__
#define DR_HD __host__ __device__
#else
#define DR_HD
#endif
#endif

#if defined(__CUDA_ARCH__)
#define DR_DMUL(a, b) __dmul_rn((a), (b))
#define DR_DADD(a, b) __dadd_rn((a), (b))
#define DR_DSUB(a, b) __dsub_rn((a), (b))
#else
#define DR_DMUL(a, b) ((a) * (b))
#define DR_DADD(a, b) ((a) + (b))
#define DR_DSUB(a, b) ((a) - (b))
#endif

static inline DR_HD float dr_expf_det(float x) {
    if (x != x) return x + x;           /* NaN stays NaN */
    if (x > 89.0f) return 1.0f / 0.0f;  /* exp(88.73) already exceeds FLT_MAX */
    if (x < -104.0f) return 0.0f;       /* below 2^-150: rounds to zero */
    double xd = (double)x;
    const double shift = 0x1.8p52;      /* adding and removing it rounds to the nearest integer */
    double kd = DR_DSUB(DR_DADD(DR_DMUL(xd, 0x1.71547652b82fep+0), shift), shift);
    double r = DR_DSUB(DR_DSUB(xd, DR_DMUL(kd, 0x1.62e42fee00000p-1)), DR_DMUL(kd, 0x1.a39ef35793c76p-33));
    double p = 0x1.1eed8eff8d898p-29;   /* 1/12! ... 1/0!, Horner */
    p = DR_DADD(DR_DMUL(p, r), 0x1.ae64567f544e4p-26);
    p = DR_DADD(DR_DMUL(p, r), 0x1.27e4fb7789f5cp-22);
    p = DR_DADD(DR_DMUL(p, r), 0x1.71de3a556c734p-19);
    p = DR_DADD(DR_DMUL(p, r), 0x1.a01a01a01a01ap-16);
    p = DR_DADD(DR_DMUL(p, r), 0x1.a01a01a01a01ap-13);
    p = DR_DADD(DR_DMUL(p, r), 0x1.6c16c16c16c17p-10);
    p = DR_DADD(DR_DMUL(p, r), 0x1.1111111111111p-7);
    p = DR_DADD(DR_DMUL(p, r), 0x1.5555555555555p-5);
    p = DR_DADD(DR_DMUL(p, r), 0x1.5555555555555p-3);
    p = DR_DADD(DR_DMUL(p, r), 0x1.0p-1);
    p = DR_DADD(DR_DMUL(p, r), 1.0);
    p = DR_DADD(DR_DMUL(p, r), 1.0);
    int k = (int)kd;                    /* -150 .. 129: 2^k is a normal double */
    uint64_t bits = (uint64_t)(k + 1023) << 52;
    double two_k;
    memcpy(&two_k, &bits, sizeof two_k);
    return (float)DR_DMUL(p, two_k);    /* exact scaling, then the one rounding to fp32 */
}

#endif
