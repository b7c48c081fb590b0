/* nabla — TensorBoard summaries (include/nabla/summary.h).
 *
 * Each call encodes one Event (event.proto: wall_time 1, step 2, file_version
 * 3, summary 5) holding a Summary (value 1) of one Summary.Value (tag 1,
 * simple_value 2, histo 5) with pb_encode.h, and appends it to the event file
 * through the TFRecord writer. The encoding buffers live in the writer and are
 * reused, so a call in a training loop allocates nothing once they have grown.
 * Histograms use TensorFlow's default bucket limits (tensorflow/core/lib/
 * histogram/histogram.cc), built once. */
#include "lib/core/core.h"
#include "lib/data/pb_encode.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { FLUSH_RECORDS = 1000 };
#define FLUSH_SECONDS 2.0

/* Event, Summary, Summary.Value and HistogramProto field numbers. */
enum { EVENT_WALL_TIME = 1, EVENT_STEP = 2, EVENT_FILE_VERSION = 3, EVENT_SUMMARY = 5 };
enum { SUMMARY_VALUE = 1 };
enum { VALUE_TAG = 1, VALUE_SIMPLE = 2, VALUE_HISTO = 5 };
enum { HISTO_MIN = 1, HISTO_MAX, HISTO_NUM, HISTO_SUM, HISTO_SUM_SQUARES, HISTO_LIMIT, HISTO_BUCKET };

struct nb_summary_writer {
    pthread_mutex_t lock;
    nb_tfrecord_writer *file;
    char *path;
    nb_pb event, summary, value, histo; /* reused encoding buffers */
    double *values;                     /* a histogram's values on the host */
    size_t values_cap;
    double *counts;                     /* one per default bucket */
    double *limits_out, *counts_out;    /* the merged buckets written */
    double last_flush;                  /* monotonic seconds */
    int unflushed;                      /* records since */
};

static double now_monotonic(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- TensorFlow's default histogram buckets -------------------------------------------- */

enum { MAX_BUCKETS = 2048 };
static double bucket_limits[MAX_BUCKETS];
static size_t bucket_count;
static pthread_once_t buckets_once = PTHREAD_ONCE_INIT;

/* -DBL_MAX, -1e20.., ..., -1e-12, 0, 1e-12, ..., ..1e20, DBL_MAX, as
 * histogram.cc's InitDefaultBucketsInner builds them. */
static void build_buckets(void)
{
    double pos[MAX_BUCKETS / 2];
    size_t n = 0;
    for (double v = 1.0e-12; v < 1.0e20; v *= 1.1)
        pos[n++] = v;
    pos[n++] = DBL_MAX;
    size_t k = 0;
    for (size_t i = n; i-- > 0;)
        bucket_limits[k++] = -pos[i];
    bucket_limits[k++] = 0.0;
    for (size_t i = 0; i < n; i++)
        bucket_limits[k++] = pos[i];
    bucket_count = k;
}

/* The bucket of v: the first limit greater than v (the last bucket for v at or
 * past DBL_MAX). */
static size_t bucket_of(double v)
{
    size_t lo = 0, hi = bucket_count; /* the answer is in [lo, hi] */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (bucket_limits[mid] > v)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo < bucket_count ? lo : bucket_count - 1;
}

/* ---- opening ---------------------------------------------------------------------------- */

/* mkdir -p: each missing component of dir. */
static int make_dirs(const char *dir)
{
    size_t n = strlen(dir);
    char *p = malloc(n + 1);
    if (!p)
        return ENOMEM;
    memcpy(p, dir, n + 1);
    int err = 0;
    for (size_t i = 1; i <= n && !err; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            err = errno;
        p[i] = c;
    }
    struct stat sb;
    if (!err && (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)))
        err = ENOTDIR;
    free(p);
    return err;
}

static void free_writer(nb_summary_writer *w)
{
    nb__pb_free(&w->event);
    nb__pb_free(&w->summary);
    nb__pb_free(&w->value);
    nb__pb_free(&w->histo);
    free(w->values);
    free(w->counts);
    free(w->limits_out);
    free(w->counts_out);
    free(w->path);
    pthread_mutex_destroy(&w->lock);
    free(w);
}

/* Appends the event in w->event to the file; flushes when it is time. */
static nb_status write_event(nb_summary_writer *w, const char *who)
{
    if (w->event.failed)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: '%s': out of host memory for the event", who, w->path);
    nb_status st = nb_tfrecord_write(w->file, w->event.data, w->event.size);
    if (st)
        return st;
    double t = now_monotonic();
    if (++w->unflushed >= FLUSH_RECORDS || t - w->last_flush >= FLUSH_SECONDS) {
        st = nb_tfrecord_writer_flush(w->file);
        w->unflushed = 0;
        w->last_flush = t;
    }
    return st;
}

