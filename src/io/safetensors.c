/* safetensors.c - validated zero-copy reader and streaming writer (FORMATS.md section 1).
 *
 * The reader checks everything at open time so that later code can trust every view:
 * header bounds, UTF-8, JSON (duplicates rejected), dtypes, shapes (overflow-checked), and that
 * the tensor byte ranges tile the data buffer exactly. Nothing is read outside the file. */
#include "io/safetensors.h"

#include "base/log.h"
#include "base/path.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"

#define ST_MAX_HEADER 100000000ull

struct dr_st_file {
    char *path;              /* label used in messages (file path or caller label) */
    const uint8_t *image;    /* whole file */
    size_t size;
    int mapped;              /* 1 when image is our mmap */
    size_t header_len;       /* N */
    int64_t count;
    dr_tensor *tensors;      /* header order */
    char **names;            /* owned names, tensors[i].name points here */
    int64_t *by_name;        /* tensor indices sorted by name, for bsearch */
    int64_t meta_count;
    char **meta_keys, **meta_values;
};

/* ---- small helpers ---- */

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

static uint64_t load_u64le(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Returns the byte offset of the first invalid UTF-8 sequence, or -1 when all of s is valid.
 * Rejects overlong forms, surrogates and code points above U+10FFFF (as the standard does). */
static int64_t utf8_invalid_at(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t len;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
        else return (int64_t)i;
        if (n - i < len) return (int64_t)i;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return (int64_t)i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return (int64_t)i;
        i += len;
    }
    return -1;
}

void dr_st_close(dr_st_file *f) {
    if (!f) return;
    if (f->names)
        for (int64_t i = 0; i < f->count; i++) free(f->names[i]);
    if (f->meta_keys)
        for (int64_t i = 0; i < f->meta_count; i++) {
            free(f->meta_keys[i]);
            free(f->meta_values[i]);
        }
    free(f->names);
    free(f->tensors);
    free(f->by_name);
    free(f->meta_keys);
    free(f->meta_values);
    if (f->mapped && f->image) munmap((void *)f->image, f->size);
    free(f->path);
    free(f);
}

/* ---- header validation ---- */

static drama_status parse_metadata(dr_st_file *f, json_t *meta, drama_error *err) {
    if (!json_is_object(meta))
        return dr_fail(err, DRAMA_EFORMAT, "%s: __metadata__ is not a JSON object", f->path);
    size_t n = json_object_size(meta);
    f->meta_keys = calloc(n ? n : 1, sizeof *f->meta_keys);
    f->meta_values = calloc(n ? n : 1, sizeof *f->meta_values);
    if (!f->meta_keys || !f->meta_values) return dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", f->path);
    const char *key;
    json_t *val;
    json_object_foreach(meta, key, val) {
        if (!json_is_string(val))
            return dr_fail(err, DRAMA_EFORMAT, "%s: __metadata__ value of key '%s' is not a string", f->path,
                           key);
        int64_t i = f->meta_count;
        f->meta_keys[i] = dup_str(key);
        f->meta_values[i] = dup_str(json_string_value(val));
        if (!f->meta_keys[i] || !f->meta_values[i]) {
            free(f->meta_keys[i]);
            free(f->meta_values[i]);
            return dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", f->path);
        }
        f->meta_count++;
    }
    return DRAMA_OK;
}

