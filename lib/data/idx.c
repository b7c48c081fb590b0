/* nabla — reading IDX files (the MNIST format), gzip-compressed or plain.
 *
 * Layout: two zero bytes, a type code, the number of dims, then each dim as a
 * big-endian u32, then the elements in row-major order, multi-byte types
 * big-endian. gzread reads a plain file as it is, so one path serves both. The
 * data are read into a buffer that grows with what the file really holds (never
 * trusting the header's size up front), then copied into a new CPU tensor. */
#include "lib/core/core.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "nb_config.h"

#if NB_HAVE_ZLIB
#include <zlib.h>
#else
/* Without zlib (a build machine lacking its headers) plain files still read;
 * a gzip-compressed one is refused with a message that says why. */
#include <stdio.h>
typedef struct nb_plain_file {
    FILE *fp;
    const char *problem;
} *gzFile;
#define Z_ERRNO (-1)
static gzFile gzopen(const char *path, const char *mode)
{
    FILE *fp = fopen(path, mode);
    if (!fp)
        return NULL;
    gzFile f = calloc(1, sizeof *f);
    if (!f) {
        fclose(fp);
        return NULL;
    }
    f->fp = fp;
    int b0 = fgetc(fp), b1 = fgetc(fp);
    if (b0 == 0x1f && b1 == 0x8b)
        f->problem = "the file is gzip-compressed and this nabla was built without zlib; gunzip it first";
    rewind(fp);
    return f;
}
static int gzread(gzFile f, void *dst, unsigned n)
{
    if (f->problem)
        return -1;
    size_t r = fread(dst, 1, n, f->fp);
    return r == 0 && ferror(f->fp) ? -1 : (int)r;
}
static const char *gzerror(gzFile f, int *errnum)
{
    *errnum = f->problem ? 0 : Z_ERRNO;
    return f->problem ? f->problem : "";
}
static int gzclose(gzFile f)
{
    fclose(f->fp);
    free(f);
    return 0;
}
#endif

#define IDX_WHO "nb_idx_read"

/* Reads up to n bytes; returns how many were read, or -1 on a read error. */
static int64_t read_full(gzFile f, void *dst, int64_t n)
{
    int64_t got = 0;
    while (got < n) {
        int64_t want = n - got;
        unsigned chunk = want > (1 << 30) ? (1u << 30) : (unsigned)want;
        int r = gzread(f, (char *)dst + got, chunk);
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += r;
    }
    return got;
}

static const char *gz_problem(gzFile f)
{
    int errnum = 0;
    const char *msg = gzerror(f, &errnum);
    if (errnum == Z_ERRNO)
        return strerror(errno);
    return msg && *msg ? msg : "read error";
}

static bool host_is_little_endian(void)
{
    const uint16_t one = 1;
    return *(const uint8_t *)&one == 1;
}

