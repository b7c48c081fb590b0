/* nabla — reading IDX files (the MNIST format), gzip-compressed or plain, from
 * a path or from memory.
 *
 * Layout: two zero bytes, a type code, the number of dims, then each dim as a
 * big-endian u32, then the elements in row-major order, multi-byte types
 * big-endian. One parser reads from a source: a gzFile for a path (gzread reads
 * a plain file as it is), or a block of memory, inflated on the way when it
 * starts with the gzip magic (as gzread would: members one after another,
 * anything after the last one ignored). The data are read into a buffer that
 * grows with what the source really holds (never trusting the header's size up
 * front), then copied into a new CPU tensor. */
#include "lib/core/core.h"
#include "lib/data/idx.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nb_config.h"

#if NB_HAVE_ZLIB
#include <zlib.h>
#else
/* Without zlib (a build machine lacking its headers) plain files still read;
 * a gzip-compressed one is refused with a message that says why. */
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

/* Where the parser's bytes come from. read returns how many bytes it wrote to
 * dst (fewer than n only at the end), or -1 on a read error that problem then
 * describes. label names the source in messages. */
typedef struct idx_source idx_source;
struct idx_source {
    const char *who; /* the public function */
    char label[512];
    int64_t (*read)(idx_source *src, void *dst, int64_t n);
    const char *(*problem)(idx_source *src);
    gzFile file;                 /* a path */
    const uint8_t *data;         /* memory */
    size_t size, pos;
    const char *error;           /* memory: why the last read failed */
#if NB_HAVE_ZLIB
    bool z_live; /* inflateInit2 succeeded, so inflateEnd is due */
    bool z_done; /* the last member ended, or the input ran out */
    z_stream z;
#endif
};

/* ---- a path, through zlib's gz* functions ----------------------------------------------- */

static int64_t file_read(idx_source *src, void *dst, int64_t n)
{
    int64_t got = 0;
    while (got < n) {
        int64_t want = n - got;
        unsigned chunk = want > (1 << 30) ? (1u << 30) : (unsigned)want;
        int r = gzread(src->file, (char *)dst + got, chunk);
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += r;
    }
    return got;
}

static const char *file_problem(idx_source *src)
{
    int errnum = 0;
    const char *msg = gzerror(src->file, &errnum);
    if (errnum == Z_ERRNO)
        return strerror(errno);
    return msg && *msg ? msg : "read error";
}

/* ---- memory ------------------------------------------------------------------------------ */

static const char *memory_problem(idx_source *src) { return src->error ? src->error : "read error"; }

static int64_t memory_read(idx_source *src, void *dst, int64_t n)
{
    size_t left = src->size - src->pos;
    size_t take = (uint64_t)n < left ? (size_t)n : left;
    if (take)
        memcpy(dst, src->data + src->pos, take);
    src->pos += take;
    return (int64_t)take;
}

#if NB_HAVE_ZLIB
static bool gzip_magic_at(const idx_source *src, size_t pos)
{
    return src->size - pos >= 2 && src->data[pos] == 0x1f && src->data[pos + 1] == 0x8b;
}

/* Inflates the next n bytes. Like gzread: a member's end is followed by the
 * next member when the gzip magic comes next, else by the end (the rest is
 * ignored); input that stops inside a member is an early end, not an error,
 * so the parser reports what was cut short. */
static int64_t gzip_read(idx_source *src, void *dst, int64_t n)
{
    int64_t got = 0;
    while (got < n && !src->z_done) {
        z_stream *z = &src->z;
        size_t in_left = src->size - src->pos;
        int64_t out_left = n - got;
        z->next_in = (Bytef *)(uintptr_t)(src->data + src->pos);
        z->avail_in = in_left > (1u << 30) ? (1u << 30) : (uInt)in_left;
        z->next_out = (Bytef *)dst + got;
        z->avail_out = out_left > (1 << 30) ? (1u << 30) : (uInt)out_left;
        uInt had_in = z->avail_in, had_out = z->avail_out;
        int r = inflate(z, Z_NO_FLUSH);
        src->pos += had_in - z->avail_in;
        got += had_out - z->avail_out;
        if (r == Z_STREAM_END) {
            if (gzip_magic_at(src, src->pos)) {
                if (inflateReset(z) != Z_OK) {
                    src->error = "cannot restart the inflater";
                    return -1;
                }
            } else {
                src->z_done = true;
            }
        } else if (r == Z_BUF_ERROR) {
            /* No progress: with output room left, the input has run out. */
            src->z_done = true;
        } else if (r != Z_OK) {
            src->error = r == Z_MEM_ERROR ? "out of memory" : z->msg ? z->msg : "corrupt gzip data";
            return -1;
        }
    }
    return got;
}
#endif