/* Parse one tensor entry; fills t (data pointer set later) and its [begin, end). */
static drama_status parse_entry(dr_st_file *f, const char *name, json_t *entry, dr_tensor *t,
                                uint64_t *begin, uint64_t *end, drama_error *err) {
    if (!json_is_object(entry))
        return dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s': entry is not a JSON object", f->path, name);
    json_t *jdt = json_object_get(entry, "dtype");
    json_t *jshape = json_object_get(entry, "shape");
    json_t *joff = json_object_get(entry, "data_offsets");
    if (!jdt) return dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s': missing field 'dtype'", f->path, name);
    if (!jshape) return dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s': missing field 'shape'", f->path, name);
    if (!joff)
        return dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s': missing field 'data_offsets'", f->path, name);
    const char *key;
    json_t *val;
    json_object_foreach(entry, key, val) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            DR_WARN("%s: tensor '%s': unknown field '%s' ignored", f->path, name, key);
    }
    if (!json_is_string(jdt))
        return dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s': field 'dtype' is not a string", f->path, name);
    const char *dtname = json_string_value(jdt);
    t->dtype = dr_dtype_from_name(dtname);
    if (t->dtype == DR_DT_INVALID)
        return dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s': unknown dtype '%s'", f->path, name, dtname);
    if (!json_is_array(jshape))
        return dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s': field 'shape' is not an array", f->path, name);
    size_t nd = json_array_size(jshape);
    if (nd > DR_MAX_DIMS)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "%s: tensor '%s': %zu dimensions (at most %d supported)",
                       f->path, name, nd, DR_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t numel = 1;
    int overflow = 0;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(jshape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s': shape[%zu] is not a non-negative integer",
                           f->path, name, i);
        t->shape[i] = (int64_t)json_integer_value(d);
        uint64_t prod;
        if (__builtin_mul_overflow(numel, (uint64_t)t->shape[i], &prod)) overflow = 1;
        numel = prod;
    }
    uint64_t nbits;
    if (overflow || numel > (uint64_t)INT64_MAX || __builtin_mul_overflow(numel, dr_dtype_bits(t->dtype), &nbits))
        return dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s': shape size overflows 64 bits", f->path, name);
    if (nbits % 8)  /* sub-byte dtypes (F4) must fill whole bytes */
        return dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s': %llu %s elements do not fill whole bytes", f->path,
                       name, (unsigned long long)numel, dtname);
    uint64_t nbytes = nbits / 8;
    if (!json_is_array(joff) || json_array_size(joff) != 2 || !json_is_integer(json_array_get(joff, 0)) ||
        !json_is_integer(json_array_get(joff, 1)))
        return dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s': data_offsets is not two integers", f->path, name);
    json_int_t b = json_integer_value(json_array_get(joff, 0));
    json_int_t e = json_integer_value(json_array_get(joff, 1));
    if (b < 0 || e < b)
        return dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s': data_offsets [%lld, %lld] not 0 <= begin <= end",
                       f->path, name, (long long)b, (long long)e);
    if ((uint64_t)(e - b) != nbytes)
        return dr_fail(err, DRAMA_EFORMAT,
                       "%s: tensor '%s': data_offsets [%lld, %lld] hold %llu bytes but %s shape needs %llu",
                       f->path, name, (long long)b, (long long)e, (unsigned long long)(e - b), dtname,
                       (unsigned long long)nbytes);
    *begin = (uint64_t)b;
    *end = (uint64_t)e;
    t->nbytes = (size_t)nbytes;
    return DRAMA_OK;
}

typedef struct { uint64_t begin, end; int64_t idx; } st_range;

static int cmp_range(const void *a, const void *b) {
    const st_range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/* Sort indices by name. qsort has no context argument in C11; a merge sort keeps this reentrant. */
static void sort_names(dr_st_file *f, int64_t *idx, int64_t *tmp, int64_t n) {
    if (n < 2) return;
    int64_t h = n / 2;
    sort_names(f, idx, tmp, h);
    sort_names(f, idx + h, tmp, n - h);
    int64_t i = 0, j = h, k = 0;
    while (i < h && j < n)
        tmp[k++] = strcmp(f->tensors[idx[i]].name, f->tensors[idx[j]].name) <= 0 ? idx[i++] : idx[j++];
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, (size_t)n * sizeof *idx);
}