static void swap_bytes(void *data, int64_t count, size_t elem)
{
    uint8_t *p = data;
    for (int64_t i = 0; i < count; i++, p += elem) {
        for (size_t a = 0, b = elem - 1; a < b; a++, b--) {
            uint8_t t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
    }
}

nb_tensor *nb_idx_read(const char *path)
{
    if (!path)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, IDX_WHO ": path is NULL");

    errno = 0;
    gzFile f = gzopen(path, "rb");
    if (!f)
        return nb__fail_null(NB_ERR_IO, IDX_WHO ": cannot open '%s': %s", path,
                             errno ? strerror(errno) : "out of memory");

    nb_tensor *result = NULL;
    uint8_t *buf = NULL;
    uint8_t head[4];
    int64_t got = read_full(f, head, 4);
    if (got < 0) {
        nb__fail(NB_ERR_IO, IDX_WHO ": '%s': cannot read the header: %s", path, gz_problem(f));
        goto done;
    }
    if (got < 4) {
        nb__fail(NB_ERR_IO, IDX_WHO ": '%s': truncated header (%lld of 4 bytes)", path,
                 (long long)got);
        goto done;
    }
    if (head[0] != 0 || head[1] != 0) {
        nb__fail(NB_ERR_IO,
                 IDX_WHO ": '%s': bad magic number 0x%02x%02x%02x%02x (the first two bytes "
                         "must be 0; not an IDX file)",
                 path, head[0], head[1], head[2], head[3]);
        goto done;
    }

    nb_dtype dtype;
    switch (head[2]) {
    case 0x08: dtype = NB_U8; break;  /* unsigned byte */
    case 0x09: dtype = NB_U8; break;  /* signed byte: kept as its bits */
    case 0x0C: dtype = NB_I32; break;
    case 0x0D: dtype = NB_F32; break;
    case 0x0E: dtype = NB_F64; break;
    case 0x0B:
        nb__fail(NB_ERR_UNSUPPORTED,
                 IDX_WHO ": '%s': element type i16 (0x0B) is not supported", path);
        goto done;
    default:
        nb__fail(NB_ERR_IO, IDX_WHO ": '%s': unknown element type code 0x%02x", path, head[2]);
        goto done;
    }

    int ndim = head[3];
    if (ndim == 0 || ndim > NB_MAX_DIMS) {
        nb__fail(NB_ERR_IO, IDX_WHO ": '%s': %d dims (must be 1 to %d)", path, ndim,
                 NB_MAX_DIMS);
        goto done;
    }

    uint8_t dimbytes[4 * NB_MAX_DIMS];
    got = read_full(f, dimbytes, 4 * ndim);
    if (got < 0) {
        nb__fail(NB_ERR_IO, IDX_WHO ": '%s': cannot read the dims: %s", path, gz_problem(f));
        goto done;
    }
    if (got < 4 * ndim) {
        nb__fail(NB_ERR_IO, IDX_WHO ": '%s': truncated header (%lld of %d dim bytes)", path,
                 (long long)got, 4 * ndim);
        goto done;
    }
    int64_t shape[NB_MAX_DIMS];
    size_t elem = nb_dtype_size(dtype);
    /* Bytes the data must hold; the limit keeps the arithmetic in range. */
    const int64_t limit = INT64_C(1) << 48;
    int64_t nbytes = (int64_t)elem;
    for (int i = 0; i < ndim; i++) {
        const uint8_t *d = dimbytes + 4 * i;
        shape[i] = (int64_t)((uint32_t)d[0] << 24 | (uint32_t)d[1] << 16 | (uint32_t)d[2] << 8 |
                             (uint32_t)d[3]);
        if (nbytes > 0 && shape[i] > limit / nbytes) {
            char s[NB_SHAPE_STR_MAX];
            nb__fail(NB_ERR_IO, IDX_WHO ": '%s': dims %s are too large", path,
                     nb__shape_str(ndim, shape, s, sizeof s));
            goto done;
        }
        nbytes *= shape[i];
    }

    /* Read the data into a buffer that grows only as far as the file goes, plus
     * one byte to find trailing data. */
    int64_t cap = nbytes + 1 < (INT64_C(1) << 24) ? nbytes + 1 : (INT64_C(1) << 24);
    buf = malloc((size_t)cap);
    if (!buf) {
        nb__fail(NB_ERR_OUT_OF_MEMORY, IDX_WHO ": '%s': out of host memory", path);
        goto done;
    }
    int64_t have = 0;
    for (;;) {
        int64_t r = read_full(f, buf + have, cap - have);
        if (r < 0) {
            char s[NB_SHAPE_STR_MAX];
            nb__fail(NB_ERR_IO,
                     IDX_WHO ": '%s': truncated or corrupt data after %lld of %lld bytes for "
                             "shape %s: %s",
                     path, (long long)have, (long long)nbytes,
                     nb__shape_str(ndim, shape, s, sizeof s), gz_problem(f));
            goto done;
        }
        have += r;
        if (have < cap || cap == nbytes + 1)
            break;
        int64_t ncap = cap * 2 < nbytes + 1 ? cap * 2 : nbytes + 1;
        uint8_t *nbuf = realloc(buf, (size_t)ncap);
        if (!nbuf) {
            nb__fail(NB_ERR_OUT_OF_MEMORY, IDX_WHO ": '%s': out of host memory", path);
            goto done;
        }
        buf = nbuf;
        cap = ncap;
    }
    if (have < nbytes) {
        char s[NB_SHAPE_STR_MAX];
        nb__fail(NB_ERR_IO,
                 IDX_WHO ": '%s': truncated data: %lld of %lld bytes for shape %s of %s",
                 path, (long long)have, (long long)nbytes, nb__shape_str(ndim, shape, s, sizeof s),
                 nb_dtype_name(dtype));
        goto done;
    }
    if (have > nbytes) {
        char s[NB_SHAPE_STR_MAX];
        nb__fail(NB_ERR_IO,
                 IDX_WHO ": '%s': trailing data after the %lld bytes of shape %s of %s", path,
                 (long long)nbytes, nb__shape_str(ndim, shape, s, sizeof s), nb_dtype_name(dtype));
        goto done;
    }

    if (elem > 1 && host_is_little_endian())
        swap_bytes(buf, nbytes / (int64_t)elem, elem);

    nb_device *cpu = nb__device_cpu0();
    if (!cpu)
        goto done;
    nb_tensor *t = nb__tensor_new(IDX_WHO, cpu, dtype, ndim, shape);
    if (!t)
        goto done;
    if (nbytes > 0)
        memcpy(nb__data(t), buf, (size_t)nbytes);
    result = nb__own(t);

done:
    free(buf);
    gzclose(f);
    return result;
}
