/* Helpers shared by the benchmarks: the command line, a monotonic clock,
 * medians, and running the matching PyTorch script and reading its "name value"
 * lines. Public API only. */
#ifndef NB_BENCH_UTIL_H
#define NB_BENCH_UTIL_H

#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <nabla/nabla.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef NB_BENCH_DIR
#define NB_BENCH_DIR "bench"
#endif

/* One option of a benchmark's command line: "--name VALUE" reads a whole number
 * into *number, raised to `least` when smaller, or keeps the text in *text; a
 * flag ("--name" alone, value NULL) sets *flag to `to`. */
typedef struct bench_option {
    const char *name;  /* "--reps" */
    const char *value; /* what the usage line calls its value ("R"); NULL for a flag */
    int *number;
    int least;
    const char **text;
    bool *flag;
    bool to;
} bench_option;

#define BENCH_NUMBER(name, value, p, least) {(name), (value), (p), (least), NULL, NULL, false}
#define BENCH_TEXT(name, value, p) {(name), (value), NULL, 0, (p), NULL, false}
#define BENCH_FLAG(name, p, to) {(name), NULL, NULL, 0, NULL, (p), (to)}
/* The two every benchmark takes: --reps R (at least 1) and --no-peer (clears
 * *run_peer). */
#define BENCH_REPS(p) BENCH_NUMBER("--reps", "R", p, 1)
#define BENCH_NO_PEER(run_peer) BENCH_FLAG("--no-peer", run_peer, false)

static inline void bench_usage(FILE *out, const char *prog, int n, const bench_option *opt)
{
    fprintf(out, "usage: %s", prog);
    for (int k = 0; k < n; k++)
        fprintf(out, opt[k].value ? " [%s %s]" : " [%s]", opt[k].name, opt[k].value);
    fprintf(out, "\n");
}

/* Reads argv by the table. --help prints the usage line and exits 0; anything
 * else the table lacks prints it to stderr and exits 2. */
static inline void bench_options(int argc, char **argv, int n, const bench_option *opt)
{
    for (int i = 1; i < argc; i++) {
        int k = 0;
        while (k < n && strcmp(argv[i], opt[k].name) != 0)
            k++;
        if (k < n && !opt[k].value) {
            *opt[k].flag = opt[k].to;
            continue;
        }
        if (k < n && i + 1 < argc) {
            if (opt[k].number) {
                int v = atoi(argv[++i]);
                *opt[k].number = v < opt[k].least ? opt[k].least : v;
            } else
                *opt[k].text = argv[++i];
            continue;
        }
        bool help = !strcmp(argv[i], "--help");
        bench_usage(help ? stdout : stderr, argv[0], n, opt);
        exit(help ? 0 : 2);
    }
}

/* BENCH_OPTIONS(argc, argv, BENCH_REPS(&reps), BENCH_NO_PEER(&peer), ...): the
 * table in the order the usage line lists it. */
#define BENCH_OPTIONS(argc, argv, ...)                                                \
    do {                                                                              \
        const bench_option table_[] = {__VA_ARGS__};                                  \
        bench_options((argc), (argv), (int)(sizeof table_ / sizeof *table_), table_); \
    } while (0)

static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of n samples (sorts them in place). */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Median milliseconds of step(ctx) over reps runs after warm untimed ones.
 * Each run has a scope of its own and stands between two nb_synchronize()
 * calls, so that what a GPU queued is in its time and nothing before it is. */
static inline double bench_median_ms(void (*step)(void *ctx), void *ctx, int warm, int reps)
{
    double *v = malloc(sizeof *v * (size_t)reps);
    for (int i = 0; i < warm + reps; i++) {
        nb_synchronize();
        double t0 = bench_now();
        nb_scope *s = nb_scope_begin();
        step(ctx);
        nb_scope_end(s);
        nb_synchronize();
        if (i >= warm)
            v[i - warm] = (bench_now() - t0) * 1e3;
    }
    double ms = bench_median(v, reps);
    free(v);
    return ms;
}

/* Whether NB_REQUIRE_GPU (set, not "0") says a GPU must be there. */
static inline int bench_gpu_required(void)
{
    const char *want = getenv("NB_REQUIRE_GPU");
    return want && want[0] && strcmp(want, "0") != 0;
}

/* Readies /gpu:0 for a GPU benchmark: false where there is none; otherwise
 * strict placement (so that a CPU fallback is never timed by mistake) and the
 * card's properties in *props. */
static inline bool bench_gpu_ready(nb_gpu_properties *props)
{
    if (nb_device_count(NB_DEVICE_GPU) == 0)
        return false;
    nb_set_soft_placement(false);
    nb_gpu_device_properties("/gpu:0", props);
    return true;
}

