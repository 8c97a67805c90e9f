/* torchzip.c - PyTorch zip archive reader (see torchzip.h). ZIP layout: PKWARE APPNOTE 6.3
 * (end-of-central-directory record, ZIP64 locator/record, central and local file headers). */
#include "io/torchzip.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "base/path.h"
#include "io/unpickle.h"

typedef struct zentry {
    char *name;
    const uint8_t *data;
    uint64_t size;
    uint32_t crc; /* CRC-32 from the central directory */
} zentry;

struct dr_pth {
    char *path;
    const uint8_t *map;
    size_t map_size;
    int mapped;
    char *prefix;
    zentry *entries; /* sorted by name */
    int64_t n_entries;
    dr_tensor *tensors;
    int64_t n_tensors;
    int64_t *sorted; /* tensor indices sorted by name */
    void **copies;   /* owned buffers of copied (non-contiguous) views */
    int64_t n_copies;
};

static uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const zentry *)a)->name, ((const zentry *)b)->name);
}

static const zentry *find_entry(const dr_pth *p, const char *name) {
    zentry key = {.name = (char *)name};
    return bsearch(&key, p->entries, (size_t)p->n_entries, sizeof key, cmp_entry);
}

/* Parse the central directory into p->entries. */
static drama_status parse_zip(dr_pth *p, drama_error *err) {
    const uint8_t *f = p->map;
    size_t n = p->map_size;
    const char *path = p->path;
    if (n >= 2 && f[0] == 0x80 && f[1] >= 2 && f[1] <= 5)
        return dr_fail(err, DRAMA_EUNSUPPORTED,
                       "%s: legacy (non-zip) torch.save format is not supported; re-save it with a current "
                       "PyTorch (zip serialization)", path);
    if (n < 22 || le(f, 4) != 0x04034b50)
        return dr_fail(err, DRAMA_EFORMAT, "%s: not a zip archive (no local header at byte 0)", path);
    /* end of central directory: the last 22..65557 bytes */
    int64_t eocd = -1;
    size_t lo = n > 22 + 65535 ? n - 22 - 65535 : 0;
    for (size_t i = n - 22 + 1; i-- > lo;)
        if (le(f + i, 4) == 0x06054b50 && i + 22 + le(f + i + 20, 2) == n) {
            eocd = (int64_t)i;
            break;
        }
    if (eocd < 0) return dr_fail(err, DRAMA_EFORMAT, "%s: zip end-of-central-directory record not found (truncated?)", path);
    uint64_t count = le(f + eocd + 10, 2), cd_size = le(f + eocd + 12, 4), cd_off = le(f + eocd + 16, 4);
    if (le(f + eocd + 4, 2) != 0 || le(f + eocd + 6, 2) != 0)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "%s: multi-disk zip archives are not supported", path);
    /* ZIP64 locator right before the EOCD */
    if (eocd >= 20 && le(f + eocd - 20, 4) == 0x07064b50) {
        uint64_t z64 = le(f + eocd - 20 + 8, 8);
        if (z64 > n || n - z64 < 56 || le(f + z64, 4) != 0x06064b50)
            return dr_fail(err, DRAMA_EFORMAT, "%s: bad ZIP64 end-of-central-directory record at byte %llu", path,
                           (unsigned long long)z64);
        count = le(f + z64 + 32, 8);
        cd_size = le(f + z64 + 40, 8);
        cd_off = le(f + z64 + 48, 8);
    }
    if (cd_off > n || cd_size > n - cd_off)
        return dr_fail(err, DRAMA_EFORMAT, "%s: central directory (offset %llu, %llu bytes) lies outside the file",
                       path, (unsigned long long)cd_off, (unsigned long long)cd_size);
    if (count > cd_size / 46) return dr_fail(err, DRAMA_EFORMAT, "%s: central directory too small for %llu entries", path,
                                             (unsigned long long)count);
    p->entries = calloc(count ? (size_t)count : 1, sizeof *p->entries);
    if (!p->entries) return dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", path);
    uint64_t pos = cd_off, end = cd_off + cd_size;
    for (uint64_t e = 0; e < count; e++) {
        if (end - pos < 46 || le(f + pos, 4) != 0x02014b50)
            return dr_fail(err, DRAMA_EFORMAT, "%s: bad central directory entry %llu at byte %llu", path,
                           (unsigned long long)e, (unsigned long long)pos);
        const uint8_t *h = f + pos;
        uint64_t flags = le(h + 8, 2), method = le(h + 10, 2), csize = le(h + 20, 4), usize = le(h + 24, 4);
        uint64_t nlen = le(h + 28, 2), elen = le(h + 30, 2), clen = le(h + 32, 2), lho = le(h + 42, 4);
        if (46 + nlen + elen + clen > end - pos)
            return dr_fail(err, DRAMA_EFORMAT, "%s: central directory entry %llu runs past the directory", path,
                           (unsigned long long)e);
        char *name = malloc(nlen + 1);
        if (!name) return dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", path);
        memcpy(name, h + 46, nlen);
        name[nlen] = '\0';
        p->entries[e].name = name;
        p->n_entries = (int64_t)e + 1;
        if (strlen(name) != nlen) return dr_fail(err, DRAMA_EFORMAT, "%s: zip entry name with a NUL byte", path);
        /* ZIP64 extended information: the fields that are 0xFFFFFFFF, in this order */
        const uint8_t *x = h + 46 + nlen, *xe = x + elen;
        while (xe - x >= 4) {
            uint64_t id = le(x, 2), sz = le(x + 2, 2);
            if (sz > (uint64_t)(xe - x - 4)) break;
            if (id == 1) {
                const uint8_t *q = x + 4, *qe = x + 4 + sz;
                if (usize == 0xFFFFFFFFu && qe - q >= 8) usize = le(q, 8), q += 8;
                if (csize == 0xFFFFFFFFu && qe - q >= 8) csize = le(q, 8), q += 8;
                if (lho == 0xFFFFFFFFu && qe - q >= 8) lho = le(q, 8), q += 8;
            }
            x += 4 + sz;
        }
        if (flags & 1) return dr_fail(err, DRAMA_EUNSUPPORTED, "%s: zip entry '%s' is encrypted", path, name);
        if (method != 0)
            return dr_fail(err, DRAMA_EUNSUPPORTED, "%s: zip entry '%s' is compressed (method %llu); only stored entries "
                           "are supported", path, name, (unsigned long long)method);
        if (csize != usize)
            return dr_fail(err, DRAMA_EFORMAT, "%s: stored zip entry '%s' has compressed size %llu != size %llu", path,
                           name, (unsigned long long)csize, (unsigned long long)usize);
        if (lho > n || n - lho < 30 || le(f + lho, 4) != 0x04034b50)
            return dr_fail(err, DRAMA_EFORMAT, "%s: zip entry '%s': local header at byte %llu is outside the file or bad",
                           path, name, (unsigned long long)lho);
        uint64_t data = lho + 30 + le(f + lho + 26, 2) + le(f + lho + 28, 2);
        if (data > n || usize > n - data)
            return dr_fail(err, DRAMA_EFORMAT, "%s: zip entry '%s' (%llu bytes at byte %llu) lies outside the file "
                           "(%zu bytes)", path, name, (unsigned long long)usize, (unsigned long long)data, n);
        p->entries[e].data = f + data;
        p->entries[e].size = usize;
        p->entries[e].crc = (uint32_t)le(h + 16, 4);
        pos += 46 + nlen + elen + clen;
    }
    qsort(p->entries, (size_t)p->n_entries, sizeof *p->entries, cmp_entry);
    for (int64_t i = 1; i < p->n_entries; i++)
        if (!strcmp(p->entries[i].name, p->entries[i - 1].name))
            return dr_fail(err, DRAMA_EFORMAT, "%s: duplicate zip entry '%s'", path, p->entries[i].name);
    return DRAMA_OK;
}

