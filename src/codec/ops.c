/* ops.c - codec convolutions and elementwise blocks (CODEC.md section 3) on [channels][time].
 *
 * Determinism rule (CODEC.md 6): every output value is one fixed-order sum (input channels in
 * order, taps in order, then + bias), whatever the number of time steps in the call, the tile
 * it falls in or the thread that computes it. Vectorisation runs across time steps or across
 * output channels, never across a sum. History columns make a call on a chunk equal to the same
 * call on the whole sequence. The portable kernels here are the reference (products and sums
 * rounded apart: -ffp-contract=off); the AVX2 and AVX-512 kernels (conv_x86.c) run the same
 * sums as FMA chains. One instruction set is picked per conv at load (cd_isa_best). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "codec/internal.h"
#include "codec/kernels.h"

#define VW 8     /* time steps per register block */
#define TT 256   /* time steps per layer-norm block */
#define OB CD_WPACK /* output channels per packed weight block */

typedef float v8 __attribute__((vector_size(VW * sizeof(float)))); /* GNU vector: SSE pairs or AVX */

static int isa_detect(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return CD_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CD_ISA_AVX2;
#endif
    return CD_ISA_PORTABLE;
}

static const char *const isa_names[CD_ISA_COUNT] = {"portable", "avx2", "avx512"};

const char *cd_isa_name(int isa) { return isa >= 0 && isa < CD_ISA_COUNT ? isa_names[isa] : "?"; }

int cd_isa_supported(int isa) { return isa >= CD_ISA_PORTABLE && isa <= isa_detect(); }

int cd_isa_best(void) {
    static int best = -1; /* the CPU and the environment do not change while the process runs */
    if (best >= 0) return best;
    int b = isa_detect();
    const char *e = getenv("DRAMA_CODEC_ISA");
    for (int i = 0; e && i < CD_ISA_COUNT; i++)
        if (!strcmp(e, isa_names[i]) && i <= b) b = i;
    return best = b;
}

int cd_gemm_default(void) {
    static int on = -1; /* the environment does not change while the process runs */
    if (on < 0) {
        const char *e = getenv("DRAMA_CODEC_GEMM");
        on = !(e && !strcmp(e, "0"));
    }
    return on;
}

void cd_pack_weights(const float *w, float *packed, int cout, int cin_g, int k) {
    int64_t row = (int64_t)cin_g * k;
    for (int o = 0; o < (cout + OB - 1) / OB * OB; o++)
        for (int64_t ik = 0; ik < row; ik++)
            packed[((int64_t)(o / OB) * row + ik) * OB + o % OB] = o < cout ? w[(int64_t)o * row + ik] : 0.0f;
}

float cd_weight_at(const float *packed, int cin_g, int k, int o, int i, int kk) {
    return packed[((int64_t)(o / OB) * cin_g * k + (int64_t)i * k + kk) * OB + o % OB];
}

void cd_conv_init(cd_conv *cv, int cin, int cout, int k, int dil, int stride, int groups, int transposed) {
    *cv = (cd_conv){.cin = cin, .cout = cout, .k = k, .dil = dil, .stride = stride, .groups = groups,
                    .transposed = transposed, .state = -1, .isa = cd_isa_best(), .gemm = cd_gemm_default()};
    if (transposed) {
        cv->hist = (k + stride - 1) / stride - 1; /* inputs that still reach the next outputs */
    } else {
        int span = (k - 1) * dil + 1;
        cv->hist = span - stride > 0 ? span - stride : 0;
    }
}

int64_t cd_conv_weight_len(const cd_conv *cv) {
    if (!cv->transposed) return cd_packed_len(cv->cout, cv->cin / cv->groups, cv->k);
    int R = (cv->k + cv->stride - 1) / cv->stride;
    return cv->stride * cd_packed_len(cv->cout, cv->cin, R);
}

