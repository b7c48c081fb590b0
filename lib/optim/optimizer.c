/* Optimizers: SGD, SGD with (Nesterov) momentum, Adam and AdamW.
 *
 * An optimizer keeps its hyper-parameters, the number of apply calls, and per
 * variable its slot tensors (the momentum buffer, or Adam's m and v), allocated
 * zero-filled on the variable's device the first time the variable is updated.
 * Slots are keyed on the variable's unique id, never on its address (a freed
 * variable's address may come back for a new one). The update itself is one
 * fused kernel of the variable's device: in place, or out of place into a fresh
 * buffer when a read still holds the value (see nb__variable_update_target).
 * Nothing is recorded on tapes.
 *
 * A mirrored variable is updated copy by copy with the same gradient and one
 * step count, and each copy keeps its own slots on its own device. The mirrored
 * strategy drives the same machinery in three parts (optimizer_impl.h): slots
 * are made first on one thread, then each replica updates its own copies
 * concurrently, then the iteration is counted once.
 *
 * Under a loss scaler, a captured step's update may be skipped on the device
 * (its gradients were not finite), which the host learns only by reading
 * back: there the count of applied updates lives on the device (dev_count),
 * advanced by the scaler's kernel, and is read back when the host next asks
 * for it (iterations_now). */
#include "optimizer_impl.h"

#include "lib/core/backend.h"
#include "lib/core/capture.h"
#include "lib/variable/variable_impl.h"
#include "ops/op.h"
#include "lib/core/recording.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef enum opt_kind { OPT_SGD, OPT_MOMENTUM, OPT_ADAM } opt_kind;

typedef struct slot_entry {
    uint64_t uid; /* 0: empty */
    nb_tensor *s1, *s2;
} slot_entry;

struct nb_optimizer {
    opt_kind kind;
    const char *kind_name; /* "sgd", "momentum", "adam", "adamw" */
    nb_update_params params;
    int64_t iterations;
    nb_tensor *dev_count;  /* NULL, or f64 [1]: the count on the device of a loss scaler's captured step */
    bool count_newer;      /* dev_count holds updates iterations lacks (replays ran) */
    bool count_stale;      /* iterations changed since dev_count was written */
    uint64_t recorded_in;  /* the recording (capture id) its last recorded update belongs to */
    int recorded_updates;  /* updates recorded in it so far */
    slot_entry *slots; /* open addressing on uid; capacity a power of two */
    size_t cap, count;
};

/* ---- construction --------------------------------------------------------------- */

static bool check_rate(const char *who, double lr)
{
    if (lr >= 0 && isfinite(lr))
        return true;
    nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: learning rate is %g; expected a finite value >= 0", who, lr);
    return false;
}

static bool check_nonneg(const char *who, const char *what, double x)
{
    if (x >= 0 && isfinite(x))
        return true;
    nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s is %g; expected a finite value >= 0", who, what, x);
    return false;
}

static bool check_beta(const char *who, const char *what, double b)
{
    if (b >= 0 && b < 1)
        return true;
    nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s is %g; expected a value in [0, 1)", who, what, b);
    return false;
}

static nb_optimizer *optimizer_new(const char *who, opt_kind kind, const char *kind_name, nb_update_params p)
{
    nb_optimizer *opt = calloc(1, sizeof *opt);
    if (!opt)
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    opt->kind = kind;
    opt->kind_name = kind_name;
    opt->params = p;
    return opt;
}

nb_optimizer *nb_sgd_new(double learning_rate)
{
    const char *who = "nb_sgd_new";
    if (!check_rate(who, learning_rate))
        return NULL;
    return optimizer_new(who, OPT_SGD, "sgd", (nb_update_params){.lr = learning_rate});
}

nb_optimizer *nb_sgd_momentum_new(double learning_rate, double momentum, bool nesterov)
{
    const char *who = "nb_sgd_momentum_new";
    if (!check_rate(who, learning_rate) || !check_nonneg(who, "momentum", momentum))
        return NULL;
    return optimizer_new(who, OPT_MOMENTUM, "momentum",
                         (nb_update_params){.lr = learning_rate, .momentum = momentum, .nesterov = nesterov});
}

static nb_optimizer *adam_new(const char *who, const char *kind_name, double lr, double beta1, double beta2, double epsilon,
                              double weight_decay)
{
    if (!check_rate(who, lr) || !check_beta(who, "beta1", beta1) || !check_beta(who, "beta2", beta2) ||
        !check_nonneg(who, "epsilon", epsilon) || !check_nonneg(who, "weight decay", weight_decay))
        return NULL;
    return optimizer_new(who, OPT_ADAM, kind_name,
                         (nb_update_params){.lr = lr, .beta1 = beta1, .beta2 = beta2, .epsilon = epsilon,
                                            .weight_decay = weight_decay});
}

