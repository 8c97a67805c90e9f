/* The tower's switches (MODEL.md 10, tower.*) against an independent float64 implementation of
 * TOWER-H1.md written here, on a small random tower of non-golden shape (input width != dim,
 * odd head counts, 4 codebooks, head rows > head_vocab): every switch combination must agree
 * within 1e-4; and the switches reach dr_tower_dims from config.json / --set. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "model/config.h"
#include "model/tower.h"
#include "testutil.h"

enum { H = 24, D = 20, NH = 3, NKV = 1, HD = 8, FF = 28, NC = 4, NS = 2, V = 8, HROWS = 12, HV = 10, T = 7 };
#define NL (NS + NC - 1)

typedef struct table {
    int n;
    dr_tensor t[128];
    char names[128][96];
    uint16_t *data[128];
} table;

static uint64_t g_rs = 12345;
static double urand(void) { /* [-1, 1) */
    g_rs = g_rs * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rs >> 11) * 0x1.0p-52 - 1.0;
}

static uint16_t bf16(double x) {
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static double from_bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void add(table *tb, const char *name, int64_t rows, int64_t cols, double scale, double offset) {
    int i = tb->n++;
    int64_t n = rows * (cols ? cols : 1);
    tb->data[i] = malloc((size_t)n * 2);
    for (int64_t k = 0; k < n; k++) tb->data[i][k] = bf16(offset + scale * urand());
    snprintf(tb->names[i], sizeof tb->names[i], "%s", name);
    dr_tensor *t = &tb->t[i];
    memset(t, 0, sizeof *t);
    t->name = tb->names[i];
    t->dtype = DR_DT_BF16;
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->data = (const uint8_t *)tb->data[i];
    t->nbytes = (size_t)n * 2;
}

static const dr_tensor *find(void *ctx, const char *name) {
    table *tb = ctx;
    for (int i = 0; i < tb->n; i++)
        if (!strcmp(tb->names[i], name)) return &tb->t[i];
    return NULL;
}

static const uint16_t *get(table *tb, const char *name) {
    const dr_tensor *t = find(tb, name);
    assert_non_null(t);
    return (const uint16_t *)t->data;
}

static void prefix(int l, char *p, size_t n) {
    if (l < NS) snprintf(p, n, "audio_decoder_mtp_shared.layers.%d.", l);
    else snprintf(p, n, "audio_decoder_mtp.layers.%d.", l - NS);
}

static void build(table *tb) {
    memset(tb, 0, sizeof *tb);
    char n[128], p[64];
    for (int l = 0; l < NL; l++) {
        prefix(l, p, sizeof p);
        int dh = l ? D : H;
#define NM(s) (snprintf(n, sizeof n, "%s%s", p, s), n)
        add(tb, NM("enorm.weight"), D, 0, 0.1, 1.0);
        add(tb, NM("hnorm.weight"), dh, 0, 0.1, 1.0);
        add(tb, NM("attention_norm.weight"), D, 0, 0.1, 1.0);
        add(tb, NM("ffn_norm.weight"), D, 0, 0.1, 1.0);
        add(tb, NM("out_norm.weight"), D, 0, 0.1, 1.0);
        add(tb, NM("attention.q_norm.weight"), HD, 0, 0.1, 0.9);
        add(tb, NM("attention.k_norm.weight"), HD, 0, 0.1, 1.1);
        add(tb, NM("eh_proj.weight"), D, D + dh, 0.3, 0);
        add(tb, NM("attention.wqkv.weight"), (NH + 2 * NKV) * HD, D, 0.4, 0);
        add(tb, NM("attention.wo.weight"), D, NH * HD, 0.4, 0);
        add(tb, NM("feed_forward.w1.weight"), FF, D, 0.4, 0);
        add(tb, NM("feed_forward.w3.weight"), FF, D, 0.4, 0);
        add(tb, NM("feed_forward.w2.weight"), D, FF, 0.3, 0);
#undef NM
    }
    add(tb, "audio_decoder_mtp.codebook_embeddings.weight", NC * V, D, 1.0, 0);
    for (int j = 0; j < NC - 1; j++) {
        snprintf(n, sizeof n, "audio_decoder_mtp.heads.%d.weight", j);
        add(tb, n, HROWS, D, 0.5, 0);
    }
}

/* ---------------- float64 reference (TOWER-H1.md, with the switch alternatives) ---------------- */

typedef struct ref_sw {
    double norm_offset;
    int hidden_first, shared_none, qk_norm, rope_half, freq_head_dim, rope_dims;
} ref_sw;

static void rms(const double *x, const uint16_t *w, int n, double off, double *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + 1e-6);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * (from_bf16(w[i]) + off);
}