/* Every member's bytes against its CRC-32: a flipped bit in a stored tensor would otherwise load
 * as a silently wrong weight. Run last, after everything cheaper has been validated. */
static drama_status check_crcs(const dr_pth *p, drama_error *err) {
    for (int64_t i = 0; i < p->n_entries; i++) {
        const zentry *ze = &p->entries[i];
        uLong crc = crc32(0L, Z_NULL, 0);
        for (uint64_t off = 0; off < ze->size;) { /* zlib takes 32-bit lengths */
            uInt len = ze->size - off > (1u << 30) ? (1u << 30) : (uInt)(ze->size - off);
            crc = crc32(crc, ze->data + off, len);
            off += len;
        }
        if (p->mapped) { /* drop the pages just read from this process's RSS: most are never used again */
            uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)ze->data + pg - 1) & ~(pg - 1);
            uintptr_t b = ((uintptr_t)ze->data + ze->size) & ~(pg - 1);
            if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
        }
        if ((uint32_t)crc != ze->crc)
            return dr_fail(err, DRAMA_EFORMAT, "%s: zip member '%s' (%llu bytes) fails its CRC-32 check (stored %08x, "
                           "computed %08x): the file is corrupt", p->path, ze->name, (unsigned long long)ze->size,
                           (unsigned)ze->crc, (unsigned)crc);
    }
    return DRAMA_OK;
}