/* ---- the parser ---------------------------------------------------------------------------- */

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

/* Which rows to keep: index, index + count, ... (count 1, index 0: all); with
 * header_only, none are read and only the header is checked. */
typedef struct idx_rows {
    int64_t count, index;
    bool header_only;
} idx_rows;

static nb_status read_rows(idx_source *src, int64_t nbytes, int64_t rows, int64_t row_bytes, idx_rows sel,
                           uint8_t **out, const char *what);

/* Reads one IDX image from src: the rows sel picks into a new tensor owned by
 * the current scope, written to *out (left NULL with sel.header_only, when
 * *header gets the dtype and shape alone). Returns NB_OK, or an error naming
 * src->who and src->label. */
static nb_status idx_parse(idx_source *src, idx_rows sel, nb_tensor **out, nb_idx_header *header)
{
    *out = NULL;
    const char *who = src->who, *where = src->label;
    uint8_t *buf = NULL;
    uint8_t head[4];
    int64_t got = src->read(src, head, 4);
    if (got < 0) {
        nb__fail(NB_ERR_IO, "%s: %s: cannot read the header: %s", who, where, src->problem(src));
        goto done;
    }
    if (got < 4) {
        nb__fail(NB_ERR_IO, "%s: %s: truncated header (%lld of 4 bytes)", who, where, (long long)got);
        goto done;
    }
    if (head[0] != 0 || head[1] != 0) {
        nb__fail(NB_ERR_IO,
                 "%s: %s: bad magic number 0x%02x%02x%02x%02x (the first two bytes must be 0; "
                 "not an IDX file)",
                 who, where, head[0], head[1], head[2], head[3]);
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
        nb__fail(NB_ERR_UNSUPPORTED, "%s: %s: element type i16 (0x0B) is not supported", who, where);
        goto done;
    default:
        nb__fail(NB_ERR_IO, "%s: %s: unknown element type code 0x%02x", who, where, head[2]);
        goto done;
    }

    int ndim = head[3];
    if (ndim == 0 || ndim > NB_MAX_DIMS) {
        nb__fail(NB_ERR_IO, "%s: %s: %d dims (must be 1 to %d)", who, where, ndim, NB_MAX_DIMS);
        goto done;
    }

    uint8_t dimbytes[4 * NB_MAX_DIMS];
    got = src->read(src, dimbytes, 4 * ndim);
    if (got < 0) {
        nb__fail(NB_ERR_IO, "%s: %s: cannot read the dims: %s", who, where, src->problem(src));
        goto done;
    }
    if (got < 4 * ndim) {
        nb__fail(NB_ERR_IO, "%s: %s: truncated header (%lld of %d dim bytes)", who, where, (long long)got,
                 4 * ndim);
        goto done;
    }
    int64_t shape[NB_MAX_DIMS];
    for (int i = 0; i < ndim; i++) {
        const uint8_t *d = dimbytes + 4 * i;
        shape[i] = (int64_t)((uint32_t)d[0] << 24 | (uint32_t)d[1] << 16 | (uint32_t)d[2] << 8 | (uint32_t)d[3]);
    }
    /* Every dim counts, a zero one as 1: a zero dim empties the data, but the
     * others still set the tensor's strides, which must stay in range. The
     * limit keeps the byte arithmetic well inside int64. */
    const int64_t limit = INT64_C(1) << 48;
    size_t elem = nb_dtype_size(dtype);
    int64_t span = (int64_t)elem;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] > 1 && span > limit / shape[i]) {
            char s[NB_SHAPE_STR_MAX];
            nb__fail(NB_ERR_IO, "%s: %s: dims %s of %s are too large (more than 2^48 bytes, a zero dim counted as 1)",
                     who, where, nb__shape_str(ndim, shape, s, sizeof s), nb_dtype_name(dtype));
            goto done;
        }
        span *= shape[i] > 1 ? shape[i] : 1;
    }
    const int64_t nbytes = nb__shape_numel(ndim, shape) * (int64_t)elem; /* <= span */
    if (header) {
        header->dtype = dtype;
        header->ndim = ndim;
        memcpy(header->shape, shape, sizeof(int64_t) * (size_t)ndim);
    }
    if (sel.header_only)
        return NB_OK;
    char what[NB_SHAPE_STR_MAX + 16]; /* "[2, 3] of u8", for messages */
    char dims[NB_SHAPE_STR_MAX];
    snprintf(what, sizeof what, "%s of %s", nb__shape_str(ndim, shape, dims, sizeof dims), nb_dtype_name(dtype));
    const int64_t rows = shape[0], row_bytes = rows ? nbytes / rows : 0;
    if (read_rows(src, nbytes, rows, row_bytes, sel, &buf, what))
        goto done;
    shape[0] = rows > sel.index ? (rows - sel.index + sel.count - 1) / sel.count : 0;
    const int64_t kept = shape[0] * row_bytes;
    if (elem > 1 && host_is_little_endian())
        swap_bytes(buf, kept / (int64_t)elem, elem);
    nb_device *cpu = nb__device_cpu0();
    nb_tensor *t = cpu ? nb__tensor_new(who, cpu, dtype, ndim, shape) : NULL;
    if (t && kept > 0)
        memcpy(nb__data(t), buf, (size_t)kept);
    if (t)
        *out = nb__own(t);