static drama_status parse_image(dr_st_file *f, drama_error *err) {
    if (f->size < 8)
        return dr_fail(err, DRAMA_EFORMAT, "%s: file is %zu bytes, shorter than the 8-byte header length",
                       f->path, f->size);
    uint64_t n = load_u64le(f->image);
    if (n > ST_MAX_HEADER)
        return dr_fail(err, DRAMA_EFORMAT, "%s: header length %llu exceeds the limit of %llu bytes", f->path,
                       (unsigned long long)n, ST_MAX_HEADER);
    if (8 + n > f->size)
        return dr_fail(err, DRAMA_EFORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)",
                       f->path, (unsigned long long)n, f->size);
    f->header_len = (size_t)n;
    const uint8_t *hdr = f->image + 8;
    int64_t bad = utf8_invalid_at(hdr, (size_t)n);
    if (bad >= 0)
        return dr_fail(err, DRAMA_EFORMAT, "%s: header is not valid UTF-8 at byte offset %lld", f->path,
                       (long long)(8 + bad));
    if (n == 0 || hdr[0] != '{')
        return dr_fail(err, DRAMA_EFORMAT, "%s: header does not start with '{' (byte offset 8)", f->path);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)hdr, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return dr_fail(err, DRAMA_EFORMAT, "%s: header JSON invalid near byte offset %lld: %s", f->path,
                       (long long)(8 + jerr.position), jerr.text);
    drama_status st = DRAMA_OK;
    st_range *ranges = NULL;
    if (!json_is_object(root)) {
        st = dr_fail(err, DRAMA_EFORMAT, "%s: header is not a JSON object", f->path);
        goto done;
    }
    size_t nent = json_object_size(root);
    json_t *meta = json_object_get(root, "__metadata__");
    size_t ntensors = nent - (meta ? 1 : 0);
    f->tensors = calloc(ntensors ? ntensors : 1, sizeof *f->tensors);
    f->names = calloc(ntensors ? ntensors : 1, sizeof *f->names);
    f->by_name = calloc(ntensors ? ntensors : 1, sizeof *f->by_name);
    ranges = calloc(ntensors ? ntensors : 1, sizeof *ranges);
    if (!f->tensors || !f->names || !f->by_name || !ranges) {
        st = dr_fail(err, DRAMA_ENOMEM, "%s: out of memory for %zu tensors", f->path, ntensors);
        goto done;
    }
    if (meta && (st = parse_metadata(f, meta, err)) != DRAMA_OK) goto done;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) continue;
        int64_t i = f->count;
        dr_tensor *t = &f->tensors[i];
        if ((st = parse_entry(f, key, val, t, &ranges[i].begin, &ranges[i].end, err)) != DRAMA_OK) goto done;
        f->names[i] = dup_str(key);
        if (!f->names[i]) {
            st = dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", f->path);
            goto done;
        }
        t->name = f->names[i];
        ranges[i].idx = i;
        f->count++;
    }
    /* Exact tiling: sorted by begin, no gaps, no overlaps, nothing left over. */
    uint64_t data_len = (uint64_t)f->size - 8 - n;
    qsort(ranges, (size_t)f->count, sizeof *ranges, cmp_range);
    uint64_t pos = 0;
    for (int64_t k = 0; k < f->count; k++) {
        const char *name = f->tensors[ranges[k].idx].name;
        if (ranges[k].end > data_len) {
            st = dr_fail(err, DRAMA_EFORMAT,
                         "%s: tensor '%s': data_offsets [%llu, %llu] beyond the data buffer of %llu bytes "
                         "(file offset %llu)",
                         f->path, name, (unsigned long long)ranges[k].begin, (unsigned long long)ranges[k].end,
                         (unsigned long long)data_len, (unsigned long long)(8 + n + ranges[k].begin));
            goto done;
        }
        if (ranges[k].begin < pos) {
            st = dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] overlap '%s' (ends at %llu)",
                         f->path, name, (unsigned long long)ranges[k].begin, (unsigned long long)ranges[k].end,
                         f->tensors[ranges[k - 1].idx].name, (unsigned long long)pos);
            goto done;
        }
        if (ranges[k].begin > pos) {
            st = dr_fail(err, DRAMA_EFORMAT, "%s: gap in the data buffer: bytes [%llu, %llu) belong to no tensor "
                         "(next tensor '%s')",
                         f->path, (unsigned long long)pos, (unsigned long long)ranges[k].begin, name);
            goto done;
        }
        pos = ranges[k].end;
        f->tensors[ranges[k].idx].data = f->image + 8 + n + ranges[k].begin;
    }
    if (pos != data_len) {
        st = dr_fail(err, DRAMA_EFORMAT,
                     "%s: %llu trailing bytes after the last tensor (data buffer %llu bytes, tensors end at %llu)",
                     f->path, (unsigned long long)(data_len - pos), (unsigned long long)data_len,
                     (unsigned long long)pos);
        goto done;
    }
    for (int64_t i = 0; i < f->count; i++) f->by_name[i] = i;
    int64_t *tmp = malloc((size_t)(f->count ? f->count : 1) * sizeof *tmp);
    if (!tmp) {
        st = dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", f->path);
        goto done;
    }
    sort_names(f, f->by_name, tmp, f->count);
    free(tmp);