nb_summary_writer *nb_summary_writer_open(const char *logdir)
{
    const char *who = "nb_summary_writer_open";
    if (!logdir || !*logdir)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: logdir is %s", who, logdir ? "empty" : "NULL");
    int err = make_dirs(logdir);
    if (err)
        return nb__fail_null(NB_ERR_IO, "%s: cannot create the directory '%s': %s", who, logdir, strerror(err));

    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0 || !host[0])
        snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    for (char *c = host; *c; c++)
        if (*c == '/')
            *c = '_';
    size_t cap = strlen(logdir) + strlen(host) + 96;
    char *path = malloc(cap);
    nb_summary_writer *w = calloc(1, sizeof *w);
    if (w) {
        w->counts = NULL;
        pthread_mutex_init(&w->lock, NULL);
    }
    pthread_once(&buckets_once, build_buckets);
    if (!path || !w || !(w->counts = calloc(bucket_count, sizeof(double))) ||
        !(w->limits_out = malloc(bucket_count * sizeof(double))) ||
        !(w->counts_out = malloc(bucket_count * sizeof(double)))) {
        free(path);
        if (w)
            free_writer(w);
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: '%s': out of host memory", who, logdir);
    }
    long long secs = (long long)time(NULL);
    snprintf(path, cap, "%s/events.out.tfevents.%lld.%s", logdir, secs, host);
    struct stat sb;
    for (int n = 1; stat(path, &sb) == 0 && n < 1000000; n++)
        snprintf(path, cap, "%s/events.out.tfevents.%lld.%s.%ld.%d", logdir, secs, host, (long)getpid(), n);
    w->path = path;
    w->file = nb_tfrecord_writer_open(path);
    if (!w->file) {
        free_writer(w);
        return NULL; /* the TFRecord writer's error names the file */
    }
    w->last_flush = now_monotonic();

    nb__pb_double(&w->event, EVENT_WALL_TIME, now_wall());
    nb__pb_bytes(&w->event, EVENT_FILE_VERSION, "brain.Event:2", 13);
    if (write_event(w, who) != NB_OK || nb_tfrecord_writer_flush(w->file) != NB_OK) {
        nb_tfrecord_writer_close(w->file);
        free_writer(w);
        return NULL;
    }
    return w;
}

const char *nb_summary_writer_path(const nb_summary_writer *w) { return w ? w->path : NULL; }

/* Wraps the Summary.Value in w->value into an Event at step in w->event. */
static void encode_event(nb_summary_writer *w, int64_t step)
{
    nb__pb_clear(&w->summary);
    nb__pb_message(&w->summary, SUMMARY_VALUE, &w->value);
    nb__pb_clear(&w->event);
    nb__pb_double(&w->event, EVENT_WALL_TIME, now_wall());
    nb__pb_varint(&w->event, EVENT_STEP, (uint64_t)step);
    nb__pb_message(&w->event, EVENT_SUMMARY, &w->summary);
}

nb_status nb_summary_scalar(nb_summary_writer *w, const char *tag, int64_t step, double value)
{
    const char *who = "nb_summary_scalar";
    if (!w)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: writer is NULL", who);
    if (!tag || !*tag)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: '%s': tag is %s", who, w->path, tag ? "empty" : "NULL");
    pthread_mutex_lock(&w->lock);
    nb__pb_clear(&w->value);
    nb__pb_bytes(&w->value, VALUE_TAG, tag, strlen(tag));
    nb__pb_float(&w->value, VALUE_SIMPLE, (float)value);
    encode_event(w, step);
    nb_status st = write_event(w, who);
    pthread_mutex_unlock(&w->lock);
    return st;
}

