/* nabla — checkpoints in the safetensors format, and a manager that keeps the
 * last few (as tf.train.CheckpointManager).
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON (padded
 * with spaces to a multiple of 8), then the tensors' bytes, row-major and
 * little-endian. The JSON maps each tensor's name to {"dtype", "shape",
 * "data_offsets": [begin, end]} (offsets from the start of the data) and may
 * hold "__metadata__", an object of strings. Files written by the Python
 * safetensors package read here, and ours read there.
 *
 * A variable is saved under its name. With an optimizer, each of a variable's
 * slots is saved as "<variable>/<slot>" (e.g. "dense/kernel/adam_m"), and the
 * optimizer's kind, iteration count and hyper-parameters go in __metadata__
 * ("nabla.optimizer", "nabla.optimizer.iterations", "nabla.optimizer.<name>").
 * Restoring both variables and optimizer resumes training exactly. */
#ifndef NABLA_CHECKPOINT_H
#define NABLA_CHECKPOINT_H

#include <nabla/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Writes n variables (vars NULL or n 0: every registered variable, see
 * nb_variables_list) and, when opt is not NULL, its slots for them and its
 * state, to path. Atomic: the file is written to "<path>.tmp.<pid>", synced,
 * and renamed over path (and the directory synced), so path holds either the
 * old checkpoint or the whole new one; on failure the temporary file is
 * removed. Two variables with one name, or a name that collides with a slot's,
 * are refused (NB_ERR_INVALID_ARGUMENT). Returns NB_OK, or the error with a
 * message naming the function, the file and the tensor (NB_ERR_IO when the file
 * cannot be written). */
nb_status nb_checkpoint_save(const char *path, int n, nb_variable *const *vars, const nb_optimizer *opt);

/* Reads path and assigns each of n variables (vars NULL or n 0: every
 * registered variable) the tensor of its name, copied to the variable's device.
 * With opt, restores its slots for them ("<variable>/<slot>", where the file
 * has them) and its iteration count; the file must then hold optimizer state of
 * opt's kind. The whole header and the layout are checked before any variable
 * changes: NB_ERR_IO for a file that cannot be read, is truncated, or is not
 * safetensors (a header length past the file, malformed or duplicate JSON,
 * data_offsets out of bounds, overlapping or not covering the data exactly, a
 * size that does not match the shape); NB_ERR_INVALID_ARGUMENT for a missing
 * tensor or a dtype or shape that differs from the variable's. Messages name
 * the function, the file and the tensor. Only a read that fails after those
 * checks (the file cut short meanwhile, a disk error) leaves variables partly
 * restored. Tensors read from a variable before keep their values. Returns
 * NB_OK or the error. */
nb_status nb_checkpoint_restore(const char *path, int n, nb_variable *const *vars, nb_optimizer *opt);

/* Keeps numbered checkpoints "<dir>/<prefix>-<step>.safetensors". */
typedef struct nb_checkpoint_manager nb_checkpoint_manager;

/* A manager for dir (which must exist) keeping the max_to_keep newest
 * checkpoints (all of them when max_to_keep <= 0). dir and prefix are copied;
 * prefix must be non-empty and hold no '/'. The caller frees it with
 * nb_checkpoint_manager_free. NULL and NB_ERR_INVALID_ARGUMENT (bad arguments)
 * or NB_ERR_IO (dir is not a readable directory). */
nb_checkpoint_manager *nb_checkpoint_manager_new(const char *dir, const char *prefix, int max_to_keep);

/* Saves "<dir>/<prefix>-<step>.safetensors" as nb_checkpoint_save does (step
 * >= 0), then deletes the checkpoints of this prefix in dir with the smallest
 * steps until max_to_keep remain. NB_OK or the error. */
nb_status nb_checkpoint_manager_save(nb_checkpoint_manager *m, int64_t step, int n, nb_variable *const *vars,
                                     const nb_optimizer *opt);

/* The path of the checkpoint with the largest step in dir, found by listing the
 * directory (so a new process finds what an earlier one saved); NULL when
 * there is none (no error) or on a listing error (NB_ERR_IO). The string
 * belongs to m and stays valid until the next call on m. */
const char *nb_checkpoint_manager_latest(nb_checkpoint_manager *m);

/* Frees m (the files stay). NULL is ignored. */
void nb_checkpoint_manager_free(nb_checkpoint_manager *m);

#ifdef __cplusplus
}
#endif
#endif
