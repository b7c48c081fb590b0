/* Placement: the device an op runs on (the pushed one, else its inputs'),
 * the capability query with its soft fallback to /cpu:0, and the recorded copy
 * between devices that moves an input there (also behind nb_to_device). */
#include "op.h"
#include "lib/core/capture.h"

#include <stdatomic.h>

nb_device *nb__op_place(const char *op, int n, const nb_tensor **inputs)
{
    nb_device *pushed = nb__device_pushed();
    nb_device *dev = pushed ? pushed : inputs[0]->device;
    for (int i = 0; i < n; i++) {
        if (inputs[i]->device == dev)
            continue;
        if (!pushed)
            return nb__fail_null(NB_ERR_DEVICE,
                                 "%s: inputs are on two devices, %s and %s; push a device to have them copied there",
                                 op, dev->name, inputs[i]->device->name);
        nb_tensor *moved = nb__copy_to_device(inputs[i], dev);
        if (!moved)
            return NULL;
        inputs[i] = moved;
    }
    if (nb__log_placement_enabled())
        nb__log_op(op, dev);
    return dev;
}

bool nb__supports(const nb_device *dev, nb_kernel k, int variant, nb_dtype dtype)
{
    const nb_backend *b = dev->backend;
    if (b->supports)
        return b->supports(dev, k, variant, dtype);
    return (unsigned)dtype < NB_DTYPE_COUNT && (b->dtypes & NB_MASK(dtype));
}

/* One warning per (device kind, kernel, variant, dtype) a fallback served: a
 * training loop would otherwise repeat it every step. */
#define WARN_VARIANTS 32
static atomic_uchar g_warned[2][NB_K_COUNT][WARN_VARIANTS][NB_DTYPE_COUNT];

nb_device *nb__op_place_kernel(const char *op, int n, const nb_tensor **inputs, nb_kernel k, int variant,
                               nb_dtype dtype)
{
    nb_device *dev = nb__op_place(op, n, inputs);
    if (!dev || nb__supports(dev, k, variant, dtype))
        return dev;
    nb_device *cpu = nb__device_cpu0();
    bool can_fall_back = dev != cpu && nb__supports(cpu, k, variant, dtype);
    if (!can_fall_back || !nb__soft_placement()) {
        return nb__fail_null(NB_ERR_UNSUPPORTED, "%s: %s does not run it for dtype %s%s", op, dev->name,
                             nb_dtype_name(dtype),
                             can_fall_back ? " (placement is strict; soft placement would use /cpu:0)" : "");
    }
    if ((unsigned)dev->kind < 2 && (unsigned)variant < WARN_VARIANTS &&
        !atomic_exchange(&g_warned[dev->kind][k][variant][dtype], 1))
        nb__log(NB_LOG_WARNING, "%s: %s does not run it for dtype %s; running it on /cpu:0", op, dev->name,
                nb_dtype_name(dtype));
    for (int i = 0; i < n; i++) {
        if (inputs[i]->device == cpu)
            continue;
        nb_tensor *moved = nb__copy_to_device(inputs[i], cpu);
        if (!moved)
            return NULL;
        inputs[i] = moved;
    }
    return cpu;
}

/* ---- copies between devices --------------------------------------------------- */

static nb_status copy_to_device_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    gi[0] = nb__copy_to_device(g[0], n->in[0]->device);
    return nb__ok(gi[0]);
}

static const nb_op_def copy_to_device_def = {.name = "copy_to_device", .grad = copy_to_device_grad};

nb_tensor *nb__copy_to_device(const nb_tensor *t, nb_device *dev)
{
    const char *op = copy_to_device_def.name;
    if (!t)
        return nb__null_input(op, 0);
    if (!dev)
        return nb__fail_null(NB_ERR_DEVICE, "%s: no target device", op);
    nb_device *from = t->device;
    /* The source must be contiguous: make it so on its own device first. */
    const nb_tensor *src = t;
    nb_tensor *tmp = NULL;
    if (!t->contiguous) {
        tmp = nb__tensor_new(op, from, t->dtype, SHAPE_OF(t));
        if (!tmp)
            return NULL;
        nb_view vo = nb__view(tmp), vi = nb__view(t);
        if (!(tmp = nb__kernel_done(from->backend->copy(from, &vo, &vi), tmp)))
            return NULL;
        src = tmp;
    }
    nb_tensor *out = nb__out(op, dev, t->dtype, SHAPE_OF(t));
    size_t nbytes = (size_t)t->numel * nb_dtype_size(t->dtype);
    if (out && nbytes) {
        if (from == dev) {
            nb_view vo = nb__view(out), vi = nb__view(src);
            out = nb__kernel_done(dev->backend->copy(dev, &vo, &vi), out);
        } else if (nb__capture_check(NULL, op, "a copy between devices")) {
            nb__release(out);
            out = NULL;
        } else {
            /* The non-CPU side's backend knows how to reach the other side. */
            const nb_backend *be = dev->kind != NB_DEVICE_CPU ? dev->backend : from->backend;
            out = nb__kernel_done(be->copy_between(dev, nb__data(out), from, nb__data(src), nbytes), out);
        }
    }
    nb__release(tmp);
    nb__log_op(op, dev);
    const nb_tensor *in[1] = {t};
    return nb__finish(&copy_to_device_def, 1, in, out, NULL);
}

nb_tensor *nb_to_device(nb_tensor *t, const char *device)
{
    const char *op = "nb_to_device";
    if (!t)
        return nb__null_input(op, 0);
    /* Soft placement applies as for nb_device_push: a missing GPU means /cpu:0
     * (with a one-line warning) unless placement is strict. */
    nb_device *dev = nb__device_resolve(device, op);
    if (!dev)
        return NULL;
    if (dev == t->device)
        return nb_retain(t);
    return nb__copy_to_device(t, dev);
}
