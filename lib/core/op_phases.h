/* nabla internal — the phase marks of nb_set_op_profiling (nabla/profile.h),
 * placed along an op's path by lib/core, ops/ and gpu/ (C and CUDA C++).
 *
 * A mark costs one relaxed load and a branch while no thread profiles: the
 * count of profiling threads is zero. Otherwise the calling thread's state
 * decides, and a mark reads the clock. Marks nest: nb__phase_enter returns the
 * phase it interrupted (-1 when the thread does not profile) and
 * nb__phase_leave goes back to it. */
#ifndef NB_OP_PHASES_H
#define NB_OP_PHASES_H

#include <nabla/profile.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Threads with profiling on (read and written with __atomic builtins, which
 * C and the .cu files share). */
extern int nb__phase_threads;

/* The slow halves: switch the calling thread to phase (returning the one it
 * left, or -1 when the thread does not profile), and back. */
int nb__phase_switch(int phase, bool op_begins);
void nb__phase_return(int prev);

/* Enters phase; returns what nb__phase_leave needs. */
static inline int nb__phase_enter(nb_op_phase phase)
{
    return __builtin_expect(__atomic_load_n(&nb__phase_threads, __ATOMIC_RELAXED) != 0, 0)
               ? nb__phase_switch((int)phase, false)
               : -1;
}

/* A counted op begins: its checks phase is entered and the op counted. */
static inline int nb__phase_op_begin(void)
{
    return __builtin_expect(__atomic_load_n(&nb__phase_threads, __ATOMIC_RELAXED) != 0, 0)
               ? nb__phase_switch((int)NB_PHASE_CHECKS, true)
               : -1;
}

/* Returns to the phase nb__phase_enter (or _op_begin) interrupted. */
static inline void nb__phase_leave(int prev)
{
    if (__builtin_expect(prev >= 0, 0))
        nb__phase_return(prev);
}

/* At thread exit (threads.c): the thread stops counting among the profiling. */
void nb__phase_thread_exit(void);

#ifdef __cplusplus
}
#endif
#endif
