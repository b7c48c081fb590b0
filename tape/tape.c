/* Tapes: the per-thread stack, watching, and recording ops. */
#include "tape_impl.h"

#include <pthread.h>
#include <string.h>


static _Thread_local nb_tape *tl_stack[NB_TAPE_STACK_MAX];
static _Thread_local int tl_depth;

/* The last tapes a thread freed leave their buffers for its next tapes
 * (emptied, up to TAPE_SPARE_BYTES each), so that a training loop with a
 * tape a step regrows none of them: before, recording copied every node
 * again as the array doubled, and rehashed the watched set. */
enum { TAPE_SPARES = 2 };                    /* a tape and one nested in it */
#define TAPE_SPARE_BYTES ((size_t)32 << 20) /* a bigger tape gives its buffers back */
static _Thread_local nb_tape_buffers tl_spares[TAPE_SPARES];
static _Thread_local int tl_n_spares;

static size_t buffers_bytes(const nb_tape_buffers *b)
{
    size_t bytes = b->watched.cap * (sizeof *b->watched.keys + sizeof *b->watched.vals) +
                   b->cap_nodes * sizeof *b->nodes + b->cap_reads * sizeof *b->reads;
    for (const nb_arena_chunk *c = b->arena; c; c = c->next)
        bytes += sizeof *c + c->size;
    return bytes;
}

