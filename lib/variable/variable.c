/* Variables: named, mutable tensors that live until freed.
 *
 * A variable owns one contiguous tensor (a plain reference, in no scope). nb_read
 * hands that same tensor out with a new reference, so reading costs nothing. A
 * read is a snapshot: before an assignment or an optimizer update writes the
 * value, the writer checks whether anyone else holds the tensor or a view of its
 * storage; if so the variable moves to a fresh tensor (copy-on-write) and the
 * tensors already read keep their values. Otherwise it is updated in place.
 * Nothing here is recorded on tapes.
 *
 * A mirrored variable (made by a mirrored strategy) has no value of its own: it
 * holds one plain variable per replica, all made from one initial value. Reads
 * and the internal accessors go to the copy of the replica the calling thread
 * runs (lib/core/replica.c), or to copy 0 outside any replica; assignments write
 * every copy, so they stay equal. */
#include "variable_impl.h"

#include "lib/core/backend.h"
#include "lib/core/capture.h"
#include "ops/op.h"
#include "tape/sources.h"

#include <stdlib.h>
#include <string.h>

struct nb_variable {
    char *name;
    bool trainable;
    nb_tensor *value; /* contiguous, offset 0, one reference held by the variable;
                         NULL for a mirrored variable */
    uint64_t uid;
    uint64_t mirror_owner; /* the strategy's id for a mirrored variable, else 0 */
    uint64_t bound_in;     /* the recording (capture id) it is bound to, while it runs */
    struct bound *bindings; /* the recorded graphs' holds on its tensors */
    int n_copies;
    nb_variable **copies;  /* one plain variable per replica */
};

/* The variable the calling thread's reads and updates of v go to. */
static inline nb_variable *local(nb_variable *v)
{
    if (!v->copies)
        return v;
    int r = nb__replica_of(v->mirror_owner);
    return v->copies[r >= 0 ? r : 0];
}
static inline const nb_variable *local_const(const nb_variable *v) { return local((nb_variable *)v); }

static atomic_uint_fast64_t g_next_uid = 1;

/* ---- creation ------------------------------------------------------------------- */

/* A plain variable, not registered (the copies of a mirrored variable). */
static nb_variable *plain_new(const char *name, const nb_tensor *initial)
{
    if (!initial) {
        if (nb_error())
            return NULL;
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "nb_variable_new: initial value of '%s' is NULL",
                             name ? name : "");
    }
    nb_variable *v = calloc(1, sizeof *v);
    char *copy = strdup(name ? name : "");
    if (!v || !copy) {
        free(v);
        free(copy);
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "nb_variable_new: out of host memory");
    }
    nb_device *dev = initial->device;
    nb_tensor *t = nb__tensor_new("nb_variable_new", dev, initial->dtype, initial->ndim, initial->shape);
    if (!t) {
        free(v);
        free(copy);
        return NULL;
    }
    nb_view out = nb__view(t), in = nb__view(initial);
    if (dev->backend->copy(dev, &out, &in) != NB_OK) {
        nb__release(t);
        free(v);
        free(copy);
        return NULL;
    }
    v->name = copy;
    v->trainable = true;
    v->value = t;
    v->uid = atomic_fetch_add_explicit(&g_next_uid, 1, memory_order_relaxed);
    return v;
}

nb_variable *nb_variable_new(const char *name, const nb_tensor *initial)
{
    if (nb__capture_check(NULL, "nb_variable_new", "making a variable"))
        return NULL;
    nb_variable *v = plain_new(name, initial);
    if (v && nb__variable_register(v, "nb_variable_new") != NB_OK) {
        nb_variable_free(v);
        return NULL;
    }
    return v;
}

void nb_variable_free(nb_variable *v)
{
    if (!v)
        return;
    nb__variable_unregister(v);
    for (int i = 0; i < v->n_copies; i++)
        nb_variable_free(v->copies[i]);
    free(v->copies);
    nb__release(v->value);
    free(v->name);
    free(v);
}