done:
    free(ranges);
    json_decref(root);
    return st;
}

drama_status dr_st_open_memory(const void *data, size_t size, const char *label, dr_st_file **out,
                               drama_error *err) {
    if (!out) return dr_fail(err, DRAMA_EINVAL, "dr_st_open_memory: out is NULL");
    *out = NULL;
    if (!data && size) return dr_fail(err, DRAMA_EINVAL, "dr_st_open_memory: data is NULL");
    dr_st_file *f = calloc(1, sizeof *f);
    if (!f) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    f->path = dup_str(label ? label : "<memory>");
    f->image = data;
    f->size = size;
    if (!f->path) {
        dr_st_close(f);
        return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    }
    drama_status st = parse_image(f, err);
    if (st != DRAMA_OK) {
        dr_st_close(f);
        return st;
    }
    *out = f;
    return DRAMA_OK;
}

drama_status dr_st_open(const char *path, dr_st_file **out, drama_error *err) {
    if (!out) return dr_fail(err, DRAMA_EINVAL, "dr_st_open: out is NULL");
    *out = NULL;
    if (!path) return dr_fail(err, DRAMA_EINVAL, "dr_st_open: path is NULL");
    char link_target[4096];
    const char *real_path = dr_path_follow_placeholder(path, link_target, sizeof link_target);
    if (real_path != path) DR_INFO("%s: symbolic link stored as a text file, following it to %s", path, real_path);
    int fd = open(real_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dr_fail(err, DRAMA_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return dr_fail(err, DRAMA_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return dr_fail(err, DRAMA_EIO, "%s: not a regular file", path);
    }
    dr_st_file *f = calloc(1, sizeof *f);
    if (!f) {
        close(fd);
        return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    }
    f->path = dup_str(path);
    f->size = (size_t)sb.st_size;
    if (!f->path) {
        close(fd);
        dr_st_close(f);
        return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    }
    if (f->size > 0) {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            dr_st_close(f);
            return dr_fail(err, DRAMA_EIO, "%s: cannot mmap %lld bytes: %s", path, (long long)sb.st_size,
                           strerror(e));
        }
        f->image = m;
        f->mapped = 1;
    } else {
        f->image = (const uint8_t *)"";
    }
    close(fd);
    drama_status st = parse_image(f, err);
    if (st != DRAMA_OK) {
        /* A git checkout without symlink support leaves the link target as file text. */
        if (f->size >= 3 && f->size < 4096 && (!memcmp(f->image, "../", 3) || !memcmp(f->image, "./", 2)) &&
            !memchr(f->image, 0, f->size))
            dr_error_prefix(err, "(looks like a symbolic link stored as a text file: restore the link) ");
        dr_st_close(f);
        return st;
    }
    *out = f;
    return DRAMA_OK;
}

/* ---- accessors ---- */

const char *dr_st_path(const dr_st_file *f) { return f ? f->path : NULL; }
int64_t dr_st_count(const dr_st_file *f) { return f ? f->count : 0; }
size_t dr_st_header_len(const dr_st_file *f) { return f ? f->header_len : 0; }
size_t dr_st_file_size(const dr_st_file *f) { return f ? f->size : 0; }

const dr_tensor *dr_st_at(const dr_st_file *f, int64_t i) {
    return (f && i >= 0 && i < f->count) ? &f->tensors[i] : NULL;
}

const dr_tensor *dr_st_find(const dr_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    int64_t lo = 0, hi = f->count - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        const dr_tensor *t = &f->tensors[f->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

const char *dr_st_metadata(const dr_st_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (int64_t i = 0; i < f->meta_count; i++)
        if (!strcmp(f->meta_keys[i], key)) return f->meta_values[i];
    return NULL;
}

int64_t dr_st_metadata_count(const dr_st_file *f) { return f ? f->meta_count : 0; }

void dr_st_metadata_at(const dr_st_file *f, int64_t i, const char **key, const char **value) {
    int ok = f && i >= 0 && i < f->meta_count;
    if (key) *key = ok ? f->meta_keys[i] : NULL;
    if (value) *value = ok ? f->meta_values[i] : NULL;
}

/* ---- conversion to float32 (unaligned loads through memcpy) ---- */

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0) {
        /* zero or subnormal: m * 2^-24 is exact in float */
        float v = (float)m * (1.0f / 16777216.0f);
        return s ? -v : v;
    }
    if (e == 31) return f32_from_bits(s | 0x7F800000u | (m << 13));
    return f32_from_bits(s | ((e + 112) << 23) | (m << 13));
}

static float e4m3_to_f32(uint8_t b) {
    uint32_t s = b >> 7, e = (b >> 3) & 0xF, m = b & 7;
    float v;
    if (e == 15 && m == 7) return f32_from_bits(0x7FC00000u | (s << 31)); /* 0x7F / 0xFF: NaN, no inf */
    if (e == 0) v = (float)m * (1.0f / 512.0f);                            /* 2^-6 * m/8 */
    else v = f32_from_bits(((e + 120) << 23) | (m << 20));
    return s ? -v : v;
}

#define LOADER(fn, type)                                   \
    static type fn(const uint8_t *p) {                     \
        type v;                                            \
        memcpy(&v, p, sizeof v);                           \
        return v;                                          \
    }
LOADER(ld_u16, uint16_t)
LOADER(ld_i16, int16_t)
LOADER(ld_u32, uint32_t)
LOADER(ld_i32, int32_t)
LOADER(ld_u64, uint64_t)
LOADER(ld_i64, int64_t)
LOADER(ld_f32, float)
LOADER(ld_f64, double)

drama_status dr_st_to_f32(const dr_tensor *t, float *out, drama_error *err) {
    if (!t || (!out && t->nbytes)) return dr_fail(err, DRAMA_EINVAL, "dr_st_to_f32: NULL argument");
    const char *name = t->name ? t->name : "?";
    size_t es = dr_dtype_size(t->dtype);
    if (es == 0) return dr_fail(err, DRAMA_EUNSUPPORTED, "tensor '%s': dtype %d has no element size", name, t->dtype);
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || __builtin_mul_overflow(numel, (uint64_t)t->shape[i], &numel))
            return dr_fail(err, DRAMA_ESHAPE, "tensor '%s': invalid shape", name);
    }
    uint64_t need;
    if (__builtin_mul_overflow(numel, es, &need) || need != t->nbytes)
        return dr_fail(err, DRAMA_ESHAPE, "tensor '%s': %zu bytes do not match %llu %s elements", name, t->nbytes,
                       (unsigned long long)numel, dr_dtype_name(t->dtype));
    const uint8_t *p = t->data;
    size_t n = (size_t)numel;
    switch (t->dtype) {
    case DR_DT_F32: for (size_t i = 0; i < n; i++) out[i] = ld_f32(p + 4 * i); break;
    case DR_DT_F64: for (size_t i = 0; i < n; i++) out[i] = (float)ld_f64(p + 8 * i); break;
    case DR_DT_F16: for (size_t i = 0; i < n; i++) out[i] = f16_to_f32(ld_u16(p + 2 * i)); break;
    case DR_DT_BF16: for (size_t i = 0; i < n; i++) out[i] = f32_from_bits((uint32_t)ld_u16(p + 2 * i) << 16); break;
    case DR_DT_F8_E4M3: for (size_t i = 0; i < n; i++) out[i] = e4m3_to_f32(p[i]); break;
    /* E5M2 is the upper byte of an IEEE half */
    case DR_DT_F8_E5M2: for (size_t i = 0; i < n; i++) out[i] = f16_to_f32((uint16_t)(p[i] << 8)); break;
    /* E8M0 (MX block scales): a bare biased exponent, 2^(e-127); 0xFF is NaN */
    case DR_DT_F8_E8M0: for (size_t i = 0; i < n; i++) out[i] = p[i] == 0xFF ? NAN : ldexpf(1.0f, (int)p[i] - 127); break;
    case DR_DT_BOOL: for (size_t i = 0; i < n; i++) out[i] = p[i] ? 1.0f : 0.0f; break;
    case DR_DT_U8: for (size_t i = 0; i < n; i++) out[i] = (float)p[i]; break;
    case DR_DT_I8: for (size_t i = 0; i < n; i++) out[i] = (float)(int8_t)p[i]; break;
    case DR_DT_U16: for (size_t i = 0; i < n; i++) out[i] = (float)ld_u16(p + 2 * i); break;
    case DR_DT_I16: for (size_t i = 0; i < n; i++) out[i] = (float)ld_i16(p + 2 * i); break;
    case DR_DT_U32: for (size_t i = 0; i < n; i++) out[i] = (float)ld_u32(p + 4 * i); break;
    case DR_DT_I32: for (size_t i = 0; i < n; i++) out[i] = (float)ld_i32(p + 4 * i); break;
    case DR_DT_U64: for (size_t i = 0; i < n; i++) out[i] = (float)ld_u64(p + 8 * i); break;
    case DR_DT_I64: for (size_t i = 0; i < n; i++) out[i] = (float)ld_i64(p + 8 * i); break;
    default:
        return dr_fail(err, DRAMA_EUNSUPPORTED, "tensor '%s': cannot convert dtype %s to F32", name,
                       dr_dtype_name(t->dtype));
    }
    return DRAMA_OK;
}

