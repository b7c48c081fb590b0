/* The thread's first error, the error handler and the log callback. */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local nb_status tl_code;
static _Thread_local char tl_message[NB_ERROR_MESSAGE_MAX];
static _Thread_local bool tl_in_handler; /* the handler is running on this thread */

static nb_error_handler g_handler;
static void *g_handler_user;

static void default_log(nb_log_level level, const char *message, void *user);
static nb_log_callback g_log = default_log;
static void *g_log_user;

nb_status nb_error(void) { return tl_code; }

const char *nb_error_message(void) { return tl_code ? tl_message : ""; }

void nb__error_stash(nb_error_saved *out)
{
    out->code = tl_code;
    memcpy(out->message, tl_message, sizeof out->message);
    nb_error_clear();
}

void nb__error_unstash(const nb_error_saved *in)
{
    if (in->code == NB_OK)
        return;
    tl_code = in->code; /* the earlier error: it was first */
    memcpy(tl_message, in->message, sizeof tl_message);
}

void nb__error_restore(const nb_error_saved *in)
{
    nb_error_clear();
    nb__error_unstash(in);
}

nb_status nb_error_clear(void)
{
    nb_status code = tl_code;
    tl_code = NB_OK;
    tl_message[0] = '\0';
    return code;
}

const char *nb_status_name(nb_status code)
{
    switch (code) {
    case NB_OK: return "NB_OK";
    case NB_ERR_INVALID_ARGUMENT: return "NB_ERR_INVALID_ARGUMENT";
    case NB_ERR_SHAPE: return "NB_ERR_SHAPE";
    case NB_ERR_DTYPE: return "NB_ERR_DTYPE";
    case NB_ERR_DEVICE: return "NB_ERR_DEVICE";
    case NB_ERR_OUT_OF_MEMORY: return "NB_ERR_OUT_OF_MEMORY";
    case NB_ERR_TAPE: return "NB_ERR_TAPE";
    case NB_ERR_IO: return "NB_ERR_IO";
    case NB_ERR_BACKEND: return "NB_ERR_BACKEND";
    case NB_ERR_UNSUPPORTED: return "NB_ERR_UNSUPPORTED";
    case NB_ERR_INTERNAL: return "NB_ERR_INTERNAL";
    case NB_ERR_OUT_OF_RANGE: return "NB_ERR_OUT_OF_RANGE";
    case NB_ERR_TIMEOUT: return "NB_ERR_TIMEOUT";
    }
    return "NB_ERR_UNKNOWN";
}

nb_error_handler nb_set_error_handler(nb_error_handler handler, void *user)
{
    nb_error_handler old = g_handler;
    g_handler = handler;
    g_handler_user = user;
    return old;
}

void nb_error_handler_exit(nb_status code, const char *message, void *user)
{
    (void)user;
    fprintf(stderr, "nabla: %s: %s\n", nb_status_name(code), message);
    exit(1);
}

static _Thread_local const char *tl_context;

const char *nb__error_context(const char *who)
{
    const char *prev = tl_context;
    tl_context = who;
    return prev;
}

static nb_status vfail(nb_status code, const char *fmt, va_list ap)
{
    /* The first error wins: later ones are usually consequences of it. */
    if (tl_code == NB_OK) {
        tl_code = code;
        int k = tl_context ? snprintf(tl_message, sizeof tl_message, "%s: ", tl_context) : 0;
        if (k < 0 || (size_t)k >= sizeof tl_message)
            k = 0;
        vsnprintf(tl_message + k, sizeof tl_message - (size_t)k, fmt, ap);
    }
    /* Not again from inside the handler: one that calls a failing op would
     * otherwise recurse without end. Those failures are still recorded. */
    if (g_handler && !tl_in_handler) {
        tl_in_handler = true;
        g_handler(code, tl_message, g_handler_user);
        tl_in_handler = false;
    }
    return code;
}

nb_status nb__fail(nb_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(code, fmt, ap);
    va_end(ap);
    return code;
}

void *nb__fail_null(nb_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(code, fmt, ap);
    va_end(ap);
    return NULL;
}

void *nb__null_input(const char *op, int index)
{
    if (tl_code == NB_OK)
        nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: input %d is NULL", op, index);
    return NULL;
}

static void default_log(nb_log_level level, const char *message, void *user)
{
    (void)user;
    if (level >= NB_LOG_INFO)
        fprintf(stderr, "nabla: %s%s\n", level == NB_LOG_WARNING ? "warning: " : "", message);
}

nb_log_callback nb_set_log_callback(nb_log_callback callback, void *user)
{
    nb_log_callback old = g_log;
    g_log = callback;
    g_log_user = user;
    return old;
}

void nb__log(nb_log_level level, const char *fmt, ...)
{
    if (!g_log)
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    g_log(level, buf, g_log_user);
}

const char *nb_version(void) { return "0.1.0"; }
