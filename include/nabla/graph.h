/* nabla — step capture: a training step recorded once, then replayed whole.
 *
 * An eager op pays a few microseconds of host work (checks, allocation, tape,
 * launch) each time it runs; a small model's step is mostly that. A graph
 * runs the same eager step code once more while the device records it (a CUDA
 * graph on a GPU; on the CPU, the list of its kernel calls with their
 * arguments), and each replay then runs the whole recorded step at once.
 *
 *   nb_graph *g;
 *   nb_graph_capture("/gpu:0", train_step, &model, 2, (nb_tensor *[]){x, y}, 1, &loss, &g);  // step 1
 *   for (...) nb_graph_replay(g, (nb_tensor *[]){next_x, next_y}, &loss);                  // steps 2, 3, ...
 *   nb_graph_free(g);
 *
 * What a capture does:
 *   1. copies the inputs into tensors of the graph's own on the device (the
 *      step reads those, at the same addresses, in every replay);
 *   2. runs the step as a normal eager step, under the rules below (the
 *      warm-up: it is step 1, its outputs are the capture's outputs, and it
 *      makes what a step makes once: optimizer slots, library handles, plans);
 *   3. runs the step a second time while the device records it: nothing runs, the host state it changes is taken back (the
 *      optimizer's step count; a variable that moved to a fresh buffer goes
 *      back to its old one), and the recorded kernels are kept. Memory the
 *      recording allocates comes from a pool private to the graph, so every
 *      replay uses the same addresses and no one else gets them.
 * A replay copies its inputs into the graph's, refreshes the numbers an
 * optimizer update reads from the host (its step count, hence Adam's bias
 * corrections, and its learning rate: a changed rate is seen), launches the
 * recorded step, advances the optimizers' step counts and the dropout layers'
 * seeds (a recorded dropout layer draws its mask from a seed in device memory,
 * so each replay draws the mask an eager step would), and copies the outputs
 * into new tensors. 100 replays give the same variables, bit for bit, as 100
 * eager steps. A loss scaler (nabla/optimizer.h) in the step keeps its state,
 * its check of the gradients and the optimizer's step count in device memory
 * there, so a replay whose gradients overflow is skipped on the device as an
 * eager step would be, and the host reads the outcome back only when asked. The CPU and the GPU record alike (the same hooks refresh and
 * advance the same host state), so a step that captures on the CPU captures
 * on a GPU; a device kind that cannot record would run the step again at each
 * replay, under the same rules.
 *
 * The rules (NB_ERR_UNSUPPORTED naming the call, while the step runs at
 * capture and at every replay): a replay repeats only the step's kernels on
 * its device, so the step may not read a tensor to the host (nb_tensor_read,
 * _get, _item), copy host data in (nb_from_buffer), wait (nb_synchronize),
 * copy between devices or make a tensor on another device, make a variable,
 * run a mirrored strategy's call, or, while recording, make optimizer slots.
 * Host values the step reads are frozen at capture: control flow that depends
 * on them, a seed passed to nb_dropout or a random op, a scalar computed on
 * the host each step. Pass them as
 * input tensors instead. The step runs twice at capture (three times in the
 * case below), and no other thread may use the device while it is recorded.
 *
 * Variables: a replay reads and writes each variable the step uses in the
 * tensor the recording found it in, which the graph keeps. Its optimizer
 * updates write those tensors in place, even where the step still holds
 * reads of the old values (an eager step writes a fresh tensor then, so that
 * the reads keep them): no copy is replayed. A step that uses such a read
 * after the update (computes with it, returns it, passes it as a gradient) is
 * recorded once more with the eager step's copies, so its replays give what
 * eager steps give. Eager steps and
 * assignments may run between replays: a variable they moved to a fresh
 * tensor (copy-on-write, while a read held its value) is copied back into the
 * graph's before the next replay, which starts from its current value. A
 * tensor read from such a variable before a replay may see the replay's
 * values afterwards (on a GPU, where the replay writes in place): read it
 * again after the replays.
 *
 * Lifetimes: the graph holds its inputs and outputs; the variables and
 * optimizers the step uses, and any tensor it reads other than its inputs
 * (through user), must outlive the graph, whose replays read and write their
 * memory. */
