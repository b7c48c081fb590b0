/* Progress lines for the Fashion-MNIST samples' training loops (header-only).
 *
 *   progress p;
 *   progress_begin(&p, epoch, steps);           at the start of an epoch
 *   if (progress_due(&p, step))                 after step `step` (1-based)
 *       progress_show(&p, step, loss, examples) with the running mean loss and
 *                                               the examples seen this epoch
 *   progress_end(&p);                           before the epoch's summary line
 *
 * On a terminal one line is rewritten in place (\r) about ten times a second;
 * otherwise (a log, a test) a line is printed every PROGRESS_EVERY steps. Each
 * shows step/total, the loss, examples per second and the time left in the
 * epoch. progress_due is cheap, so a loop asks it every step and reads its loss
 * (which waits for the device) only when a line is due. */
#ifndef NB_SAMPLES_PROGRESS_H
#define NB_SAMPLES_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#define PROGRESS_EVERY 100

typedef struct progress {
    int epoch;
    int64_t total;
    bool tty;
    bool shown;   /* a \r line is on the screen */
    double start; /* seconds */
    double last;  /* when a line was last shown */
} progress;

static inline double progress_now(void)
{
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void progress_begin(progress *p, int epoch, int64_t total_steps)
{
    p->epoch = epoch;
    p->total = total_steps;
    p->tty = isatty(fileno(stdout));
    p->shown = false;
    p->start = p->last = progress_now();
}

/* Whether a line is due after step (1-based): never after the last step, which
 * the epoch's summary line covers. */
static inline bool progress_due(const progress *p, int64_t step)
{
    if (step >= p->total)
        return false;
    return p->tty ? progress_now() - p->last >= 0.1 : step % PROGRESS_EVERY == 0;
}

static inline void progress_show(progress *p, int64_t step, double loss, int64_t examples)
{
    double t = progress_now(), elapsed = t - p->start;
    double rate = elapsed > 0 ? (double)examples / elapsed : 0;
    double left = step > 0 ? elapsed * (double)(p->total - step) / (double)step : 0;
    printf("%s  epoch %d, step %lld/%lld: loss %.4f, %.0f examples/s, %.0f s left%s", p->tty ? "\r" : "",
           p->epoch, (long long)step, (long long)p->total, loss, rate, left, p->tty ? "\033[K" : "\n");
    fflush(stdout);
    p->shown = p->tty;
    p->last = t;
}

/* Clears a rewritten line so the next print starts on a clean one. */
static inline void progress_end(progress *p)
{
    if (p->shown)
        printf("\r\033[K");
    p->shown = false;
}

#endif
