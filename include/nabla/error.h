/* nabla — errors and logging.
 *
 * A function that returns a pointer returns NULL on failure; one that returns a
 * status returns a non-zero NB_ERR_*. Each thread keeps its FIRST error (code and
 * message) until it is read with nb_error_clear(), so a chain of calls can be
 * checked once at its end: an op given a NULL input returns NULL and leaves the
 * earlier error in place. The library never exits, aborts or prints by itself. */
#ifndef NABLA_ERROR_H
#define NABLA_ERROR_H

#include <nabla/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Returns the calling thread's pending error code, NB_OK when none. */
nb_status nb_error(void);

/* Returns the pending error's message ("" when none). The string belongs to the
 * thread and stays valid until the error is cleared. */
const char *nb_error_message(void);

/* Clears the pending error and returns its code. */
nb_status nb_error_clear(void);

/* Returns a static name for a status code, e.g. "NB_ERR_SHAPE". */
const char *nb_status_name(nb_status code);

/* Called at the moment of every failure, on the failing thread, after the error is
 * stored. A failure inside the handler itself (an op it calls) is recorded but
 * does not call it again. NULL removes the handler. Returns the previous handler. */
typedef void (*nb_error_handler)(nb_status code, const char *message, void *user);
nb_error_handler nb_set_error_handler(nb_error_handler handler, void *user);

/* A ready-made handler that prints the message to stderr and exits(1): for
 * samples and quick programs, never used by the library itself. */
void nb_error_handler_exit(nb_status code, const char *message, void *user);

/* Log levels for messages the library wants a person to see (placement
 * warnings, device placement logging). */
typedef enum nb_log_level { NB_LOG_DEBUG, NB_LOG_INFO, NB_LOG_WARNING } nb_log_level;

/* The library prints only through this callback. The default writes WARNING
 * and the placement log to stderr; NULL silences everything. Returns the
 * previous callback. */
typedef void (*nb_log_callback)(nb_log_level level, const char *message, void *user);
nb_log_callback nb_set_log_callback(nb_log_callback callback, void *user);

#ifdef __cplusplus
}
#endif
#endif
