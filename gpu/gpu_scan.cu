// Running sums along an axis (the cumsum entry).
//
// x (any strides) is seen as rows = (the dims before axis) x (the dims after
// it), each row L elements along axis, out contiguous. Three layouts:
// - short rows (L <= 64), or many rows side by side in memory (axis not the
//   innermost dim): one thread per row scans it serially; neighbouring threads
//   read neighbouring rows, so the loads coalesce when the axis is not innermost;
// - otherwise one block per row (or per chunk of a row), cub::BlockScan over
//   tiles of 1024 elements carrying the running total from tile to tile;
// - few long rows: the rows are cut into chunks so that every SM gets work:
//   one pass sums each chunk (cub::BlockReduce), one scans those sums per row,
//   one scans each chunk starting from its offset. A single row of over 64K
//   elements goes to cub::DeviceScan instead, unless deterministic mode is on
//   (DeviceScan's decoupled look-back may add floats in an order that varies
//   from run to run; the chunked passes always add in the same order).
// Reverse scans read the row from its end: position j of the scan is element
// L-1-j. f16, bf16, f32 and f64 accumulate in double, each output rounded to
// its dtype, as the CPU's f32 does (a float accumulator drifts by the rounding
// of every step: [1e8, 1, -1e8] would end in 0, not 1); i32 and i64 in
// wrapping uint64 (an i32 result wraps like the CPU's, and no signed overflow).
// Scratch comes from the caching allocator, never from cudaMalloc.
#include "gpu_kernels.cuh"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/tabulate_output_iterator.h>
#include <thrust/iterator/transform_iterator.h>

using namespace nbg;

