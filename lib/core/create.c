/* Creation functions: filled, ranged, copied from the host, random. */
#include "core.h"
#include "capture.h"
#include "backend.h"

#include <math.h>
#include <string.h>

static bool check_shape(const char *who, nb_shape shape)
{
    if (shape.ndim < 0 || shape.ndim > NB_MAX_DIMS) {
        nb__fail(NB_ERR_SHAPE, "%s: %d dims is outside [0, %d]", who, shape.ndim, NB_MAX_DIMS);
        return false;
    }
    for (int i = 0; i < shape.ndim; i++) {
        if (shape.dims[i] < 0) {
            char s[NB_SHAPE_STR_MAX];
            nb__fail(NB_ERR_SHAPE, "%s: shape %s has a negative dim", who, nb__shape_str(shape.ndim, shape.dims, s, sizeof s));
            return false;
        }
    }
    return true;
}

static bool check_dtype(const char *who, nb_dtype dtype)
{
    if ((unsigned)dtype >= NB_DTYPE_COUNT) {
        nb__fail(NB_ERR_DTYPE, "%s: invalid dtype %d", who, (int)dtype);
        return false;
    }
    return true;
}

nb_tensor *nb__full_on(const char *who, nb_device *dev, nb_dtype dtype, int ndim, const int64_t *shape,
                       double value)
{
    nb_tensor *t = nb__tensor_new(who, dev, dtype, ndim, shape);
    if (!t)
        return NULL;
    nb_view v = nb__view(t);
    if (dev->backend->fill(dev, &v, value)) {
        nb__release(t);
        return NULL;
    }
    return nb__own(t);
}

nb_tensor *nb__scalar_on(const char *who, nb_device *dev, nb_dtype dtype, double value)
{
    return nb__full_on(who, dev, dtype, 0, NULL, value);
}

static nb_tensor *full(const char *who, nb_dtype dtype, nb_shape shape, double value)
{
    if (!check_dtype(who, dtype) || !check_shape(who, shape))
        return NULL;
    return nb__full_on(who, nb__device_default(), dtype, shape.ndim, shape.dims, value);
}

nb_tensor *nb_full(nb_dtype dtype, nb_shape shape, double value) { return full("nb_full", dtype, shape, value); }

nb_tensor *nb_empty(nb_dtype dtype, nb_shape shape)
{
    if (!check_dtype("nb_empty", dtype) || !check_shape("nb_empty", shape))
        return NULL;
    return nb__own(nb__tensor_new("nb_empty", nb__device_default(), dtype, shape.ndim, shape.dims));
}

nb_tensor *nb_zeros(nb_dtype dtype, nb_shape shape) { return full("nb_zeros", dtype, shape, 0.0); }
nb_tensor *nb_ones(nb_dtype dtype, nb_shape shape) { return full("nb_ones", dtype, shape, 1.0); }
nb_tensor *nb_scalar(nb_dtype dtype, double value) { return full("nb_scalar", dtype, NB_SCALAR, value); }

nb_tensor *nb_zeros_like(const nb_tensor *t)
{
    if (!t)
        return nb__null_input("nb_zeros_like", 0);
    return nb__full_on("nb_zeros_like", t->device, t->dtype, t->ndim, t->shape, 0.0);
}

nb_tensor *nb_ones_like(const nb_tensor *t)
{
    if (!t)
        return nb__null_input("nb_ones_like", 0);
    return nb__full_on("nb_ones_like", t->device, t->dtype, t->ndim, t->shape, 1.0);
}

/* Whether dev computes kernel k in dtype (the CPU holds f16 and bf16 but makes
 * and computes in neither); false with NB_ERR_DTYPE naming who otherwise. */
static bool device_makes(const char *who, nb_device *dev, nb_kernel k, nb_dtype dtype)
{
    if (!dev->backend->supports || dev->backend->supports(dev, k, 0, dtype))
        return true;
    nb__fail(NB_ERR_DTYPE, "%s: dtype %s is not supported on %s (it can hold it: make the tensor in another dtype "
             "and nb_cast it)", who, nb_dtype_name(dtype), dev->name);
    return false;
}

