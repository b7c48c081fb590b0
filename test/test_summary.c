/* TensorBoard summaries: scalars and histograms written to a new log dir, the
 * event file's framing checked with nabla's TFRecord reader (the first record
 * holds "brain.Event:2"), then the file read by TensorBoard's own loaders
 * (argv[1], test/read_events.py): every scalar, step and histogram figure
 * compared, and each value shown by TensorBoard's scalars or histograms
 * dashboard; bad arguments and a log dir that cannot be made. Exits 77 with the
 * reason when python3 cannot import tensorboard (after the other checks). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "check.h"

#include <float.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];
static const char *script;
static bool interop_skipped;
static char skip_reason[256];

enum { STEPS = 10 };
static const double hist_vals[8] = {-2.0, -0.5, 0.0, 0.0, 1e-13, 0.3, 3.0, 100.0};

static double loss_at(int s) { return 1.0 / (s + 1); }

/* The default bucket limits, built as TensorFlow does. */
static double limits[2048];
static int nlimits;
static void build_limits(void)
{
    double pos[1024];
    int n = 0;
    for (double v = 1e-12; v < 1e20; v *= 1.1)
        pos[n++] = v;
    pos[n++] = DBL_MAX;
    nlimits = 0;
    for (int i = n; i-- > 0;)
        limits[nlimits++] = -pos[i];
    limits[nlimits++] = 0;
    for (int i = 0; i < n; i++)
        limits[nlimits++] = pos[i];
}

static double limit_above(double v)
{
    for (int i = 0; i < nlimits; i++)
        if (limits[i] > v)
            return limits[i];
    return DBL_MAX;
}

/* Writes the summaries; returns the event file's path (malloc'd). */
static char *write_summaries(void)
{
    char logdir[400];
    snprintf(logdir, sizeof logdir, "%s/logs/run1", tmpdir); /* two levels missing */
    nb_summary_writer *w = nb_summary_writer_open(logdir);
    CHECK(w != NULL);
    if (!w)
        return NULL;
    const char *path = nb_summary_writer_path(w);
    CHECK(path && strncmp(path, logdir, strlen(logdir)) == 0 && strstr(path, "/events.out.tfevents."));
    char *copy = strdup(path);
    for (int s = 0; s < STEPS; s++) {
        CHECK_OK(nb_summary_scalar(w, "train/loss", s, loss_at(s)));
        CHECK_OK(nb_summary_scalar(w, "train/accuracy", s, 0.5 + 0.05 * s));
    }
    nb_tensor *t = nb_from_buffer(NB_F64, NB_SHAPE(2, 4), hist_vals);
    CHECK_OK(nb_summary_histogram(w, "weights/w", 3, t));
    float f[8];
    for (int i = 0; i < 8; i++)
        f[i] = (float)hist_vals[i];
    nb_tensor *t32 = nb_from_buffer(NB_F32, NB_SHAPE(8), f);
    CHECK_OK(nb_summary_histogram(w, "weights/w32", 4, t32));
    CHECK_OK(nb_summary_histogram(w, "weights/empty", 5, nb_zeros(NB_F32, NB_SHAPE(0))));
    CHECK_OK(nb_summary_writer_flush(w));
    CHECK_OK(nb_summary_writer_close(w));
    return copy;
}

/* The framing, through nabla's own TFRecord reader. */
static void check_framing(const char *path)
{
    nb_tfrecord_reader *r = nb_tfrecord_reader_open(path);
    CHECK(r != NULL);
    if (!r)
        return;
    int n = 0;
    for (;;) {
        const void *data;
        size_t size;
        nb_status st = nb_tfrecord_next(r, &data, &size);
        if (st == NB_ERR_OUT_OF_RANGE)
            break;
        CHECK_OK(st);
        if (st)
            break;
        if (n == 0)
            CHECK(size > 13 && memmem(data, size, "brain.Event:2", 13) != NULL);
        n++;
    }
    CHECK(n == 1 + 2 * STEPS + 3);
    nb_tfrecord_reader_close(r);
}