namespace {

// The kept (row) dims: sizes and byte strides in x and in out.
struct SGeo {
    int nk;
    int64_t shape[NB_MAX_DIMS], sx[NB_MAX_DIMS], so[NB_MAX_DIMS];
};

__host__ __device__ __forceinline__ void row_offsets(const SGeo &g, int64_t r, int64_t &ox, int64_t &oo)
{
    ox = 0;
    oo = 0;
    for (int d = g.nk - 1; d >= 0; d--) {
        const int64_t q = r / g.shape[d], i = r - q * g.shape[d];
        ox += i * g.sx[d];
        oo += i * g.so[d];
        r = q;
    }
}

// What a scan of dtype D accumulates in: double for every floating dtype,
// uint64 for the integers.
template <nb_dtype D> using ScanAcc = std::conditional_t<is_float_v<D>, double, unsigned long long>;

// Storage dtype D in and out, accumulated in ScanAcc<D>.
template <nb_dtype D> struct ElemIO {
    using Acc = ScanAcc<D>;
    static __device__ __forceinline__ Acc load(const char *p)
    {
        return static_cast<Acc>(ld<D>(*reinterpret_cast<const T_of<D> *>(p)));
    }
    static __device__ __forceinline__ void store(char *p, Acc v) { *reinterpret_cast<T_of<D> *>(p) = st<D>(v); }
};

// The per-chunk sums, kept in Acc.
template <class A> struct AccIO {
    using Acc = A;
    static __device__ __forceinline__ Acc load(const char *p) { return *reinterpret_cast<const A *>(p); }
    static __device__ __forceinline__ void store(char *p, Acc v) { *reinterpret_cast<A *>(p) = v; }
};

struct Line {
    const char *x;
    char *out;
    int64_t rows, L;
    int64_t sx, so; // byte steps along the axis
    bool exclusive, reverse;
};

// One thread per row.
template <class IO>
__global__ void __launch_bounds__(kThreads) k_scan_serial(SGeo g, Line ln)
{
    using Acc = typename IO::Acc;
    for (int64_t r = gtid(); r < ln.rows; r += gstride()) {
        int64_t ox, oo;
        row_offsets(g, r, ox, oo);
        const char *x = ln.x + ox;
        char *out = ln.out + oo;
        Acc acc = Acc(0);
        for (int64_t j = 0; j < ln.L; j++) {
            const int64_t l = ln.reverse ? ln.L - 1 - j : j;
            const Acc v = IO::load(x + l * ln.sx);
            if (ln.exclusive) {
                IO::store(out + l * ln.so, acc);
                acc += v;
            } else {
                acc += v;
                IO::store(out + l * ln.so, acc);
            }
        }
    }
}

constexpr int kScanThreads = 256, kItems = 4, kTile = kScanThreads * kItems;

// Segment s of a line cut into nchunk chunks of chunk positions: row s /
// nchunk's data, and its positions [j0, j1) along the axis.
struct Segment {
    const char *x;
    char *out;
    int64_t j0, j1;
};

__device__ __forceinline__ Segment segment(const SGeo &g, const Line &ln, int64_t s, int64_t chunk, int64_t nchunk)
{
    const int64_t r = s / nchunk, cidx = s - r * nchunk;
    int64_t ox, oo;
    row_offsets(g, r, ox, oo);
    const int64_t j0 = cidx * chunk;
    return Segment{ln.x + ox, ln.out + oo, j0, min(ln.L, j0 + chunk)};
}

// One block per segment (row r, chunk c): scan positions [c*chunk, (c+1)*chunk)
// of row r, starting from prefix[r * nchunk + c] (0 when prefix is NULL).
template <class IO>
__global__ void __launch_bounds__(kScanThreads)
    k_scan_block(SGeo g, Line ln, int64_t chunk, int64_t nchunk, const typename IO::Acc *prefix)
{
    using Acc = typename IO::Acc;
    using BlockScan = cub::BlockScan<Acc, kScanThreads>;
    __shared__ typename BlockScan::TempStorage temp;
    const int64_t nseg = ln.rows * nchunk;
    for (int64_t s = blockIdx.x; s < nseg; s += gridDim.x) {
        const Segment seg = segment(g, ln, s, chunk, nchunk);
        const char *x = seg.x;
        char *out = seg.out;
        const int64_t j0 = seg.j0, j1 = seg.j1;
        Acc carry = prefix ? prefix[s] : Acc(0);
        for (int64_t t = j0; t < j1; t += kTile) {
            Acc v[kItems], y[kItems];
#pragma unroll
            for (int k = 0; k < kItems; k++) {
                const int64_t j = t + (int64_t)threadIdx.x * kItems + k;
                const int64_t l = ln.reverse ? ln.L - 1 - j : j;
                v[k] = j < j1 ? IO::load(x + l * ln.sx) : Acc(0);
            }
            Acc total;
            if (ln.exclusive)
                BlockScan(temp).ExclusiveSum(v, y, total);
            else
                BlockScan(temp).InclusiveSum(v, y, total);
#pragma unroll
            for (int k = 0; k < kItems; k++) {
                const int64_t j = t + (int64_t)threadIdx.x * kItems + k;
                const int64_t l = ln.reverse ? ln.L - 1 - j : j;
                if (j < j1)
                    IO::store(out + l * ln.so, carry + y[k]);
            }
            carry += total;
            __syncthreads(); // temp is reused by the next tile
        }
    }
}

// sums[s] = the sum of segment s, added in a fixed order.
template <class IO>
__global__ void __launch_bounds__(kScanThreads)
    k_chunk_sums(SGeo g, Line ln, int64_t chunk, int64_t nchunk, typename IO::Acc *sums)
{
    using Acc = typename IO::Acc;
    using BlockReduce = cub::BlockReduce<Acc, kScanThreads>;
    __shared__ typename BlockReduce::TempStorage temp;
    const int64_t nseg = ln.rows * nchunk;
    for (int64_t s = blockIdx.x; s < nseg; s += gridDim.x) {
        const Segment seg = segment(g, ln, s, chunk, nchunk);
        const char *x = seg.x;
        const int64_t j0 = seg.j0, j1 = seg.j1;
        Acc acc = Acc(0);
        for (int64_t j = j0 + threadIdx.x; j < j1; j += kScanThreads)
            acc += IO::load(x + (ln.reverse ? ln.L - 1 - j : j) * ln.sx);
        const Acc total = BlockReduce(temp).Sum(acc);
        if (threadIdx.x == 0)
            sums[s] = total;
        __syncthreads();
    }
}

// For cub::DeviceScan over one row: element j of the scan, as Acc.
template <nb_dtype D> struct RowLoad {
    const char *x;
    int64_t L, sx;
    bool reverse;
    __device__ __forceinline__ ScanAcc<D> operator()(int64_t j) const
    {
        return ElemIO<D>::load(x + (reverse ? L - 1 - j : j) * sx);
    }
};
template <nb_dtype D> struct RowStore {
    char *out;
    int64_t L, so;
    bool reverse;
    __device__ __forceinline__ void operator()(int64_t j, ScanAcc<D> v) const
    {
        ElemIO<D>::store(out + (reverse ? L - 1 - j : j) * so, v);
    }
};

unsigned block_grid(const nb_gpu_ctx *c, int64_t segments)
{
    const int64_t cap = (int64_t)c->phys->sm_count * (2048 / kScanThreads) * 4;
    return (unsigned)(segments < cap ? (segments < 1 ? 1 : segments) : cap);
}

template <nb_dtype D> nb_status scan_typed(nb_gpu_ctx *c, const SGeo &g, const Line &ln)
{
    using Acc = ScanAcc<D>;
    const int64_t sm = c->phys->sm_count, es = (int64_t)sizeof(T_of<D>);
    const bool det = nb_deterministic();

    // Many rows side by side (the axis is not the innermost dim), or short rows.
    const bool rows_adjacent = g.nk > 0 && g.sx[g.nk - 1] == es && ln.sx != es;
    if (ln.L <= 64 || (rows_adjacent && ln.rows >= sm * 256)) {
        k_scan_serial<ElemIO<D>><<<grid_for(c, ln.rows), kThreads, 0, c->stream>>>(g, ln);
        return nb__gpu_launched(c, "cumsum");
    }

    // One long row: cub::DeviceScan (not in deterministic mode).
    if (ln.rows == 1 && ln.L > 65536 && !det) {
        int64_t ox, oo;
        row_offsets(g, 0, ox, oo);
        auto in = thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0),
                                                  RowLoad<D>{ln.x + ox, ln.L, ln.sx, ln.reverse});
        auto outp = thrust::make_tabulate_output_iterator(RowStore<D>{ln.out + oo, ln.L, ln.so, ln.reverse});
        size_t bytes = 0;
        cudaError_t e = ln.exclusive ? cub::DeviceScan::ExclusiveSum(nullptr, bytes, in, outp, ln.L, c->stream)
                                     : cub::DeviceScan::InclusiveSum(nullptr, bytes, in, outp, ln.L, c->stream);
        if (e != cudaSuccess)
            return nb__gpu_cuda_fail(e, "cub::DeviceScan", c->dev->name);
        Scratch temp(c, bytes);
        if (bytes && !temp.p)
            return nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
        e = ln.exclusive ? cub::DeviceScan::ExclusiveSum(temp.p, bytes, in, outp, ln.L, c->stream)
                         : cub::DeviceScan::InclusiveSum(temp.p, bytes, in, outp, ln.L, c->stream);
        if (e != cudaSuccess)
            return nb__gpu_cuda_fail(e, "cub::DeviceScan", c->dev->name);
        return nb__gpu_launched(c, "cumsum");
    }

    // Blocks over rows, each row cut into nchunk chunks when rows alone would
    // leave SMs idle.
    int64_t nchunk = 1;
    const int64_t want = sm * 4;
    if (ln.rows < want && ln.L > 4 * kTile) {
        nchunk = (want + ln.rows - 1) / ln.rows;
        const int64_t most = (ln.L + 4 * kTile - 1) / (4 * kTile); // chunks of at least 4 tiles
        if (nchunk > most)
            nchunk = most;
    }
    int64_t chunk = (ln.L + nchunk - 1) / nchunk;
    chunk = (chunk + kTile - 1) / kTile * kTile;
    nchunk = (ln.L + chunk - 1) / chunk;
    if (nchunk == 1) {
        k_scan_block<ElemIO<D>><<<block_grid(c, ln.rows), kScanThreads, 0, c->stream>>>(g, ln, ln.L, 1, nullptr);
        return nb__gpu_launched(c, "cumsum");
    }
    const int64_t nseg = ln.rows * nchunk;
    Scratch sums(c, (size_t)nseg * sizeof(Acc));
    if (!sums.p)
        return nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
    Acc *sp = static_cast<Acc *>(sums.p);
    k_chunk_sums<ElemIO<D>><<<block_grid(c, nseg), kScanThreads, 0, c->stream>>>(g, ln, chunk, nchunk, sp);
    nb_status s = nb__gpu_launched(c, "cumsum_chunks");
    if (s)
        return s;
    // The chunk sums of each row, scanned (exclusive) in place: rows of nchunk.
    SGeo gs;
    std::memset(&gs, 0, sizeof gs);
    gs.nk = 1;
    gs.shape[0] = ln.rows;
    gs.sx[0] = gs.so[0] = nchunk * (int64_t)sizeof(Acc);
    Line ls{reinterpret_cast<const char *>(sp), reinterpret_cast<char *>(sp), ln.rows, nchunk,
            (int64_t)sizeof(Acc), (int64_t)sizeof(Acc), true, false};
    if (nchunk <= 64)
        k_scan_serial<AccIO<Acc>><<<grid_for(c, ln.rows), kThreads, 0, c->stream>>>(gs, ls);
    else
        k_scan_block<AccIO<Acc>><<<block_grid(c, ln.rows), kScanThreads, 0, c->stream>>>(gs, ls, nchunk, 1,
                                                                                          nullptr);
    if ((s = nb__gpu_launched(c, "cumsum_offsets")) != NB_OK)
        return s;
    k_scan_block<ElemIO<D>><<<block_grid(c, nseg), kScanThreads, 0, c->stream>>>(g, ln, chunk, nchunk, sp);
    return nb__gpu_launched(c, "cumsum");
}

} // namespace