/* Reads values' elements into w->values as doubles; sets *n. */
static nb_status host_values(nb_summary_writer *w, const char *who, const nb_tensor *t, size_t *n)
{
    int64_t numel = nb_tensor_numel(t);
    *n = (size_t)numel;
    if (numel == 0)
        return NB_OK;
    if ((uint64_t)numel > SIZE_MAX / sizeof(double))
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: '%s': %lld values do not fit in host memory", who, w->path,
                        (long long)numel);
    if (*n > w->values_cap) {
        double *p = realloc(w->values, *n * sizeof(double));
        if (!p)
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: '%s': out of host memory for %lld values", who, w->path,
                            (long long)numel);
        w->values = p;
        w->values_cap = *n;
    }
    nb_dtype dt = nb_tensor_dtype(t);
    if (dt == NB_F64)
        return nb_tensor_read(t, w->values, *n * sizeof(double));
    if (dt == NB_F32) {
        /* Read into the back half of the buffer, widen from the front. */
        float *f = (float *)(w->values) + *n;
        nb_status st = nb_tensor_read(t, f, *n * sizeof(float));
        if (st)
            return st;
        for (size_t i = 0; i < *n; i++)
            w->values[i] = (double)f[i];
        return NB_OK;
    }
    /* f16, bf16: widened on their device first. */
    nb_scope *s = nb_scope_begin();
    nb_tensor *wide = nb_cast(t, NB_F64);
    nb_status st = wide ? nb_tensor_read(wide, w->values, *n * sizeof(double)) : nb_error();
    nb_scope_end(s);
    return st ? st : NB_OK;
}

nb_status nb_summary_histogram(nb_summary_writer *w, const char *tag, int64_t step, const nb_tensor *values)
{
    const char *who = "nb_summary_histogram";
    if (!w)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: writer is NULL", who);
    if (!tag || !*tag)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: '%s': tag is %s", who, w->path, tag ? "empty" : "NULL");
    if (!values)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: '%s': values is NULL", who, w->path);
    nb_dtype dt = nb_tensor_dtype(values);
    if (dt != NB_F32 && dt != NB_F64 && dt != NB_F16 && dt != NB_BF16)
        return nb__fail(NB_ERR_DTYPE, "%s: '%s': values are %s; a histogram takes f32, f64, f16 or bf16", who,
                        w->path, nb_dtype_name(dt));

    pthread_mutex_lock(&w->lock);
    size_t n = 0;
    nb_status st = host_values(w, who, values, &n);
    if (st) {
        pthread_mutex_unlock(&w->lock);
        if (!nb_error())
            return nb__fail(st, "%s: '%s': cannot read the values back", who, w->path);
        return st;
    }
    /* As histogram.cc: min starts at the last limit, max at its negation. */
    double lo = DBL_MAX, hi = -DBL_MAX, num = 0, sum = 0, sum2 = 0;
    memset(w->counts, 0, bucket_count * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        double v = w->values[i];
        if (isnan(v))
            continue;
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        num += 1;
        sum += v;
        sum2 += v * v;
        w->counts[bucket_of(v)] += 1;
    }
    /* histogram.cc's EncodeToProto without preserve_zero_buckets: a run of empty
     * buckets becomes one, at the run's last limit. */
    size_t out = 0;
    for (size_t i = 0; i < bucket_count;) {
        double end = bucket_limits[i], count = w->counts[i];
        i++;
        if (count <= 0.0) {
            while (i < bucket_count && w->counts[i] <= 0.0) {
                end = bucket_limits[i];
                count = w->counts[i];
                i++;
            }
        }
        w->limits_out[out] = end;
        w->counts_out[out] = count;
        out++;
    }
    nb__pb_clear(&w->histo);
    nb__pb_double(&w->histo, HISTO_MIN, lo);
    nb__pb_double(&w->histo, HISTO_MAX, hi);
    nb__pb_double(&w->histo, HISTO_NUM, num);
    nb__pb_double(&w->histo, HISTO_SUM, sum);
    nb__pb_double(&w->histo, HISTO_SUM_SQUARES, sum2);
    nb__pb_packed_doubles(&w->histo, HISTO_LIMIT, w->limits_out, out);
    nb__pb_packed_doubles(&w->histo, HISTO_BUCKET, w->counts_out, out);
    nb__pb_clear(&w->value);
    nb__pb_bytes(&w->value, VALUE_TAG, tag, strlen(tag));
    nb__pb_message(&w->value, VALUE_HISTO, &w->histo);
    encode_event(w, step);
    st = write_event(w, who);
    pthread_mutex_unlock(&w->lock);
    return st;
}

nb_status nb_summary_writer_flush(nb_summary_writer *w)
{
    if (!w)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_summary_writer_flush: writer is NULL");
    pthread_mutex_lock(&w->lock);
    nb_status st = nb_tfrecord_writer_flush(w->file);
    w->unflushed = 0;
    w->last_flush = now_monotonic();
    pthread_mutex_unlock(&w->lock);
    return st;
}

nb_status nb_summary_writer_close(nb_summary_writer *w)
{
    if (!w)
        return NB_OK;
    nb_status st = nb_tfrecord_writer_close(w->file);
    free_writer(w);
    return st;
}
