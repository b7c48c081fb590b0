/* nabla internal — the tape stack set aside, for the modules above the tape
 * (the mirrored strategy) that run work on a thread for someone else. The
 * recording interface itself (op definitions, nodes, nb__record, pausing) is
 * the core's: lib/core/recording.h. */
#ifndef NB_TAPE_SET_ASIDE_H
#define NB_TAPE_SET_ASIDE_H

#include "lib/core/core.h"

/* The calling thread's tape stack set aside, so that work run on this thread for
 * someone else (replica 0 of a mirrored strategy) is recorded on none of its
 * tapes: set_aside empties the stack, restore puts it back (tapes begun in
 * between must have been freed). */
#define NB_TAPE_STACK_MAX 32
typedef struct nb_tapes_aside {
    nb_tape *stack[NB_TAPE_STACK_MAX];
    int depth, active, pause_depth;
} nb_tapes_aside;
void nb__tapes_set_aside(nb_tapes_aside *out);
void nb__tapes_restore(const nb_tapes_aside *in);

#endif