void cd_conv_pack(const cd_conv *cv, const float *w, float *packed) {
    if (!cv->transposed) {
        cd_pack_weights(w, packed, cv->cout, cv->cin / cv->groups, cv->k);
        return;
    }
    /* [cin][cout][k] -> per output phase q: a stride-1 conv [cout][cin][R] whose tap r reads
     * kernel tap q + (R-1-r)*s (oldest input first); taps past k are zero */
    int s = cv->stride, R = (cv->k + s - 1) / s, cin = cv->cin, cout = cv->cout, k = cv->k;
    int64_t plen = cd_packed_len(cout, cin, R);
    for (int q = 0; q < s; q++) {
        float *pq = packed + (int64_t)q * plen;
        for (int o = 0; o < (cout + OB - 1) / OB * OB; o++)
            for (int i = 0; i < cin; i++)
                for (int r = 0; r < R; r++) {
                    int tap = q + (R - 1 - r) * s;
                    float v = o < cout && tap < k ? w[((int64_t)i * cout + o) * k + tap] : 0.0f;
                    pq[((int64_t)(o / OB) * cin * R + (int64_t)i * R + r) * OB + o % OB] = v;
                }
    }
}

static inline float snake1(float v, float alpha, float inv) {
    float s = sinf(alpha * v);
    return v + inv * (s * s);
}

/* the portable epilogue: + bias, fused Snake, residual, store */
static inline __attribute__((always_inline)) void put(const cd_conv_job *j, int o, int64_t t, float a) {
    float v = a + (j->b ? j->b[o] : 0.0f);
    if (j->snake) v = snake1(v, j->snake->alpha[o], j->snake->inv[o]);
    int64_t at = (int64_t)o * j->ldy + j->yoff + t * j->ystep;
    if (j->res) v = j->res[at] + v;
    j->y[at] = v;
}

/* nt output steps from t0 (any stride, groups 1), vectorised across the OB outputs of block ob:
 * each lane runs the plain per-output sum in order, so a value equals the scalar loop's. Inlined
 * into each caller's clone. */
static inline __attribute__((always_inline)) void steps_across_outputs(const cd_conv_job *j, int ob, int64_t t0,
                                                                       int64_t nt) {
    int cin = j->cin, K = j->k, d = j->dil, s = j->stride, o0 = ob * OB, no = j->cout - o0 < OB ? j->cout - o0 : OB;
    const float *wb = j->w + (int64_t)ob * cin * K * OB;
    for (int64_t t = 0; t < nt; t++) {
        v8 acc = {0};
        for (int i = 0; i < cin; i++) {
            const float *xr = j->x + (int64_t)i * j->lx + (t0 + t) * s;
            const float *wr = wb + (int64_t)i * K * OB;
            for (int k = 0; k < K; k++) {
                v8 wv;
                memcpy(&wv, wr + (int64_t)k * OB, sizeof wv);
                acc = acc + wv * xr[(int64_t)k * d];
            }
        }
        for (int r = 0; r < no; r++) put(j, o0 + r, t0 + t, acc[r]);
    }
}

/* Stride-1, groups-1 conv on one block of OB outputs. Every output is the same fixed-order sum
 * a = 0; a = a + w[o][i][k] * x[i][t + k d] over i, then k; y = a + bias. Full groups of VW
 * steps are vectorised across time (4 outputs x 8 steps in registers); the remaining steps are
 * vectorised across the OB outputs instead: each lane still runs the same sum in the same
 * order, so a value never depends on which path computed it (no FP contraction:
 * -ffp-contract=off). On x86-64 GCC also builds an AVX2 clone, picked once per process at load
 * time (ifunc), so generic builds use 8-wide registers where the CPU has them; a process always
 * runs the same clone, so its results stay bit-identical for any chunking. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && !defined(__AVX2__)
__attribute__((target_clones("avx2", "default")))
#endif
static void conv_block_s1(const cd_conv_job *j, int ob, int64_t t0, int64_t nt) {
    int cin = j->cin, K = j->k, d = j->dil, o0 = ob * OB, no = j->cout - o0 < OB ? j->cout - o0 : OB;
    const float *wb = j->w + (int64_t)ob * cin * K * OB;
    int64_t t = 0;
    for (; t + VW <= nt; t += VW) {
        for (int h = 0; h < OB; h += 4) {
            if (h >= no) break;
            v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int i = 0; i < cin; i++) {
                const float *xr = j->x + (int64_t)i * j->lx + t0 + t;
                const float *wr = wb + (int64_t)i * K * OB + h;
                for (int k = 0; k < K; k++) {
                    v8 xv;
                    memcpy(&xv, xr + (int64_t)k * d, sizeof xv); /* unaligned load */
                    const float *w4 = wr + (int64_t)k * OB;
                    a0 = a0 + w4[0] * xv;
                    a1 = a1 + w4[1] * xv;
                    a2 = a2 + w4[2] * xv;
                    a3 = a3 + w4[3] * xv;
                }
            }
            v8 acc[4] = {a0, a1, a2, a3};
            for (int r = 0; r < 4 && h + r < no; r++)
                for (int e = 0; e < VW; e++) put(j, o0 + h + r, t0 + t + e, acc[r][e]);
        }
    }
    steps_across_outputs(j, ob, t0 + t, nt - t);
}