nb_optimizer *nb_adam_new(double learning_rate, double beta1, double beta2, double epsilon)
{
    return adam_new("nb_adam_new", "adam", learning_rate, beta1, beta2, epsilon, 0.0);
}

nb_optimizer *nb_adamw_new(double learning_rate, double beta1, double beta2, double epsilon, double weight_decay)
{
    return adam_new("nb_adamw_new", "adamw", learning_rate, beta1, beta2, epsilon, weight_decay);
}

void nb_optimizer_free(nb_optimizer *opt)
{
    if (!opt)
        return;
    for (size_t i = 0; i < opt->cap; i++) {
        nb__release(opt->slots[i].s1);
        nb__release(opt->slots[i].s2);
    }
    free(opt->slots);
    nb__release(opt->dev_count);
    free(opt);
}

/* The count of applied updates, read back first where the device's is newer
 * (which waits for it). When the read fails, the host's count and the error. */
static int64_t iterations_now(nb_optimizer *opt)
{
    if (opt->count_newer) {
        double v = 0;
        nb_device *dev = opt->dev_count->device;
        if (dev->backend->copy_to_host(dev, &v, nb__data(opt->dev_count), sizeof v) == NB_OK) {
            opt->iterations = (int64_t)v;
            opt->count_newer = false;
        }
    }
    return opt->iterations;
}

static void set_iterations(nb_optimizer *opt, int64_t n)
{
    opt->iterations = n;
    opt->count_newer = false;
    opt->count_stale = true;
}

/* ---- settings ------------------------------------------------------------------- */

nb_status nb_optimizer_set_learning_rate(nb_optimizer *opt, double learning_rate)
{
    const char *who = "nb_optimizer_set_learning_rate";
    if (!opt)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: optimizer is NULL", who);
    if (!check_rate(who, learning_rate))
        return NB_ERR_INVALID_ARGUMENT;
    opt->params.lr = learning_rate;
    return NB_OK;
}

double nb_optimizer_learning_rate(const nb_optimizer *opt) { return opt ? opt->params.lr : NAN; }

int64_t nb_optimizer_iterations(const nb_optimizer *opt)
{
    return opt ? iterations_now((nb_optimizer *)opt) : 0; /* the read-back is a cache's refresh */
}

/* ---- slots ---------------------------------------------------------------------- */

static size_t slot_hash(uint64_t uid, size_t cap)
{
    uid *= 0x9E3779B97F4A7C15ull; /* Fibonacci hashing spreads consecutive ids */
    return (size_t)(uid >> 32) & (cap - 1);
}

static slot_entry *slot_lookup(slot_entry *table, size_t cap, uint64_t uid)
{
    for (size_t i = slot_hash(uid, cap);; i = (i + 1) & (cap - 1))
        if (table[i].uid == uid || table[i].uid == 0)
            return &table[i];
}

/* The entry for uid, inserted (with no slots yet) when absent; NULL on no memory. */
static slot_entry *slot_entry_for(nb_optimizer *opt, uint64_t uid, const char *who)
{
    if (opt->cap) {
        slot_entry *e = slot_lookup(opt->slots, opt->cap, uid);
        if (e->uid == uid)
            return e;
    }
    if (2 * (opt->count + 1) > opt->cap) {
        size_t cap = opt->cap ? 2 * opt->cap : 16;
        slot_entry *table = calloc(cap, sizeof *table);
        if (!table)
            return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
        for (size_t i = 0; i < opt->cap; i++)
            if (opt->slots[i].uid)
                *slot_lookup(table, cap, opt->slots[i].uid) = opt->slots[i];
        free(opt->slots);
        opt->slots = table;
        opt->cap = cap;
    }
    slot_entry *e = slot_lookup(opt->slots, opt->cap, uid);
    e->uid = uid;
    opt->count++;
    return e;
}

/* A zero-filled tensor like t (contiguous, on t's device, not scoped). */
static nb_tensor *zeros_like_value(const nb_tensor *t)
{
    nb_tensor *z = nb__tensor_new("nb_optimizer_apply", t->device, t->dtype, t->ndim, t->shape);
    if (!z)
        return NULL;
    nb_view zv = nb__view(z);
    if (t->device->backend->fill(t->device, &zv, 0.0) != NB_OK) {
        nb__release(z);
        return NULL;
    }
    return z;
}

