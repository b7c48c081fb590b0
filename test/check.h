/* A tiny test harness: CHECK macros, random inputs, reference comparisons. Each
 * test file is one executable; main() calls RUN(fn) for each case and returns
 * check_finish(). A test fails when any CHECK fails or tensors are left alive. */
#ifndef NB_TEST_CHECK_H
#define NB_TEST_CHECK_H

#include <nabla/nabla.h>
#include "read_doubles.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_failures;

/* Under AddressSanitizer an impossible allocation must return NULL, as the tests
 * check, not abort the test. Nothing calls this without the sanitizer. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* For a GPU test where there is no GPU: prints why and returns its exit status,
 * 77 (skipped), or 1 (failed) when NB_REQUIRE_GPU=1 says a GPU must be there, so
 * a broken CUDA setup cannot pass as a skip. */
static inline int check_no_gpu(const char *test)
{
    const char *want = getenv("NB_REQUIRE_GPU");
    bool required = want && want[0] && strcmp(want, "0") != 0;
    const char *why = nb_gpu_unavailable_reason();
    printf("%s: no GPU (%s): %s\n", test, why ? why : "none found",
           required ? "FAILED, NB_REQUIRE_GPU=1 asks for one" : "skipped");
    return required ? 1 : 77;
}
static const char *check_current = "";

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: [%s] CHECK failed: %s (pending error: %s)\n", __FILE__, \
                    __LINE__, check_current, #cond, nb_error_message());                     \
            check_failures++;                                                                \
        }                                                                                    \
    } while (0)

