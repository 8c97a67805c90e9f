/* loader.c - renamed name view, consumption marks, weight binding with companions, findings. */
#include <regex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "io/safetensors.h"
#include "model/loader.h"

/* ---- findings ---- */

static const char *KIND_NAMES[DR_FIND_KIND_COUNT] = {"missing",    "mis-shaped", "unsupported",
                                                      "incomplete", "unexpected", "ignored"};

const char *dr_finding_kind_name(dr_finding_kind k) {
    return (k >= 0 && k < DR_FIND_KIND_COUNT) ? KIND_NAMES[k] : "?";
}

void dr_findings_add(dr_findings *f, dr_finding_kind kind, const char *name, const char *fmt, ...) {
    if (!f) return;
    if (f->n == f->cap) {
        int cap = f->cap ? f->cap * 2 : 16;
        dr_finding *ni = realloc(f->items, (size_t)cap * sizeof *ni);
        if (!ni) return; /* out of memory: the finding is dropped, the load still fails elsewhere */
        f->items = ni;
        f->cap = cap;
    }
    char detail[768] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(detail, sizeof detail, fmt, ap);
        va_end(ap);
    }
    dr_finding *it = &f->items[f->n];
    it->kind = kind;
    it->name = strdup(name ? name : "");
    it->detail = strdup(detail);
    if (!it->name || !it->detail) {
        free(it->name);
        free(it->detail);
        return;
    }
    f->n++;
}

int dr_findings_count(const dr_findings *f, dr_finding_kind kind) {
    int n = 0;
    for (int i = 0; f && i < f->n; i++) n += f->items[i].kind == kind;
    return n;
}

static int is_fatal(dr_finding_kind k, int strict) {
    return k == DR_FIND_MISSING || k == DR_FIND_MISSHAPED || k == DR_FIND_UNSUPPORTED || k == DR_FIND_INCOMPLETE ||
           (strict && k == DR_FIND_UNEXPECTED);
}

int dr_findings_fatal(const dr_findings *f, int strict) {
    int n = 0;
    for (int i = 0; f && i < f->n; i++) n += is_fatal(f->items[i].kind, strict);
    return n;
}

void dr_findings_print(const dr_findings *f, FILE *out) {
    for (int i = 0; f && i < f->n; i++) {
        const dr_finding *it = &f->items[i];
        fprintf(out, "%s: %s%s%s\n", KIND_NAMES[it->kind], it->name, it->detail[0] ? ": " : "", it->detail);
    }
}

drama_status dr_findings_check(const dr_findings *f, int strict, drama_error *err) {
    int nf = dr_findings_fatal(f, strict);
    if (nf == 0) return DRAMA_OK;
    char msg[900];
    int len = snprintf(msg, sizeof msg, "%d load finding%s", nf, nf == 1 ? "" : "s");
    int shown = 0;
    drama_status code = DRAMA_ESHAPE;
    for (int i = 0; i < f->n && shown < 4; i++) {
        const dr_finding *it = &f->items[i];
        if (!is_fatal(it->kind, strict)) continue;
        if (shown == 0 && it->kind == DR_FIND_UNSUPPORTED) code = DRAMA_EUNSUPPORTED;
        if (len < (int)sizeof msg)
            len += snprintf(msg + len, sizeof msg - (size_t)len, "%s %s: %s%s%s", shown ? ";" : ":",
                            KIND_NAMES[it->kind], it->name, it->detail[0] ? ": " : "", it->detail);
        shown++;
    }
    if (nf > shown && len < (int)sizeof msg) snprintf(msg + len, sizeof msg - (size_t)len, "; ...");
    return dr_fail(err, code, "%s", msg);
}

void dr_findings_clear(dr_findings *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) {
        free(f->items[i].name);
        free(f->items[i].detail);
    }
    free(f->items);
    memset(f, 0, sizeof *f);
}

/* ---- loader ---- */

typedef struct entry {
    char *name;            /* after names.rename */
    const dr_tensor *t;
    int taken;
} entry;

struct dr_loader {
    const dr_ckpt *ckpt;
    const dr_config *cfg;
    int64_t n;
    entry *e;              /* sorted by name */
    dr_findings findings;
    int warned_group;      /* config/tensor affine group disagreement reported once */
};

static int cmp_entry(const void *a, const void *b) { return strcmp(((const entry *)a)->name, ((const entry *)b)->name); }

