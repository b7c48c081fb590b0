/* nabla internal — the recording interface: what an op records, and the hook
 * through which it records. The core owns it; tape/ implements it (installs
 * the recorder, keeps the count of recording tapes) and ops/ use it, so ops
 * never include tape/. Gradient functions are called by the tape through the
 * pointer each op's definition carries. */
#ifndef NB_CORE_RECORDING_H
#define NB_CORE_RECORDING_H

#include "core.h"

/* Small attributes an op keeps for its gradient (axes, a scalar, flags). */
typedef struct nb_op_attrs {
    int64_t i[2 * NB_MAX_DIMS];
    double d[2];
    int n;         /* a count, e.g. of axes */
    void *ptr;     /* custom gradients: their closure */
} nb_op_attrs;

typedef struct nb_node nb_node;

/* Computes the gradients of a node's inputs from those of its outputs. out_grads
 * has one entry per output (missing ones are zeros, but for the outputs the
 * op's def says have none: NULL). It writes one
 * entry per input to in_grads, NULL where an input gets none (integer inputs,
 * conditions). Written with nabla ops so an outer tape can record it. Returns
 * NB_OK or the error. Tensors it creates belong to the current scope. */
typedef nb_status (*nb_grad_fn)(const nb_node *node, nb_tensor *const *out_grads, nb_tensor **in_grads);

typedef struct nb_op_def {
    const char *name;
    nb_grad_fn grad; /* NULL: not differentiable (asking is NB_ERR_TAPE) */
    /* 0: every output has a gradient; n: only the first n, the others being
     * what the op saves for its gradient (a row's statistics), whose missing
     * gradients reach grad as NULL rather than as tensors of zeros made for
     * nothing. */
    int n_grad_outputs;
} nb_op_def;

struct nb_node {
    const nb_op_def *op;
    int n_in, n_out;
    nb_tensor **in;   /* held references (NULL after a one-shot tape used them) */
    nb_tensor **out;
    uint64_t *in_ids, *out_ids;
    uint32_t needs;   /* during backward: bit k set when input k wants a gradient */
    nb_op_attrs attrs;
};

/* For gradient functions: whether input k wants a gradient (skip the work if not). */
static inline bool nb__needs_grad(const nb_node *n, int k) { return k >= 32 || (n->needs >> k) & 1u; }

/* True when the calling thread has a tape that is recording (one on its stack
 * not paused, and no nb__tapes_pause in force). Cheap: ops call it on every
 * invocation. */
bool nb__tape_recording(void);

/* Records an op on every recording tape that watches one of inputs (NULL inputs
 * are skipped), through the recorder the tape module installed. Outputs with a
 * floating dtype become watched by those tapes. attrs may be NULL. Returns
 * NB_OK (also when nothing is recording) or NB_ERR_OUT_OF_MEMORY. */
nb_status nb__record(const nb_op_def *op, int n_in, const nb_tensor *const *inputs, int n_out,
                     nb_tensor *const *outputs, const nb_op_attrs *attrs);

/* Pauses every tape of this thread (for code whose ops must not be recorded, like
 * a composite op's forward or an optimizer update); returns a token for
 * nb__tapes_resume. Nests. */
int nb__tapes_pause(void);
void nb__tapes_resume(int token);

/* ---- for the tape module (tape/), which implements recording ---- */

/* Installs the function nb__record calls. The tape module installs it when its
 * first tape begins; the same function again is a no-op. */
typedef nb_status (*nb_record_fn)(const nb_op_def *op, int n_in, const nb_tensor *const *inputs, int n_out,
                                  nb_tensor *const *outputs, const nb_op_attrs *attrs);
void nb__recorder_install(nb_record_fn fn);
/* The calling thread's recording state: how many of its tapes are not paused,
 * and the nb__tapes_pause nesting. The tape module keeps the count current;
 * setting both restores a state set aside. */
void nb__recording_set_active(int active);
int nb__recording_active(void);
int nb__recording_pause_depth(void);
void nb__recording_set_pause_depth(int depth);


#endif