/* ---- streaming writer ----
 * The header (names, dtypes, shapes, offsets) is built as JSON while tensors are declared; offsets
 * follow declaration order, so it is complete before the first data byte and written then. */

struct dr_st_writer {
    char *path, *tmp_path;
    FILE *fp;
    json_t *meta;        /* __metadata__ */
    json_t *tensors;     /* name -> entry, declaration order */
    uint64_t total;      /* declared data bytes */
    uint64_t written;    /* data bytes written so far */
    int header_done;
    int pad_to_8;
};

static void writer_free(dr_st_writer *w) {
    if (!w) return;
    if (w->fp) fclose(w->fp);
    json_decref(w->meta);
    json_decref(w->tensors);
    free(w->path);
    free(w->tmp_path);
    free(w);
}

drama_status dr_st_writer_create(const char *path, dr_st_writer **out, drama_error *err) {
    if (!out || !path) return dr_fail(err, DRAMA_EINVAL, "dr_st_writer_create: NULL argument");
    *out = NULL;
    dr_st_writer *w = calloc(1, sizeof *w);
    if (!w) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    size_t n = strlen(path);
    w->path = dup_str(path);
    w->tmp_path = malloc(n + 5);
    w->meta = json_object();
    w->tensors = json_object();
    w->pad_to_8 = 1;
    if (!w->path || !w->tmp_path || !w->meta || !w->tensors) {
        writer_free(w);
        return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    }
    memcpy(w->tmp_path, path, n);
    memcpy(w->tmp_path + n, ".tmp", 5);
    /* A stale temporary (or a link planted at its name) is removed, never written through. */
    unlink(w->tmp_path);
    int fd = open(w->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    w->fp = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!w->fp) {
        int e = errno;
        if (fd >= 0) close(fd);
        drama_status st = dr_fail(err, DRAMA_EIO, "%s: cannot create: %s", w->tmp_path, strerror(e));
        writer_free(w);
        return st;
    }
    *out = w;
    return DRAMA_OK;
}