extern "C" nb_status nb__gpu_cumsum(nb_gpu_ctx *c, const nb_view *out, const nb_view *x, int axis, bool exclusive,
                                    bool reverse)
{
    if (axis < 0)
        axis += x->ndim;
    if (axis < 0 || axis >= x->ndim)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "cumsum: axis %d is out of range for rank %d", axis, x->ndim);
    if (out->dtype != x->dtype || out->ndim != x->ndim || !out->contiguous || out->numel != x->numel)
        return nb__fail(NB_ERR_INTERNAL, "cumsum: output must be contiguous with the input's shape and dtype on %s",
                        c->dev->name);
    if (out->numel <= 0)
        return NB_OK;
    const int64_t es = (int64_t)dtype_size(x->dtype);
    int64_t ostr[NB_MAX_DIMS];
    nb__contiguous_strides(out->ndim, out->shape, (size_t)es, ostr);
    SGeo g;
    std::memset(&g, 0, sizeof g);
    int64_t rows = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (d == axis || x->shape[d] == 1)
            continue;
        g.shape[g.nk] = x->shape[d];
        g.sx[g.nk] = x->strides[d];
        g.so[g.nk++] = ostr[d];
        rows *= x->shape[d];
    }
    // Merge neighbouring dims contiguous in both x and out.
    if (g.nk > 1) {
        int w = 0;
        for (int d = 1; d < g.nk; d++) {
            if (g.sx[w] == g.sx[d] * g.shape[d] && g.so[w] == g.so[d] * g.shape[d]) {
                g.shape[w] *= g.shape[d];
                g.sx[w] = g.sx[d];
                g.so[w] = g.so[d];
            } else {
                w++;
                g.shape[w] = g.shape[d];
                g.sx[w] = g.sx[d];
                g.so[w] = g.so[d];
            }
        }
        g.nk = w + 1;
    }
    Line ln{static_cast<const char *>(x->data), static_cast<char *>(out->data), rows, x->shape[axis],
            x->strides[axis], ostr[axis], exclusive, reverse};
    switch (x->dtype) {
    case NB_F32: return scan_typed<NB_F32>(c, g, ln);
    case NB_F64: return scan_typed<NB_F64>(c, g, ln);
    case NB_F16: return scan_typed<NB_F16>(c, g, ln);
    case NB_BF16: return scan_typed<NB_BF16>(c, g, ln);
    case NB_I32: return scan_typed<NB_I32>(c, g, ln);
    case NB_I64: return scan_typed<NB_I64>(c, g, ln);
    default: return dtype_error(c, "cumsum", x->dtype);
    }
}