#define CHECK_OK(expr)                                                                       \
    do {                                                                                     \
        nb_status st_ = (expr);                                                              \
        if (st_ != NB_OK) {                                                                  \
            fprintf(stderr, "%s:%d: [%s] %s returned %s: %s\n", __FILE__, __LINE__,          \
                    check_current, #expr, nb_status_name(st_), nb_error_message());          \
            check_failures++;                                                                \
            nb_error_clear();                                                                \
        }                                                                                    \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                \
    do {                                                                                     \
        double a_ = (a), b_ = (b);                                                           \
        if (!(fabs(a_ - b_) <= (tol) * (1.0 + fabs(b_)))) {                                  \
            fprintf(stderr, "%s:%d: [%s] CHECK_NEAR failed: %s = %.9g, %s = %.9g\n",         \
                    __FILE__, __LINE__, check_current, #a, a_, #b, b_);                      \
            check_failures++;                                                                \
        }                                                                                    \
    } while (0)

/* Checks that the pending error has code and a message containing each of the
 * given substrings, then clears it. */
#define CHECK_ERROR(code, ...)                                                               \
    do {                                                                                     \
        const char *subs_[] = {__VA_ARGS__};                                                 \
        check_error_(__FILE__, __LINE__, (code), subs_, sizeof subs_ / sizeof *subs_);       \
    } while (0)

static inline void check_error_(const char *file, int line, nb_status code, const char **subs, size_t n)
{
    if (nb_error() != code) {
        fprintf(stderr, "%s:%d: [%s] expected %s, got %s: %s\n", file, line, check_current,
                nb_status_name(code), nb_status_name(nb_error()), nb_error_message());
        check_failures++;
    } else {
        for (size_t i = 0; i < n; i++) {
            if (!strstr(nb_error_message(), subs[i])) {
                fprintf(stderr, "%s:%d: [%s] message '%s' lacks '%s'\n", file, line, check_current,
                        nb_error_message(), subs[i]);
                check_failures++;
            }
        }
    }
    nb_error_clear();
}

/* Runs one case inside a scope and checks it leaves no error and no live tensors. */
#define RUN(fn)                                                                              \
    do {                                                                                     \
        check_current = #fn;                                                                 \
        int64_t live_ = nb_live_tensors();                                                   \
        nb_scope *s_ = nb_scope_begin();                                                     \
        fn();                                                                                \
        nb_scope_end(s_);                                                                    \
        if (nb_error()) {                                                                    \
            fprintf(stderr, "[%s] left a pending error: %s\n", #fn, nb_error_message());     \
            check_failures++;                                                                \
            nb_error_clear();                                                                \
        }                                                                                    \
        if (nb_live_tensors() != live_) {                                                    \
            fprintf(stderr, "[%s] leaked %lld tensors\n", #fn,                               \
                    (long long)(nb_live_tensors() - live_));                                 \
            check_failures++;                                                                \
        }                                                                                    \
    } while (0)

/* ---- a watchdog for tests that could hang (threads, processes) -------------- */

#include <signal.h>
#include <unistd.h>

/* Ends the test, naming the case that did not finish in time. */
static inline void check_on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "timed out (a hang?) in ";
    ssize_t w = write(2, msg, sizeof msg - 1);
    w = write(2, check_current, strlen(check_current));
    w = write(2, "\n", 1);
    (void)w;
    _exit(1);
}

/* RUN under a deadline of `seconds`: a hang fails the test, naming the case,
 * instead of stalling it. */
#define RUN_WITHIN(fn, seconds)                                                              \
    do {                                                                                     \
        signal(SIGALRM, check_on_alarm);                                                     \
        alarm(seconds);                                                                      \
        RUN(fn);                                                                             \
        alarm(0);                                                                            \
    } while (0)

static inline int check_finish(void)
{
    if (nb_live_tensors() != 0) {
        fprintf(stderr, "%lld tensors alive at exit\n", (long long)nb_live_tensors());
        check_failures++;
    }
    if (check_failures)
        fprintf(stderr, "%d check(s) failed\n", check_failures);
    return check_failures ? 1 : 0;
}

/* Tolerances the op tests share: value checks per dtype, and the gradient
 * checker's step and tolerance in f64. */
#define TOL32 1e-5
#define TOL64 1e-12
#define GC_EPS 1e-6
#define GC_TOL 1e-6
/* A macro, so that a test may redefine TOL32 or TOL64 after including this. */
#define value_tol(dt) ((dt) == NB_F32 ? TOL32 : TOL64)

/* Whether t exists and has shape s. */
static inline bool has_shape(const nb_tensor *t, nb_shape s)
{
    if (!t || nb_tensor_ndim(t) != s.ndim)
        return false;
    for (int i = 0; i < s.ndim; i++)
        if (nb_tensor_dim(t, i) != s.dims[i])
            return false;
    return true;
}

/* Makes a fresh folder NAME_XXXXXX under $TMPDIR (else /tmp), its path in dir;
 * false, having said why, when it cannot. */
static inline bool check_scratch_dir(char *dir, size_t size, const char *name)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, size, "%s/%s_XXXXXX", tmp && *tmp ? tmp : "/tmp", name);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return false;
    }
    return true;
}

/* A log callback that counts the warnings whose message holds w.text:
 * nb_set_log_callback(count_warnings, &w). */
typedef struct warning_count {
    const char *text;
    int n;
} warning_count;

static inline void count_warnings(nb_log_level level, const char *message, void *user)
{
    warning_count *w = user;
    if (level == NB_LOG_WARNING && strstr(message, w->text))
        w->n++;
}

/* How references walk one axis of a row-major array of shape s: element
 * (o, k, i) of the [outer, n, inner] view sits at (o * n + k) * inner + i. A
 * 0-d shape is one element. */
static inline void axis_split(nb_shape s, int axis, int64_t *outer, int64_t *n, int64_t *inner)
{
    *outer = *inner = 1;
    *n = s.ndim ? s.dims[axis] : 1;
    for (int i = 0; i < axis; i++)
        *outer *= s.dims[i];
    for (int i = axis + 1; i < s.ndim; i++)
        *inner *= s.dims[i];
}

/* CHECK_GRADIENT(fn, user, NB_TENSORS(...)): the gradient checker passes fn
 * at the inputs with the shared step and tolerance, and reports an error it
 * measured, at most GC_TOL. */