nb_tensor *nb_arange(nb_dtype dtype, double start, double stop, double step)
{
    if (!check_dtype("nb_arange", dtype))
        return NULL;
    if (step == 0 || !isfinite(start) || !isfinite(stop) || !isfinite(step))
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "nb_arange: start %g, stop %g, step %g do not make a range",
                             start, stop, step);
    double count = ceil((stop - start) / step);
    if (!(count < 0x1p62)) /* also inf and NaN: the cast to int64 must be defined */
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "nb_arange: start %g, stop %g, step %g make %g elements, too many "
                             "to count", start, stop, step, count);
    int64_t n = count > 0 ? (int64_t)count : 0;
    nb_device *dev = nb__device_default();
    if (!device_makes("nb_arange", dev, NB_K_ARANGE, dtype))
        return NULL;
    nb_tensor *t = nb__tensor_new("nb_arange", dev, dtype, 1, &n);
    if (!t)
        return NULL;
    nb_view v = nb__view(t);
    if (dev->backend->arange(dev, &v, start, step)) {
        nb__release(t);
        return NULL;
    }
    return nb__own(t);
}

nb_tensor *nb_from_buffer(nb_dtype dtype, nb_shape shape, const void *data)
{
    if (!check_dtype("nb_from_buffer", dtype) || !check_shape("nb_from_buffer", shape))
        return NULL;
    if (!data)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "nb_from_buffer: data is NULL");
    nb_device *dev = nb__device_default();
    nb_tensor *t = nb__tensor_new("nb_from_buffer", dev, dtype, shape.ndim, shape.dims);
    if (!t)
        return NULL;
    size_t bytes = (size_t)t->numel * nb_dtype_size(dtype);
    if (bytes && nb__capture_check(dev, "nb_from_buffer", "copying host data in")) {
        nb__release(t);
        return NULL;
    }
    if (bytes && dev->backend->copy_from_host(dev, nb__data(t), data, bytes)) {
        nb__release(t);
        return NULL;
    }
    return nb__own(t);
}

static nb_tensor *random_tensor(const char *who, nb_dtype dtype, nb_shape shape, nb_random_dist dist,
                                double a, double b, uint64_t seed)
{
    if (!check_dtype(who, dtype) || !check_shape(who, shape))
        return NULL;
    if (!nb__is_floating(dtype))
        return nb__fail_null(NB_ERR_DTYPE, "%s: dtype %s is not floating", who, nb_dtype_name(dtype));
    if (!isfinite(a) || !isfinite(b) || (dist != NB_RAND_UNIFORM && b < 0) || (dist == NB_RAND_UNIFORM && b < a))
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: bad parameters %g, %g", who, a, b);
    nb_device *dev = nb__device_default();
    if (!device_makes(who, dev, NB_K_RANDOM, dtype))
        return NULL;
    nb_tensor *t = nb__tensor_new(who, dev, dtype, shape.ndim, shape.dims);
    if (!t)
        return NULL;
    nb_view v = nb__view(t);
    if (dev->backend->random(dev, &v, dist, a, b, seed, NULL)) {
        nb__release(t);
        return NULL;
    }
    return nb__own(t);
}

nb_tensor *nb_random_normal(nb_dtype dtype, nb_shape shape, double mean, double stddev, uint64_t seed)
{
    return random_tensor("nb_random_normal", dtype, shape, NB_RAND_NORMAL, mean, stddev, seed);
}

nb_tensor *nb_random_uniform(nb_dtype dtype, nb_shape shape, double low, double high, uint64_t seed)
{
    return random_tensor("nb_random_uniform", dtype, shape, NB_RAND_UNIFORM, low, high, seed);
}

nb_tensor *nb_truncated_normal(nb_dtype dtype, nb_shape shape, double mean, double stddev, uint64_t seed)
{
    return random_tensor("nb_truncated_normal", dtype, shape, NB_RAND_TRUNCATED_NORMAL, mean, stddev, seed);
}