static void matvec(const uint16_t *W, int rows, int cols, const double *x, double *y) {
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++) s += from_bf16(W[(int64_t)r * cols + c]) * x[c];
        y[r] = s;
    }
}

static void rope(double *x, int pos, const ref_sw *sw) {
    int R = sw->rope_dims;
    for (int i = 0; i < R / 2; i++) {
        double f = pow(1e7, -2.0 * i / (sw->freq_head_dim ? HD : R));
        double c = cos(pos * f), s = sin(pos * f);
        int a = sw->rope_half ? i : 2 * i, b = sw->rope_half ? i + R / 2 : 2 * i + 1;
        double xa = x[a], xb = x[b];
        x[a] = xa * c - xb * s;
        x[b] = xb * c + xa * s;
    }
}

static void reference(table *tb, const ref_sw *sw, const double *h, const int32_t *codes, const uint8_t *mask,
                      double *layer_out, double *logits) {
    static double K[NL][T][NKV * HD], Vv[NL][T][NKV * HD];
    char n[128], p[64];
    for (int r = 0; r < T; r++) {
        double g[H > D ? H : D];
        for (int i = 0; i < H; i++) g[i] = h[r * H + i];
        for (int l = 0; l < NL; l++) {
            prefix(l, p, sizeof p);
#define W(s) (snprintf(n, sizeof n, "%s%s", p, s), get(tb, n))
            int dh = l ? D : H, slot = l < NS ? 0 : l - NS;
            int m = (l < NS && sw->shared_none) ? 0 : mask[r];
            double e[D], x[2 * D + H], u[D], a[D], qkv[(NH + 2 * NKV) * HD], o[NH * HD], t1[D], f1[FF], f3[FF];
            const uint16_t *E = get(tb, "audio_decoder_mtp.codebook_embeddings.weight");
            for (int i = 0; i < D; i++) e[i] = m ? from_bf16(E[(int64_t)(codes[r * NC + slot] + slot * V) * D + i]) : 0;
            double *xe = sw->hidden_first ? x + dh : x, *xh = sw->hidden_first ? x : x + D;
            rms(e, W("enorm.weight"), D, sw->norm_offset, xe);
            rms(g, W("hnorm.weight"), dh, sw->norm_offset, xh);
            matvec(W("eh_proj.weight"), D, D + dh, x, u);
            rms(u, W("attention_norm.weight"), D, sw->norm_offset, a);
            matvec(W("attention.wqkv.weight"), (NH + 2 * NKV) * HD, D, a, qkv);
            for (int hh = 0; hh < NH + NKV; hh++) {
                double *v = qkv + hh * HD;
                if (sw->qk_norm) rms(v, hh < NH ? W("attention.q_norm.weight") : W("attention.k_norm.weight"), HD,
                                     sw->norm_offset, v);
                rope(v, r, sw);
            }
            memcpy(K[l][r], qkv + NH * HD, sizeof K[l][r]);
            memcpy(Vv[l][r], qkv + (NH + NKV) * HD, sizeof Vv[l][r]);
            for (int hh = 0; hh < NH; hh++) {
                int kv = hh / (NH / NKV);
                double sc[T], mx = -1e300, z = 0;
                for (int t = 0; t <= r; t++) {
                    double d = 0;
                    for (int i = 0; i < HD; i++) d += qkv[hh * HD + i] * K[l][t][kv * HD + i];
                    sc[t] = d / sqrt((double)HD);
                    if (sc[t] > mx) mx = sc[t];
                }
                for (int t = 0; t <= r; t++) z += (sc[t] = exp(sc[t] - mx));
                for (int i = 0; i < HD; i++) {
                    double acc = 0;
                    for (int t = 0; t <= r; t++) acc += sc[t] * Vv[l][t][kv * HD + i];
                    o[hh * HD + i] = acc / z;
                }
            }
            matvec(W("attention.wo.weight"), D, NH * HD, o, t1);
            for (int i = 0; i < D; i++) u[i] += t1[i];
            rms(u, W("ffn_norm.weight"), D, sw->norm_offset, a);
            matvec(W("feed_forward.w1.weight"), FF, D, a, f1);
            matvec(W("feed_forward.w3.weight"), FF, D, a, f3);
            for (int i = 0; i < FF; i++) f1[i] = f1[i] / (1 + exp(-f1[i])) * f3[i];
            matvec(W("feed_forward.w2.weight"), D, FF, f1, t1);
            for (int i = 0; i < D; i++) u[i] += t1[i];
            rms(u, W("out_norm.weight"), D, sw->norm_offset, g);
#undef W
            for (int i = 0; i < D; i++) layer_out[((int64_t)l * T + r) * D + i] = g[i];
            if (l >= NS) {
                snprintf(n, sizeof n, "audio_decoder_mtp.heads.%d.weight", slot);
                double y[HROWS];
                matvec(get(tb, n), HROWS, D, g, y);
                for (int i = 0; i < HV; i++) logits[((int64_t)r * (NC - 1) + slot) * HV + i] = y[i];
            }
        }
    }
}