typedef struct name_idx {
    const char *name;
    int64_t idx;
} name_idx;

static int cmp_name_idx(const void *a, const void *b) {
    return strcmp(((const name_idx *)a)->name, ((const name_idx *)b)->name);
}

/* Turn one unpickled tensor into a view (or a copy, for non-contiguous strides). */
static drama_status make_tensor(dr_pth *p, const char *name, const dr_pk_value *v, dr_tensor *t, drama_error *err) {
    const dr_pk_value *st = v->storage;
    size_t es = dr_dtype_size(v->dtype);
    char ename[1024];
    snprintf(ename, sizeof ename, "%s/data/%s", p->prefix, st->s);
    const zentry *ze = find_entry(p, ename);
    if (!ze) return dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s': storage entry '%s' is missing", p->path, name, ename);
    if ((uint64_t)st->numel > ze->size / es)
        return dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s': storage '%s' holds %llu bytes, fewer than %lld elements of %zu",
                       p->path, name, ename, (unsigned long long)ze->size, (long long)st->numel, es);
    t->dtype = v->dtype;
    t->ndim = v->ndim;
    int64_t numel = 1, last = v->offset;
    int contiguous = 1;
    int64_t expect = 1;
    for (int d = v->ndim - 1; d >= 0; d--) {
        int64_t sz = v->shape[d], sd = v->stride[d];
        t->shape[d] = sz;
        if (sz == 0) numel = 0;
        else if (numel && numel > INT64_MAX / sz) return dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s': size overflow", p->path, name);
        else numel *= sz;
        if (sz > 1) {
            if (sd && sz - 1 > (INT64_MAX / 2) / sd)
                return dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s': stride overflow", p->path, name);
            last += (sz - 1) * sd;
            if (last < 0) return dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s': stride overflow", p->path, name);
            if (sd != expect) contiguous = 0;
        }
        expect = sz > 0 && expect <= INT64_MAX / sz ? expect * sz : expect;
    }
    if (numel > 0 && last >= st->numel)
        return dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s': view (offset %lld, last element %lld) lies outside its "
                       "storage of %lld elements", p->path, name, (long long)v->offset, (long long)last, (long long)st->numel);
    if (numel > st->numel) /* only overlapping (e.g. stride 0) views can exceed it; never in a state dict */
        return dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s': %lld elements view a storage of %lld", p->path, name,
                       (long long)numel, (long long)st->numel);
    if (numel == 0) {
        t->data = ze->data;
        t->nbytes = 0;
        return DRAMA_OK;
    }
    t->nbytes = (size_t)numel * es;
    if (contiguous) {
        t->data = ze->data + (size_t)v->offset * es;
        return DRAMA_OK;
    }
    uint8_t *buf = malloc(t->nbytes);
    void **nc = realloc(p->copies, (size_t)(p->n_copies + 1) * sizeof *nc);
    if (!buf || !nc) {
        free(buf);
        if (nc) p->copies = nc;
        return dr_fail(err, DRAMA_ENOMEM, "%s: tensor '%s': out of memory copying a strided view", p->path, name);
    }
    p->copies = nc;
    p->copies[p->n_copies++] = buf;
    int64_t idx[DR_MAX_DIMS] = {0};
    for (int64_t k = 0; k < numel; k++) {
        int64_t src = v->offset;
        for (int d = 0; d < v->ndim; d++) src += idx[d] * v->stride[d];
        memcpy(buf + (size_t)k * es, ze->data + (size_t)src * es, es);
        for (int d = v->ndim - 1; d >= 0; d--) {
            if (++idx[d] < v->shape[d]) break;
            idx[d] = 0;
        }
    }
    t->data = buf;
    return DRAMA_OK;
}

