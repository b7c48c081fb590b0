/* nabla internal — the rules a captured step runs under, and the record its
 * recording keeps (the public side is include/nabla/graph.h, lib/graph/).
 *
 * While a thread runs a step for nb_graph_capture or nb_graph_replay, that
 * thread is "in a capture" on the step's device, and the work a replay of
 * recorded kernels could not repeat is refused, NB_ERR_UNSUPPORTED naming the
 * call (nb__capture_check): reading a tensor to the host, copying host data
 * in, waiting for a device, copying between devices, a tensor on any other
 * device, making a variable. The rules hold on every device kind, so a step
 * that runs under them on the CPU records on a GPU.
 *
 * On a GPU the step runs twice at capture: once as a normal step (the
 * warm-up: it makes optimizer slots, library handles and plans), then once
 * while the device's stream is recorded, which runs nothing; three times
 * when that recording reaches a stale value and is made again with copies
 * (nb__capture_no_in_place). During the
 * recording, rooms above the core that change host state register hooks
 * (nb__capture_hook) so that the graph can undo that state when the recording
 * ends and redo it at each replay, and may ask for device doubles that each
 * replay refreshes from the host (nb__capture_params): a step count, a
 * learning rate. */
#ifndef NB_CAPTURE_H
#define NB_CAPTURE_H

#include "core.h"

typedef struct nb__capture nb__capture;

/* What a room above the core does around a recording and its replays. Every
 * member may be NULL. */
typedef struct nb__capture_hooks {
    /* The recording ends: kept is false when it failed and nothing will be
     * replayed. Work queued here on the device is recorded (when kept). Hooks
     * run in the reverse order of registration. */
    void (*at_end)(void *ctx, bool kept);
    /* Before each replay: fill this hook's device doubles (nb__capture_params)
     * at params[first .. first + n). */
    void (*before_replay)(void *ctx, double *params);
    /* After each replay was queued. */
    void (*after_replay)(void *ctx);
    /* The graph is freed (or the recording failed): free ctx. */
    void (*release)(void *ctx);
} nb__capture_hooks;

/* The most device doubles one recording may ask for. */
#define NB_CAPTURE_MAX_PARAMS 256

/* The capture the calling thread runs a step under, or NULL. */
nb__capture *nb__capture_current(void);
/* Its device. */
nb_device *nb__capture_device(const nb__capture *c);
/* A process-unique id of c (never reused, unlike its address). */
uint64_t nb__capture_id(const nb__capture *c);
/* Whether its device's stream is being recorded now (not the warm-up, not a
 * replay by running the step again). */
bool nb__capture_recording(const nb__capture *c);

/* NB_OK outside a capture. Inside one, for work touching dev (NULL: any
 * device), NB_ERR_UNSUPPORTED recorded as "<who>: <what> cannot run in a step
 * captured on <device>: <why>". */
nb_status nb__capture_check(const nb_device *dev, const char *who, const char *what);
/* nb__tensor_new's rule: NB_OK, or NB_ERR_UNSUPPORTED when a capture on
 * another device runs on this thread. */
nb_status nb__capture_check_device(const nb_device *dev, const char *who);

/* Registers hooks on the recording c with ctx (which release frees). On
 * failure (host memory) release(ctx) has run and the error is recorded. */
nb_status nb__capture_hook(nb__capture *c, const nb__capture_hooks *h, void *ctx);
/* Whether a hook or a request for doubles failed during the recording c: it
 * must not be kept. */
bool nb__capture_failed(const nb__capture *c);
/* Marks the recording c failed (it will not be kept) and returns st, the
 * error the caller recorded. */
nb_status nb__capture_fail(nb__capture *c, nb_status st);
/* n device doubles of the recording c that each replay refreshes before it
 * runs: the device address, the index of the first in the replay's host array
 * at *first. NULL with NB_ERR_UNSUPPORTED recorded when more than
 * NB_CAPTURE_MAX_PARAMS would be needed. */
double *nb__capture_params(nb__capture *c, int n, int *first);

/* ---- variables written in place by a recording ----
 * An optimizer update writes a fresh buffer when a read still holds the
 * variable's value (copy-on-write), and a recording then copied it back into
 * the buffer the replays read: a copy per variable per replay. Instead, while
 * recording, the update writes the variable's memory in place (lib/variable
 * gives it a new storage over the same memory) and the old storage, which the
 * reads hold, is marked stale. A kernel that reaches a stale storage's data
 * afterwards (a read of the old value used after the update), or a step
 * output that shares it, would see the new values: the recording notes it,
 * and lib/graph records the step again with copies. */

/* Whether updates recorded in c may write variables in place (c records, and
 * no earlier recording of the same step met a stale read). */
bool nb__capture_in_place(const nb__capture *c);
/* lib/graph: forbids it for the recording c (the step's second recording). */
void nb__capture_no_in_place(nb__capture *c);
/* Marks s stale until the recording c ends (nb__capture_leave clears it
 * before the hooks' closing work), holding a reference to it till then. */
nb_status nb__capture_mark_stale(nb__capture *c, nb_storage *s);
/* Whether a stale storage's data was reached during the recording c. */
bool nb__capture_stale_reached(const nb__capture *c);

/* Whether a device that records a step may fuse its elementwise chains
 * (nb_graph_set_fusion; on unless set off). */
bool nb__graph_fusion(void);

/* ---- for lib/graph: running a step under the rules ---- */

/* Enters a capture on dev for the calling thread (recording: the device's
 * stream records; dev_params: NB_CAPTURE_MAX_PARAMS device doubles, for
 * recordings). Returns it, or NULL (out of host memory, or a capture already
 * runs on this thread: NB_ERR_INVALID_ARGUMENT). */
nb__capture *nb__capture_enter(nb_device *dev, bool recording, double *dev_params);
/* Leaves it (the thread is in no capture afterwards). For a recording, runs
 * the at_end hooks (kept as given) and keeps the hooks for the replays when
 * kept; without kept the hooks are released. c is then freed unless kept:
 * then nb__capture_replay and nb__capture_free use it. */
void nb__capture_leave(nb__capture *c, bool kept);
/* How many device doubles the recording asked for. */
int nb__capture_param_count(const nb__capture *c);
/* Runs every before_replay hook into params (nb__capture_param_count). */
void nb__capture_before_replay(nb__capture *c, double *params);
void nb__capture_after_replay(nb__capture *c);
/* Releases every hook and frees c. NULL is ignored. */
void nb__capture_free(nb__capture *c);

#endif