/* The tower runs with `sw`, the reference with `ref` (the same unless a negative control). */
static void check_combo2(table *tb, const ref_sw *sw, const ref_sw *ref, const char *label) {
    dr_tower_dims d;
    memset(&d, 0, sizeof d);
    d.dim = D; d.n_head = NH; d.n_kv_head = NKV; d.head_dim = HD; d.ffn = FF; d.eps = 1e-6;
    d.num_codebooks = NC; d.n_shared = NS; d.code_stride = V; d.head_vocab = HV; d.rope_base = 1e7;
    d.rope_dims = sw->rope_dims; d.rope_half = sw->rope_half; d.rope_freq_head_dim = sw->freq_head_dim;
    d.norm_offset = sw->norm_offset; d.concat_hidden_first = sw->hidden_first; d.shared_code_none = sw->shared_none;
    d.qk_norm = sw->qk_norm; d.code_table = "audio_decoder_mtp.codebook_embeddings.weight";
    dr_tower t;
    drama_error e = {0};
    if (dr_tower_bind(&t, &d, find, tb, &e)) fail_msg("%s", e.message);
    assert_int_equal(t.input_dim, H);
    double hd[T * H];
    float hf[T * H];
    int32_t codes[T * NC];
    uint8_t mask[T];
    for (int i = 0; i < T * H; i++) hd[i] = hf[i] = (float)(2 * urand());
    for (int r = 0; r < T; r++) {
        mask[r] = r % 3 != 1;
        for (int j = 0; j < NC; j++) codes[r * NC + j] = (int32_t)((urand() + 1) * 0.5 * V) % V;
    }
    static double rl[NL * T * D], rg[T * (NC - 1) * HV];
    reference(tb, ref, hd, codes, mask, rl, rg);
    static float ml[NL * T * D], mg[T * (NC - 1) * HV];
    dr_tower_cache *c;
    assert_int_equal(dr_tower_cache_create(&t, 2, &c, &e), DRAMA_OK);
    if (dr_tower_forward(&t, c, T, hf, codes, mask, ml, mg, NULL, &e)) fail_msg("%s", e.message);
    tu_cmp ca = tu_compare_f32_f64(ml, rl, NL * T * D), cb = tu_compare_f32_f64(mg, rg, T * (NC - 1) * HV);
    char la[96], lb[96];
    snprintf(la, sizeof la, "%s: layer_out", label);
    snprintf(lb, sizeof lb, "%s: logits", label);
    if (sw == ref) {
        int ok = tu_report(la, ca, 1e-4);
        ok &= tu_report(lb, cb, 1e-4);
        assert_true(ok);
    } else { /* a different reading must be visible */
        int ok = tu_report_differs(la, ca, 1e-2);
        ok &= tu_report_differs(lb, cb, 1e-2);
        assert_true(ok);
    }
    dr_tower_cache_free(c);
    dr_tower_release(&t);
}

static void check_combo(table *tb, const ref_sw *sw, const char *label) { check_combo2(tb, sw, sw, label); }

static void test_switch_combinations(void **state) {
    (void)state;
    static table tb;
    build(&tb);
    ref_sw h1 = {0, 0, 0, 0, 0, 0, HD / 2};
    check_combo(&tb, &h1, "H1 defaults");
    ref_sw a = {1.0, 1, 0, 0, 1, 1, 6};
    check_combo(&tb, &a, "offset 1, hidden_first, half, freq head_dim, R 6");
    ref_sw b = {0, 0, 1, 1, 0, 0, HD};
    check_combo(&tb, &b, "shared_code none, qk_norm, full rotary");
    ref_sw c = {0, 1, 1, 0, 1, 0, 2};
    check_combo(&tb, &c, "hidden_first, shared none, half, R 2");
    /* negative controls: each single switch flipped in the reference only must be detected */
    ref_sw flips[6] = {h1, h1, h1, h1, h1, h1};
    flips[0].norm_offset = 1;
    flips[1].hidden_first = 1;
    flips[2].shared_none = 1;
    flips[3].qk_norm = 1;
    flips[4].rope_half = 1;
    flips[5].freq_head_dim = 1;
    for (int i = 0; i < 6; i++) {
        char l[64];
        snprintf(l, sizeof l, "control: H1 tower vs flipped reference %d", i);
        check_combo2(&tb, &h1, &flips[i], l);
    }
    for (int i = 0; i < tb.n; i++) free(tb.data[i]);
}