/* General case (strides, groups): a plain loop with the same per-output order. */
static void conv_block_generic(const cd_conv_job *j, int ob, int64_t t0, int64_t nt) {
    int cin_g = j->cin / j->groups, cout_g = j->cout / j->groups;
    int K = j->k, d = j->dil, s = j->stride, o0 = ob * OB, no = j->cout - o0 < OB ? j->cout - o0 : OB;
    for (int r = 0; r < no; r++) {
        int o = o0 + r, g = o / cout_g;
        for (int64_t t = 0; t < nt; t++) {
            float a = 0.0f;
            for (int i = 0; i < cin_g; i++) {
                const float *xr = j->x + (int64_t)(g * cin_g + i) * j->lx + (t0 + t) * s;
                for (int k = 0; k < K; k++) a = a + cd_weight_at(j->w, cin_g, K, o, i, k) * xr[(int64_t)k * d];
            }
            put(j, o, t0 + t, a);
        }
    }
}

/* Strided, groups-1 conv: the generic loop's sums, vectorised across the OB outputs of the block. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && !defined(__AVX2__)
__attribute__((target_clones("avx2", "default")))
#endif
static void conv_block_strided(const cd_conv_job *j, int ob, int64_t t0, int64_t nt) { steps_across_outputs(j, ob, t0, nt); }

/* one conv call: n_phase output phases (transposed convs; 1 otherwise) x weight blocks x tiles */
#define CD_MAX_SEG CD_MAX_TAPS
typedef struct conv_run {
    cd_conv_job j;
    int isa, simd, n_phase; /* simd: the SIMD kernels run it (groups 1, at most CD_MAX_TAPS taps) */
    int64_t toff[CD_MAX_TAPS];
    int64_t phase_len; /* floats of packed weights per phase */
    int64_t n_ob, n_tiles;
    int nob;          /* weight blocks per task (AVX2 GEMM blocking; else 1) */
    int64_t n_obg;    /* tasks per tile and phase: ceil(n_ob / nob) */
    float *acc;       /* [workers][nob * 8][CD_TILE] partial sums (AVX2 with more than one contraction block) */
    /* SIMD: each worker copies the input columns of its tile into a contiguous panel of cin rows
     * of prow floats (one segment of columns per cluster of tap offsets), kept while its next
     * tasks are on the same tile */
    int n_seg;
    int64_t seg_lo[CD_MAX_SEG], seg_len[CD_MAX_SEG], seg_at[CD_MAX_SEG]; /* columns past t0, extra length, panel column */
    int64_t ptoff[CD_MAX_TAPS]; /* tap offsets in the panel */
    int64_t prow;
    float *panel;     /* [workers][cin][prow] */
    int64_t *tile_of; /* [workers]: tile held in the worker's panel, -1 none */
} conv_run;

/* tap offsets -> column segments of the panel for tiles of at most tw steps (sorted offsets; a gap
 * wider than a tile starts a new one) */
static void plan_panel(conv_run *cr, int K, int64_t tw) {
    int64_t v[CD_MAX_TAPS];
    for (int k = 0; k < K; k++) v[k] = cr->toff[k];
    for (int a = 1; a < K; a++) /* insertion sort: K <= 64 */
        for (int b = a; b > 0 && v[b - 1] > v[b]; b--) {
            int64_t t = v[b];
            v[b] = v[b - 1], v[b - 1] = t;
        }
    int n = 0;
    int64_t at = 0;
    for (int k = 0; k < K; k++) {
        if (n == 0 || v[k] - (cr->seg_lo[n - 1] + cr->seg_len[n - 1]) > tw) {
            if (n) at += cr->seg_len[n - 1] + tw;
            cr->seg_lo[n] = v[k], cr->seg_len[n] = 0, cr->seg_at[n] = at, n++;
        }
        cr->seg_len[n - 1] = v[k] - cr->seg_lo[n - 1];
    }
    at += cr->seg_len[n - 1] + tw;
    cr->n_seg = n;
    for (int k = 0; k < K; k++)
        for (int g = n - 1; g >= 0; g--)
            if (cr->toff[k] >= cr->seg_lo[g]) {
                cr->ptoff[k] = cr->seg_at[g] + cr->toff[k] - cr->seg_lo[g];
                break;
            }
    int64_t row = (at + 15) / 16 * 16;
    cr->prow = row % 1024 ? row : row + 16; /* rows 4 KB apart would share cache sets */
}