#define CHECK_GRADIENT(fn, user, ...)                                                        \
    do {                                                                                     \
        double gc_err_ = -1;                                                                 \
        CHECK_OK(nb_gradient_check((fn), (user), __VA_ARGS__, GC_EPS, GC_TOL, &gc_err_));    \
        CHECK(gc_err_ >= 0 && gc_err_ <= GC_TOL);                                            \
    } while (0)

/* The bit mask of the dims an axes set names, normalised by the tests
 * themselves (no axes: all of them). */
static inline int axes_mask(nb_axes axes, int ndim)
{
    if (axes.n == 0)
        return (1 << ndim) - 1;
    int m = 0;
    for (int i = 0; i < axes.n; i++)
        m |= 1 << (axes.axes[i] < 0 ? axes.axes[i] + ndim : axes.axes[i]);
    return m;
}

/* For second-order checks: g[0..n) gets an inner tape's gradients of
 * sum(y * y), y = fn(n, in, user), with every input watched (NULL for an input y
 * does not reach); the checker then differentiates what the caller makes of
 * them. Returns false when a step failed. */
static inline bool grads_of_square_sum(nb_checked_fn fn, void *user, int n, nb_tensor *const *in, nb_tensor **g)
{
    nb_tape *inner = nb_tape_begin();
    for (int i = 0; i < n; i++)
        if (nb_tape_watch(inner, in[i]))
            return false;
    nb_tensor *y = fn(n, in, user);
    return nb_tape_gradient(inner, nb_sum_all(nb_mul(y, y)), n, in, g) == NB_OK;
}

/* CHECK with a printf-style explanation of what failed. */
#define CHECKF(cond, ...)                                                                    \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: [%s] CHECK failed: %s: ", __FILE__, __LINE__,            \
                    check_current, #cond);                                                   \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fprintf(stderr, " (pending error: %s)\n", nb_error_message());                   \
            check_failures++;                                                                \
        }                                                                                    \
    } while (0)


/* Whether t lives on the device named dev. */
static inline bool on_device(const nb_tensor *t, const char *dev)
{
    return t && dev && strcmp(nb_tensor_device(t), dev) == 0;
}

/* Whether a and b have one dtype, one shape and the same bytes. */
static inline bool same_bits(const nb_tensor *a, const nb_tensor *b)
{
    if (!a || !b || nb_tensor_dtype(a) != nb_tensor_dtype(b) || !has_shape(b, nb_tensor_shape(a)))
        return false;
    size_t n = (size_t)nb_tensor_numel(a) * nb_dtype_size(nb_tensor_dtype(a));
    unsigned char *pa = malloc(n ? n : 1), *pb = malloc(n ? n : 1);
    bool same = pa && pb && nb_tensor_read(a, pa, n) == NB_OK && nb_tensor_read(b, pb, n) == NB_OK &&
                memcmp(pa, pb, n) == 0;
    free(pa);
    free(pb);
    return same;
}

static inline int64_t numel_of(nb_shape s)
{
    int64_t n = 1;
    for (int i = 0; i < s.ndim; i++)
        n *= s.dims[i];
    return n;
}

/* Reads a tensor into a malloc'd double array (caller frees). */
static inline double *check_values(const nb_tensor *t)
{
    int64_t n = nb_tensor_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++)
        v[i] = nb_tensor_get(t, i);
    return v;
}

/* Largest |a - ref| / (1 + |ref|) between a tensor and a reference array. */
static inline double check_max_error(const nb_tensor *t, const double *ref, int64_t n)
{
    if (!t || nb_tensor_numel(t) != n)
        return INFINITY;
    double *v = check_values(t), worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(v[i] - ref[i]) / (1.0 + fabs(ref[i]));
        if (!(e <= worst))
            worst = isnan(e) ? INFINITY : e;
    }
    free(v);
    return worst;
}

#endif