/* Makes sure the variable's slots exist (or with create false, that they do:
 * the table is then only read, so replicas may call it at once); returns the
 * entry or NULL. */
static slot_entry *slots_for(nb_optimizer *opt, nb_variable *v, bool create, const char *who)
{
    static slot_entry none;
    if (opt->kind == OPT_SGD)
        return &none;
    if (!create) {
        slot_entry *e = opt->cap ? slot_lookup(opt->slots, opt->cap, nb__variable_uid(v)) : NULL;
        if (!e || e->uid != nb__variable_uid(v) || !e->s1 || (opt->kind == OPT_ADAM && !e->s2))
            return nb__fail_null(NB_ERR_INTERNAL, "%s: the slots of '%s' were not prepared", who,
                                 nb_variable_name(v));
        return e;
    }
    slot_entry *e = slot_entry_for(opt, nb__variable_uid(v), who);
    if (!e)
        return NULL;
    const nb_tensor *value = nb__variable_value(v);
    int need = opt->kind == OPT_ADAM ? 2 : opt->kind == OPT_MOMENTUM ? 1 : 0;
    if (((need >= 1 && !e->s1) || (need >= 2 && !e->s2)) && nb__capture_recording(nb__capture_current()))
        return nb__fail_null(NB_ERR_UNSUPPORTED,
                             "%s: the %s slots of '%s' cannot be made while a step is recorded (a replay would zero "
                             "them again): the warm-up step makes them, so update the same variables in every step",
                             who, opt->kind_name, nb_variable_name(v));
    if (need >= 1 && !e->s1 && !(e->s1 = zeros_like_value(value)))
        return NULL;
    if (need >= 2 && !e->s2 && !(e->s2 = zeros_like_value(value)))
        return NULL;
    return e;
}

/* ---- apply ---------------------------------------------------------------------- */

/* Checks gradient i against its variable (shape, dtype, a floating variable);
 * a NULL gradient passes whatever its variable. */
static nb_status check_pair(const char *who, int i, nb_variable *v, const nb_tensor *g)
{
    if (!v)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: variable %d is NULL", who, i);
    if (!g)
        return NB_OK;
    const nb_tensor *x = nb__variable_value(v);
    const char *name = nb_variable_name(v);
    if (!nb__is_floating(x->dtype))
        return nb__fail(NB_ERR_DTYPE, "%s: variable '%s' is %s: only floating variables can be trained", who,
                        name, nb_dtype_name(x->dtype));
    bool same_shape = nb__same_shape(g, x);
    if (!same_shape || g->dtype != x->dtype) {
        char sx[NB_SHAPE_STR_MAX], sg[NB_SHAPE_STR_MAX];
        return nb__fail(!same_shape ? NB_ERR_SHAPE : NB_ERR_DTYPE, "%s: variable '%s' is %s %s, gradient %d is %s %s",
                        who, name, nb_dtype_name(x->dtype), nb__shape_str(x->ndim, x->shape, sx, sizeof sx), i,
                        nb_dtype_name(g->dtype), nb__shape_str(g->ndim, g->shape, sg, sizeof sg));
    }
    return NB_OK;
}

/* The gradient on dev, contiguous: g itself, or a copy owned by the current scope. */
static const nb_tensor *prepare_grad(const nb_tensor *g, nb_device *dev)
{
    if (g->device != dev) {
        g = nb__copy_to_device(g, dev);
        if (!g)
            return NULL;
    }
    if (g->contiguous)
        return g;
    nb_tensor *c = nb__tensor_new("nb_optimizer_apply", dev, g->dtype, g->ndim, g->shape);
    if (!c)
        return NULL;
    nb_view cv = nb__view(c), gv = nb__view(g);
    if (dev->backend->copy(dev, &cv, &gv) != NB_OK) {
        nb__release(c);
        return NULL;
    }
    return nb__own(c);
}

/* Checks the arguments of an apply and every (variable, gradient) pair. */
static nb_status check_apply(const char *who, nb_optimizer *opt, int n, nb_variable *const *vars,
                             nb_tensor *const *grads)
{
    if (!opt)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: optimizer is NULL", who);
    if (n < 0)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: n is %d", who, n);
    if (n > 0 && (!vars || !grads))
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: the %s array is NULL", who, !vars ? "variable" : "gradient");
    for (int i = 0; i < n; i++) {
        nb_status st = check_pair(who, i, vars[i], grads[i]);
        if (st)
            return st;
    }
    return NB_OK;
}