/* AVX2 GEMM blocking (kernels.h): input channels per contraction block such that the block's
 * weights (8 outputs x K taps) and its input window for 24 steps (every panel segment) take
 * about 24 KB of the 32 KB L1, split evenly; up to 4 weight blocks per task, fewer while the
 * call would have under 4 tasks per thread */
#define GEMM_L1 24576
static void gemm_plan(conv_run *cr, const cd_conv *cv, int K, int nw) {
    int64_t per_ch = (int64_t)OB * K * 4;
    for (int g = 0; g < cr->n_seg; g++) per_ch += (cr->seg_len[g] + 24) * 4;
    int64_t kcb = GEMM_L1 / per_ch, cin = cv->cin;
    if (kcb < 8) kcb = 8;
    if (kcb < cin) {
        int64_t nblk = (cin + kcb - 1) / kcb;
        kcb = (cin + nblk - 1) / nblk;
    }
    cr->j.kcb = (int)(cv->kcb > 0 ? cv->kcb : kcb < cin ? kcb : cin);
    int nob = 4;
    while (nob > 1 && cr->n_tiles * cr->n_phase * ((cr->n_ob + nob - 1) / nob) < 4 * (int64_t)nw) nob /= 2;
    cr->nob = cv->nob > 0 ? cv->nob : nob;
}

static void pack_panel(const conv_run *cr, int64_t t0, int64_t nt, float *panel) {
    for (int i = 0; i < cr->j.cin; i++) {
        const float *src = cr->j.x + (int64_t)i * cr->j.lx + t0;
        float *dst = panel + (int64_t)i * cr->prow;
        for (int g = 0; g < cr->n_seg; g++)
            memcpy(dst + cr->seg_at[g], src + cr->seg_lo[g], (size_t)(cr->seg_len[g] + nt) * sizeof(float));
    }
}

static void conv_task(void *ctx, int64_t idx, int worker) {
    conv_run *cr = ctx;
    /* tile-major: a thread's contiguous run of tasks shares one input tile across phases and weight
     * blocks, so the tile is read from memory once and then from its cache (ob-major order read
     * every tile again for each weight block: from DRAM once activations outgrow the caches) */
    int64_t per_tile = cr->n_obg * cr->n_phase, tile = idx / per_tile, rest = idx % per_tile;
    int64_t q = rest / cr->n_obg, ob = rest % cr->n_obg * cr->nob;
    int nob = cr->n_ob - ob < cr->nob ? (int)(cr->n_ob - ob) : cr->nob;
    cd_conv_job j = cr->j;
    j.w += q * cr->phase_len;
    j.yoff = q;
    int64_t t0 = tile * CD_TILE, nt = j.ly - t0 < CD_TILE ? j.ly - t0 : CD_TILE;
    if (cr->simd) {
        float *panel = cr->panel + (int64_t)worker * cr->j.cin * cr->prow;
        if (cr->tile_of[worker] != tile) pack_panel(cr, t0, nt, panel), cr->tile_of[worker] = tile;
        j.x = panel, j.lx = cr->prow, j.toff = cr->ptoff, j.xt0 = t0;
        if (cr->acc) j.acc = cr->acc + (int64_t)worker * cr->nob * OB * CD_TILE;
        if (cr->isa == CD_ISA_AVX512) cd_conv_tile_avx512(&j, (int)ob, t0, nt);
        else if (cr->isa == CD_ISA_AVX2) cd_conv_tile_avx2(&j, (int)ob, nob, t0, nt);
    } else if (j.stride == 1 && j.groups == 1) {
        conv_block_s1(&j, (int)ob, t0, nt);
    } else if (j.groups == 1) {
        conv_block_strided(&j, (int)ob, t0, nt);
    } else {
        conv_block_generic(&j, (int)ob, t0, nt);
    }
}

int64_t cd_conv_out_len(const cd_conv *cv, int64_t L) { return cv->transposed ? L * cv->stride : L / cv->stride; }

static void snake_row(const cd_snake *sn, int64_t c, const float *x, float *y, int64_t L);