void dr_st_writer_set_padding(dr_st_writer *w, int pad_to_8) {
    if (w && !w->header_done) w->pad_to_8 = pad_to_8 ? 1 : 0;
}

drama_status dr_st_writer_metadata(dr_st_writer *w, const char *key, const char *value, drama_error *err) {
    if (!w || !key || !value) return dr_fail(err, DRAMA_EINVAL, "dr_st_writer_metadata: NULL argument");
    if (w->header_done)
        return dr_fail(err, DRAMA_EINVAL, "%s: metadata '%s' set after data was written", w->path, key);
    json_t *s = json_string(value);
    if (!s || json_object_set_new(w->meta, key, s) != 0)
        return dr_fail(err, DRAMA_EINVAL, "%s: metadata '%s' is not valid UTF-8", w->path, key);
    return DRAMA_OK;
}

drama_status dr_st_writer_declare(dr_st_writer *w, const char *name, dr_dtype dtype, int ndim,
                                  const int64_t *shape, drama_error *err) {
    if (!w || !name || (ndim > 0 && !shape)) return dr_fail(err, DRAMA_EINVAL, "dr_st_writer_declare: NULL argument");
    if (w->header_done)
        return dr_fail(err, DRAMA_EINVAL, "%s: tensor '%s' declared after data was written", w->path, name);
    if (!strcmp(name, "__metadata__") || !name[0])
        return dr_fail(err, DRAMA_EINVAL, "%s: invalid tensor name '%s'", w->path, name);
    if (json_object_get(w->tensors, name))
        return dr_fail(err, DRAMA_EINVAL, "%s: tensor '%s' declared twice", w->path, name);
    size_t es = dr_dtype_size(dtype);
    if (es == 0) return dr_fail(err, DRAMA_EINVAL, "%s: tensor '%s': invalid dtype", w->path, name);
    if (ndim < 0 || ndim > DR_MAX_DIMS)
        return dr_fail(err, DRAMA_EINVAL, "%s: tensor '%s': ndim %d out of range", w->path, name, ndim);
    uint64_t bytes = es;
    json_t *jshape = json_array();
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || __builtin_mul_overflow(bytes, (uint64_t)shape[i], &bytes)) {
            json_decref(jshape);
            return dr_fail(err, DRAMA_EINVAL, "%s: tensor '%s': invalid shape[%d]", w->path, name, i);
        }
        json_array_append_new(jshape, json_integer(shape[i]));
    }
    uint64_t end;
    if (__builtin_add_overflow(w->total, bytes, &end) || end > (uint64_t)INT64_MAX) {
        json_decref(jshape);
        return dr_fail(err, DRAMA_EINVAL, "%s: tensor '%s': data size overflows", w->path, name);
    }
    json_t *entry = json_pack("{s:s, s:o, s:[I,I]}", "dtype", dr_dtype_name(dtype), "shape", jshape,
                              "data_offsets", (json_int_t)w->total, (json_int_t)end);
    if (!entry || json_object_set_new(w->tensors, name, entry) != 0)
        return dr_fail(err, DRAMA_EINVAL, "%s: tensor name '%s' is not valid UTF-8", w->path, name);
    w->total = end;
    return DRAMA_OK;
}