static drama_status load(dr_pth *p, drama_error *err) {
    drama_status rc = parse_zip(p, err);
    if (rc) return rc;
    const zentry *pkl = NULL;
    for (int64_t i = 0; i < p->n_entries; i++) {
        const char *nm = p->entries[i].name;
        size_t l = strlen(nm);
        if (l >= 9 && !strcmp(nm + l - 9, "/data.pkl")) {
            if (pkl) return dr_fail(err, DRAMA_EFORMAT, "%s: more than one data.pkl ('%s', '%s')", p->path, pkl->name, nm);
            pkl = &p->entries[i];
        }
    }
    if (!pkl) return dr_fail(err, DRAMA_EFORMAT, "%s: no '<dir>/data.pkl' entry: not a torch.save archive", p->path);
    size_t plen = strlen(pkl->name) - 9;
    if (plen == 0 || memchr(pkl->name, '/', plen))
        return dr_fail(err, DRAMA_EFORMAT, "%s: '%s' is not inside a single top directory", p->path, pkl->name);
    p->prefix = strndup(pkl->name, plen);
    if (!p->prefix) return dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", p->path);
    char bo[1100];
    snprintf(bo, sizeof bo, "%s/byteorder", p->prefix);
    const zentry *boe = find_entry(p, bo);
    if (boe && !(boe->size == 6 && !memcmp(boe->data, "little", 6)))
        return dr_fail(err, DRAMA_EUNSUPPORTED, "%s: '%s' does not say 'little' (big-endian archives are not supported)",
                       p->path, bo);

    char label[1200];
    snprintf(label, sizeof label, "%s:%s", p->path, pkl->name);
    dr_pk *pk = NULL;
    const dr_pk_value *root = NULL;
    if ((rc = dr_pk_load(pkl->data, (size_t)pkl->size, label, NULL, &pk, &root, err))) return rc;
    const dr_pk_value *sd = root;
    if (sd->kind == DR_PK_DICT) {
        const dr_pk_value *w = dr_pk_dict_get(sd, "state_dict");
        if (w && w->kind == DR_PK_DICT) sd = w;
    }
    if (sd->kind != DR_PK_DICT) {
        dr_pk_free(pk);
        return dr_fail(err, DRAMA_EFORMAT, "%s: the pickle holds a %s, not a dict of tensors", label,
                       dr_pk_kind_name(sd->kind));
    }
    int64_t n = sd->n / 2;
    p->tensors = calloc(n ? (size_t)n : 1, sizeof *p->tensors);
    p->sorted = calloc(n ? (size_t)n : 1, sizeof *p->sorted);
    if (!p->tensors || !p->sorted) {
        dr_pk_free(pk);
        return dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", p->path);
    }
    for (int64_t i = 0; i < n && !rc; i++) {
        const dr_pk_value *k = sd->items[2 * i], *v = sd->items[2 * i + 1];
        if (k->kind != DR_PK_STR) {
            rc = dr_fail(err, DRAMA_EFORMAT, "%s: state dict key %lld is a %s, not a string", label, (long long)i,
                         dr_pk_kind_name(k->kind));
            break;
        }
        if (v->kind != DR_PK_TENSOR) {
            rc = dr_fail(err, DRAMA_EFORMAT, "%s: state dict entry '%s' is a %s, not a tensor", label, k->s,
                         dr_pk_kind_name(v->kind));
            break;
        }
        p->tensors[i].name = strdup(k->s);
        p->n_tensors = i + 1;
        if (!p->tensors[i].name) rc = dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", p->path);
        else rc = make_tensor(p, k->s, v, &p->tensors[i], err);
        p->sorted[i] = i;
    }
    dr_pk_free(pk);
    if (rc) return rc;
    name_idx *ni = malloc((size_t)(p->n_tensors ? p->n_tensors : 1) * sizeof *ni);
    if (!ni) return dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", p->path);
    for (int64_t i = 0; i < p->n_tensors; i++) ni[i].name = p->tensors[i].name, ni[i].idx = i;
    qsort(ni, (size_t)p->n_tensors, sizeof *ni, cmp_name_idx);
    for (int64_t i = 0; i < p->n_tensors; i++) p->sorted[i] = ni[i].idx;
    free(ni);
    for (int64_t i = 1; i < p->n_tensors; i++)
        if (!strcmp(p->tensors[p->sorted[i]].name, p->tensors[p->sorted[i - 1]].name))
            return dr_fail(err, DRAMA_EFORMAT, "%s: duplicate tensor name '%s'", label, p->tensors[p->sorted[i]].name);
    return check_crcs(p, err);
}