nb_variable *nb__variable_mirrored_new(uint64_t owner, const char *name, int n, nb_device *const *devices,
                                       const nb_tensor *initial, const char *who)
{
    if (!initial)
        return nb_error() ? NULL
                          : nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: initial value of '%s' is NULL", who,
                                          name ? name : "");
    nb_variable *v = calloc(1, sizeof *v);
    char *copy = strdup(name ? name : "");
    nb_variable **copies = calloc((size_t)n, sizeof *copies);
    if (!v || !copy || !copies) {
        free(v);
        free(copy);
        free(copies);
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    }
    v->name = copy;
    v->trainable = true;
    v->uid = atomic_fetch_add_explicit(&g_next_uid, 1, memory_order_relaxed);
    v->mirror_owner = owner;
    v->copies = copies;
    /* Every copy comes from the one initial value, so all start equal. */
    int token = nb__tapes_pause();
    nb_scope *scope = nb_scope_begin();
    for (int r = 0; r < n && scope; r++) {
        const nb_tensor *src = initial->device == devices[r] ? initial : nb__copy_to_device(initial, devices[r]);
        if (!src || !(v->copies[r] = plain_new(copy, src)))
            break;
        v->n_copies++;
    }
    if (scope)
        nb_scope_end(scope);
    nb__tapes_resume(token);
    if (v->n_copies < n) {
        nb_variable_free(v);
        return nb_error() ? NULL : nb__fail_null(NB_ERR_INTERNAL, "%s: could not copy '%s' to every replica", who, name);
    }
    if (nb__variable_register(v, who) != NB_OK) {
        nb_variable_free(v);
        return NULL;
    }
    return v;
}

int nb_variable_replicas(const nb_variable *v) { return v ? v->n_copies : 0; }

uint64_t nb__variable_mirror_owner(const nb_variable *v) { return v ? v->mirror_owner : 0; }

nb_variable *nb__variable_copy(nb_variable *v, int r)
{
    if (!v || !v->copies)
        return v;
    return r >= 0 && r < v->n_copies ? v->copies[r] : NULL;
}

static void bind_to_recording(nb_variable *v);

/* ---- reading -------------------------------------------------------------------- */

nb_tensor *nb_read(nb_variable *v)
{
    if (!v)
        return nb__null_input("nb_read", 0);
    nb_variable *lv = local(v);
    bind_to_recording(lv);
    nb_tensor *t = lv->value;
    nb__retain(t);
    if (!nb__own(t))
        return NULL;
    if (v->trainable && nb__is_floating(t->dtype))
        nb__tape_watch_read(v, t);
    return t;
}

/* ---- accessors ------------------------------------------------------------------ */

const char *nb_variable_name(const nb_variable *v) { return v ? v->name : NULL; }

bool nb_variable_trainable(const nb_variable *v) { return v && v->trainable; }

void nb_variable_set_trainable(nb_variable *v, bool trainable)
{
    if (!v)
        return;
    v->trainable = trainable;
    for (int i = 0; i < v->n_copies; i++)
        v->copies[i]->trainable = trainable;
}

nb_shape nb_variable_shape(const nb_variable *v)
{
    nb_shape s = {0, {0}};
    if (!v)
        return s;
    const nb_tensor *t = local_const(v)->value;
    s.ndim = t->ndim;
    memcpy(s.dims, t->shape, sizeof(int64_t) * (size_t)s.ndim);
    return s;
}

nb_dtype nb_variable_dtype(const nb_variable *v) { return v ? local_const(v)->value->dtype : NB_F32; }

const char *nb_variable_device(const nb_variable *v) { return v ? local_const(v)->value->device->name : NULL; }

uint64_t nb__variable_uid(const nb_variable *v) { return v ? local_const(v)->uid : 0; }

/* No binding here: it also serves to look at a variable's dtype and shape
 * (a mirrored step's bucket plan reads replica 0's copies from any replica's
 * thread); reads and writes of the values bind (nb_read, the update target,
 * assignments). */
nb_tensor *nb__variable_value(nb_variable *v) { return v ? local(v)->value : NULL; }

/* ---- copy-on-write -------------------------------------------------------------- */

static int graph_holds(const nb_variable *v, const nb_tensor *t);

/* True when a tensor read from v's value t, or a view of its storage, is
 * alive: a reference other than v's own and its graphs' (which replay into t
 * whatever it holds, so an update may write it in place). */
static bool value_shared(const nb_variable *v, const nb_tensor *t)
{
    return atomic_load(&t->refs) > 1 + graph_holds(v, t) || atomic_load(&t->storage->refs) > 1;
}

/* A recorded update that writes a shared value in place (capture.h): a tensor
 * over a new storage sharing cur's memory, which holds cur's storage until it
 * goes; commit makes it the value and marks cur's storage stale. */
static void alias_release(void *ctx) { nb__storage_release(ctx); }

/* The storage that owns the memory of t's: an alias's original. */
static nb_storage *root_storage(const nb_tensor *t)
{
    return t->storage->release == alias_release ? t->storage->release_ctx : t->storage;
}

/* Whether t is an alias over cur's memory (cur itself may be one). */
static bool is_alias_of(const nb_tensor *t, const nb_tensor *cur)
{
    return t->storage->release == alias_release && t->storage->release_ctx == (void *)root_storage(cur);
}