static drama_status write_all(dr_st_writer *w, const void *p, size_t n, drama_error *err) {
    if (n && fwrite(p, 1, n, w->fp) != n)
        return dr_fail(err, DRAMA_EIO, "%s: write failed: %s", w->tmp_path, strerror(errno));
    return DRAMA_OK;
}

static drama_status write_header(dr_st_writer *w, drama_error *err) {
    json_t *root = json_object();
    if (!root) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    if (json_object_size(w->meta)) json_object_set(root, "__metadata__", w->meta);
    json_object_update(root, w->tensors);
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
    json_decref(root);
    if (!text) return dr_fail(err, DRAMA_ENOMEM, "%s: cannot serialise header", w->path);
    size_t n = strlen(text), padded = n;
    if (w->pad_to_8) padded = (n + 7) & ~(size_t)7;
    if (padded > ST_MAX_HEADER) { /* readers (ours included) refuse larger headers */
        free(text);
        return dr_fail(err, DRAMA_EINVAL, "%s: header of %zu bytes exceeds the %llu-byte limit", w->path, padded,
                       ST_MAX_HEADER);
    }
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    drama_status st = write_all(w, len, 8, err);
    if (!st) st = write_all(w, text, n, err);
    for (size_t i = n; i < padded && !st; i++) st = write_all(w, " ", 1, err);
    free(text);
    w->header_done = 1;
    return st;
}