/* Apply rule (compiled re) to s once: the first match is replaced; \0..\9 in rep are groups. */
static char *apply_rule(const regex_t *re, const char *rep, const char *s) {
    regmatch_t m[10];
    if (regexec(re, s, 10, m, 0) != 0) return strdup(s);
    size_t cap = strlen(s) + strlen(rep) * 4 + 256, len = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
#define PUT(p, n)                                           \
    do {                                                    \
        size_t n_ = (n);                                    \
        if (len + n_ + 1 > cap) {                           \
            cap = (len + n_ + 1) * 2;                       \
            char *o_ = realloc(out, cap);                   \
            if (!o_) { free(out); return NULL; }            \
            out = o_;                                       \
        }                                                   \
        memcpy(out + len, (p), n_);                         \
        len += n_;                                          \
    } while (0)
    PUT(s, (size_t)m[0].rm_so);
    for (const char *r = rep; *r; r++) {
        if (r[0] == '\\' && r[1] >= '0' && r[1] <= '9') {
            int g = r[1] - '0';
            if (m[g].rm_so >= 0) PUT(s + m[g].rm_so, (size_t)(m[g].rm_eo - m[g].rm_so));
            r++;
        } else {
            PUT(r, 1);
        }
    }
    PUT(s + m[0].rm_eo, strlen(s + m[0].rm_eo));
    out[len] = 0;
#undef PUT
    return out;
}

drama_status dr_loader_create(const dr_ckpt *ckpt, const dr_config *cfg, dr_loader **out, drama_error *err) {
    *out = NULL;
    dr_loader *ld = calloc(1, sizeof *ld);
    if (!ld) return dr_fail(err, DRAMA_ENOMEM, "loader: out of memory");
    ld->ckpt = ckpt;
    ld->cfg = cfg;
    ld->n = dr_ckpt_count(ckpt);
    ld->e = calloc((size_t)(ld->n > 0 ? ld->n : 1), sizeof(entry));
    int nrules = cfg ? cfg->sw.n_rename : 0;
    regex_t *res = nrules ? calloc((size_t)nrules, sizeof(regex_t)) : NULL;
    drama_status st = DRAMA_OK;
    int compiled = 0;
    if (!ld->e || (nrules && !res)) {
        st = dr_fail(err, DRAMA_ENOMEM, "loader: out of memory");
        goto done;
    }
    for (; compiled < nrules; compiled++) {
        int rc = regcomp(&res[compiled], cfg->sw.rename[compiled].pattern, REG_EXTENDED);
        if (rc != 0) {
            char why[128];
            regerror(rc, &res[compiled], why, sizeof why);
            st = dr_fail(err, DRAMA_EINVAL, "switch names.rename: rule %d: invalid regex \"%s\": %s", compiled,
                         cfg->sw.rename[compiled].pattern, why);
            goto done;
        }
    }
    for (int64_t i = 0; i < ld->n; i++) {
        const dr_tensor *t = dr_ckpt_at(ckpt, i);
        char *name = strdup(t->name ? t->name : "");
        for (int r = 0; name && r < nrules; r++) {
            char *nn = apply_rule(&res[r], cfg->sw.rename[r].replacement, name);
            free(name);
            name = nn;
        }
        if (!name) {
            st = dr_fail(err, DRAMA_ENOMEM, "loader: out of memory");
            goto done;
        }
        ld->e[i].name = name;
        ld->e[i].t = t;
    }
    qsort(ld->e, (size_t)ld->n, sizeof(entry), cmp_entry);
    for (int64_t i = 1; i < ld->n; i++)
        if (strcmp(ld->e[i].name, ld->e[i - 1].name) == 0) {
            st = dr_fail(err, DRAMA_EINVAL, "switch names.rename: tensors %s and %s both become %s", ld->e[i - 1].t->name,
                         ld->e[i].t->name, ld->e[i].name);
            goto done;
        }
done:
    for (int r = 0; r < compiled; r++) regfree(&res[r]);
    free(res);
    if (st) {
        dr_loader_free(ld);
        return st;
    }
    *out = ld;
    return DRAMA_OK;
}

void dr_loader_free(dr_loader *ld) {
    if (!ld) return;
    for (int64_t i = 0; ld->e && i < ld->n; i++) free(ld->e[i].name);
    free(ld->e);
    dr_findings_clear(&ld->findings);
    free(ld);
}