/* Where a GPU benchmark finds no GPU: prints why under its title and returns its
 * exit status, 0 (skipped), or 1 when bench_gpu_required(). */
static inline int bench_no_gpu(const char *title, const char *why)
{
    int required = bench_gpu_required();
    printf("\n%s\n(no GPU: %s: %s)\n", title, why ? why : "none found",
           required ? "FAILED, NB_REQUIRE_GPU=1 asks for one" : "skipped");
    return required;
}

#define BENCH_MAX_RESULTS 32
typedef struct bench_peer {
    int n;
    char names[BENCH_MAX_RESULTS][48];
    double values[BENCH_MAX_RESULTS];
    char version[128];
    char status[320]; /* "" when it ran, else why not */
} bench_peer;

/* Runs `python3 DIR/script args` (DIR: $NB_BENCH_DIR, else the source folder) and
 * collects its "name value" lines. The figure "version" is kept as text. */
static inline void bench_run_peer(bench_peer *p, const char *script, const char *args)
{
    memset(p, 0, sizeof *p);
    const char *dir = getenv("NB_BENCH_DIR");
    if (!dir || !*dir)
        dir = NB_BENCH_DIR;
    const char *python = getenv("PYTHON");
    if (!python || !*python)
        python = "python3";
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s '%s/%s' %s 2>/dev/null", python, dir, script, args ? args : "");
    fflush(stdout);
    FILE *f = popen(cmd, "r");
    if (!f) {
        snprintf(p->status, sizeof p->status, "PyTorch: cannot run %.200s", python);
        return;
    }
    char line[256];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!strncmp(line, "PyTorch:", 8)) {
            snprintf(p->status, sizeof p->status, "%s", line);
            continue;
        }
        char name[48], rest[128];
        if (sscanf(line, "%47s %127s", name, rest) != 2)
            continue;
        if (!strcmp(name, "version")) {
            snprintf(p->version, sizeof p->version, "%s", rest);
        } else if (p->n < BENCH_MAX_RESULTS) {
            snprintf(p->names[p->n], sizeof p->names[0], "%s", name);
            p->values[p->n++] = atof(rest);
        }
    }
    int rc = pclose(f);
    if (!p->status[0] && (rc != 0 || p->n == 0))
        snprintf(p->status, sizeof p->status, "PyTorch: %.200s/%.40s failed (status %d)", dir,
                 script, rc);
}

/* Runs the peer script with the arguments printf makes of fmt, or, when run
 * is false, only notes that it was not run. */
static inline void bench_peer_run(bench_peer *p, bool run, const char *script, const char *fmt, ...)
{
    if (!run) {
        memset(p, 0, sizeof *p);
        snprintf(p->status, sizeof p->status, "PyTorch: not run (--no-peer)");
        return;
    }
    char args[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    bench_run_peer(p, script, args);
}

/* The peer's figure called name, or -1 when it has none. */
static inline double bench_peer_get(const bench_peer *p, const char *name)
{
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->names[i], name))
            return p->values[i];
    return -1;
}

/* One table row: the figure, nabla's time, PyTorch's, and how many times faster
 * nabla is (PyTorch / nabla). */
static inline void bench_row(const char *what, double ours, double theirs)
{
    if (theirs > 0)
        printf("%-40s %10.3f %10.3f %8.2fx\n", what, ours, theirs, theirs / ours);
    else
        printf("%-40s %10.3f %10s %9s\n", what, ours, "-", "-");
}

/* The line under a table's title that says which PyTorch ran, or why none did
 * and so what the table lacks (`without`: "nabla's figures only"). */
static inline void bench_peer_line(const bench_peer *p, const char *without)
{
    if (p->status[0])
        printf("(%s; %s)\n", p->status, without);
    else
        printf("(PyTorch %s from Python, same machine, same run)\n", p->version);
}

static inline void bench_header(const char *title, const char *unit, const bench_peer *p)
{
    printf("\n%s\n", title);
    bench_peer_line(p, "nabla's figures only");
    printf("%-40s %10s %10s %9s\n", unit, "nabla", "PyTorch", "speed-up");
}

/* The line under a CPU table: the vectors nabla's loops ran with (the CPU's
 * widest, or the NB_CPU_SIMD cap) and the threads PyTorch's ran on, where the
 * peer printed a "threads" line. */
static inline void bench_cpu_footer(const bench_peer *p)
{
    const char *cap = getenv("NB_CPU_SIMD");
    printf("(nabla's vectors: the CPU's widest%s%s%s", cap ? ", capped at " : "", cap ? cap : "",
           cap ? " by NB_CPU_SIMD" : "");
    if (bench_peer_get(p, "threads") > 0)
        printf("; PyTorch's threads: %.0f", bench_peer_get(p, "threads"));
    printf(")\n");
}

#endif