#ifndef NABLA_GRAPH_H
#define NABLA_GRAPH_H

#include <nabla/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_graph nb_graph;

/* A step: reads inputs[0 .. n_inputs) (the graph's tensors, on its device,
 * which is the current device while it runs), may read variables and update
 * them (optimizers, assignments), and writes n_outputs tensors on the device
 * to outputs (made in the step; the graph keeps what it needs). Returns NB_OK,
 * or an error, which ends the capture or the replay with it. */
typedef nb_status (*nb_graph_step_fn)(void *user, int n_inputs, nb_tensor *const *inputs, int n_outputs,
                                      nb_tensor **outputs);

/* Captures fn on device ("/gpu:0", "/cpu:0"; soft placement applies) with
 * inputs (any devices; copied onto it) and runs it as step 1 (see above).
 * Writes the step's outputs, new tensors owned by the current scope (or by
 * the caller when none is open), to outputs (NULL: not wanted) and the graph,
 * which the caller frees with nb_graph_free, to *out. On failure *out is NULL
 * and the error is returned: NB_ERR_INVALID_ARGUMENT (NULL fn, out, input or
 * output; a negative count; a capture already running on this thread; an
 * output that is NULL or not on the device), NB_ERR_DEVICE (an unknown
 * device), NB_ERR_UNSUPPORTED (the step broke a rule; the message names the
 * call), the step's own error, or NB_ERR_BACKEND (the device could not record
 * or instantiate the step). A failure in step 1 leaves its effects as an
 * eager step's failure would; a failed recording changes nothing. */
nb_status nb_graph_capture(const char *device, nb_graph_step_fn fn, void *user, int n_inputs,
                           nb_tensor *const *inputs, int n_outputs, nb_tensor **outputs, nb_graph **out);

/* One more step: copies inputs (as many as at capture, each with the shape and
 * dtype it had then, on any device; NULL: the graph's inputs keep the values
 * of the last step) into the graph's, runs the step and writes
 * its outputs, new tensors owned by the current scope (or the caller), to
 * outputs (NULL: not wanted). Returns NB_OK once the step is queued (a GPU's
 * errors in it surface at the next synchronising call, as an eager step's
 * do); NB_ERR_INVALID_ARGUMENT for NULL g or input, NB_ERR_SHAPE or
 * NB_ERR_DTYPE naming the input whose shape or dtype changed (capture a new
 * graph for it), or a kernel's error on the CPU (an index out of range:
 * the replay stops there, as an eager step would). */
nb_status nb_graph_replay(nb_graph *g, nb_tensor *const *inputs, nb_tensor **outputs);

/* Whether g replays recorded kernels (the CPU and the GPU do) rather than
 * running the step again; false for NULL. */
bool nb_graph_recorded(const nb_graph *g);

/* How many kernels and copies a replay of g launches (0 where it is not
 * recorded, or for NULL). */
int64_t nb_graph_nodes(const nb_graph *g);

/* The device g runs on (a static string), or NULL for NULL. */
const char *nb_graph_device(const nb_graph *g);

/* Whether devices that record a step fuse its elementwise chains (on by
 * default): on the CPU, consecutive elementwise calls of one shape (fills,
 * unary and binary ops, casts, where) run as one
 * pass over memory in cache-sized tiles, and a result the step lets go of
 * before any later call is recorded (a temporary of exp((a + b) * c) made in
 * a scope the step closes) is never written to memory; a chain whose result
 * only a sum, mean, max, min or prod right after it reads (mean((a - b)^2),
 * over everything or the last dims) runs into that reduction, its result never
 * stored. Fused replays give the same bits as unfused ones. Applies to graphs captured afterwards;
 * returns the previous setting. Thread-safe. */
bool nb_graph_set_fusion(bool on);

/* Waits for g's queued replays, then frees it, its inputs, outputs and private
 * memory. NULL is ignored. Inside a captured step it is refused (an error is
 * recorded, as for every call the step may not make, and g is left alone). */
void nb_graph_free(nb_graph *g);

#ifdef __cplusplus
}
#endif

#endif