const dr_ckpt *dr_loader_ckpt(const dr_loader *ld) { return ld->ckpt; }
const dr_config *dr_loader_config(const dr_loader *ld) { return ld->cfg; }
dr_findings *dr_loader_findings(dr_loader *ld) { return &ld->findings; }
int64_t dr_loader_count(const dr_loader *ld) { return ld->n; }
const char *dr_loader_name_at(const dr_loader *ld, int64_t i) { return ld->e[i].name; }
const dr_tensor *dr_loader_tensor_at(const dr_loader *ld, int64_t i) { return ld->e[i].t; }
int dr_loader_taken_at(const dr_loader *ld, int64_t i) { return ld->e[i].taken; }

static entry *lookup(const dr_loader *ld, const char *name) {
    if (!name || ld->n == 0) return NULL;
    entry key = {(char *)name, NULL, 0};
    return bsearch(&key, ld->e, (size_t)ld->n, sizeof(entry), cmp_entry);
}

const dr_tensor *dr_loader_peek(const dr_loader *ld, const char *name) {
    entry *e = lookup(ld, name);
    return e ? e->t : NULL;
}

const dr_tensor *dr_loader_take(dr_loader *ld, const char *name) {
    entry *e = lookup(ld, name);
    if (!e) return NULL;
    e->taken = 1;
    return e->t;
}

const dr_tensor *dr_loader_find(void *ld, const char *name) { return dr_loader_take((dr_loader *)ld, name); }

void dr_loader_ignore(dr_loader *ld, const char *name, const char *why) {
    entry *e = lookup(ld, name);
    if (!e || e->taken) return;
    e->taken = 1;
    dr_findings_add(&ld->findings, DR_FIND_IGNORED, name, "%s", why ? why : "");
}

static int has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

drama_status dr_loader_detect_prefix(const dr_loader *ld, const char *forced, char *buf, size_t buflen,
                                     drama_error *err) {
    if (forced) {
        snprintf(buf, buflen, "%s", forced);
        if (strlen(forced) >= buflen) return dr_fail(err, DRAMA_EINVAL, "switch backbone.prefix: too long");
        return DRAMA_OK;
    }
    static const char *SUF = "embed_tokens.weight";
    char cands[512] = "", found[512] = "";
    int n_found = 0, n_cands = 0;
    for (int64_t i = 0; i < ld->n; i++) {
        const char *nm = ld->e[i].name;
        if (strncmp(nm, "audio_decoder", 13) == 0 || !has_suffix(nm, SUF)) continue;
        size_t plen = strlen(nm) - strlen(SUF);
        char probe[1024];
        if (plen + 40 >= sizeof probe) continue;
        snprintf(probe, sizeof probe, "%.*slayers.0.input_layernorm.weight", (int)plen, nm);
        size_t cl = strlen(cands);
        snprintf(cands + cl, sizeof cands - cl, "%s\"%.*s\"", n_cands ? ", " : "", (int)plen, nm);
        n_cands++;
        if (!lookup(ld, probe)) continue;
        if (n_found == 0) snprintf(buf, buflen, "%.*s", (int)plen, nm);
        size_t fl = strlen(found);
        snprintf(found + fl, sizeof found - fl, "%s\"%.*s\"", n_found ? ", " : "", (int)plen, nm);
        n_found++;
    }
    if (n_found == 1) return DRAMA_OK;
    if (n_found == 0)
        return dr_fail(err, DRAMA_ESHAPE,
                       "backbone prefix: no P with P+embed_tokens.weight and P+layers.0.input_layernorm.weight "
                       "(candidates: %s); set switch backbone.prefix",
                       n_cands ? cands : "none");
    return dr_fail(err, DRAMA_ESHAPE, "backbone prefix: several candidates (%s); set switch backbone.prefix", found);
}

static void shape_str(const dr_tensor *t, char *buf, size_t n) {
    size_t len = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < t->ndim && len < n; d++)
        len += (size_t)snprintf(buf + len, n - len, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (len < n) snprintf(buf + len, n - len, "]");
}

static void want_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t len = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && len < n; d++) {
        if (shape[d] < 0) len += (size_t)snprintf(buf + len, n - len, "%s*", d ? ", " : "");
        else len += (size_t)snprintf(buf + len, n - len, "%s%lld", d ? ", " : "", (long long)shape[d]);
    }
    if (len < n) snprintf(buf + len, n - len, "]");
}

