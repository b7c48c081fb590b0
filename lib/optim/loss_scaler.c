/* nabla — dynamic loss scaling (nabla/optimizer.h): the scale goes up after a
 * run of applied steps and down at a step whose gradients overflowed, which
 * is skipped. The finiteness check is one reduction per gradient: sum(g * 0)
 * is 0 exactly when every element of g is finite (an infinity times 0, and a
 * NaN, give NaN).
 *
 * An eager step reads the check back and decides on the host. A captured
 * step cannot read anything back, so there the scaler's state (scale, good
 * steps, skipped steps) lives in device doubles: the loss is multiplied by
 * the device's scale, the check stays on the device as a flag that makes the
 * optimizer's updates do nothing (nb__optimizer_apply_unless, whose step count
 * then lives there too), and one kernel (scaler_update) advances the state by
 * the rule an eager step runs on the host (nb_scaler_advance). The host's copy
 * is read back when next asked for, and written to the device before a replay
 * where an eager step or a setter changed it since. */
#include "lib/core/backend.h"
#include "lib/core/capture.h"
#include "optimizer_impl.h"

#include <math.h>
#include <stdlib.h>

#define SCALE_MIN 0x1p-64
#define SCALE_MAX 0x1p64

struct nb_loss_scaler {
    double st[NB_LS_COUNT]; /* the host's state */
    nb_scaler_params p;
    nb_tensor *dev;       /* NULL, or f64 [NB_LS_COUNT] on the device of the captured steps that use it */
    nb_tensor *dev_scale; /* a 0-d view of its scale */
    bool dev_newer;       /* dev holds steps st lacks (captured steps ran) */
    bool dev_stale;       /* st changed since dev was written */
    uint64_t hooked_in;   /* the recording whose replays refresh dev */
};

static bool scale_ok(double s) { return s >= SCALE_MIN && s <= SCALE_MAX; }

nb_loss_scaler *nb_loss_scaler_new(double initial_scale, double growth, double backoff, int64_t growth_interval)
{
    const char *who = "nb_loss_scaler_new";
    if (!scale_ok(initial_scale))
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: initial scale %g is outside [2^-64, 2^64]", who,
                             initial_scale);
    if (!(growth > 1 && isfinite(growth)))
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: growth %g must be finite and more than 1", who, growth);
    if (!(backoff > 0 && backoff < 1))
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: backoff %g must be in (0, 1)", who, backoff);
    if (growth_interval < 1 || growth_interval > ((int64_t)1 << 53))
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: growth interval %lld must be in [1, 2^53]", who,
                             (long long)growth_interval);
    nb_loss_scaler *ls = calloc(1, sizeof *ls);
    if (!ls)
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    ls->st[NB_LS_SCALE] = initial_scale;
    ls->p = (nb_scaler_params){growth, backoff, SCALE_MIN, SCALE_MAX, (double)growth_interval};
    return ls;
}

/* ---- the host's state and the device's -------------------------------------------- */

/* Brings the host's state up to date: a read from the device where captured
 * steps ran since (it waits for them). NB_OK or the read's error. */
static nb_status pull(nb_loss_scaler *ls)
{
    if (!ls->dev_newer)
        return NB_OK;
    nb_device *d = ls->dev->device;
    double v[NB_LS_COUNT];
    nb_status st = d->backend->copy_to_host(d, v, nb__data(ls->dev), sizeof v);
    if (st)
        return st;
    for (int i = 0; i < NB_LS_COUNT; i++)
        ls->st[i] = v[i];
    ls->dev_newer = false;
    return NB_OK;
}

/* The host's state changed: the device's is old. */
static void host_changed(nb_loss_scaler *ls)
{
    ls->dev_newer = false;
    ls->dev_stale = true;
}

/* Writes the host's state to the device's where the host's is newer (one
 * fill per double: queued in the device's order, no host buffer to keep). */
static nb_status push(nb_loss_scaler *ls)
{
    if (!ls->dev_stale)
        return NB_OK;
    nb_device *d = ls->dev->device;
    for (int i = 0; i < NB_LS_COUNT; i++) {
        nb_view v = nb__view(ls->dev);
        v.data = (double *)v.data + i;
        v.ndim = 0;
        v.numel = 1;
        v.contiguous = true;
        nb_status st = d->backend->fill(d, &v, ls->st[i]);
        if (st)
            return st;
    }
    ls->dev_stale = false;
    return NB_OK;
}

/* Before each replay of a step recorded with the scaler: the host's newer
 * state goes to the device, where the replay advances it. */
static void before_replay(void *ctx, double *params)
{
    (void)params;
    nb_loss_scaler *ls = ctx;
    if (push(ls) == NB_OK)
        ls->dev_newer = true;
}

