/* nabla — where the time of an eager op goes: per-phase totals of the ops the
 * calling thread runs, for finding what a small op's microseconds are made of.
 *
 * Off by default, and free when off (one load and a branch at each phase
 * boundary). Turned on for the calling thread only, it reads the monotonic
 * clock at every phase boundary (15 to 60 ns each, by machine, so a profiled
 * op is slower than an unprofiled one by about a dozen readings) and adds the
 * time since the previous boundary to the phase that was running, less the
 * boundary's own cost, measured when profiling is turned on. The phases are
 * exclusive: their sum, NB_PHASE_OTHER included, plus overhead_ns is the wall
 * time since the last reset (give or take the clamping below).
 *
 * Counted ops are the elementwise ops (unary, binary, where) and the
 * reductions; the phases of every other op (output tensors, allocator, device
 * entry, launches, recording, scope, release) are counted too, but their own
 * checks and shape work land in NB_PHASE_OTHER. */
#ifndef NABLA_PROFILE_H
#define NABLA_PROFILE_H

#include <nabla/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nb_op_phase {
    NB_PHASE_OTHER,        /* outside the phases below: the program between ops, an op's
                              own work not listed below */
    NB_PHASE_CHECKS,       /* argument checks, placement, broadcast shapes, kernel views */
    NB_PHASE_TENSOR,       /* the output's tensor struct and storage header (and the
                              poison fill under NB_DEBUG_POISON) */
    NB_PHASE_ALLOC,        /* the device allocator handing out the output's memory */
    NB_PHASE_KERNEL,       /* the backend's kernel entry, less the GPU phases below: the
                              whole computation on the CPU; dtype dispatch and launch
                              geometry on the GPU */
    NB_PHASE_DEVICE_ENTRY, /* GPU: making the device current, its context and stream */
    NB_PHASE_LAUNCH,       /* GPU: the kernel launch call itself */
    NB_PHASE_LAUNCH_CHECK, /* GPU: the error check after a launch */
    NB_PHASE_RECORD,       /* recording on the tapes that watch an input */
    NB_PHASE_SCOPE,        /* handing the result to the scope, and ending scopes */
    NB_PHASE_RELEASE,      /* freeing tensor structs and storage headers */
    NB_PHASE_FREE,         /* the device allocator taking memory back */
    NB_PHASE_COUNT
} nb_op_phase;

/* Totals of the calling thread since profiling was turned on or last reset. */
typedef struct nb_op_profile {
    int64_t ops;                     /* counted ops begun (nested ones included) */
    int64_t ns[NB_PHASE_COUNT];      /* nanoseconds spent in each phase, the profiling's
                                        own cost taken out (an estimate, never below 0) */
    int64_t entries[NB_PHASE_COUNT]; /* times each phase was entered */
    int64_t overhead_ns;             /* the profiling's own cost taken out of ns[] */
    int64_t boundary_ns;             /* its estimate for one boundary (a clock reading) */
} nb_op_profile;

/* Turns per-phase timing of ops on or off for the calling thread; turning it
 * on resets the thread's totals. Never fails. */
void nb_set_op_profiling(bool on);

/* Whether the calling thread profiles its ops. */
bool nb_op_profiling(void);

/* Writes the calling thread's totals to *out (the caller's struct), the time
 * up to this call included; all zero when profiling was never on. Returns
 * NB_OK, or NB_ERR_INVALID_ARGUMENT (recorded) when out is NULL. */
nb_status nb_op_profile_get(nb_op_profile *out);

/* Zeroes the calling thread's totals; profiling stays as it was. */
void nb_op_profile_reset(void);

/* The phase's short name ("checks", "launch", ...), a static string;
 * "invalid" for a value outside the enum. */
const char *nb_op_phase_name(nb_op_phase phase);

#ifdef __cplusplus
}
#endif
#endif