/* the conv's input rows [history | x] (SIMD strided: phase-major), x through Snake sn_in when
 * given; rows in parallel (one thread copying 12 MB was a serial step at 16 threads) */
typedef struct pad_job {
    const float *hist, *x;
    float *buf;
    const cd_snake *sn_in;
    int64_t L, hist_n, lx, lp, row, s;
    int phased;
} pad_job;

static void pad_rows(void *ctx, int64_t i0, int64_t n) {
    const pad_job *j = ctx;
    for (int64_t i = i0; i < i0 + n; i++) {
        float *br = j->buf + i * j->row;
        int64_t h = j->hist_n, s = j->s, lp = j->lp;
        const float *hr = h > 0 ? j->hist + i * h : NULL, *xr = j->x + i * j->L;
        if (!j->phased) {
            if (h > 0) memcpy(br, hr, (size_t)h * sizeof(float));
            if (j->sn_in) snake_row(j->sn_in, i, xr, br + h, j->L);
            else memcpy(br + h, xr, (size_t)j->L * sizeof(float));
            continue;
        }
        /* column c goes to phase c % s, place c / s: counters instead of divisions; x through
         * Snake in pieces of 256 (sn_in: a value does not depend on the piece it is in) */
        int64_t p = 0, q = 0;
        for (int64_t c = 0; c < h; c++) {
            br[p * lp + q] = hr[c];
            if (++p == s) p = 0, q++;
        }
        float tmpv[256];
        for (int64_t c0 = 0; c0 < j->L; c0 += 256) {
            int64_t np = j->L - c0 < 256 ? j->L - c0 : 256;
            const float *src = xr + c0;
            if (j->sn_in) snake_row(j->sn_in, i, src, tmpv, np), src = tmpv;
            for (int64_t e = 0; e < np; e++) {
                br[p * lp + q] = src[e];
                if (++p == s) p = 0, q++;
            }
        }
        for (int64_t c = j->lx; c < s * lp; c++) br[c % s * lp + c / s] = 0.0f; /* never read */
    }
}