float *dr_loader_take_f32(dr_loader *ld, const char *name, int ndim, const int64_t *shape, int64_t *numel) {
    const dr_tensor *t = dr_loader_take(ld, name);
    if (!t) {
        dr_findings_add(&ld->findings, DR_FIND_MISSING, name, NULL);
        return NULL;
    }
    int ok = t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = shape[d] < 0 || t->shape[d] == shape[d];
    if (!ok) {
        char a[128], b[128];
        want_str(ndim, shape, a, sizeof a);
        shape_str(t, b, sizeof b);
        dr_findings_add(&ld->findings, DR_FIND_MISSHAPED, name, "expected %s, found %s", a, b);
        return NULL;
    }
    if (t->dtype != DR_DT_F32 && t->dtype != DR_DT_BF16 && t->dtype != DR_DT_F16) {
        dr_findings_add(&ld->findings, DR_FIND_UNSUPPORTED, name, "dtype %s (expected F32, BF16 or F16)",
                        dr_dtype_name(t->dtype));
        return NULL;
    }
    int64_t n = dr_tensor_numel(t);
    float *out = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    drama_error e = {0};
    if (!out || dr_st_to_f32(t, out, &e) != DRAMA_OK) {
        dr_findings_add(&ld->findings, DR_FIND_UNSUPPORTED, name, "%s", out ? e.message : "out of memory");
        free(out);
        return NULL;
    }
    if (numel) *numel = n;
    return out;
}

/* Companion lookup per FORMATS.md 4: W's base B is W without a trailing ".weight". */
int dr_loader_bind(dr_loader *ld, const char *name, int64_t rows, int64_t cols, int64_t slice, int64_t n_slices,
                   dr_weight *out) {
    memset(out, 0, sizeof *out);
    dr_findings *f = &ld->findings;
    const dr_tensor *w = dr_loader_take(ld, name);
    if (!w) {
        dr_findings_add(f, DR_FIND_MISSING, name, NULL);
        return 0;
    }
    char base[1024], nm[1100];
    size_t nlen = strlen(name);
    int has_weight = has_suffix(name, ".weight");
    snprintf(base, sizeof base, "%.*s", (int)(has_weight ? nlen - 7 : nlen), name);
    const dr_tensor *scale = NULL, *scale2 = NULL, *bias = NULL;
    const char *fmt_name = "dense";
    switch (w->dtype) {
    case DR_DT_BF16: case DR_DT_F16: case DR_DT_F32:
        break;
    case DR_DT_F8_E4M3:
        snprintf(nm, sizeof nm, "%s_scale_inv", name);
        scale = dr_loader_take(ld, nm);
        if (!scale && !has_weight) {
            snprintf(nm, sizeof nm, "%s.weight_scale_inv", name);
            scale = dr_loader_take(ld, nm);
        }
        fmt_name = "block FP8";
        if (!scale) {
            snprintf(nm, sizeof nm, "%s.weight_scale", base);
            scale = dr_loader_take(ld, nm);
            fmt_name = "per-tensor FP8";
        }
        if (!scale) {
            dr_findings_add(f, DR_FIND_INCOMPLETE, name, "F8_E4M3 weight without %s_scale_inv or %s.weight_scale", name,
                            base);
            return 0;
        }
        /* activation scales are dynamic: a stored one is harmless */
        snprintf(nm, sizeof nm, "%s.input_scale", base);
        dr_loader_take(ld, nm);
        snprintf(nm, sizeof nm, "%s.activation_scale", base);
        dr_loader_take(ld, nm);
        break;
    case DR_DT_U8:
        fmt_name = "NVFP4";
        snprintf(nm, sizeof nm, "%s.weight_scale", base);
        scale = dr_loader_take(ld, nm);
        snprintf(nm, sizeof nm, "%s.weight_scale_2", base);
        scale2 = dr_loader_take(ld, nm);
        snprintf(nm, sizeof nm, "%s.input_scale", base); /* W4A4 activation scale: unused weight-only */
        dr_loader_take(ld, nm);
        if (!scale || !scale2) {
            dr_findings_add(f, DR_FIND_INCOMPLETE, name, "NVFP4 weight without %s.%s", base,
                            !scale ? "weight_scale" : "weight_scale_2");
            return 0;
        }
        break;
    case DR_DT_U32:
        fmt_name = "affine";
        snprintf(nm, sizeof nm, "%s.scales", base);
        scale = dr_loader_take(ld, nm);
        snprintf(nm, sizeof nm, "%s.biases", base);
        bias = dr_loader_take(ld, nm);
        if (!scale || !bias) {
            dr_findings_add(f, DR_FIND_INCOMPLETE, name, "affine weight without %s.%s", base, !scale ? "scales" : "biases");
            return 0;
        }
        break;
    default:
        dr_findings_add(f, DR_FIND_UNSUPPORTED, name, "dtype %s is not a weight format", dr_dtype_name(w->dtype));
        return 0;
    }
    if (slice >= 0) {
        if (w->ndim != 3 || (n_slices >= 0 && w->shape[0] != n_slices)) {
            char b[128];
            shape_str(w, b, sizeof b);
            dr_findings_add(f, DR_FIND_MISSHAPED, name, "expected [%lld, %lld, ...] (fused experts), found %s",
                            (long long)n_slices, (long long)rows, b);
            return 0;
        }
    } else if (w->ndim != 2) {
        char b[128];
        shape_str(w, b, sizeof b);
        dr_findings_add(f, DR_FIND_MISSHAPED, name, "expected a 2-D weight [%lld, %lld], found %s", (long long)rows,
                        (long long)cols, b);
        return 0;
    }
    const dr_quant_config *q = ld->cfg ? &ld->cfg->quant : NULL;
    drama_error e = {0};
    /* Dense weights: compare the stored shape first so the message is "expected [..], found [..]". */
    if (fmt_name[0] == 'd' && (rows >= 0 || cols >= 0)) {
        int64_t r = w->shape[w->ndim - 2], c = w->shape[w->ndim - 1];
        if ((rows >= 0 && r != rows) || (cols >= 0 && c != cols)) {
            char b[128];
            shape_str(w, b, sizeof b);
            dr_findings_add(f, DR_FIND_MISSHAPED, name, "expected [%lld, %lld], found %s", (long long)rows,
                            (long long)cols, b);
            return 0;
        }
    }
    /* The logical input width disambiguates MLX affine bits/group; others derive it from shapes. */
    drama_status st = dr_weight_bind_ex(w, scale, scale2, bias, slice, q ? q->block_rows : 0, q ? q->block_cols : 0,
                                        (w->dtype == DR_DT_U32 && cols > 0) ? cols : 0, out, &e);
    if (st != DRAMA_OK) {
        dr_findings_add(f, st == DRAMA_ESHAPE ? DR_FIND_MISSHAPED : DR_FIND_UNSUPPORTED, name, "%s: %s", fmt_name,
                        e.message);
        memset(out, 0, sizeof *out);
        return 0;
    }
    if ((rows >= 0 && out->rows != rows) || (cols >= 0 && out->cols != cols)) {
        dr_findings_add(f, DR_FIND_MISSHAPED, name, "expected [%lld, %lld], found [%lld, %lld] (%s)", (long long)rows,
                        (long long)cols, (long long)out->rows, (long long)out->cols, fmt_name);
        memset(out, 0, sizeof *out);
        return 0;
    }
    if (!out->name) out->name = w->name;
    /* FORMATS.md 4.6: config quantisation entries are cross-checks only (the tensors decide). */
    if (out->fmt == DR_WF_AFFINE && q && q->group_size > 0 && q->group_size != out->group && !ld->warned_group) {
        ld->warned_group = 1;
        DR_WARN("%s: affine group %d from the tensor shapes differs from config group_size %d (the tensors decide)",
                name, out->group, q->group_size);
    }
    return 1;
}