/* Switch names reach dr_tower_dims: defaults, then --set overrides. */
static void test_dims_from_config(void **state) {
    (void)state;
    const char *dir = tu_model_dir("tiny-drama3");
    dr_config *cfg;
    drama_error e = {0};
    if (dr_config_load(dir, NULL, 0, &cfg, &e)) fail_msg("%s", e.message);
    dr_tower_dims d;
    assert_int_equal(dr_tower_dims_from_config(cfg, &d, &e), DRAMA_OK);
    assert_int_equal(d.rope_dims, (int)lround(cfg->audio.rotary_percent * cfg->audio.head_dim));
    assert_int_equal(d.head_vocab, 1024);
    assert_true(d.head_vocab_auto); /* not set anywhere: heads with fewer rows may lower it */
    assert_true(d.code_stride == cfg->audio.vocab_size);
    assert_true(d.norm_offset == 0 && !d.rope_half && !d.concat_hidden_first && !d.shared_code_none && !d.qk_norm &&
                !d.prefill_same_row && !d.input_pre_norm && !d.rope_freq_head_dim);
    assert_string_equal(d.code_table, "audio_decoder_mtp.codebook_embeddings.weight");
    dr_config_free(cfg);
    const char *sets[] = {"tower.norm_offset=1.0", "tower.rope_pairing=half", "tower.concat_order=hidden_first",
                          "tower.shared_code=none", "tower.prefill_codes=same_row", "tower.qk_norm=true",
                          "tower.rope_dims=8", "tower.rope_freq_dims=head_dim", "tower.head_vocab=512",
                          "tower.input=pre_norm", "tower.code_stride=2048"};
    if (dr_config_load(dir, sets, 11, &cfg, &e)) fail_msg("%s", e.message);
    assert_int_equal(dr_tower_dims_from_config(cfg, &d, &e), DRAMA_OK);
    assert_true(d.norm_offset == 1.0 && d.rope_half && d.concat_hidden_first && d.shared_code_none && d.qk_norm &&
                d.prefill_same_row && d.input_pre_norm && d.rope_freq_head_dim);
    assert_int_equal(d.rope_dims, 8);
    assert_int_equal(d.head_vocab, 512);
    assert_false(d.head_vocab_auto); /* set with --set: binding never changes it */
    assert_int_equal(d.code_stride, 2048);
    dr_config_free(cfg);
    /* an odd rope_dims is refused naming the switch (by the config or by the tower) */
    const char *bad[] = {"tower.rope_dims=7"};
    dr_error_clear(&e);
    if (!dr_config_load(dir, bad, 1, &cfg, &e)) {
        assert_int_not_equal(dr_tower_dims_from_config(cfg, &d, &e), DRAMA_OK);
        dr_config_free(cfg);
    }
    assert_non_null(strstr(e.message, "tower.rope_dims"));
}

/* tower.head_vocab: the built-in default lowered to heads with fewer rows (a model with a smaller
 * residual codebook); an explicit value larger than the heads is an error naming the head. */
static void test_head_vocab_default(void **state) {
    (void)state;
    static table tb;
    build(&tb);
    dr_tower_dims d;
    memset(&d, 0, sizeof d);
    d.dim = D; d.n_head = NH; d.n_kv_head = NKV; d.head_dim = HD; d.ffn = FF; d.eps = 1e-6;
    d.num_codebooks = NC; d.n_shared = NS; d.code_stride = V; d.rope_base = 1e7; d.rope_dims = HD / 2;
    d.code_table = "audio_decoder_mtp.codebook_embeddings.weight";
    d.head_vocab = 4 * HROWS;
    d.head_vocab_auto = 1;
    dr_tower t;
    drama_error e = {0};
    if (dr_tower_bind(&t, &d, find, &tb, &e)) fail_msg("%s", e.message);
    assert_int_equal(t.d.head_vocab, HROWS);
    dr_tower_release(&t);
    d.head_vocab = HV; /* fewer than the rows: kept */
    if (dr_tower_bind(&t, &d, find, &tb, &e)) fail_msg("%s", e.message);
    assert_int_equal(t.d.head_vocab, HV);
    dr_tower_release(&t);
    d.head_vocab = 4 * HROWS;
    d.head_vocab_auto = 0;
    assert_int_not_equal(dr_tower_bind(&t, &d, find, &tb, &e), DRAMA_OK);
    printf("explicit head_vocab %d > %d rows: %s\n", 4 * HROWS, HROWS, e.message);
    assert_non_null(strstr(e.message, "audio_decoder_mtp.heads.0.weight"));
    for (int i = 0; i < tb.n; i++) free(tb.data[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_switch_combinations),
        cmocka_unit_test(test_dims_from_config),
        cmocka_unit_test(test_head_vocab_default),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