static void buffers_free(nb_tape_buffers *b)
{
    nb__idmap_free(&b->watched);
    free(b->nodes);
    for (nb_arena_chunk *c = b->arena, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(b->reads);
    *b = (nb_tape_buffers){0};
}

/* Frees the calling thread's spare buffers (at its exit: nb__thread_exit_hook). */
static void spares_drain(void)
{
    while (tl_n_spares > 0)
        buffers_free(&tl_spares[--tl_n_spares]);
}

static pthread_once_t g_spares_once = PTHREAD_ONCE_INIT;
static bool g_spares_hooked;
static void spares_hook(void) { g_spares_hooked = nb__thread_exit_hook(spares_drain); }

/* Keeps b, emptied, for the thread's next tape, or frees it. */
static void buffers_keep(nb_tape_buffers *b)
{
    pthread_once(&g_spares_once, spares_hook);
    if (!g_spares_hooked || tl_n_spares == TAPE_SPARES || buffers_bytes(b) > TAPE_SPARE_BYTES) {
        buffers_free(b);
        return;
    }
    if (b->watched.cap)
        memset(b->watched.keys, 0, b->watched.cap * sizeof *b->watched.keys);
    b->watched.n = 0;
    for (nb_arena_chunk *c = b->arena; c; c = c->next)
        c->used = 0;
    nb__thread_track();
    tl_spares[tl_n_spares++] = *b;
}

static void recount_active(void)
{
    int n = 0;
    for (int i = 0; i < tl_depth; i++)
        n += !tl_stack[i]->paused;
    nb__recording_set_active(n);
}

void nb__tapes_set_aside(nb_tapes_aside *out)
{
    memcpy(out->stack, tl_stack, sizeof tl_stack);
    out->depth = tl_depth;
    out->active = nb__recording_active();
    out->pause_depth = nb__recording_pause_depth();
    tl_depth = 0;
    nb__recording_set_active(0);
    nb__recording_set_pause_depth(0);
}

void nb__tapes_restore(const nb_tapes_aside *in)
{
    memcpy(tl_stack, in->stack, sizeof tl_stack);
    tl_depth = in->depth;
    nb__recording_set_active(in->active);
    nb__recording_set_pause_depth(in->pause_depth);
}

static void tape_destroy_from_scope(void *tape);
static nb_status tape_record(const nb_op_def *op, int n_in, const nb_tensor *const *inputs, int n_out,
                             nb_tensor *const *outputs, const nb_op_attrs *attrs);

static nb_tape *tape_begin(bool persistent, const char *who)
{
    if (tl_depth == NB_TAPE_STACK_MAX)
        return nb__fail_null(NB_ERR_TAPE, "%s: more than %d tapes are open", who, NB_TAPE_STACK_MAX);
    nb_tape *t = calloc(1, sizeof *t);
    if (!t)
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    if (tl_n_spares > 0)
        t->buf = tl_spares[--tl_n_spares];
    nb__recorder_install(tape_record);
    t->persistent = persistent;
    t->on_stack = true;
    t->owner = nb__scope_adopt(t, tape_destroy_from_scope);
    tl_stack[tl_depth++] = t;
    recount_active();
    return t;
}

nb_tape *nb_tape_begin(void) { return tape_begin(false, "nb_tape_begin"); }
nb_tape *nb_tape_begin_persistent(void) { return tape_begin(true, "nb_tape_begin_persistent"); }

void nb__tape_unlink(nb_tape *tape)
{
    for (int i = 0; i < tl_depth; i++) {
        if (tl_stack[i] == tape) {
            memmove(tl_stack + i, tl_stack + i + 1, sizeof *tl_stack * (size_t)(tl_depth - i - 1));
            tl_depth--;
            break;
        }
    }
    tape->on_stack = false;
    recount_active();
}

nb_status nb_tape_stop(nb_tape *tape)
{
    if (!tape)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_tape_stop: tape is NULL");
    nb__tape_unlink(tape);
    return NB_OK;
}

/* Pauses or resumes tape for who (the public function, for the message).
 * Returns NB_OK, or NB_ERR_INVALID_ARGUMENT when tape is NULL. */
static nb_status set_paused(const char *who, nb_tape *tape, bool paused)
{
    if (!tape)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: tape is NULL", who);
    tape->paused = paused;
    recount_active();
    return NB_OK;
}

nb_status nb_tape_pause(nb_tape *tape) { return set_paused("nb_tape_pause", tape, true); }

nb_status nb_tape_resume(nb_tape *tape) { return set_paused("nb_tape_resume", tape, false); }

void nb__tape_node_release(nb_node *n)
{
    for (int k = 0; k < n->n_in; k++) {
        nb__release(n->in[k]);
        n->in[k] = NULL;
    }
    for (int k = 0; k < n->n_out; k++) {
        nb__release(n->out[k]);
        n->out[k] = NULL;
    }
}

void nb__tape_clear_nodes(nb_tape *tape)
{
    for (size_t i = 0; i < tape->n_nodes; i++)
        nb__tape_node_release(&tape->buf.nodes[i]);
    tape->n_nodes = 0;
    for (nb_arena_chunk *c = tape->buf.arena; c; c = c->next)
        c->used = 0;
}

static void tape_destroy(nb_tape *tape)
{
    nb__tape_unlink(tape);
    nb__tape_clear_nodes(tape);
    buffers_keep(&tape->buf);
    free(tape);
}

/* Called by the owning scope as it ends. */
static void tape_destroy_from_scope(void *tape) { tape_destroy(tape); }

void nb_tape_free(nb_tape *tape)
{
    if (!tape)
        return;
    nb__scope_forget(tape->owner, tape);
    tape_destroy(tape);
}

static nb_status watch_id(nb_tape *tape, uint64_t id, const char *who)
{
    if (!nb__idmap_put(&tape->buf.watched, id, tape))
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    return NB_OK;
}

nb_status nb_tape_watch(nb_tape *tape, const nb_tensor *t)
{
    if (!tape)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_tape_watch: tape is NULL");
    if (!t)
        return nb_error() ? nb_error() : nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_tape_watch: tensor is NULL");
    if (!nb__is_floating(t->dtype))
        return nb__fail(NB_ERR_DTYPE, "nb_tape_watch: cannot watch a %s tensor: only floating dtypes have gradients",
                        nb_dtype_name(t->dtype));
    return watch_id(tape, t->id, "nb_tape_watch");
}

nb_status nb__tape_note_read(nb_tape *tape, const void *key, const nb_tensor *t)
{
    if (tape->n_reads == tape->buf.cap_reads) {
        size_t cap = tape->buf.cap_reads ? tape->buf.cap_reads * 2 : 16;
        nb_tape_read *r = realloc(tape->buf.reads, sizeof *r * cap);
        if (!r)
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_read: out of host memory");
        tape->buf.reads = r;
        tape->buf.cap_reads = cap;
    }
    tape->buf.reads[tape->n_reads++] = (nb_tape_read){key, t->id};
    return watch_id(tape, t->id, "nb_read");
}

void nb__tape_watch_read(const void *key, const nb_tensor *t)
{
    if (!nb__tape_recording() || !nb__is_floating(t->dtype))
        return;
    for (int i = 0; i < tl_depth; i++)
        if (!tl_stack[i]->paused)
            nb__tape_note_read(tl_stack[i], key, t);
}

uint64_t nb__tape_read_id(const nb_tape *tape, const void *key)
{
    if (tape)
        for (size_t r = tape->n_reads; r-- > 0;)
            if (tape->buf.reads[r].key == key)
                return tape->buf.reads[r].id;
    return 0;
}

static void *arena_alloc(nb_tape *tape, size_t bytes)
{
    bytes = (bytes + 15) & ~(size_t)15;
    nb_arena_chunk *c = tape->buf.arena;
    for (; c; c = c->next)
        if (c->size - c->used >= bytes)
            break;
    if (!c) {
        size_t size = bytes > 65536 ? bytes : 65536;
        c = malloc(sizeof *c + size);
        if (!c)
            return NULL;
        c->size = size;
        c->used = 0;
        c->next = tape->buf.arena;
        tape->buf.arena = c;
    }
    void *p = c->data + c->used;
    c->used += bytes;
    return p;
}

static nb_status record_on(nb_tape *tape, const nb_op_def *op, int n_in, const nb_tensor *const *inputs,
                           int n_out, nb_tensor *const *outputs, const nb_op_attrs *attrs)
{
    if (tape->n_nodes == tape->buf.cap_nodes) {
        size_t cap = tape->buf.cap_nodes ? tape->buf.cap_nodes * 2 : 64;
        nb_node *nodes = realloc(tape->buf.nodes, sizeof *nodes * cap);
        if (!nodes)
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory while recording", op->name);
        tape->buf.nodes = nodes;
        tape->buf.cap_nodes = cap;
    }
    size_t k = (size_t)(n_in + n_out);
    nb_tensor **ptrs = arena_alloc(tape, k * sizeof(nb_tensor *));
    uint64_t *ids = arena_alloc(tape, k * sizeof(uint64_t));
    if (!ptrs || !ids)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory while recording", op->name);
    nb_node *n = &tape->buf.nodes[tape->n_nodes];
    n->op = op;
    n->n_in = n_in;
    n->n_out = n_out;
    n->in = ptrs;
    n->out = ptrs + n_in;
    n->in_ids = ids;
    n->out_ids = ids + n_in;
    if (attrs)
        n->attrs = *attrs;
    for (int i = 0; i < n_in; i++) {
        n->in[i] = (nb_tensor *)inputs[i];
        nb__retain(n->in[i]);
        n->in_ids[i] = inputs[i] ? inputs[i]->id : 0;
    }
    for (int i = 0; i < n_out; i++) {
        n->out[i] = outputs[i];
        nb__retain(outputs[i]);
        n->out_ids[i] = outputs[i]->id;
        if (nb__is_floating(outputs[i]->dtype) && !nb__idmap_put(&tape->buf.watched, outputs[i]->id, tape))
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory while recording", op->name);
    }
    tape->n_nodes++;
    return NB_OK;
}

/* The recorder nb__record calls (installed by tape_begin) while a tape records. */
static nb_status tape_record(const nb_op_def *op, int n_in, const nb_tensor *const *inputs, int n_out,
                             nb_tensor *const *outputs, const nb_op_attrs *attrs)
{
    bool any_float = false;
    for (int i = 0; i < n_out; i++)
        any_float |= nb__is_floating(outputs[i]->dtype);
    if (!any_float)
        return NB_OK;
    for (int d = 0; d < tl_depth; d++) {
        nb_tape *tape = tl_stack[d];
        if (tape->paused)
            continue;
        bool watched = false;
        for (int i = 0; i < n_in && !watched; i++)
            watched = inputs[i] && nb__idmap_has(&tape->buf.watched, inputs[i]->id);
        if (watched) {
            nb_status st = record_on(tape, op, n_in, inputs, n_out, outputs, attrs);
            if (st)
                return st;
        }
    }
    return NB_OK;
}