drama_status dr_pth_open_memory(const void *data, size_t size, const char *label, dr_pth **out, drama_error *err) {
    *out = NULL;
    dr_pth *p = calloc(1, sizeof *p);
    if (!p) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    p->path = strdup(label ? label : "<memory>");
    p->map = data;
    p->map_size = size;
    drama_status rc = p->path ? load(p, err) : dr_fail(err, DRAMA_ENOMEM, "out of memory");
    if (rc) {
        dr_pth_close(p);
        return rc;
    }
    *out = p;
    return DRAMA_OK;
}

drama_status dr_pth_open(const char *path, dr_pth **out, drama_error *err) {
    *out = NULL;
    char link_target[4096];
    int fd = open(dr_path_follow_placeholder(path, link_target, sizeof link_target), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dr_fail(err, DRAMA_EIO, "%s: cannot open: %m", path);
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return dr_fail(err, DRAMA_EIO, "%s: not a regular file", path);
    }
    if (sb.st_size == 0) {
        close(fd);
        return dr_fail(err, DRAMA_EFORMAT, "%s: empty file", path);
    }
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return dr_fail(err, DRAMA_EIO, "%s: mmap failed: %m", path);
    dr_pth *p = calloc(1, sizeof *p);
    if (!p) {
        munmap(m, (size_t)sb.st_size);
        return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    }
    p->map = m;
    p->map_size = (size_t)sb.st_size;
    p->mapped = 1;
    p->path = strdup(path);
    drama_status rc = p->path ? load(p, err) : dr_fail(err, DRAMA_ENOMEM, "out of memory");
    if (rc) {
        dr_pth_close(p);
        return rc;
    }
    *out = p;
    return DRAMA_OK;
}

void dr_pth_close(dr_pth *p) {
    if (!p) return;
    for (int64_t i = 0; i < p->n_entries; i++) free(p->entries[i].name);
    free(p->entries);
    for (int64_t i = 0; i < p->n_tensors; i++) free((char *)p->tensors[i].name);
    free(p->tensors);
    free(p->sorted);
    for (int64_t i = 0; i < p->n_copies; i++) free(p->copies[i]);
    free(p->copies);
    if (p->mapped) munmap((void *)p->map, p->map_size);
    free(p->prefix);
    free(p->path);
    free(p);
}

int64_t dr_pth_count(const dr_pth *p) { return p ? p->n_tensors : 0; }
const dr_tensor *dr_pth_at(const dr_pth *p, int64_t i) {
    return p && i >= 0 && i < p->n_tensors ? &p->tensors[i] : NULL;
}
const dr_tensor *dr_pth_find(const dr_pth *p, const char *name) {
    if (!p) return NULL;
    int64_t lo = 0, hi = p->n_tensors;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        int c = strcmp(p->tensors[p->sorted[mid]].name, name);
        if (!c) return &p->tensors[p->sorted[mid]];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}
const char *dr_pth_prefix(const dr_pth *p) { return p ? p->prefix : NULL; }
const char *dr_pth_path(const dr_pth *p) { return p ? p->path : NULL; }