/* The device's state on the capture c's device, made or refreshed from the
 * host's where needed, which the step about to run (or each replay of the
 * step recorded now) advances there. NB_OK or the error. */
static nb_status on_device(nb_loss_scaler *ls, nb__capture *c, const char *who)
{
    nb_device *dev = nb__capture_device(c);
    bool recording = nb__capture_recording(c);
    if ((!ls->dev || ls->dev->device != dev || ls->dev_stale) && recording)
        return nb__capture_fail(
            c, nb__fail(NB_ERR_UNSUPPORTED,
                        "%s: the loss scaler's state is placed on %s by the step that runs before the recording; "
                        "use the scaler in every step",
                        who, dev->name));
    if (!ls->dev || ls->dev->device != dev) {
        nb_status st = pull(ls); /* from another device: a read while nothing records */
        if (st)
            return st;
        nb_tensor *t = nb__tensor_new(who, dev, NB_F64, 1, (int64_t[]){NB_LS_COUNT});
        nb_tensor *s = t ? nb__tensor_view(t, 0, NULL, NULL, t->offset) : NULL;
        if (!s) {
            nb__release(t);
            return nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
        }
        nb__release(ls->dev_scale);
        nb__release(ls->dev);
        ls->dev = t;
        ls->dev_scale = s;
        host_changed(ls);
    }
    nb_status st = push(ls);
    if (st)
        return st;
    if (!recording) {
        ls->dev_newer = true; /* the step runs now */
        return NB_OK;
    }
    if (ls->hooked_in == nb__capture_id(c))
        return NB_OK;
    static const nb__capture_hooks hooks = {.before_replay = before_replay};
    if ((st = nb__capture_hook(c, &hooks, ls)) != NB_OK)
        return st;
    ls->hooked_in = nb__capture_id(c);
    return NB_OK;
}

/* x times s (an f64 0-d tensor on x's device) as nb_mul_scalar(x, value of s)
 * rounds it: in x's dtype, or in f32 for f16 and bf16. */
static nb_tensor *times(const nb_tensor *x, nb_tensor *s)
{
    nb_dtype dt = x->dtype;
    if (dt == NB_F32 || dt == NB_F64)
        return nb_mul(x, nb_cast(s, dt));
    return nb_cast(nb_mul(nb_cast(x, NB_F32), nb_cast(s, NB_F32)), dt);
}

/* ---- scaling and the step ---------------------------------------------------------- */

nb_tensor *nb_loss_scaler_scale(nb_loss_scaler *ls, const nb_tensor *loss)
{
    const char *who = "nb_loss_scaler_scale";
    if (!ls || !loss)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: the %s is NULL", who, !ls ? "scaler" : "loss");
    nb__capture *c = nb__capture_current();
    if (c) {
        if (on_device(ls, c, who) != NB_OK)
            return NULL;
        return times(loss, ls->dev_scale);
    }
    if (pull(ls) != NB_OK)
        return NULL;
    return nb_mul_scalar(loss, ls->st[NB_LS_SCALE]);
}

/* The unscaled gradients into out (NULL stays NULL) and the check (an f64
 * 0-d tensor: 0 when every one is finite; NULL without gradients), by the
 * host's scale or, with inv (an f64 0-d tensor: 1 / scale), the device's; in
 * a scope the caller ends after the update. */
static nb_status unscale(nb_loss_scaler *ls, nb_tensor *inv, int n, nb_tensor *const *grads, nb_tensor **out,
                         nb_tensor **check)
{
    nb_tensor *bad = NULL; /* the sum of every g * 0, on the first gradient's device */
    for (int i = 0; i < n; i++) {
        out[i] = NULL;
        if (!grads[i])
            continue;
        out[i] = inv ? times(grads[i], inv) : nb_mul_scalar(grads[i], 1.0 / ls->st[NB_LS_SCALE]);
        if (!out[i])
            return nb_error();
        nb_tensor *z = nb_cast(nb_sum_all(nb_mul_scalar(out[i], 0.0)), NB_F64);
        if (z && bad)
            z = nb_to_device(z, nb_tensor_device(bad)); /* itself when already there */
        bad = !z ? NULL : bad ? nb_add(bad, z) : z;
        if (!bad)
            return nb_error();
    }
    *check = bad;
    return NB_OK;
}