nb_status nb__optimizer_prepare(nb_optimizer *opt, int n, nb_variable *const *vars, const char *who)
{
    nb_status st = NB_OK;
    int token = nb__tapes_pause();
    for (int i = 0; i < n && !st; i++)
        if (vars[i] && !slots_for(opt, vars[i], true, who))
            st = nb_error() ? nb_error() : NB_ERR_INTERNAL;
    nb__tapes_resume(token);
    return st;
}

void nb__optimizer_advance(nb_optimizer *opt) { set_iterations(opt, iterations_now(opt) + 1); }

int64_t nb__optimizer_next_step(const nb_optimizer *opt) { return iterations_now((nb_optimizer *)opt) + 1; }

/* ---- inside a recorded step -------------------------------------------------------
 * The recording runs nothing, and a replay repeats the recorded kernels: the
 * update's numbers (the step count's bias corrections, the learning rate) come
 * from device doubles that each replay refreshes, the iteration count the
 * recording advanced is taken back when it ends, and each replay advances it
 * as an apply call does. */

typedef struct recorded_update {
    nb_optimizer *opt;
    int first;       /* its NB_UPD_COUNT doubles in the replay's array */
    int order;       /* updates of opt recorded before it in the same step */
    int64_t before;  /* opt->iterations when it was recorded */
} recorded_update;

static void recorded_fill(void *ctx, double *params)
{
    const recorded_update *r = ctx;
    nb__optimizer_pack(r->opt, iterations_now(r->opt) + 1 + r->order, params + r->first);
}

static void recorded_end(void *ctx, bool kept)
{
    (void)kept;
    recorded_update *r = ctx;
    set_iterations(r->opt, r->before); /* the hooks end in reverse: the first leaves the oldest */
}

static void recorded_advance(void *ctx)
{
    recorded_update *r = ctx;
    set_iterations(r->opt, iterations_now(r->opt) + 1);
}

/* Writes the host's count to the device's where the host's is newer. */
static nb_status push_count(nb_optimizer *opt)
{
    if (!opt->count_stale)
        return NB_OK;
    nb_device *dev = opt->dev_count->device;
    nb_view v = nb__view(opt->dev_count);
    nb_status st = dev->backend->fill(dev, &v, (double)opt->iterations);
    if (!st)
        opt->count_stale = false;
    return st;
}

/* An update under a loss scaler, before each replay: its numbers (the step
 * comes from the device's count, which the host's replaces where newer); the
 * replay then advances the device's count, or not. */
static void scaled_fill(void *ctx, double *params)
{
    const recorded_update *r = ctx;
    nb__optimizer_pack(r->opt, 1, params + r->first); /* the bias corrections are the device's */
    if (push_count(r->opt) == NB_OK)
        r->opt->count_newer = true;
}

/* The device doubles an update recorded now reads, or NULL with the error;
 * scaled: an update under a loss scaler, whose count stays on the device. */
static const double *record_update(nb_optimizer *opt, nb__capture *c, bool scaled)
{
    recorded_update *r = malloc(sizeof *r);
    if (!r)
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "nb_optimizer_apply: out of host memory");
    if (opt->recorded_in != nb__capture_id(c)) {
        opt->recorded_in = nb__capture_id(c);
        opt->recorded_updates = 0;
    }
    *r = (recorded_update){opt, 0, opt->recorded_updates, opt->iterations};
    const double *dp = nb__capture_params(c, NB_UPD_COUNT, &r->first);
    if (!dp) {
        free(r);
        return NULL;
    }
    static const nb__capture_hooks hooks = {
        .at_end = recorded_end, .before_replay = recorded_fill, .after_replay = recorded_advance, .release = free};
    static const nb__capture_hooks scaled_hooks = {.before_replay = scaled_fill, .release = free};
    if (nb__capture_hook(c, scaled ? &scaled_hooks : &hooks, r) != NB_OK)
        return NULL;
    opt->recorded_updates++;
    return dp;
}

static nb_status update_impl(nb_optimizer *opt, int n, nb_variable *const *vars, nb_tensor *const *grads,
                             int64_t step, const double *device_params, const double *skip, const double *count,
                             const char *who);

nb_status nb__optimizer_update(nb_optimizer *opt, int n, nb_variable *const *vars, nb_tensor *const *grads,
                               int64_t step, const char *who)
{
    return update_impl(opt, n, vars, grads, step, NULL, NULL, NULL, who);
}

nb_status nb__optimizer_update_at(nb_optimizer *opt, int n, nb_variable *const *vars, nb_tensor *const *grads,
                                  int64_t step, const double *device_params, const char *who)
{
    return update_impl(opt, n, vars, grads, step, device_params, NULL, NULL, who);
}