done:
    free(buf);
    return *out ? NB_OK : nb_error() ? nb_error() : NB_ERR_INTERNAL;
}

/* Grows *buf (of *cap bytes) to hold at least need bytes, at most limit. */
static bool grow_to(uint8_t **buf, int64_t *cap, int64_t need, int64_t limit)
{
    if (need <= *cap)
        return true;
    int64_t ncap = *cap ? *cap : INT64_C(1) << 16;
    while (ncap < need)
        ncap = ncap > limit / 2 ? limit : ncap * 2;
    uint8_t *nbuf = realloc(*buf, (size_t)ncap);
    if (!nbuf)
        return false;
    *buf = nbuf;
    *cap = ncap;
    return true;
}

/* Reads the nbytes of data, keeping the bytes of the rows sel picks in a
 * buffer that grows only as far as the source goes (never trusting the
 * header's size up front): all of them read straight into it, a share
 * streamed through a window. Then reads one more byte to find trailing data.
 * *out gets the buffer (the caller frees it) on success; what names the shape
 * and dtype in messages. */
static nb_status read_rows(idx_source *src, int64_t nbytes, int64_t rows, int64_t row_bytes, idx_rows sel,
                           uint8_t **out, const char *what)
{
    const char *who = src->who, *where = src->label;
    enum { WINDOW = 1 << 20 };
    const bool all = sel.count == 1;
    uint8_t *window = all ? NULL : malloc(WINDOW), *kept = NULL;
    int64_t kept_cap = 0, pos = 0;
    const int64_t k = rows > sel.index ? (rows - sel.index + sel.count - 1) / sel.count : 0;
    nb_status st = NB_OK;
    if (!all && !window)
        goto out_of_memory;
    while (pos < nbytes) {
        int64_t want = nbytes - pos < WINDOW ? nbytes - pos : WINDOW;
        if (all && !grow_to(&kept, &kept_cap, pos + want, nbytes))
            goto out_of_memory;
        int64_t got = src->read(src, all ? kept + pos : window, want);
        if (got < 0) {
            st = nb__fail(NB_ERR_IO, "%s: %s: truncated or corrupt data after %lld of %lld bytes for shape %s: %s",
                          who, where, (long long)pos, (long long)nbytes, what, src->problem(src));
            goto done;
        }
        for (int64_t off = 0; !all && off < got;) { /* the window's pieces of one row each */
            int64_t at = pos + off, r = at / row_bytes, in_row = at - r * row_bytes;
            int64_t piece = row_bytes - in_row < got - off ? row_bytes - in_row : got - off;
            if (r % sel.count == sel.index) {
                int64_t dst = (r / sel.count) * row_bytes + in_row;
                if (!grow_to(&kept, &kept_cap, dst + piece, k * row_bytes))
                    goto out_of_memory;
                memcpy(kept + dst, window + off, (size_t)piece);
            }
            off += piece;
        }
        pos += got;
        if (got < want) {
            st = nb__fail(NB_ERR_IO, "%s: %s: truncated data: %lld of %lld bytes for shape %s", who, where,
                          (long long)pos, (long long)nbytes, what);
            goto done;
        }
    }
    uint8_t extra;
    int64_t more = src->read(src, &extra, 1);
    if (more != 0) {
        st = more < 0 ? nb__fail(NB_ERR_IO, "%s: %s: cannot read past the data: %s", who, where, src->problem(src))
                      : nb__fail(NB_ERR_IO, "%s: %s: trailing data after the %lld bytes of shape %s", who, where,
                                 (long long)nbytes, what);
        goto done;
    }
    *out = kept;
    kept = NULL;
    goto done;
out_of_memory:
    st = nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: %s: out of host memory", who, where);
done:
    free(window);
    free(kept);
    return st;
}