/* The step inside a captured step: everything on the device (see the top). */
static nb_status step_on_device(nb_loss_scaler *ls, nb__capture *c, nb_optimizer *opt, int n,
                                nb_variable *const *vars, nb_tensor *const *grads, nb_tensor **g, const char *who)
{
    nb_status st = on_device(ls, c, who);
    if (st)
        return st;
    nb_device *dev = nb__capture_device(c);
    nb_tensor *one = nb_ones(NB_F64, NB_SCALAR);
    nb_tensor *inv = one ? nb_div(one, ls->dev_scale) : NULL; /* 1.0 / scale, as the host divides */
    nb_tensor *check = NULL;
    if (!inv || (st = unscale(ls, inv, n, grads, g, &check)) != NB_OK)
        return st ? st : nb_error();
    if (!check && !(check = nb_zeros(NB_F64, NB_SCALAR))) /* no gradients: a good step */
        return nb_error();
    if (check->device != dev)
        return nb__fail(NB_ERR_UNSUPPORTED, "%s: the gradients are on %s, the captured step on %s", who,
                        check->device->name, dev->name);
    double *count = NULL;
    if ((st = nb__optimizer_apply_unless(opt, n, vars, g, nb__data(check), &count, who)) != NB_OK)
        return st;
    return dev->backend->optim->scaler_update(dev, nb__data(ls->dev), nb__data(check), count, &ls->p);
}

nb_status nb_loss_scaler_step(nb_loss_scaler *ls, nb_optimizer *opt, int n, nb_variable *const *vars,
                              nb_tensor *const *grads, bool *stepped)
{
    const char *who = "nb_loss_scaler_step";
    if (stepped)
        *stepped = false;
    if (!ls || !opt || n < 0 || (n > 0 && (!vars || !grads)))
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s", who,
                        !ls ? "the scaler is NULL" : !opt ? "the optimizer is NULL" : n < 0 ? "n is negative"
                                                                                         : "an array is NULL");
    nb__capture *c = nb__capture_current();
    nb_status st = c ? NB_OK : pull(ls);
    if (st)
        return st;
    nb_tensor **g = calloc((size_t)(n > 0 ? n : 1), sizeof *g);
    if (!g)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    nb_scope *s = nb_scope_begin();
    if (!s) {
        free(g);
        return nb_error();
    }
    if (c) {
        st = step_on_device(ls, c, opt, n, vars, grads, g, who);
        nb_scope_end(s);
        free(g);
        return st;
    }
    nb_tensor *check = NULL;
    double v = 0;
    st = unscale(ls, NULL, n, grads, g, &check);
    if (!st && check)
        st = nb_tensor_read(check, &v, sizeof v);
    bool finite = v == 0;
    if (!st && finite)
        st = nb_optimizer_apply(opt, n, vars, g);
    nb_scope_end(s);
    free(g);
    if (st)
        return st;
    nb_scaler_advance(ls->st, finite, &ls->p);
    host_changed(ls);
    if (stepped)
        *stepped = finite;
    return NB_OK;
}

/* ---- the state, read where it is newest ------------------------------------------- */

/* The host's state, read back first where the device's is newer; the
 * accessors' pointer is const to the caller, the refresh is a cache's. */
static const double *state_now(const nb_loss_scaler *ls)
{
    nb_loss_scaler *m = (nb_loss_scaler *)ls;
    if (!nb__capture_current())
        pull(m); /* on failure: the host's last state, and the error */
    return m->st;
}

double nb_loss_scaler_get_scale(const nb_loss_scaler *ls) { return ls ? state_now(ls)[NB_LS_SCALE] : 0; }
int64_t nb_loss_scaler_skipped(const nb_loss_scaler *ls) { return ls ? (int64_t)state_now(ls)[NB_LS_SKIPPED] : 0; }
int64_t nb_loss_scaler_good_steps(const nb_loss_scaler *ls) { return ls ? (int64_t)state_now(ls)[NB_LS_GOOD] : 0; }

nb_status nb_loss_scaler_set_state(nb_loss_scaler *ls, double scale, int64_t good_steps)
{
    const char *who = "nb_loss_scaler_set_state";
    if (!ls || !scale_ok(scale) || good_steps < 0)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s", who,
                        !ls ? "the scaler is NULL" : !scale_ok(scale) ? "the scale is outside [2^-64, 2^64]"
                                                                       : "the count is negative");
    if (nb__capture_current())
        return nb__capture_check(NULL, who, "setting a loss scaler's state");
    nb_status st = pull(ls); /* the skipped count stays */
    if (st)
        return st;
    ls->st[NB_LS_SCALE] = scale;
    ls->st[NB_LS_GOOD] = (double)good_steps;
    host_changed(ls);
    return NB_OK;
}

void nb_loss_scaler_free(nb_loss_scaler *ls)
{
    if (!ls)
        return;
    nb__release(ls->dev_scale);
    nb__release(ls->dev);
    free(ls);
}