/* y = res + snake(conv(sn_in(x))): cd_conv_run_ex with the input's Snake fused into the copy */
static drama_status conv_exec(const cd_conv *cv, float *hist, const float *x, int64_t L, float *y, const cd_snake *sn_in,
                             const cd_snake *snake, const float *res, dr_pool *pool, drama_error *err) {
    if (L <= 0) return DRAMA_OK;
    if (!cv->transposed && L % cv->stride)
        return dr_fail(err, DRAMA_EINTERNAL, "codec: conv input length %lld not a multiple of stride %d", (long long)L,
                       cv->stride);
    if (res && cv->transposed) return dr_fail(err, DRAMA_EINTERNAL, "codec: residual on a transposed conv");
    int64_t lx = L + cv->hist, s = cv->stride;
    int K = cv->transposed ? (cv->k + (int)s - 1) / (int)s : cv->k;
    int simd = cv->isa != CD_ISA_PORTABLE && cv->groups == 1 && K <= CD_MAX_TAPS;
    /* SIMD strided conv: each input row laid out phase-major (phase p: columns p, p+s, ...), so
     * output step t's tap k is column t + (k d) / s of phase (k d) % s: contiguous in t */
    int phased = simd && !cv->transposed && s > 1;
    int64_t lp = phased ? (lx + s - 1) / s : lx, row = phased ? s * lp : lx;
    const float *xin = x;
    float *buf = NULL;
    if (cv->hist > 0 || phased || sn_in) {
        size_t bytes;
        if (!dr_mul_size((size_t)cv->cin * (size_t)row, sizeof(float), &bytes) || !(buf = dr_alloc(bytes)))
            return dr_fail(err, DRAMA_ENOMEM, "codec: out of memory (conv of %lld steps)", (long long)L);
        pad_job pj = {hist, x, buf, sn_in, L, cv->hist, lx, lp, row, s, phased};
        cd_par_blocks(pool, cv->cin, 8, (double)row * (sn_in ? 8.0 : 0.5), pad_rows, &pj);
        xin = buf;
    }
    conv_run cr = {.j = {.b = cv->b, .cin = cv->cin, .cout = cv->cout, .x = xin, .lx = row, .y = y, .snake = snake,
                         .res = res, .plant = cv->plant, .w = cv->w, .gemm = cv->gemm},
                   .isa = cv->isa, .simd = simd, .n_phase = 1};
    cr.j.toff = cr.toff;
    if (cv->transposed) {
        /* phase q of the output (samples j*s + q) is a stride-1 conv of the input with the taps
         * q + r*s (re-laid at load as cv->w[q]: [cout][cin][R], tap order oldest input first) */
        cr.j.k = K, cr.j.dil = 1, cr.j.stride = 1, cr.j.groups = 1;
        cr.j.ly = L, cr.j.ldy = L * s, cr.j.ystep = s;
        cr.n_phase = (int)s, cr.phase_len = cd_packed_len(cv->cout, cv->cin, K);
        for (int r = 0; simd && r < K; r++) cr.toff[r] = r;
    } else {
        cr.j.k = cv->k, cr.j.dil = cv->dil, cr.j.stride = cv->stride, cr.j.groups = cv->groups;
        cr.j.ly = L / s, cr.j.ldy = cr.j.ly, cr.j.ystep = 1;
        for (int k = 0; simd && k < K; k++) {
            int64_t at = (int64_t)k * cv->dil;
            cr.toff[k] = phased ? at % s * lp + at / s : at;
        }
    }
    cr.n_tiles = (cr.j.ly + CD_TILE - 1) / CD_TILE;
    cr.n_ob = (cv->cout + OB - 1) / OB;
    cr.nob = 1;
    int nw = dr_pool_threads(pool);
    if (simd) {
        plan_panel(&cr, K, cr.j.ly < CD_TILE ? cr.j.ly : CD_TILE); /* short calls: short rows */
        if (cr.isa == CD_ISA_AVX2 && cv->gemm) gemm_plan(&cr, cv, K, nw);
        size_t pb, ab = 0;
        int blocked = cr.j.kcb > 0 && cr.j.kcb < cv->cin;
        if (!dr_mul_size((size_t)nw * (size_t)cv->cin, (size_t)cr.prow * sizeof(float), &pb) ||
            !dr_mul_size((size_t)nw * (size_t)cr.nob, (size_t)OB * CD_TILE * sizeof(float), &ab) ||
            !(cr.panel = dr_alloc(pb)) || !(cr.tile_of = malloc((size_t)nw * sizeof *cr.tile_of)) ||
            (blocked && !(cr.acc = dr_alloc(ab)))) {
            dr_free(cr.panel), free(cr.tile_of), dr_free(buf);
            return dr_fail(err, DRAMA_ENOMEM, "codec: out of memory (conv panels)");
        }
        for (int w = 0; w < nw; w++) cr.tile_of[w] = -1;
    }
    cr.n_obg = (cr.n_ob + cr.nob - 1) / cr.nob;
    dr_pool_run(pool, cr.n_phase * cr.n_obg * cr.n_tiles, conv_task, &cr);
    dr_free(cr.panel), free(cr.tile_of), dr_free(cr.acc);
    if (cv->hist > 0) { /* keep the last hist input columns for the next call */
        for (int i = 0; i < cv->cin; i++) {
            const float *br = buf + (int64_t)i * row;
            float *hr = hist + (int64_t)i * cv->hist;
            for (int64_t c = L; c < lx; c++) hr[c - L] = phased ? br[c % s * lp + c / s] : br[c];
        }
    }
    dr_free(buf);
    return DRAMA_OK;
}

drama_status cd_conv_run_ex(const cd_conv *cv, float *hist, const float *x, int64_t L, float *y, const cd_snake *snake,
                            const float *res, dr_pool *pool, drama_error *err) {
    return conv_exec(cv, hist, x, L, y, NULL, snake, res, pool, err);
}

drama_status cd_conv_run_snake_in(const cd_conv *cv, float *hist, const float *x, int64_t L, float *y,
                                  const cd_snake *sn_in, dr_pool *pool, drama_error *err) {
    return conv_exec(cv, hist, x, L, y, sn_in, NULL, NULL, pool, err);
}

drama_status cd_conv_run(const cd_conv *cv, float *hist, const float *x, int64_t L, float *y, dr_pool *pool,
                         drama_error *err) {
    return cd_conv_run_ex(cv, hist, x, L, y, NULL, NULL, pool, err);
}

typedef struct snake_job {
    const cd_snake *s;
    const float *x;
    float *y;
    int64_t L;
} snake_job;