/* Checks one "histo" line against hist_vals (as doubles, or as floats). */
static void check_histo_line(char *rest, bool as_float)
{
    double v[8], mn = DBL_MAX, mx = -DBL_MAX, sum = 0, sum2 = 0;
    for (int i = 0; i < 8; i++) {
        v[i] = as_float ? (double)(float)hist_vals[i] : hist_vals[i];
        mn = v[i] < mn ? v[i] : mn;
        mx = v[i] > mx ? v[i] : mx;
        sum += v[i];
        sum2 += v[i] * v[i];
    }
    double gmin, gmax, gnum, gsum, gsum2;
    int nlim, nbuck, used;
    CHECK(sscanf(rest, "%lf %lf %lf %lf %lf %d %d%n", &gmin, &gmax, &gnum, &gsum, &gsum2, &nlim, &nbuck, &used) == 7);
    CHECK(gmin == mn && gmax == mx && gnum == 8);
    CHECK_NEAR(gsum, sum, 1e-12);
    CHECK_NEAR(gsum2, sum2, 1e-12);
    CHECK(nlim == nbuck && nlim > 0 && nlim < nlimits);
    /* The non-empty buckets: each value counted under the first limit above it. */
    double want_l[8], want_c[8];
    int nw = 0;
    for (int i = 0; i < 8; i++) {
        double l = limit_above(v[i]);
        int k = 0;
        while (k < nw && want_l[k] != l)
            k++;
        if (k == nw) {
            want_l[nw] = l;
            want_c[nw++] = 0;
        }
        want_c[k] += 1;
    }
    char *p = rest + used;
    int got = 0;
    double l, c;
    int adv;
    while (sscanf(p, " %lf:%lf%n", &l, &c, &adv) == 2) {
        p += adv;
        int k = 0;
        while (k < nw && want_l[k] != l)
            k++;
        CHECKF(k < nw && want_c[k] == c, "bucket %.17g:%g", l, c);
        got++;
    }
    CHECK(got == nw);
}

static void check_with_tensorboard(const char *path)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "python3 '%s' '%s'", script, path);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    if (!p)
        return;
    char line[65536];
    int scalars = 0, histos = 0, versions = 0, events = -1, plugins = 0;
    bool seen[2][STEPS] = {{false}};
    while (fgets(line, sizeof line, p)) {
        char tag[128], plugin[64];
        long long step;
        int count;
        double value;
        int used;
        if (strncmp(line, "version ", 8) == 0) {
            CHECK(strcmp(line, "version brain.Event:2\n") == 0);
            versions++;
        } else if (sscanf(line, "scalar %127s %lld %lf", tag, &step, &value) == 3) {
            CHECKF(step >= 0 && step < STEPS, "step %lld", step);
            if (step < 0 || step >= STEPS)
                continue;
            int s = (int)step;
            if (strcmp(tag, "train/loss") == 0) {
                CHECK(value == (double)(float)loss_at(s));
                seen[0][s] = true;
            } else if (strcmp(tag, "train/accuracy") == 0) {
                CHECK(value == (double)(float)(0.5 + 0.05 * s));
                seen[1][s] = true;
            } else {
                CHECKF(0, "unknown tag %s", tag);
            }
            scalars++;
        } else if (sscanf(line, "histo %127s %lld%n", tag, &step, &used) == 2) {
            if (strcmp(tag, "weights/w") == 0) {
                CHECK(step == 3);
                check_histo_line(line + used, false);
            } else if (strcmp(tag, "weights/w32") == 0) {
                CHECK(step == 4);
                check_histo_line(line + used, true);
            } else if (strcmp(tag, "weights/empty") == 0) {
                double mn, mx, num, sum, sum2;
                int nl, nb;
                CHECK(step == 5);
                CHECK(sscanf(line + used, "%lf %lf %lf %lf %lf %d %d", &mn, &mx, &num, &sum, &sum2, &nl, &nb) == 7);
                CHECK(num == 0 && sum == 0 && sum2 == 0 && mn == DBL_MAX && mx == -DBL_MAX && nl == 1 && nb == 1);
            } else {
                CHECKF(0, "unknown histogram tag %s", tag);
            }
            histos++;
        } else if (sscanf(line, "events %d", &events) == 1) {
        } else if (sscanf(line, "plugin %127s %lld %63s %d", tag, &step, plugin, &count) == 4) {
            /* As TensorBoard's dashboards see them: scalars and histograms. */
            bool scalar = strncmp(tag, "train/", 6) == 0;
            CHECKF(strcmp(plugin, scalar ? "scalars" : "histograms") == 0, "%s is shown by %s", tag, plugin);
            CHECKF(!scalar || count == 1, "%s has %d values", tag, count);
            plugins++;
        } else {
            CHECKF(0, "unexpected line from read_events.py: %s", line);
        }
    }
    int rc = pclose(p);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) {
        interop_skipped = true;
        snprintf(skip_reason, sizeof skip_reason, "python3 cannot import tensorboard");
        return;
    }
    CHECKF(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "read_events.py exited with %d", rc);
    CHECK(versions == 1 && scalars == 2 * STEPS && histos == 3 && events == 1 + 2 * STEPS + 3);
    CHECK(plugins == 2 * STEPS + 3);
    for (int s = 0; s < STEPS; s++)
        CHECKF(seen[0][s] && seen[1][s], "step %d", s);
}

