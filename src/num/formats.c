/* formats.c - scalar number formats (FORMATS.md section 3). */
#include "num/formats.h"

#include <math.h>

/* Generated from the definition in FORMATS.md section 3 (bias 7, subnormal 2^-6 * m/8). */
const float dr_e4m3_table[256] = {
    0.0f, 0.001953125f, 0.00390625f, 0.005859375f, 0.0078125f, 0.009765625f, 0.01171875f, 0.013671875f,
    0.015625f, 0.017578125f, 0.01953125f, 0.021484375f, 0.0234375f, 0.025390625f, 0.02734375f, 0.029296875f,
    0.03125f, 0.03515625f, 0.0390625f, 0.04296875f, 0.046875f, 0.05078125f, 0.0546875f, 0.05859375f,
    0.0625f, 0.0703125f, 0.078125f, 0.0859375f, 0.09375f, 0.1015625f, 0.109375f, 0.1171875f,
    0.125f, 0.140625f, 0.15625f, 0.171875f, 0.1875f, 0.203125f, 0.21875f, 0.234375f,
    0.25f, 0.28125f, 0.3125f, 0.34375f, 0.375f, 0.40625f, 0.4375f, 0.46875f,
    0.5f, 0.5625f, 0.625f, 0.6875f, 0.75f, 0.8125f, 0.875f, 0.9375f,
    1.0f, 1.125f, 1.25f, 1.375f, 1.5f, 1.625f, 1.75f, 1.875f,
    2.0f, 2.25f, 2.5f, 2.75f, 3.0f, 3.25f, 3.5f, 3.75f,
    4.0f, 4.5f, 5.0f, 5.5f, 6.0f, 6.5f, 7.0f, 7.5f,
    8.0f, 9.0f, 10.0f, 11.0f, 12.0f, 13.0f, 14.0f, 15.0f,
    16.0f, 18.0f, 20.0f, 22.0f, 24.0f, 26.0f, 28.0f, 30.0f,
    32.0f, 36.0f, 40.0f, 44.0f, 48.0f, 52.0f, 56.0f, 60.0f,
    64.0f, 72.0f, 80.0f, 88.0f, 96.0f, 104.0f, 112.0f, 120.0f,
    128.0f, 144.0f, 160.0f, 176.0f, 192.0f, 208.0f, 224.0f, 240.0f,
    256.0f, 288.0f, 320.0f, 352.0f, 384.0f, 416.0f, 448.0f, NAN,
    -0.0f, -0.001953125f, -0.00390625f, -0.005859375f, -0.0078125f, -0.009765625f, -0.01171875f, -0.013671875f,
    -0.015625f, -0.017578125f, -0.01953125f, -0.021484375f, -0.0234375f, -0.025390625f, -0.02734375f, -0.029296875f,
    -0.03125f, -0.03515625f, -0.0390625f, -0.04296875f, -0.046875f, -0.05078125f, -0.0546875f, -0.05859375f,
    -0.0625f, -0.0703125f, -0.078125f, -0.0859375f, -0.09375f, -0.1015625f, -0.109375f, -0.1171875f,
    -0.125f, -0.140625f, -0.15625f, -0.171875f, -0.1875f, -0.203125f, -0.21875f, -0.234375f,
    -0.25f, -0.28125f, -0.3125f, -0.34375f, -0.375f, -0.40625f, -0.4375f, -0.46875f,
    -0.5f, -0.5625f, -0.625f, -0.6875f, -0.75f, -0.8125f, -0.875f, -0.9375f,
    -1.0f, -1.125f, -1.25f, -1.375f, -1.5f, -1.625f, -1.75f, -1.875f,
    -2.0f, -2.25f, -2.5f, -2.75f, -3.0f, -3.25f, -3.5f, -3.75f,
    -4.0f, -4.5f, -5.0f, -5.5f, -6.0f, -6.5f, -7.0f, -7.5f,
    -8.0f, -9.0f, -10.0f, -11.0f, -12.0f, -13.0f, -14.0f, -15.0f,
    -16.0f, -18.0f, -20.0f, -22.0f, -24.0f, -26.0f, -28.0f, -30.0f,
    -32.0f, -36.0f, -40.0f, -44.0f, -48.0f, -52.0f, -56.0f, -60.0f,
    -64.0f, -72.0f, -80.0f, -88.0f, -96.0f, -104.0f, -112.0f, -120.0f,
    -128.0f, -144.0f, -160.0f, -176.0f, -192.0f, -208.0f, -224.0f, -240.0f,
    -256.0f, -288.0f, -320.0f, -352.0f, -384.0f, -416.0f, -448.0f, -NAN,
};