/* ---- the public readers ---------------------------------------------------------------------- */

/* Opens path and parses it with sel; *out and *header as idx_parse. */
static nb_status read_path(const char *who, const char *path, idx_rows sel, nb_tensor **out, nb_idx_header *header)
{
    *out = NULL;
    if (!path)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: path is NULL", who);
    errno = 0;
    gzFile f = gzopen(path, "rb");
    if (!f)
        return nb__fail(NB_ERR_IO, "%s: cannot open '%s': %s", who, path, errno ? strerror(errno) : "out of memory");
    idx_source src = {.who = who, .read = file_read, .problem = file_problem, .file = f};
    snprintf(src.label, sizeof src.label, "'%s'", path);
    nb_status st = idx_parse(&src, sel, out, header);
    gzclose(f);
    return st;
}

nb_tensor *nb_idx_read(const char *path)
{
    nb_tensor *t;
    read_path("nb_idx_read", path, (idx_rows){1, 0, false}, &t, NULL);
    return t;
}

nb_tensor *nb_idx_read_share(const char *path, int64_t count, int64_t index)
{
    const char *who = "nb_idx_read_share";
    if (count < 1 || index < 0 || index >= count)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: row %lld of every %lld (count >= 1, 0 <= index < count)",
                             who, (long long)index, (long long)count);
    nb_tensor *t;
    read_path(who, path, (idx_rows){count, index, false}, &t, NULL);
    return t;
}

nb_status nb__idx_read_header(const char *who, const char *path, nb_idx_header *header)
{
    nb_tensor *none;
    return read_path(who, path, (idx_rows){1, 0, true}, &none, header);
}

nb_tensor *nb_idx_read_memory(const void *data, size_t size)
{
    const char *who = "nb_idx_read_memory";
    if (!data && size)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: data is NULL (size %zu)", who, size);
    idx_source src = {.who = who, .read = memory_read, .problem = memory_problem, .data = data, .size = size};
    snprintf(src.label, sizeof src.label, "buffer of %zu bytes", size);
    bool gzip = size >= 2 && src.data[0] == 0x1f && src.data[1] == 0x8b;
#if NB_HAVE_ZLIB
    if (gzip) {
        /* 15 + 16: a gzip wrapper, with its header and check read by zlib. */
        if (inflateInit2(&src.z, 15 + 16) != Z_OK)
            return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: %s: cannot start the inflater", who, src.label);
        src.z_live = true;
        src.read = gzip_read;
    }
#else
    if (gzip)
        return nb__fail_null(NB_ERR_IO, "%s: %s: the data are gzip-compressed and this nabla was built without "
                             "zlib; gunzip them first", who, src.label);
#endif
    nb_tensor *t;
    idx_parse(&src, (idx_rows){1, 0, false}, &t, NULL);
#if NB_HAVE_ZLIB
    if (src.z_live)
        inflateEnd(&src.z);
#endif
    return t;
}
