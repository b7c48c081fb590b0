// gather (rows of params picked by indices), scatter_add (rows added into out
// at indices, with atomicAdd) and one_hot.
//
// An index outside [0, rows) makes gather write zeros for that row and
// scatter_add skip it; either kernel records the first such index in the
// device's index-error record, and the host then checks that record
// synchronously (nb__gpu_index_error_check waits for the stream) so that the
// op reports NB_ERR_INVALID_ARGUMENT itself. That is one stream
// synchronisation per gather/scatter_add: acceptable for now; deferring the
// check to the next synchronising call would remove it.
#include "gpu_kernels.cuh"

using namespace nbg;

namespace {

__device__ __forceinline__ void flag_index(nb_gpu_index_error *err, int64_t position, int64_t value)
{
    if (atomicCAS(&err->set, 0, 1) == 0) {
        err->position = position;
        err->value = value;
    }
}

// Rows are copied in units of U bytes (up to 16), Du units a row.
template <class U, class I>
__global__ void __launch_bounds__(kThreads)
    k_gather(const U *params, const I *idx, U *out, int64_t n, int64_t Du, int64_t rows, nb_gpu_index_error *err)
{
    const int64_t total = n * Du;
    for (int64_t e = gtid(); e < total; e += gstride()) {
        const int64_t i = e / Du, j = e - i * Du;
        const int64_t r = static_cast<int64_t>(idx[i]);
        if (r < 0 || r >= rows) {
            out[e] = U{};
            if (j == 0)
                flag_index(err, i, r);
        } else {
            out[e] = params[r * Du + j];
        }
    }
}

template <nb_dtype D> __device__ __forceinline__ void atomic_add(T_of<D> *p, T_of<D> v)
{
    if constexpr (D == NB_I64)
        atomicAdd(reinterpret_cast<unsigned long long *>(p), static_cast<unsigned long long>(v));
    else
        atomicAdd(p, v);
}

template <nb_dtype D, class I>
__global__ void __launch_bounds__(kThreads) k_scatter_add(T_of<D> *out, const I *idx, const T_of<D> *updates,
                                                          int64_t n, int64_t D_, int64_t rows,
                                                          nb_gpu_index_error *err)
{
    const int64_t total = n * D_;
    for (int64_t e = gtid(); e < total; e += gstride()) {
        const int64_t i = e / D_, j = e - i * D_;
        const int64_t r = static_cast<int64_t>(idx[i]);
        if (r < 0 || r >= rows) {
            if (j == 0)
                flag_index(err, i, r);
        } else {
            atomic_add<D>(out + r * D_ + j, updates[e]);
        }
    }
}

template <nb_dtype D, class I>
__global__ void __launch_bounds__(kThreads)
    k_one_hot(T_of<D> *out, const I *idx, int64_t n, int64_t depth, double on, double off)
{
    const int64_t total = n * depth;
    for (int64_t e = gtid(); e < total; e += gstride()) {
        const int64_t i = e / depth, k = e - i * depth;
        out[e] = st<D>(static_cast<int64_t>(idx[i]) == k ? on : off);
    }
}

// Calls fn(I{}) for the index dtype.
template <class Fn>
nb_status by_index(const nb_gpu_ctx *c, const char *op, const nb_view *indices, Fn &&fn)
{
    if (indices->dtype == NB_I32)
        return fn(int32_t{});
    if (indices->dtype == NB_I64)
        return fn(int64_t{});
    return nb__fail(NB_ERR_DTYPE, "%s: indices must be i32 or i64, not %s (on %s)", op,
                    nb_dtype_name(indices->dtype), c->dev->name);
}

int64_t rows_of(const nb_view *v) { return v->ndim > 0 ? v->shape[0] : 1; }

} // namespace