void nb__optimizer_pack(const nb_optimizer *opt, int64_t step, double out[NB_UPD_COUNT])
{
    nb_update_params p = opt->params;
    p.step = step;
    nb_update_pack(&p, out);
}

/* What variable v's update reads and writes: its param view (target, or the
 * value itself when target is NULL), its gradient's, its slots' (those its
 * optimizer keeps) and the source the values are read from (NULL: param
 * itself). The value read now: a variable listed twice sees its first update. */
static void update_views(const nb_optimizer *opt, nb_variable *v, nb_tensor *target, const nb_tensor *grad,
                         nb_view *param, nb_view *g, nb_view *s1, nb_view *s2, const void **source)
{
    nb_tensor *cur = nb__variable_value(v), *x = target ? target : cur;
    *param = nb__view(x);
    *g = nb__view(grad);
    *source = x == cur ? NULL : nb__data(cur);
    if (opt->kind == OPT_SGD)
        return;
    slot_entry *e = slot_lookup(opt->slots, opt->cap, nb__variable_uid(v));
    *s1 = nb__view(e->s1);
    if (opt->kind == OPT_ADAM)
        *s2 = nb__view(e->s2);
}

/* The updates of every variable with a gradient in one call of the device's
 * many entry, where it has one and they share it and a dtype, each listed
 * once (a GPU launches one kernel); false when they do not (nothing done:
 * the caller runs them one by one), else true with the outcome in *st.
 * targets[i]: the fresh buffer variable i's update writes, or NULL (in place);
 * committed on success. */
static bool update_many(nb_optimizer *opt, int n, nb_variable *const *vars, const nb_tensor **ready,
                        nb_tensor **targets, const nb_update_params *p, nb_status *st)
{
    nb_device *dev = NULL;
    nb_dtype dt = NB_F32;
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (!ready[i])
            continue;
        const nb_tensor *x = nb__variable_value(vars[i]);
        if (!dev)
            dev = x->device, dt = x->dtype;
        else if (x->device != dev || x->dtype != dt)
            return false;
        for (int j = 0; j < i; j++)
            if (ready[j] && vars[j] == vars[i])
                return false;
        m++;
    }
    const nb_optim_kernels *k = dev ? dev->backend->optim : NULL;
    if (m < 2 || !k || !(opt->kind == OPT_ADAM ? k->adam_update_many != NULL : k->sgd_update_many != NULL))
        return false;
    /* a step of a small model allocates nothing here */
    nb_view small_views[4 * 16];
    const void *small_sources[16];
    nb_view *views = m <= 16 ? small_views : malloc(sizeof *views * 4 * (size_t)m);
    const void **sources = m <= 16 ? small_sources : malloc(sizeof *sources * (size_t)m);
    if (!views || !sources) {
        if (views != small_views)
            free(views);
        if (sources != small_sources)
            free(sources);
        return false;
    }
    nb_view *pv = views, *gv = views + m, *s1 = views + 2 * m, *s2 = views + 3 * m;
    for (int i = 0, c = 0; i < n; i++)
        if (ready[i]) {
            update_views(opt, vars[i], targets[i], ready[i], &pv[c], &gv[c], &s1[c], &s2[c], &sources[c]);
            c++;
        }
    *st = opt->kind == OPT_ADAM ? k->adam_update_many(dev, m, pv, gv, s1, s2, sources, p)
                                : k->sgd_update_many(dev, m, pv, gv, opt->kind == OPT_MOMENTUM ? s1 : NULL, sources, p);
    if (views != small_views)
        free(views);
    if (sources != small_sources)
        free(sources);
    for (int i = 0; i < n && !*st; i++)
        if (targets[i]) {
            nb__variable_commit(vars[i], targets[i]);
            targets[i] = NULL;
        }
    return true;
}

