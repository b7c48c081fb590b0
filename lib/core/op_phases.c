/* Per-phase timing of ops (nabla/profile.h): per-thread totals, the clock,
 * and the slow halves of the marks in op_phases.h. */
#include "op_phases.h"
#include "core.h"

#include <string.h>
#include <time.h>

int nb__phase_threads;

typedef struct phase_state {
    bool on;
    int current;        /* the phase running now */
    int64_t since;      /* when it was entered (ns, monotonic) */
    int64_t boundary;   /* what one boundary costs itself (ns), measured when turned on */
    nb_op_profile totals; /* ns[] may dip below 0 here; the getter clamps */
} phase_state;

static _Thread_local phase_state tl_phase;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Adds the time since the last boundary to the running phase, less the cost
 * of a boundary (its clock reading and bookkeeping), which goes to overhead_ns. */
static void settle(phase_state *s, int64_t t)
{
    s->totals.ns[s->current] += t - s->since - s->boundary;
    s->totals.overhead_ns += s->boundary;
    s->since = t;
}

/* The cost of one boundary: the fastest of a few runs of 64 back to back,
 * on a scratch state (the clock's cost varies by machine, 15 to 60 ns). */
static int64_t measure_boundary(void)
{
    phase_state scratch;
    memset(&scratch, 0, sizeof scratch);
    int64_t best = INT64_MAX;
    for (int run = 0; run < 5; run++) {
        int64_t t0 = now_ns();
        scratch.since = t0;
        for (int i = 0; i < 64; i++) {
            settle(&scratch, now_ns());
            scratch.current = (scratch.current + 1) % NB_PHASE_COUNT;
            scratch.totals.entries[scratch.current]++;
        }
        int64_t per = (now_ns() - t0) / 64;
        if (per < best)
            best = per;
    }
    return best;
}

int nb__phase_switch(int phase, bool op_begins)
{
    phase_state *s = &tl_phase;
    if (!s->on)
        return -1;
    settle(s, now_ns());
    int prev = s->current;
    s->current = phase;
    s->totals.entries[phase]++;
    if (op_begins)
        s->totals.ops++;
    return prev;
}

void nb__phase_return(int prev)
{
    phase_state *s = &tl_phase;
    if (!s->on)
        return; /* turned off inside the phase: nothing to account */
    settle(s, now_ns());
    s->current = prev;
}

void nb_set_op_profiling(bool on)
{
    phase_state *s = &tl_phase;
    if (on == s->on)
        return;
    if (on) {
        nb__thread_track(); /* so the count drops if the thread ends profiling */
        memset(&s->totals, 0, sizeof s->totals);
        s->boundary = measure_boundary();
        s->current = NB_PHASE_OTHER;
        s->since = now_ns();
        s->on = true;
        __atomic_add_fetch(&nb__phase_threads, 1, __ATOMIC_RELAXED);
    } else {
        settle(s, now_ns());
        s->on = false;
        __atomic_sub_fetch(&nb__phase_threads, 1, __ATOMIC_RELAXED);
    }
}

bool nb_op_profiling(void) { return tl_phase.on; }

nb_status nb_op_profile_get(nb_op_profile *out)
{
    if (!out)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_op_profile_get: out is NULL");
    phase_state *s = &tl_phase;
    if (s->on)
        settle(s, now_ns());
    *out = s->totals;
    for (int p = 0; p < NB_PHASE_COUNT; p++)
        if (out->ns[p] < 0) /* the boundary cost is an estimate: a tiny phase can dip below 0 */
            out->ns[p] = 0;
    out->boundary_ns = s->boundary;
    return NB_OK;
}

void nb_op_profile_reset(void)
{
    phase_state *s = &tl_phase;
    memset(&s->totals, 0, sizeof s->totals);
    if (s->on)
        s->since = now_ns();
}

const char *nb_op_phase_name(nb_op_phase phase)
{
    static const char *const names[NB_PHASE_COUNT] = {
        [NB_PHASE_OTHER] = "other",
        [NB_PHASE_CHECKS] = "checks",
        [NB_PHASE_TENSOR] = "tensor",
        [NB_PHASE_ALLOC] = "alloc",
        [NB_PHASE_KERNEL] = "kernel",
        [NB_PHASE_DEVICE_ENTRY] = "device_entry",
        [NB_PHASE_LAUNCH] = "launch",
        [NB_PHASE_LAUNCH_CHECK] = "launch_check",
        [NB_PHASE_RECORD] = "record",
        [NB_PHASE_SCOPE] = "scope",
        [NB_PHASE_RELEASE] = "release",
        [NB_PHASE_FREE] = "free",
    };
    return (unsigned)phase < NB_PHASE_COUNT ? names[phase] : "invalid";
}

void nb__phase_thread_exit(void)
{
    if (tl_phase.on)
        nb_set_op_profiling(false);
}