extern "C" nb_status nb__gpu_gather(nb_gpu_ctx *c, const char *op, const nb_view *out, const nb_view *params,
                                    const nb_view *indices)
{
    const int64_t n = indices->numel, rows = rows_of(params);
    if (n <= 0 || out->numel <= 0)
        return by_index(c, op, indices, [](auto) { return NB_OK; });
    if (!params->contiguous || !indices->contiguous || !out->contiguous)
        return nb__fail(NB_ERR_INTERNAL, "%s: gather expects contiguous operands on %s", op, c->dev->name);
    const int64_t row_bytes = (out->numel / n) * (int64_t)dtype_size(out->dtype);
    nb_gpu_index_error *err;
    nb_status s = nb__gpu_index_error_record(c, &err);
    if (s)
        return s;
    // The widest copy unit that divides the row and both base addresses.
    const uintptr_t align = (uintptr_t)params->data | (uintptr_t)out->data | (uintptr_t)row_bytes;
    const int unit = align % 16 == 0 ? 16 : align % 8 == 0 ? 8 : align % 4 == 0 ? 4 : align % 2 == 0 ? 2 : 1;
    const int64_t Du = row_bytes / unit;
    s = by_index(c, op, indices, [&](auto ityp) -> nb_status {
        using I = decltype(ityp);
        const I *ip = static_cast<const I *>(indices->data);
        const unsigned blocks = grid_for(c, n * Du);
        switch (unit) {
        case 16:
            k_gather<uint4, I><<<blocks, kThreads, 0, c->stream>>>(static_cast<const uint4 *>(params->data), ip,
                                                                  static_cast<uint4 *>(out->data), n, Du, rows, err);
            break;
        case 8:
            k_gather<uint64_t, I><<<blocks, kThreads, 0, c->stream>>>(
                static_cast<const uint64_t *>(params->data), ip, static_cast<uint64_t *>(out->data), n, Du, rows, err);
            break;
        case 4:
            k_gather<uint32_t, I><<<blocks, kThreads, 0, c->stream>>>(
                static_cast<const uint32_t *>(params->data), ip, static_cast<uint32_t *>(out->data), n, Du, rows, err);
            break;
        case 2:
            k_gather<uint16_t, I><<<blocks, kThreads, 0, c->stream>>>(
                static_cast<const uint16_t *>(params->data), ip, static_cast<uint16_t *>(out->data), n, Du, rows, err);
            break;
        default:
            k_gather<uint8_t, I><<<blocks, kThreads, 0, c->stream>>>(
                static_cast<const uint8_t *>(params->data), ip, static_cast<uint8_t *>(out->data), n, Du, rows, err);
            break;
        }
        return nb__gpu_launched(c, op);
    });
    return s ? s : nb__gpu_index_error_check(c, op, rows);
}

extern "C" nb_status nb__gpu_scatter_add(nb_gpu_ctx *c, const char *op, const nb_view *out, const nb_view *indices,
                                         const nb_view *updates)
{
    const int64_t n = indices->numel, rows = rows_of(out);
    if (n <= 0 || updates->numel <= 0)
        return by_index(c, op, indices, [](auto) { return NB_OK; });
    if (!out->contiguous || !indices->contiguous)
        return nb__fail(NB_ERR_INTERNAL, "%s: scatter_add expects contiguous out and indices on %s", op,
                        c->dev->name);
    if (updates->dtype != out->dtype)
        return nb__fail(NB_ERR_DTYPE, "%s: updates are %s but out is %s", op, nb_dtype_name(updates->dtype),
                        nb_dtype_name(out->dtype));
    const int64_t D_ = updates->numel / n;
    // Strided updates are made contiguous first, in scratch memory.
    Scratch dense(c, updates->contiguous ? 0 : (size_t)updates->numel * dtype_size(updates->dtype));
    const void *up = updates->data;
    if (!updates->contiguous) {
        if (!dense.p)
            return nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
        nb_view v = *updates;
        v.data = dense.p;
        v.contiguous = true;
        nb__contiguous_strides(v.ndim, v.shape, dtype_size(v.dtype), v.strides);
        nb_status s = nb__gpu_copy(c, &v, updates);
        if (s)
            return s;
        up = dense.p;
    }
    nb_gpu_index_error *err;
    nb_status s = nb__gpu_index_error_record(c, &err);
    if (s)
        return s;
    s = dispatch(out->dtype, [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        if constexpr (D == NB_BOOL || D == NB_U8) {
            return dtype_error(c, op, D);
        } else {
            return by_index(c, op, indices, [&](auto ityp) -> nb_status {
                using I = decltype(ityp);
                k_scatter_add<D, I><<<grid_for(c, n * D_), kThreads, 0, c->stream>>>(
                    static_cast<T_of<D> *>(out->data), static_cast<const I *>(indices->data),
                    static_cast<const T_of<D> *>(up), n, D_, rows, err);
                return nb__gpu_launched(c, op);
            });
        }
    });
    return s ? s : nb__gpu_index_error_check(c, op, rows);
}

extern "C" nb_status nb__gpu_one_hot(nb_gpu_ctx *c, const nb_view *out, const nb_view *indices, double on,
                                     double off)
{
    const int64_t n = indices->numel;
    if (out->numel <= 0 || n <= 0)
        return NB_OK;
    if (!out->contiguous || !indices->contiguous)
        return nb__fail(NB_ERR_INTERNAL, "one_hot: expects contiguous operands on %s", c->dev->name);
    const int64_t depth = out->numel / n;
    return dispatch(out->dtype, [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        return by_index(c, "one_hot", indices, [&](auto ityp) -> nb_status {
            using I = decltype(ityp);
            k_one_hot<D, I><<<grid_for(c, n * depth), kThreads, 0, c->stream>>>(
                static_cast<T_of<D> *>(out->data), static_cast<const I *>(indices->data), n, depth, on, off);
            return nb__gpu_launched(c, "one_hot");
        });
    });
}