static void snake_row(const cd_snake *sn, int64_t c, const float *x, float *y, int64_t L) {
    float a = sn->alpha[c], inv = sn->inv[c];
    if (sn->isa == CD_ISA_AVX512) cd_snake_row_avx512(a, inv, x, y, L, sn->plant);
    else if (sn->isa == CD_ISA_AVX2) cd_snake_row_avx2(a, inv, x, y, L, sn->plant);
    else
        for (int64_t t = 0; t < L; t++) y[t] = snake1(x[t], a, inv);
}

static void snake_task(void *ctx, int64_t c, int worker) {
    (void)worker;
    const snake_job *j = ctx;
    snake_row(j->s, c, j->x + c * j->L, j->y + c * j->L, j->L);
}

void cd_snake_prepare(cd_snake *s, double eps) {
    for (int i = 0; i < s->c; i++) s->inv[i] = 1.0f / (s->alpha[i] + (float)eps); /* fp32, as the reference */
    s->isa = cd_isa_best();
}

void cd_snake_apply(const cd_snake *s, const float *x, float *y, int64_t L, dr_pool *pool) {
    snake_job j = {s, x, y, L};
    dr_pool_run(pool, s->c, snake_task, &j);
}

void cd_snake_run(const cd_snake *s, float *x, int64_t L, dr_pool *pool) { cd_snake_apply(s, x, x, L, pool); }

static float *tmp(int64_t c, int64_t L) {
    size_t bytes;
    if (!dr_mul_size((size_t)c * (size_t)L, sizeof(float), &bytes)) return NULL;
    return dr_alloc(bytes ? bytes : 4);
}

/* x + conv2(snake2(conv1(snake1(x)))): snake1 fused into conv1's input copy, snake2 into its
 * output, the residual add into conv2's */
drama_status cd_ru_run(const cd_ru *ru, float **hist, float *x, int64_t L, dr_pool *pool, drama_error *err) {
    float *b = tmp(ru->c1.cout, L);
    drama_status rc = DRAMA_OK;
    if (!b) rc = dr_fail(err, DRAMA_ENOMEM, "codec: out of memory (residual unit)");
    if (!rc) rc = conv_exec(&ru->c1, cd_hist(hist, &ru->c1), x, L, b, &ru->s1, &ru->s2, NULL, pool, err);
    if (!rc) rc = cd_conv_run_ex(&ru->c2, cd_hist(hist, &ru->c2), b, L, x, NULL, x, pool, err);
    dr_free(b);
    return rc;
}

typedef struct par_job {
    void (*fn)(void *ctx, int64_t i0, int64_t len);
    void *ctx;
    int64_t n, block;
} par_job;

static void par_task(void *ctx, int64_t i, int worker) {
    (void)worker;
    const par_job *j = ctx;
    int64_t i0 = i * j->block, len = j->n - i0 < j->block ? j->n - i0 : j->block;
    j->fn(j->ctx, i0, len);
}

void cd_par_blocks(dr_pool *pool, int64_t n, int64_t block, double work_per_item,
                   void (*fn)(void *ctx, int64_t i0, int64_t len), void *ctx) {
    if (n <= 0) return;
    par_job j = {fn, ctx, n, block > 0 ? block : 1};
    dr_pool_run_work(pool, (n + j.block - 1) / j.block, par_task, &j, work_per_item * (double)n);
}

typedef struct ln_job {
    float *x;
    int C;
    int64_t L;
    const float *w, *b;
    double eps;
} ln_job;

/* steps t0 .. t0+len: the sums of a step run over its channels in order, whatever the block */
static void ln_steps(void *ctx, int64_t t0_, int64_t len) {
    const ln_job *j = ctx;
    float *x = j->x;
    int C = j->C;
    int64_t L = j->L;
    const float *w = j->w, *b = j->b;
    double eps = j->eps;
    for (int64_t t0 = t0_; t0 < t0_ + len; t0 += TT) {
        int64_t nt = t0_ + len - t0 < TT ? t0_ + len - t0 : TT;
        float mean[TT], var[TT];
        for (int64_t t = 0; t < nt; t++) mean[t] = 0.0f, var[t] = 0.0f;
        for (int c = 0; c < C; c++)
            for (int64_t t = 0; t < nt; t++) mean[t] += x[(int64_t)c * L + t0 + t];
        for (int64_t t = 0; t < nt; t++) mean[t] /= (float)C;
        for (int c = 0; c < C; c++)
            for (int64_t t = 0; t < nt; t++) {
                float d = x[(int64_t)c * L + t0 + t] - mean[t];
                var[t] += d * d;
            }
        for (int64_t t = 0; t < nt; t++) var[t] = 1.0f / sqrtf(var[t] / (float)C + (float)eps);
        for (int c = 0; c < C; c++)
            for (int64_t t = 0; t < nt; t++) {
                float *p = &x[(int64_t)c * L + t0 + t];
                *p = (*p - mean[t]) * var[t] * w[c] + b[c];
            }
    }
}