static const char *const COMPANIONS[] = {"_scale_inv", ".weight_scale_2", ".weight_scale", ".scales", ".biases",
                                         ".input_scale", ".activation_scale", NULL};

void dr_loader_finish(dr_loader *ld) {
    for (int64_t i = 0; i < ld->n; i++) {
        entry *e = &ld->e[i];
        if (e->taken) continue;
        const char *kind_suf = NULL;
        for (int k = 0; COMPANIONS[k] && !kind_suf; k++)
            if (has_suffix(e->name, COMPANIONS[k])) kind_suf = COMPANIONS[k];
        if (kind_suf) {
            /* a companion whose weight is absent is "incomplete"; with its weight present and also
             * untaken, both are simply unexpected */
            char w1[1100], w2[1100];
            size_t blen = strlen(e->name) - strlen(kind_suf);
            snprintf(w1, sizeof w1, "%.*s", (int)blen, e->name);          /* "X.weight" + "_scale_inv" */
            snprintf(w2, sizeof w2, "%.*s.weight", (int)blen, e->name);   /* "X" + ".scales" */
            if (!lookup(ld, w1) && !lookup(ld, w2)) {
                dr_findings_add(&ld->findings, DR_FIND_INCOMPLETE, e->name, "quantisation companion without its weight");
                continue;
            }
        }
        char b[128];
        shape_str(e->t, b, sizeof b);
        dr_findings_add(&ld->findings, DR_FIND_UNEXPECTED, e->name, "%s %s, not used", dr_dtype_name(e->t->dtype), b);
    }
}