/* The update; skip and count (device doubles, or NULL) as in nb_update_params. */
static nb_status update_impl(nb_optimizer *opt, int n, nb_variable *const *vars, nb_tensor *const *grads,
                             int64_t step, const double *device_params, const double *skip, const double *count,
                             const char *who)
{
    /* Gradients on their variables' devices, slots found, values writable: what
     * can fail for want of memory fails here, before any variable moves. */
    const nb_tensor *small[16];
    nb_tensor *small_targets[16];
    const nb_tensor **ready = n <= 16 ? small : malloc(sizeof *ready * (size_t)n);
    nb_tensor **targets = n <= 16 ? small_targets : calloc((size_t)n, sizeof *targets);
    if (!ready || !targets) {
        if (ready != small)
            free(ready);
        if (targets != small_targets)
            free(targets);
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    }
    int token = nb__tapes_pause();
    nb_scope *scope = nb_scope_begin();
    nb_status st = scope ? NB_OK : nb_error();
    for (int i = 0; i < n; i++)
        ready[i] = NULL, targets[i] = NULL;
    for (int i = 0; i < n && !st; i++) {
        if (!grads[i])
            continue;
        nb_tensor *x = nb__variable_value(vars[i]);
        if (!(ready[i] = prepare_grad(grads[i], x->device)) || !slots_for(opt, vars[i], false, who))
            st = nb_error() ? nb_error() : NB_ERR_INTERNAL;
    }
    /* Where a read (or a gradient that is a view of it) still holds a value, the
     * update writes a fresh buffer from the old one: copy-on-write at no extra
     * pass. Those buffers are allocated here, after every gradient is ready. */
    for (int i = 0; i < n && !st; i++) {
        if (!ready[i])
            continue;
        nb_tensor *cur = nb__variable_value(vars[i]);
        nb_tensor *t = nb__variable_update_target(vars[i], who);
        if (!t)
            st = nb_error() ? nb_error() : NB_ERR_INTERNAL;
        else if (t != cur)
            targets[i] = t;
    }

    /* An update recorded in place (lib/core/capture.h) must not read a
     * gradient from the memory it rewrites: such a step is recorded again,
     * with copies. */
    for (int i = 0; i < n && !st; i++) {
        if (!targets[i] || !nb__variable_target_in_place(vars[i], targets[i]))
            continue;
        const void *mem = nb__variable_value(vars[i])->storage->data;
        for (int j = 0; j < n; j++)
            if (ready[j] && ready[j]->storage->data == mem)
                nb__stale_reached();
    }

    /* The updates. */
    nb_update_params p = opt->params;
    p.step = step;
    nb__capture *rec = nb__capture_current();
    p.device_params = device_params;
    p.skip = skip;
    p.device_count = count;
    if (!st && !device_params && nb__capture_recording(rec) && !(p.device_params = record_update(opt, rec, skip)))
        st = nb_error() ? nb_error() : NB_ERR_INTERNAL;
    bool done = !st && update_many(opt, n, vars, ready, targets, &p, &st);
    for (int i = 0; i < n && !st && !done; i++) {
        if (!ready[i])
            continue;
        nb_view xv, gv, s1, s2;
        update_views(opt, vars[i], targets[i], ready[i], &xv, &gv, &s1, &s2, &p.source);
        nb_device *dev = nb__variable_value(vars[i])->device;
        const nb_optim_kernels *k = dev->backend->optim;
        st = opt->kind == OPT_ADAM ? k->adam_update(dev, &xv, &gv, &s1, &s2, &p)
                                   : k->sgd_update(dev, &xv, &gv, opt->kind == OPT_MOMENTUM ? &s1 : NULL, &p);
        if (!st && targets[i]) {
            nb__variable_commit(vars[i], targets[i]);
            targets[i] = NULL;
        }
    }
    for (int i = 0; i < n; i++)
        nb__release(targets[i]); /* left over after a failure */

    if (scope)
        nb_scope_end(scope);
    nb__tapes_resume(token);
    if (ready != small)
        free(ready);
    if (targets != small_targets)
        free(targets);
    return st;
}

/* The device's count of opt on dev, made or refreshed from the host's
 * where needed, which the captured step about to run (or each replay of the
 * one recorded now) advances on the device; NULL with the error. */
static double *device_count(nb_optimizer *opt, nb_device *dev, const char *who)
{
    bool recording = nb__capture_recording(nb__capture_current());
    if ((!opt->dev_count || opt->dev_count->device != dev || opt->count_stale) && recording)
        return nb__fail_null(NB_ERR_UNSUPPORTED,
                             "%s: the step count of a %s optimizer under a loss scaler is placed on %s by the step "
                             "that runs before the recording; update it in every step", who, opt->kind_name,
                             dev->name);
    if (!opt->dev_count || opt->dev_count->device != dev) {
        int64_t n = iterations_now(opt); /* from another device's count: a read while nothing records */
        nb_tensor *t = nb__tensor_new(who, dev, NB_F64, 1, (int64_t[]){1});
        if (!t)
            return NULL;
        nb__release(opt->dev_count);
        opt->dev_count = t;
        set_iterations(opt, n);
    }
    if (push_count(opt) != NB_OK)
        return NULL;
    if (!recording)
        opt->count_newer = true; /* the step runs now */
    return nb__data(opt->dev_count);
}