static nb_tensor *in_place_alias(const nb_tensor *cur)
{
    nb_storage *s = root_storage(cur); /* a second update's alias too, so that is_alias_of holds */
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    nb_storage *a = nb__storage_wrap(cur->device, s->data, s->nbytes, alias_release, s);
    if (!a) {
        nb__storage_release(s);
        return NULL;
    }
    return nb__tensor_on_storage(a, cur->dtype, cur->ndim, cur->shape, cur->strides, cur->offset);
}

nb_tensor *nb__variable_update_target(nb_variable *v, const char *who)
{
    if (!v)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: variable is NULL", who);
    nb_variable *lv = local(v);
    bind_to_recording(lv); /* written in place, or moved by set_value */
    nb_tensor *cur = lv->value;
    if (!value_shared(lv, cur))
        return cur;
    nb__capture *c = nb__capture_current();
    if (nb__capture_in_place(c) && lv->bound_in == nb__capture_id(c))
        return in_place_alias(cur);
    return nb__tensor_new(who, cur->device, cur->dtype, cur->ndim, cur->shape);
}

bool nb__variable_target_in_place(nb_variable *v, const nb_tensor *t)
{
    return v && t && is_alias_of(t, local(v)->value);
}

/* ---- bound to a recorded step ----------------------------------------------------
 * A replay reads and writes a variable where the recording first found it:
 * that tensor is bound to the graph (the hook holds a reference). An update
 * recorded while a read holds the value writes that memory in place through
 * a second storage over it (nb__variable_update_target), so going back costs
 * nothing. A variable that moves to a fresh tensor during the recording (an
 * assignment while a read held it, or an update of a recording that may not
 * write in place) goes back to it when the recording ends, its new value
 * copied there by the last recorded kernel; one that moved between replays (an eager update while a
 * read held its value, an assignment) goes back to it before the next replay,
 * its value copied there first, on the device's stream, so the replay starts
 * from the value eager code left. */

typedef struct bound {
    nb_variable *v;
    nb_tensor *rec; /* the tensor the recording reads and writes (a reference) */
    struct bound *next; /* v's next binding */
} bound;

/* How many of v's graphs hold t. */
static int graph_holds(const nb_variable *v, const nb_tensor *t)
{
    int n = 0;
    for (const bound *b = v->bindings; b; b = b->next)
        n += b->rec == t;
    return n;
}

/* v's value goes back to b->rec, now's values copied there first when keep. */
static void go_back(bound *b, bool keep)
{
    nb_tensor *now = b->v->value;
    if (now == b->rec)
        return;
    if (keep && !is_alias_of(now, b->rec)) { /* an alias: the memory holds the values already */
        nb_device *dev = now->device;
        nb_view dst = nb__view(b->rec), src = nb__view(now);
        if (dev->backend->copy(dev, &dst, &src) != NB_OK)
            nb__log(NB_LOG_WARNING, "graph: variable '%s' could not be copied to its recorded tensor on %s: %s",
                    b->v->name, dev->name, nb_error_message());
    }
    nb__retain(b->rec);
    b->v->value = b->rec;
    nb__release(now);
}

static void bound_end(void *ctx, bool kept)
{
    bound *b = ctx;
    b->v->bound_in = 0;
    go_back(b, kept);
}

static void bound_before_replay(void *ctx, double *params)
{
    (void)params;
    go_back(ctx, true);
}

/* The graph goes (its variables outlive it, nabla/graph.h). */
static void bound_release(void *ctx)
{
    bound *b = ctx;
    for (bound **p = &b->v->bindings; *p; p = &(*p)->next)
        if (*p == b) {
            *p = b->next;
            break;
        }
    nb__release(b->rec);
    free(b);
}

/* v (plain) is read or written on the calling thread: inside a recording, the
 * first time, its value is bound to the recording. A failure fails the
 * recording (its error is recorded). */
static void bind_to_recording(nb_variable *v)
{
    nb__capture *c = nb__capture_current();
    if (!nb__capture_recording(c) || v->bound_in == nb__capture_id(c))
        return;
    bound *b = malloc(sizeof *b);
    static const nb__capture_hooks hooks = {
        .at_end = bound_end, .before_replay = bound_before_replay, .release = bound_release};
    if (!b) {
        nb__capture_fail(c, nb__fail(NB_ERR_OUT_OF_MEMORY, "graph capture: out of host memory binding variable '%s'",
                                     v->name));
        return;
    }
    nb__retain(v->value);
    *b = (bound){v, v->value, v->bindings};
    v->bindings = b;
    if (nb__capture_hook(c, &hooks, b) == NB_OK) /* else released: the recording fails */
        v->bound_in = nb__capture_id(c);
}

/* v (plain) takes t as its value, releasing the old one (which a recording
 * running on the calling thread keeps). */
static void set_value(nb_variable *v, nb_tensor *t)
{
    bind_to_recording(v);
    nb__release(v->value);
    v->value = t;
}

