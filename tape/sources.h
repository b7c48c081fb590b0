/* nabla internal — what modules above the tape need to make their own objects
 * gradient sources (lib/variable: a variable's value changes between reads, so
 * the tape must remember which value it saw). The tape keys those reads on an
 * opaque pointer and never looks inside it, so tape/ knows nothing of variables. */
#ifndef NB_TAPE_SOURCES_H
#define NB_TAPE_SOURCES_H

#include "lib/core/recording.h"

/* Watches t on every recording tape of this thread, remembering that it is a
 * value of key. Called by nb_read; does nothing for non-floating t. Out of memory
 * is recorded as the thread's error, naming nb_read. */
void nb__tape_watch_read(const void *key, const nb_tensor *t);

/* The same on one tape, whether or not it is recording. NB_OK, or
 * NB_ERR_OUT_OF_MEMORY naming nb_read. */
nb_status nb__tape_note_read(nb_tape *tape, const void *key, const nb_tensor *t);

/* The id of the latest value of key read on tape (0 when none, or tape is NULL). */
uint64_t nb__tape_read_id(const nb_tape *tape, const void *key);

/* nb_tape_gradient_ex with sources given by id: ids[i] is the tensor id of source
 * i (0 is a NULL source), like[i] a tensor shaped like it for zeros (NB_UNCONNECTED_ZERO).
 * Errors name nb_tape_gradient. */
nb_status nb__tape_gradient_ids(nb_tape *tape, const nb_tensor *target, const nb_tensor *seed, int n,
                                const uint64_t *ids, nb_tensor *const *like, nb_tensor **out,
                                nb_unconnected unconnected);

#endif