/* nb_optimizer_apply; skip: NULL, or (in a captured step under a loss
 * scaler) the device flag that makes the update do nothing, the count then
 * kept on the device and handed to *count. */
static nb_status apply(nb_optimizer *opt, int n, nb_variable *const *vars, nb_tensor *const *grads,
                       const double *skip, double **count, const char *who)
{
    nb_status st = check_apply(who, opt, n, vars, grads);
    if (st)
        return st;

    /* Mirrored variables become one pair per copy, all with the same gradient. */
    int total = 0;
    for (int i = 0; i < n; i++) {
        int copies = nb_variable_replicas(vars[i]);
        if (copies && nb__replica_strategy() == nb__variable_mirror_owner(vars[i]))
            return nb__fail(NB_ERR_INVALID_ARGUMENT,
                            "%s: mirrored variable '%s' cannot be updated inside a replica function; "
                            "nb_mirrored_step applies the update to every replica", who, nb_variable_name(vars[i]));
        total += copies ? copies : 1;
    }
    nb_variable *small_vars[16];
    nb_tensor *small_grads[16];
    nb_variable **pv = (nb_variable **)vars;
    nb_tensor **pg = (nb_tensor **)grads;
    if (total != n) {
        pv = total <= 16 ? small_vars : malloc(sizeof *pv * (size_t)total);
        pg = total <= 16 ? small_grads : malloc(sizeof *pg * (size_t)total);
        if (!pv || !pg) {
            if (pv != small_vars)
                free(pv);
            if (pg != small_grads)
                free(pg);
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
        }
        int k = 0;
        for (int i = 0; i < n; i++) {
            int copies = nb_variable_replicas(vars[i]);
            for (int r = 0; r < (copies ? copies : 1); r++) {
                pv[k] = nb__variable_copy(vars[i], r);
                pg[k++] = grads[i];
            }
        }
    }
    st = nb__optimizer_prepare(opt, total, pv, who);
    if (skip) {
        nb__capture *c = nb__capture_current();
        double *dc = NULL;
        if (!st && !(dc = device_count(opt, nb__capture_device(c), who)))
            st = nb_error() ? nb_error() : NB_ERR_INTERNAL;
        if (!st)
            st = update_impl(opt, total, pv, pg, 0, NULL, skip, dc, who);
        if (!st)
            *count = dc;
    } else {
        if (!st)
            st = nb__optimizer_update(opt, total, pv, pg, iterations_now(opt) + 1, who);
        if (!st)
            set_iterations(opt, opt->iterations + 1);
    }
    if (pv != (nb_variable **)vars && pv != small_vars)
        free(pv);
    if (pg != (nb_tensor **)grads && pg != small_grads)
        free(pg);
    return st;
}

nb_status nb_optimizer_apply(nb_optimizer *opt, int n, nb_variable *const *vars, nb_tensor *const *grads)
{
    return apply(opt, n, vars, grads, NULL, NULL, "nb_optimizer_apply");
}

nb_status nb__optimizer_apply_unless(nb_optimizer *opt, int n, nb_variable *const *vars, nb_tensor *const *grads,
                                     const double *skip, double **count, const char *who)
{
    if (!nb__capture_current() || !skip || !count)
        return nb__fail(NB_ERR_INTERNAL, "%s: a skippable update outside a captured step", who);
    return apply(opt, n, vars, grads, skip, count, who);
}

/* ---- state, for checkpoints ----------------------------------------------------- */

const char *nb_optimizer_kind(const nb_optimizer *opt) { return opt ? opt->kind_name : NULL; }

double nb_optimizer_hyperparameter(const nb_optimizer *opt, const char *name)
{
    if (!opt || !name)
        return NAN;
    const nb_update_params *p = &opt->params;
    bool momentum = opt->kind == OPT_MOMENTUM, adam = opt->kind == OPT_ADAM;
    if (strcmp(name, "learning_rate") == 0)
        return p->lr;
    if (momentum && strcmp(name, "momentum") == 0)
        return p->momentum;
    if (momentum && strcmp(name, "nesterov") == 0)
        return p->nesterov ? 1.0 : 0.0;
    if (adam && strcmp(name, "beta1") == 0)
        return p->beta1;
    if (adam && strcmp(name, "beta2") == 0)
        return p->beta2;
    if (adam && strcmp(name, "epsilon") == 0)
        return p->epsilon;
    if (adam && strcmp(name, "weight_decay") == 0)
        return p->weight_decay;
    return NAN;
}

static const char *const momentum_slots[] = {"momentum"};
static const char *const adam_slots[] = {"adam_m", "adam_v"};