void nb__variable_commit(nb_variable *v, nb_tensor *t)
{
    v = local(v);
    if (t == v->value)
        return;
    if (is_alias_of(t, v->value)) /* a failure fails the recording */
        (void)nb__capture_mark_stale(nb__capture_current(), v->value->storage);
    set_value(v, t);
}

/* ---- assignment ----------------------------------------------------------------- */

typedef enum { ASSIGN_SET, ASSIGN_ADD, ASSIGN_SUB } assign_kind;

static nb_status assign(nb_variable *v, const nb_tensor *value, assign_kind kind, const char *who);

/* Writes every copy of a mirrored variable; the checks run on copy 0 first so a
 * bad value changes none of them. */
static nb_status assign_mirrored(nb_variable *v, const nb_tensor *value, assign_kind kind, const char *who)
{
    if (nb__replica_strategy() == v->mirror_owner)
        return nb__fail(NB_ERR_INVALID_ARGUMENT,
                        "%s: mirrored variable '%s' cannot be assigned inside a replica function (the "
                        "replicas would race); assign it between steps", who, v->name);
    for (int r = 0; r < v->n_copies; r++) {
        nb_status st = assign(v->copies[r], value, kind, who);
        if (st)
            return st;
    }
    return NB_OK;
}

static nb_status assign(nb_variable *v, const nb_tensor *value, assign_kind kind, const char *who)
{
    if (!v)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: variable is NULL", who);
    if (!value)
        return nb_error() ? nb_error()
                          : nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: value for variable '%s' is NULL", who, v->name);
    if (v->copies)
        return assign_mirrored(v, value, kind, who);
    bind_to_recording(v); /* written in place, or moved by set_value */
    nb_tensor *cur = v->value;
    bool same_shape = nb__same_shape(value, cur);
    if (!same_shape || value->dtype != cur->dtype) {
        char sv[NB_SHAPE_STR_MAX], sx[NB_SHAPE_STR_MAX];
        return nb__fail(!same_shape ? NB_ERR_SHAPE : NB_ERR_DTYPE, "%s: variable '%s' is %s %s, value is %s %s", who,
                        v->name, nb_dtype_name(cur->dtype), nb__shape_str(cur->ndim, cur->shape, sv, sizeof sv),
                        nb_dtype_name(value->dtype), nb__shape_str(value->ndim, value->shape, sx, sizeof sx));
    }

    nb_device *dev = cur->device;
    const nb_backend *be = dev->backend;
    nb_status st = NB_OK;
    int token = nb__tapes_pause();
    nb_scope *scope = NULL;
    const nb_tensor *src = value;
    if (value->device != dev) {
        /* The copy is an op owned by a scope: keep it in one of our own. */
        scope = nb_scope_begin();
        src = scope ? nb__copy_to_device(value, dev) : NULL;
        if (!src) {
            st = nb_error() ? nb_error()
                            : nb__fail(NB_ERR_INTERNAL, "%s: could not copy the value for '%s' from %s to %s", who,
                                       v->name, value->device->name, dev->name);
            goto done;
        }
    }

    /* A plain assignment writes into the variable's own tensor unless a read
     * still holds it. Add and sub always write a fresh tensor: the binary kernel
     * may not alias its output with an input (its pointers are restrict), and
     * the traffic is the same either way. */
    bool fresh = kind != ASSIGN_SET || value_shared(v, cur);
    nb_tensor *out = fresh ? nb__tensor_new(who, dev, cur->dtype, cur->ndim, cur->shape) : cur;
    if (!out) {
        st = nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
        goto done;
    }
    nb_view ov = nb__view(out), sv = nb__view(src);
    if (kind == ASSIGN_SET) {
        st = be->copy(dev, &ov, &sv);
    } else {
        nb_view cv = nb__view(cur);
        st = be->binary(dev, kind == ASSIGN_ADD ? NB_BIN_ADD : NB_BIN_SUB, &ov, &cv, &sv);
    }
    if (out != cur) {
        if (st == NB_OK) {
            set_value(v, out);
        } else {
            nb__release(out);
        }
    }
done:
    if (scope)
        nb_scope_end(scope);
    nb__tapes_resume(token);
    return st;
}

nb_status nb_variable_assign(nb_variable *v, const nb_tensor *value)
{
    return assign(v, value, ASSIGN_SET, "nb_variable_assign");
}

nb_status nb_variable_assign_add(nb_variable *v, const nb_tensor *value)
{
    return assign(v, value, ASSIGN_ADD, "nb_variable_assign_add");
}

nb_status nb_variable_assign_sub(nb_variable *v, const nb_tensor *value)
{
    return assign(v, value, ASSIGN_SUB, "nb_variable_assign_sub");
}