/* LayerNorm over channels per time step; sums run over channels in order for every t. */
void cd_layernorm_ct(float *x, int C, int64_t L, const float *w, const float *b, double eps, dr_pool *pool) {
    ln_job j = {x, C, L, w, b, eps};
    cd_par_blocks(pool, L, 8, 4.0 * C, ln_steps, &j);
}

drama_status cd_convnext_run(const cd_convnext *b, float **hist, float *x, int64_t L, dr_pool *pool, drama_error *err) {
    int C = b->dw.cout, H = b->pw1.cout;
    float *h = tmp(C, L), *m = tmp(H, L), *o = tmp(C, L);
    drama_status rc = DRAMA_OK;
    if (!h || !m || !o) rc = dr_fail(err, DRAMA_ENOMEM, "codec: out of memory (ConvNeXt block)");
    if (!rc) rc = cd_conv_run(&b->dw, cd_hist(hist, &b->dw), x, L, h, pool, err);
    if (!rc) {
        cd_layernorm_ct(h, C, L, b->ln_w, b->ln_b, b->ln_eps, pool);
        rc = cd_conv_run(&b->pw1, NULL, h, L, m, pool, err);
    }
    if (!rc) {
        cd_gelu_erf(m, (int64_t)H * L, pool);
        rc = cd_conv_run(&b->pw2, NULL, m, L, o, pool, err);
    }
    if (!rc)
        for (int c = 0; c < C; c++)
            for (int64_t t = 0; t < L; t++) x[(int64_t)c * L + t] += b->gamma[c] * o[(int64_t)c * L + t];
    dr_free(h), dr_free(m), dr_free(o);
    return rc;
}

static void gelu_part(void *ctx, int64_t i0, int64_t len) {
    float *x = (float *)ctx + i0;
    for (int64_t i = 0; i < len; i++) x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * (float)M_SQRT1_2));
}

void cd_gelu_erf(float *x, int64_t n, dr_pool *pool) { cd_par_blocks(pool, n, 4096, 16.0, gelu_part, x); }

typedef struct map_job {
    const float *x;
    float *y;
} map_job;

static void tanh_part(void *ctx, int64_t i0, int64_t len) {
    const map_job *j = ctx;
    for (int64_t i = i0; i < i0 + len; i++) j->y[i] = tanhf(j->x[i]);
}

void cd_tanh(const float *x, float *y, int64_t n, dr_pool *pool) {
    map_job j = {x, y};
    cd_par_blocks(pool, n, 4096, 16.0, tanh_part, &j);
}

float cd_unit_vector(const float *x, int64_t stride, int dim, float *out) {
    float ss = 0.0f, hs = 0.0f;
    for (int d = 0; d < dim; d++) ss += x[d * stride] * x[d * stride];
    float nrm = sqrtf(ss), den = nrm > 1e-12f ? nrm : 1e-12f;
    for (int d = 0; d < dim; d++) {
        out[d] = x[d * stride] / den;
        hs += out[d] * out[d];
    }
    return hs;
}

void cd_vq_normalise(cd_vq *q) {
    for (int j = 0; j < q->n; j++)
        q->cb_hat_sq[j] = cd_unit_vector(q->codebook + (int64_t)j * q->dim, 1, q->dim, q->cb_hat + (int64_t)j * q->dim);
}

int cd_vq_nearest(const cd_vq *q, const float *e, int64_t stride) {
    float eh[CD_VQ_MAX_DIM];
    if (q->dim > CD_VQ_MAX_DIM) return -1;
    float ee = cd_unit_vector(e, stride, q->dim, eh);
    int best = 0;
    float best_d = INFINITY;
    for (int j = 0; j < q->n; j++) {
        const float *h = q->cb_hat + (int64_t)j * q->dim;
        float dot = 0.0f;
        for (int d = 0; d < q->dim; d++) dot += eh[d] * h[d];
        float dist = ee - 2.0f * dot + q->cb_hat_sq[j];
        if (dist < best_d) best_d = dist, best = j; /* ties: lowest index */
    }
    return best;
}
