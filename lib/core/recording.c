/* The recording hook and the per-thread recording state (lib/core/recording.h). */
#include "recording.h"

#include <stdatomic.h>

static _Atomic(nb_record_fn) g_recorder;
static _Thread_local int tl_active;      /* this thread's tapes that are not paused */
static _Thread_local int tl_pause_depth; /* nb__tapes_pause nesting */

bool nb__tape_recording(void) { return tl_active > 0 && tl_pause_depth == 0; }

nb_status nb__record(const nb_op_def *op, int n_in, const nb_tensor *const *inputs, int n_out,
                     nb_tensor *const *outputs, const nb_op_attrs *attrs)
{
    nb_record_fn fn = atomic_load_explicit(&g_recorder, memory_order_acquire);
    if (!fn || !nb__tape_recording())
        return NB_OK;
    return fn(op, n_in, inputs, n_out, outputs, attrs);
}

void nb__recorder_install(nb_record_fn fn) { atomic_store_explicit(&g_recorder, fn, memory_order_release); }

int nb__tapes_pause(void) { return tl_pause_depth++; }
void nb__tapes_resume(int token) { tl_pause_depth = token; }

void nb__recording_set_active(int active) { tl_active = active; }
int nb__recording_active(void) { return tl_active; }
int nb__recording_pause_depth(void) { return tl_pause_depth; }
void nb__recording_set_pause_depth(int depth) { tl_pause_depth = depth; }