const float dr_e2m1_table[16] = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

double dr_rne(double v) {
    double fl = floor(v);
    double d = v - fl; /* exact for |v| < 2^52 */
    if (d > 0.5) return fl + 1.0;
    if (d < 0.5) return fl;
    return fmod(fl, 2.0) == 0.0 ? fl : fl + 1.0;
}

uint16_t dr_f32_to_bf16(float f) {
    uint32_t u = dr_f32_bits(f);
    if (isnan(f)) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float dr_f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31;
    uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0) {
        /* subnormal or zero: exact in fp32 */
        float v = (float)m * 0x1p-24f;
        return dr_f32_from_bits(dr_f32_bits(v) | s);
    }
    /* NaN comes back quiet (bit 9 set), as the F16C instruction does, so both paths agree */
    if (e == 31) return dr_f32_from_bits(s | 0x7F800000u | ((m ? (m | 0x200u) : 0u) << 13));
    return dr_f32_from_bits(s | ((e - 15 + 127) << 23) | (m << 13));
}

uint16_t dr_f32_to_f16(float f) {
    uint32_t u = dr_f32_bits(f);
    uint16_t s = (uint16_t)((u >> 16) & 0x8000);
    if (isnan(f)) return (uint16_t)(s | 0x7E00);
    double a = fabs((double)f);
    if (a >= 65520.0) return (uint16_t)(s | 0x7C00); /* 65520 = halfway past 65504: rounds up to inf */
    if (a < 0x1p-14) {
        /* subnormal range: steps of 2^-24; q = 1024 lands exactly on the smallest normal */
        return (uint16_t)(s | (uint16_t)dr_rne(a * 0x1p24));
    }
    int ex;
    frexp(a, &ex); /* a = f * 2^ex, f in [0.5, 1) */
    int e = ex - 1; /* a in [2^e, 2^(e+1)) */
    double q = dr_rne(ldexp(a, 10 - e)); /* in [1024, 2048] */
    uint32_t code = ((uint32_t)(e + 15) << 10) + ((uint32_t)q - 1024u); /* q = 2048 carries */
    return (uint16_t)(s | code);
}

uint8_t dr_e4m3_from_f64(double x) {
    if (isnan(x)) return 0x7F;
    uint8_t s = signbit(x) ? 0x80 : 0x00;
    double a = fabs(x);
    if (a >= 448.0) return (uint8_t)(s | 0x7E);
    if (a < 0x1p-6) return (uint8_t)(s | (uint8_t)dr_rne(a * 512.0)); /* 8 = smallest normal */
    int ex;
    frexp(a, &ex);
    int e = ex - 1;                          /* -6 .. 8 */
    double q = dr_rne(ldexp(a, 3 - e));     /* in [8, 16]; 16 carries into the next exponent */
    int code = ((e + 7) << 3) + ((int)q - 8);
    if (code > 0x7E) code = 0x7E;            /* cannot happen below 448; kept as a guard */
    return (uint8_t)(s | code);
}

uint8_t dr_e2m1_from_f64(double x) {
    if (isnan(x)) return 0;
    double a = fabs(x);
    int code;
    if (a >= 6.0) code = 7;
    else if (a < 1.0) code = (int)dr_rne(a * 2.0);         /* 0, 0.5, 1.0 (code 2) */
    else {
        int ex;
        frexp(a, &ex);
        int e = ex - 1;                                     /* 0 .. 2 */
        double q = dr_rne(ldexp(a, 1 - e));                /* in [2, 4] */
        code = ((e + 1) << 1) + ((int)q - 2);
        if (code > 7) code = 7;
    }
    if (code == 0) return 0;
    return (uint8_t)((x < 0 ? 8 : 0) | code);
}
