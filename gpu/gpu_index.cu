// gather (rows of params picked by indices), scatter_add (rows added into out
// at indices) and one_hot.
//
// An index outside [0, rows) makes gather write zeros for that row and
// scatter_add skip it, so nothing is written out of bounds; either kernel
// records such an index (with the op's name and the range: the first thread
// to find one wins, so among several bad indices which one is named may vary,
// where the CPU names the first in order) in the device's index-error record
// and the op returns at once, without waiting for the stream. The next synchronising call (a read, nb_synchronize) reads the
// record and fails with the op's NB_ERR_INVALID_ARGUMENT (gpu_device.c).
//
// scatter_add adds with atomicAdd, whose order varies from run to run for
// floats. In deterministic mode (nb_deterministic) floating scatter_add instead
// sorts (index, position) pairs with cub::DeviceRadixSort (stable, so equal
// indices keep their positions' order) and adds each run of equal indices in
// that order, one thread per output element of the run.
#include "gpu_kernels.cuh"

#include <cub/device/device_radix_sort.cuh>

using namespace nbg;

namespace {

// Rows are copied in units of U bytes (up to 16), Du units a row.
template <class U, class I>
__global__ void __launch_bounds__(kThreads)
    k_gather(const U *params, const I *idx, U *out, int64_t n, int64_t Du, int64_t rows, IndexCheck err)
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
                                                          IndexCheck err)
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

// ---- deterministic scatter_add ----------------------------------------------------

// keys[i] = indices[i], or rows (after every valid row) for a bad one, which is
// recorded; pos[i] = i.
template <class I>
__global__ void __launch_bounds__(kThreads)
    k_sort_keys(const I *idx, int64_t n, uint64_t *keys, int64_t *pos, IndexCheck chk)
{
    for (int64_t i = gtid(); i < n; i += gstride()) {
        const int64_t r = static_cast<int64_t>(idx[i]);
        if (r < 0 || r >= chk.rows) {
            flag_index(chk, i, r);
            keys[i] = (uint64_t)chk.rows;
        } else {
            keys[i] = (uint64_t)r;
        }
        pos[i] = i;
    }
}

// Over the sorted pairs: the thread for (k, j), k starting a run of equal keys,
// adds column j of the run's updates in position order and adds that sum to
// out once.
template <nb_dtype D>
__global__ void __launch_bounds__(kThreads)
    k_scatter_runs(T_of<D> *out, const uint64_t *keys, const int64_t *pos, const T_of<D> *updates, int64_t n,
                   int64_t D_, int64_t rows)
{
    using Acc = typename DT<D>::Acc;
    const int64_t total = n * D_;
    for (int64_t e = gtid(); e < total; e += gstride()) {
        const int64_t k = e / D_, j = e - k * D_;
        const uint64_t key = keys[k];
        if ((k > 0 && keys[k - 1] == key) || key >= (uint64_t)rows)
            continue;
        Acc acc = Acc(0);
        for (int64_t q = k; q < n && keys[q] == key; q++)
            acc += static_cast<Acc>(ld<D>(updates[pos[q] * D_ + j]));
        T_of<D> *o = out + (int64_t)key * D_ + j;
        *o = st<D>(static_cast<Acc>(ld<D>(*o)) + acc);
    }
}

template <nb_dtype D, class I>
nb_status scatter_add_sorted(nb_gpu_ctx *c, const char *op, T_of<D> *out, const I *idx, const T_of<D> *updates,
                             int64_t n, int64_t D_, int64_t rows, IndexCheck chk)
{
    int end_bit = 1; // keys run to rows (the bad-index key)
    while (end_bit < 64 && ((uint64_t)rows >> end_bit) != 0)
        end_bit++;
    Scratch keys(c, (size_t)n * 2 * sizeof(uint64_t)), pos(c, (size_t)n * 2 * sizeof(int64_t));
    if (!keys.p || !pos.p)
        return nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
    uint64_t *k_in = static_cast<uint64_t *>(keys.p), *k_out = k_in + n;
    int64_t *p_in = static_cast<int64_t *>(pos.p), *p_out = p_in + n;
    k_sort_keys<I><<<grid_for(c, n), kThreads, 0, c->stream>>>(idx, n, k_in, p_in, chk);
    nb_status s = nb__gpu_launched(c, op);
    if (s)
        return s;
    size_t bytes = 0;
    cudaError_t e = cub::DeviceRadixSort::SortPairs(nullptr, bytes, k_in, k_out, p_in, p_out, n, 0, end_bit,
                                                    c->stream);
    if (e != cudaSuccess)
        return nb__gpu_cuda_fail(e, "cub::DeviceRadixSort::SortPairs", c->dev->name);
    Scratch temp(c, bytes);
    if (bytes && !temp.p)
        return nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
    e = cub::DeviceRadixSort::SortPairs(temp.p, bytes, k_in, k_out, p_in, p_out, n, 0, end_bit, c->stream);
    if (e != cudaSuccess)
        return nb__gpu_cuda_fail(e, "cub::DeviceRadixSort::SortPairs", c->dev->name);
    k_scatter_runs<D><<<grid_for(c, n * D_), kThreads, 0, c->stream>>>(out, k_out, p_out, updates, n, D_, rows);
    return nb__gpu_launched(c, op);
}