int nb_optimizer_slot_names(const nb_optimizer *opt, const char *const **names)
{
    int n = !opt ? 0 : opt->kind == OPT_ADAM ? 2 : opt->kind == OPT_MOMENTUM ? 1 : 0;
    if (names)
        *names = !opt ? NULL : opt->kind == OPT_ADAM ? adam_slots : momentum_slots;
    return n;
}

/* The index of slot among opt's slot names, or -1 with the error recorded. */
static int slot_index(const char *who, const nb_optimizer *opt, const nb_variable *v, const char *slot)
{
    if (!opt || !v || !slot) {
        nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: the %s is NULL", who, !opt ? "optimizer" : !v ? "variable" : "slot name");
        return -1;
    }
    const char *const *names;
    int n = nb_optimizer_slot_names(opt, &names);
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], slot) == 0)
            return i;
    nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: a %s optimizer has no slot '%s' (variable '%s')", who, opt->kind_name,
             slot, nb_variable_name(v));
    return -1;
}

nb_tensor *nb_optimizer_get_slot(nb_optimizer *opt, nb_variable *v, const char *slot)
{
    const char *who = "nb_optimizer_get_slot";
    int i = slot_index(who, opt, v, slot);
    if (i < 0)
        return NULL;
    uint64_t uid = nb__variable_uid(v);
    slot_entry *e = opt->cap ? slot_lookup(opt->slots, opt->cap, uid) : NULL;
    nb_tensor *s = e && e->uid == uid ? (i == 0 ? e->s1 : e->s2) : NULL;
    if (!s)
        return NULL;
    nb_tensor *c = nb__tensor_new(who, s->device, s->dtype, s->ndim, s->shape);
    if (!c)
        return NULL;
    nb_view cv = nb__view(c), sv = nb__view(s);
    if (s->device->backend->copy(s->device, &cv, &sv) != NB_OK) {
        nb__release(c);
        return NULL;
    }
    return nb__own(c);
}

nb_status nb_optimizer_set_slot(nb_optimizer *opt, nb_variable *v, const char *slot, const nb_tensor *value)
{
    const char *who = "nb_optimizer_set_slot";
    int i = slot_index(who, opt, v, slot);
    if (i < 0)
        return nb_error();
    if (!value)
        return nb_error() ? nb_error()
                          : nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: value for slot '%s' of '%s' is NULL", who, slot,
                                     nb_variable_name(v));
    const nb_tensor *x = nb__variable_value(v);
    bool same_shape = nb__same_shape(value, x);
    if (!same_shape || value->dtype != x->dtype) {
        char sx[NB_SHAPE_STR_MAX], sv[NB_SHAPE_STR_MAX];
        return nb__fail(!same_shape ? NB_ERR_SHAPE : NB_ERR_DTYPE, "%s: variable '%s' is %s %s, slot '%s' value is %s %s",
                        who, nb_variable_name(v), nb_dtype_name(x->dtype), nb__shape_str(x->ndim, x->shape, sx, sizeof sx),
                        slot, nb_dtype_name(value->dtype), nb__shape_str(value->ndim, value->shape, sv, sizeof sv));
    }
    int copies = nb_variable_replicas(v);
    nb_status st = NB_OK;
    int token = nb__tapes_pause();
    nb_scope *scope = nb_scope_begin();
    if (!scope)
        st = nb_error() ? nb_error() : NB_ERR_INTERNAL;
    for (int r = 0; r < (copies ? copies : 1) && !st; r++) {
        nb_variable *c = nb__variable_copy(v, r);
        slot_entry *e = slots_for(opt, c, true, who);
        if (!e) {
            st = nb_error() ? nb_error() : NB_ERR_INTERNAL;
            break;
        }
        nb_tensor *s = i == 0 ? e->s1 : e->s2;
        const nb_tensor *src = value->device == s->device ? value : nb__copy_to_device(value, s->device);
        if (!src) {
            st = nb_error() ? nb_error() : NB_ERR_INTERNAL;
            break;
        }
        nb_view dv = nb__view(s), svw = nb__view(src);
        st = s->device->backend->copy(s->device, &dv, &svw);
    }
    if (scope)
        nb_scope_end(scope);
    nb__tapes_resume(token);
    return st;
}

nb_status nb_optimizer_set_iterations(nb_optimizer *opt, int64_t iterations)
{
    if (!opt || iterations < 0)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_optimizer_set_iterations: %s", !opt ? "optimizer is NULL"
                                                                                          : "iterations < 0");
    set_iterations(opt, iterations);
    return NB_OK;
}