drama_status dr_st_writer_write(dr_st_writer *w, const void *bytes, size_t n, drama_error *err) {
    if (!w || (!bytes && n)) return dr_fail(err, DRAMA_EINVAL, "dr_st_writer_write: NULL argument");
    drama_status st;
    if (!w->header_done && (st = write_header(w, err)) != DRAMA_OK) return st;
    if (n > w->total - w->written)
        return dr_fail(err, DRAMA_EINVAL, "%s: %zu bytes written past the %llu declared data bytes", w->path, n,
                       (unsigned long long)w->total);
    if ((st = write_all(w, bytes, n, err)) != DRAMA_OK) return st;
    w->written += n;
    return DRAMA_OK;
}

void dr_st_writer_abort(dr_st_writer *w) {
    if (!w) return;
    if (w->fp) fclose(w->fp);
    w->fp = NULL;
    unlink(w->tmp_path);
    writer_free(w);
}

drama_status dr_st_writer_finish(dr_st_writer *w, drama_error *err) {
    if (!w) return dr_fail(err, DRAMA_EINVAL, "dr_st_writer_finish: NULL writer");
    drama_status st = DRAMA_OK;
    if (!w->header_done) st = write_header(w, err);
    if (!st && w->written != w->total)
        st = dr_fail(err, DRAMA_EINVAL, "%s: %llu of %llu declared data bytes written", w->path,
                     (unsigned long long)w->written, (unsigned long long)w->total);
    if (!st && (fflush(w->fp) != 0 || fsync(fileno(w->fp)) != 0))
        st = dr_fail(err, DRAMA_EIO, "%s: flush failed: %s", w->tmp_path, strerror(errno));
    if (!st) {
        int rc = fclose(w->fp);
        w->fp = NULL;
        if (rc != 0) st = dr_fail(err, DRAMA_EIO, "%s: close failed: %s", w->tmp_path, strerror(errno));
    }
    if (!st && rename(w->tmp_path, w->path) != 0)
        st = dr_fail(err, DRAMA_EIO, "%s: cannot rename to %s: %s", w->tmp_path, w->path, strerror(errno));
    if (st) {
        dr_st_writer_abort(w);
        return st;
    }
    writer_free(w);
    return DRAMA_OK;
}
