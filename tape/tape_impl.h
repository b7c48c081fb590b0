/* nabla internal — the tape object, shared by the files of tape/. */
#ifndef NB_TAPE_IMPL_H
#define NB_TAPE_IMPL_H

#include "lib/core/recording.h"
#include "set_aside.h"
#include "sources.h"
#include "idmap.h"

typedef struct nb_arena_chunk {
    struct nb_arena_chunk *next;
    size_t used, size;
    _Alignas(16) unsigned char data[];
} nb_arena_chunk;

/* A value of some outside object (a variable) read while the tape was open. */
typedef struct nb_tape_read {
    const void *key;
    uint64_t id;
} nb_tape_read;

/* A tape's growing buffers: a freed tape leaves them, emptied, to its
 * thread's next tape (tape.c). */
typedef struct nb_tape_buffers {
    nb_idmap watched;
    nb_node *nodes;
    size_t cap_nodes;
    nb_arena_chunk *arena;
    nb_tape_read *reads;
    size_t cap_reads;
} nb_tape_buffers;

struct nb_tape {
    bool persistent;
    bool on_stack;   /* recording unless paused */
    bool paused;
    bool used;       /* a one-shot tape whose gradient was taken */
    nb__scope_frame *owner; /* the scope that frees it, or NULL */
    nb_tape_buffers buf;
    size_t n_nodes, n_reads;
};

/* Releases the tensors one node holds (its inputs and outputs), leaving NULLs. */
void nb__tape_node_release(nb_node *n);
/* Releases every tensor the nodes hold and empties the record. */
void nb__tape_clear_nodes(nb_tape *tape);
/* Takes the tape off the thread's stack if it is there. */
void nb__tape_unlink(nb_tape *tape);

#endif