// ---- index checks without a result ---------------------------------------------------

template <class I>
__global__ void __launch_bounds__(kThreads) k_check_indices(const I *idx, int64_t n, IndexCheck chk)
{
    for (int64_t i = gtid(); i < n; i += gstride()) {
        const int64_t r = static_cast<int64_t>(idx[i]);
        if (r < 0 || r >= chk.rows)
            flag_index(chk, i, r);
    }
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
    // the kernel copies rows of params' width into out: the CPU's checks
    if (out->dtype != params->dtype)
        return nb__fail(NB_ERR_DTYPE, "%s: output dtype %s differs from params dtype %s on %s", op,
                        nb_dtype_name(out->dtype), nb_dtype_name(params->dtype), c->dev->name);
    if (params->ndim < 1 || out->numel != n * (rows > 0 ? params->numel / rows : 0))
        return nb__fail(NB_ERR_SHAPE, "%s: gather of %lld rows of params [%lld, ...] %s into %lld elements of %s on %s",
                        op, (long long)n, (long long)rows, nb_dtype_name(params->dtype), (long long)out->numel,
                        nb_dtype_name(out->dtype), c->dev->name);
    const int64_t row_bytes = (out->numel / n) * (int64_t)dtype_size(out->dtype);
    IndexCheck err{nullptr, (unsigned long long)(uintptr_t)op, rows};
    nb_status s = nb__gpu_index_error_record(c, &err.err);
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
    nb__gpu_index_error_arm(c); // after a failure too: a kernel that ran before it may have flagged an index
    return s;
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
    if (out->ndim < 1 || updates->numel != n * (rows > 0 ? out->numel / rows : 0))
        return nb__fail(NB_ERR_SHAPE, "%s: %lld updates do not fill %lld rows of out [%lld, ...] on %s", op,
                        (long long)updates->numel, (long long)n, (long long)rows, c->dev->name);
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
    IndexCheck err{nullptr, (unsigned long long)(uintptr_t)op, rows};
    nb_status s = nb__gpu_index_error_record(c, &err.err);
    if (s)
        return s;
    const bool det = nb_deterministic();
    s = dispatch(out->dtype, [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        if constexpr (D == NB_BOOL || D == NB_U8) {
            return dtype_error(c, op, D);
        } else {
            return by_index(c, op, indices, [&](auto ityp) -> nb_status {
                using I = decltype(ityp);
                if constexpr (is_float_v<D>) {
                    if (det) // integer sums do not depend on the order: atomics stay
                        return scatter_add_sorted<D, I>(c, op, static_cast<T_of<D> *>(out->data),
                                                        static_cast<const I *>(indices->data),
                                                        static_cast<const T_of<D> *>(up), n, D_, rows, err);
                }
                k_scatter_add<D, I><<<grid_for(c, n * D_), kThreads, 0, c->stream>>>(
                    static_cast<T_of<D> *>(out->data), static_cast<const I *>(indices->data),
                    static_cast<const T_of<D> *>(up), n, D_, rows, err);
                return nb__gpu_launched(c, op);
            });
        }
    });
    nb__gpu_index_error_arm(c); // after a failure too: a kernel that ran before it may have flagged an index
    return s;
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

extern "C" nb_status nb__gpu_check_indices(nb_gpu_ctx *c, const char *op, const nb_view *indices, int64_t rows)
{
    const int64_t n = indices->numel;
    if (n <= 0)
        return by_index(c, op, indices, [](auto) { return NB_OK; });
    if (!indices->contiguous)
        return nb__fail(NB_ERR_INTERNAL, "%s: index check expects contiguous indices on %s", op, c->dev->name);
    IndexCheck chk{nullptr, (unsigned long long)(uintptr_t)op, rows};
    nb_status s = nb__gpu_index_error_record(c, &chk.err);
    if (s)
        return s;
    s = by_index(c, op, indices, [&](auto ityp) -> nb_status {
        using I = decltype(ityp);
        k_check_indices<I><<<grid_for(c, n), kThreads, 0, c->stream>>>(static_cast<const I *>(indices->data), n,
                                                                        chk);
        return nb__gpu_launched(c, op);
    });
    nb__gpu_index_error_arm(c); // after a failure too: a kernel that ran before it may have flagged an index
    return s;
}

// ---- the index-error record, read by the host ------------------------------------------

namespace {
__global__ void k_index_error_take(nb_gpu_index_error *d, nb_gpu_index_error *h)
{
    if (d->set && !h->set) // a record a failed wait left in the mirror is kept
        *h = *d;
    *d = nb_gpu_index_error{};
}
} // namespace

// One kernel, so that no check queued by another thread can land between the
// read and the clear. It moves the record only into an empty mirror: one a
// failed wait left there is reported at the next.
extern "C" cudaError_t nb__gpu_index_error_take(cudaStream_t s, nb_gpu_index_error *d, nb_gpu_index_error *h)
{
    k_index_error_take<<<1, 1, 0, s>>>(d, h);
    return cudaGetLastError();
}
