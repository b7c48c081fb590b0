// Running sums along an axis (the cumsum entry).
#include "gpu_kernels.cuh"

extern "C" nb_status nb__gpu_cumsum(nb_gpu_ctx *c, const nb_view *out, const nb_view *x, int axis, bool exclusive,
                                    bool reverse)
{
    (void)out, (void)x, (void)axis, (void)exclusive, (void)reverse;
    return nb__fail(NB_ERR_UNSUPPORTED, "cumsum: not yet implemented on %s", c->dev->name);
}