static void test_scalars_and_histograms(void)
{
    char *path = write_summaries();
    if (!path)
        return;
    check_framing(path);
    if (script)
        check_with_tensorboard(path);
    free(path);
}

/* 1000 records are flushed without a flush call. */
static void test_flush_by_count(void)
{
    char logdir[400];
    snprintf(logdir, sizeof logdir, "%s/count", tmpdir);
    nb_summary_writer *w = nb_summary_writer_open(logdir);
    CHECK(w != NULL);
    if (!w)
        return;
    struct stat sb;
    CHECK(stat(nb_summary_writer_path(w), &sb) == 0 && sb.st_size > 0); /* the version event */
    off_t first = sb.st_size;
    for (int i = 0; i < 1000; i++)
        CHECK_OK(nb_summary_scalar(w, "x", i, i));
    CHECK(stat(nb_summary_writer_path(w), &sb) == 0 && sb.st_size > first + 1000 * 16);
    /* A second writer in the same second gets a file of its own. */
    nb_summary_writer *w2 = nb_summary_writer_open(logdir);
    CHECK(w2 != NULL && strcmp(nb_summary_writer_path(w), nb_summary_writer_path(w2)) != 0);
    CHECK_OK(nb_summary_writer_close(w2));
    CHECK_OK(nb_summary_writer_close(w));
}

static void test_bad_arguments(void)
{
    CHECK(nb_summary_writer_open(NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_summary_writer_open: logdir is NULL");
    CHECK(nb_summary_writer_open("") == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_summary_writer_open: logdir is empty");
    char file[400], under[420];
    snprintf(file, sizeof file, "%s/a_file", tmpdir);
    FILE *f = fopen(file, "w");
    if (f)
        fclose(f);
    snprintf(under, sizeof under, "%s/sub", file);
    CHECK(nb_summary_writer_open(file) == NULL);
    CHECK_ERROR(NB_ERR_IO, "nb_summary_writer_open: cannot create the directory '", file);
    CHECK(nb_summary_writer_open(under) == NULL);
    CHECK_ERROR(NB_ERR_IO, "nb_summary_writer_open", under);

    CHECK(nb_summary_scalar(NULL, "x", 0, 1) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_summary_scalar: writer is NULL");
    CHECK(nb_summary_writer_flush(NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_summary_writer_flush");
    CHECK_OK(nb_summary_writer_close(NULL));
    CHECK(nb_summary_writer_path(NULL) == NULL);

    char logdir[400];
    snprintf(logdir, sizeof logdir, "%s/args", tmpdir);
    nb_summary_writer *w = nb_summary_writer_open(logdir);
    CHECK(w != NULL);
    CHECK(nb_summary_scalar(w, NULL, 0, 1) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_summary_scalar", "tag is NULL");
    CHECK(nb_summary_histogram(w, "h", 0, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_summary_histogram", "values is NULL");
    CHECK(nb_summary_histogram(w, "h", 0, nb_zeros(NB_I32, NB_SHAPE(3))) == NB_ERR_DTYPE);
    CHECK_ERROR(NB_ERR_DTYPE, "nb_summary_histogram", "i32");
    CHECK_OK(nb_summary_writer_close(w));
}

int main(int argc, char **argv)
{
    if (!check_scratch_dir(tmpdir, sizeof tmpdir, "nb_summary"))
        return 1;
    script = argc > 1 ? argv[1] : NULL;
    build_limits();
    RUN(test_scalars_and_histograms);
    RUN(test_flush_by_count);
    RUN(test_bad_arguments);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    int rc = check_finish();
    if (rc == 0 && !script) {
        printf("test_summary: no read_events.py given (argv[1]): the TensorBoard check is skipped\n");
        return 77;
    }
    if (rc == 0 && interop_skipped) {
        printf("test_summary: %s: the TensorBoard check is skipped\n", skip_reason);
        return 77;
    }
    return rc;
}
