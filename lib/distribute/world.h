/* nabla internal — the processes a strategy spans (the MPI world), for
 * mirrored.c: every call here is collective (each rank makes the same calls in
 * the same order), made from one thread at a time, and bounded by a deadline.
 *
 * Every collective starts with a handshake: each rank sends every other its
 * header (what it is doing, its call count, a description and a number) and
 * waits for theirs, polling against the deadline. A rank that does not answer
 * is named; a rank doing something else (another call, another variable) is
 * named with both descriptions. After any failure the world is broken for
 * good: later calls fail at once with the first error; after a rank stopped
 * answering, MPI_Finalize is not called at exit either (it would wait for the
 * dead rank for ever).
 *
 * A timeout leaves no MPI operation pending on memory anybody frees: pending
 * receives are cancelled, and what a pending operation may still touch is the
 * world's own memory, or the caller's when the call says so through *kept
 * (the caller then hands it to nb__world_keep rather than freeing it).
 *
 * Built without MPI, or run without mpirun, the world is one process and every
 * call is a local no-op. */
#ifndef NB_DISTRIBUTE_WORLD_H
#define NB_DISTRIBUTE_WORLD_H

#include "lib/core/core.h"

/* Joins the world: initialises MPI (MPI_THREAD_SERIALIZED) unless the program
 * did, with errors returned rather than aborting, and finalises it at exit when
 * the library initialised it. NB_OK, or NB_ERR_BACKEND naming who when MPI
 * cannot start. Safe to call again. */
nb_status nb__world_join(const char *who);

/* This process's rank and the number of processes (0 and 1 before joining or
 * without MPI). */
int nb__world_rank(void);
int nb__world_size(void);

/* The deadline of every wait, in seconds (NB_WORLD_TIMEOUT in the
 * environment, else 300). */
double nb__world_timeout(void);
void nb__world_set_timeout(double seconds);

/* The handshake alone: every rank says it is at kind/desc with value; on
 * success *sum and *min (either may be NULL) receive the sum and the least of
 * the ranks' values. Fails naming the rank that did not answer within the
 * deadline, or the first whose kind or description differs from this rank's. */
nb_status nb__world_handshake(const char *who, const char *kind, const char *desc, int64_t value, int64_t *sum,
                              int64_t *min);

/* In place: buf (count elements of dtype: f32, f64, i32, i64) becomes the sum
 * over the ranks. Host memory. With kept, MPI works on buf itself, and on a
 * failure *kept says whether an operation that may still read or write buf
 * stayed pending (a rank that is only slow may answer later): buf must then
 * never be freed or reused, but handed to nb__world_keep. With kept NULL (a
 * small buffer, or one the caller cannot keep, such as its stack), the sum
 * runs in a copy the world owns and buf is free whatever happens. */
nb_status nb__world_sum(const char *who, void *buf, int64_t count, nb_dtype dtype, bool *kept);

/* Keeps p (memory, or an object holding memory, a pending MPI operation may
 * still touch) reachable until the process ends: it is never freed. Call it
 * in place of the free that *kept forbade. */
void nb__world_keep(void *p);

/* In place: rank 0's bytes to every rank. Host memory, through a copy the
 * world owns: buf is the caller's again when it returns, whatever happened. */
nb_status nb__world_broadcast(const char *who, void *buf, size_t bytes);

/* ---- messages between two ranks ----------------------------------------------
 * Unlike the calls above these are not collective, and any thread may make
 * them (they take turns inside MPI). Each waits against the deadline. */

/* Sends bytes to rank dest with tag and waits until MPI has taken them.
 * NB_ERR_TIMEOUT naming dest when it does not within the deadline (the world
 * is not broken by it: the caller decides whether that rank is dead). MPI
 * sends the world's copy of buf, so buf is the caller's again on return
 * either way; after a timeout the copy lives until its send completes. */
nb_status nb__world_send(const char *who, int dest, int tag, const void *buf, size_t bytes);

/* Receives one message from rank src with tag into buf (at most bytes; the
 * size to *got). NB_ERR_TIMEOUT naming src after the deadline, which breaks
 * the world; the receive is then cancelled, and where it could not be (the
 * message had begun to arrive) *kept is set: buf must then go to
 * nb__world_keep, never be freed. *kept is false otherwise. */
nb_status nb__world_recv(const char *who, int src, int tag, void *buf, size_t bytes, size_t *got, bool *kept);

/* Says that some rank died while the others went on: MPI_Finalize would wait
 * for it, so it is not called at exit. */
void nb__world_lost(void);

/* Whether a message with tag waits from any rank: its rank and size to *src
 * and *bytes. Does not wait. */
bool nb__world_probe(int tag, int *src, size_t *bytes);

#endif
