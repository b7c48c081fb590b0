// Layer normalisation over contiguous rows: the table's layer_norm_rows and
// layer_norm_rows_grad, in f32, f64, f16 and bf16, as the CPU's (backend.h).
//
// Forward: a row's sum and then its squared deviations about the mean are
// accumulated in double whatever the dtype (a half-precision row would lose
// its statistics otherwise, and a row of one value must centre to exactly 0),
// then the output is written, computed in float (f16, bf16, f32) or double
// (f64) with the CPU's centring: (x - m) - dm, where m is the mean rounded to
// the compute type and dm what that rounding lost. Rows up to 1024 long get a
// warp each, longer ones a block of 256 threads; a row is read three times,
// from L1 or L2 after the first.
//
// Gradient: a first kernel sums each row's mean again (double), h = g gamma and
// h xhat over the row, keeps the mean for the column sums and writes dx; a
// second sums g and g xhat down blocks of 64 rows per column into double
// partials, and a third adds the partials in block order into dgamma and
// dbeta. The splits depend on the shape alone, so the results repeat bit for
// bit. mean and rstd are f32 for f16 and bf16 inputs (the front end makes
// them so), the input's dtype otherwise.
#include "gpu_kernels.cuh"

#include <cub/block/block_reduce.cuh>

#include <initializer_list>
#include <type_traits>

using namespace nbg;

namespace {

constexpr int kRowThreads = 256;
constexpr int64_t kColRows = 64; // rows per partial of the column sums

// The dtype of mean and rstd for input dtype D.
template <nb_dtype D> using Stat = std::conditional_t<D == NB_F64, double, float>;

// The sum over the lanes of a row group: one warp (WARP) or one block.
template <bool WARP> struct RowSum {
    using BR = cub::BlockReduce<double, kRowThreads>;
    typename BR::TempStorage *temp;
    __device__ __forceinline__ double operator()(double v) const
    {
        if constexpr (WARP) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                v += __shfl_xor_sync(0xffffffffu, v, o);
            return v; // every lane holds it
        } else {
            __shared__ double total;
            const double s = BR(*temp).Sum(v);
            if (threadIdx.x == 0)
                total = s;
            __syncthreads();
            const double r = total;
            __syncthreads(); // temp and total are reused by the next sum
            return r;
        }
    }
};

// How a row kernel's threads share the rows: with WARP a warp per row, else a
// block per row. The group's lanes take every lanes-th element of a row.
template <bool WARP> struct RowGroup {
    int lane, lanes;
    int64_t first, step; // the group's first row, and the stride to its next
};

template <bool WARP> __device__ __forceinline__ RowGroup<WARP> row_group()
{
    if constexpr (WARP)
        return RowGroup<WARP>{(int)(threadIdx.x & 31), 32, gtid() >> 5, gstride() >> 5};
    else
        return RowGroup<WARP>{(int)threadIdx.x, kRowThreads, (int64_t)blockIdx.x, (int64_t)gridDim.x};
}

// The mean of row xr's L values, summed in double; every lane gets it.
template <nb_dtype D, bool WARP>
__device__ __forceinline__ double mean_of_row(const RowSum<WARP> &sum, const RowGroup<WARP> &grp, const T_of<D> *xr,
                                           int64_t L)
{
    double s = 0;
    for (int64_t j = grp.lane; j < L; j += grp.lanes)
        s += static_cast<double>(ld<D>(xr[j]));
    return sum(s) / static_cast<double>(L);
}

template <nb_dtype D, bool WARP>
__global__ void __launch_bounds__(kRowThreads)
    k_ln_fwd(const T_of<D> *x, const T_of<D> *gamma, const T_of<D> *beta, T_of<D> *out, Stat<D> *mean,
             Stat<D> *rstd, int64_t rows, int64_t L, double eps)
{
    using C = typename DT<D>::C; // float, or double for f64
    __shared__ typename cub::BlockReduce<double, kRowThreads>::TempStorage temp;
    const RowSum<WARP> sum{&temp};
    const RowGroup<WARP> grp = row_group<WARP>();
    const int lane = grp.lane, lanes = grp.lanes;
    for (int64_t r = grp.first; r < rows; r += grp.step) {
        const T_of<D> *xr = x + r * L;
        const double mu = mean_of_row<D>(sum, grp, xr, L);
        double q = 0;
        for (int64_t j = lane; j < L; j += lanes) {
            const double d = static_cast<double>(ld<D>(xr[j])) - mu;
            q += d * d;
        }
        const double rs = 1.0 / sqrt(sum(q) / static_cast<double>(L) + eps);
        if (lane == 0) {
            if (mean)
                mean[r] = static_cast<Stat<D>>(mu);
            rstd[r] = static_cast<Stat<D>>(rs);
        }
        const C m = static_cast<C>(mu), dm = static_cast<C>(mu - static_cast<double>(m)), sc = static_cast<C>(rs);
        T_of<D> *o = out + r * L;
        for (int64_t j = lane; j < L; j += lanes) {
            // each step rounded, in the CPU's order (no fma)
            C v = mul_rn(sub_rn(sub_rn(static_cast<C>(ld<D>(xr[j])), m), dm), sc);
            if (gamma)
                v = mul_rn(v, static_cast<C>(ld<D>(gamma[j])));
            if (beta)
                v = add_rn(v, static_cast<C>(ld<D>(beta[j])));
            o[j] = st<D>(v);
        }
    }
}

// dx per row, and each row's mean (double) for the column sums.
template <nb_dtype D, bool WARP>
__global__ void __launch_bounds__(kRowThreads)
    k_ln_bwd_rows(const T_of<D> *g, const T_of<D> *x, const Stat<D> *rstd, const T_of<D> *gamma, T_of<D> *dx,
                  double *row_mean, int64_t rows, int64_t L)
{
    using C = typename DT<D>::C;
    __shared__ typename cub::BlockReduce<double, kRowThreads>::TempStorage temp;
    const RowSum<WARP> sum{&temp};
    const RowGroup<WARP> grp = row_group<WARP>();
    const int lane = grp.lane, lanes = grp.lanes;
    for (int64_t r = grp.first; r < rows; r += grp.step) {
        const T_of<D> *xr = x + r * L, *gr = g + r * L;
        const double mu = mean_of_row<D>(sum, grp, xr, L), rs = static_cast<double>(rstd[r]);
        if (lane == 0 && row_mean)
            row_mean[r] = mu;
        if (!dx)
            continue;
        double sh = 0, shx = 0;
        for (int64_t j = lane; j < L; j += lanes) {
            const double gj = static_cast<double>(ld<D>(gr[j]));
            const double h = gamma ? gj * static_cast<double>(ld<D>(gamma[j])) : gj;
            sh += h;
            shx += h * ((static_cast<double>(ld<D>(xr[j])) - mu) * rs);
        }
        sh = sum(sh);
        shx = sum(shx);
        const C m = static_cast<C>(mu), dm = static_cast<C>(mu - static_cast<double>(m)), sc = static_cast<C>(rs);
        const C a = static_cast<C>(sh / static_cast<double>(L)), q = static_cast<C>(shx / static_cast<double>(L));
        T_of<D> *o = dx + r * L;
        for (int64_t j = lane; j < L; j += lanes) {
            C h = static_cast<C>(ld<D>(gr[j]));
            if (gamma)
                h = mul_rn(h, static_cast<C>(ld<D>(gamma[j])));
            // each step rounded, in the CPU's order (no fma)
            const C xq = mul_rn(mul_rn(sub_rn(sub_rn(static_cast<C>(ld<D>(xr[j])), m), dm), sc), q);
            o[j] = st<D>(mul_rn(sc, sub_rn(sub_rn(h, a), xq)));
        }
    }
}

// part[b][j] = the sums of g and of g xhat over rows [b kColRows, (b+1) kColRows)
// of column j (g's at part, g xhat's at part + blocks L): a thread per column.
template <nb_dtype D>
__global__ void __launch_bounds__(kThreads)
    k_ln_bwd_cols(const T_of<D> *g, const T_of<D> *x, const Stat<D> *rstd, const double *row_mean, double *part,
                  int64_t rows, int64_t L, int64_t blocks)
{
    for (int64_t t = gtid(); t < blocks * L; t += gstride()) {
        const int64_t b = t / L, j = t - b * L;
        const int64_t r1 = min(rows, (b + 1) * kColRows);
        double sg = 0, sgx = 0;
        for (int64_t r = b * kColRows; r < r1; r++) {
            const double gj = static_cast<double>(ld<D>(g[r * L + j]));
            sg += gj;
            sgx += gj * ((static_cast<double>(ld<D>(x[r * L + j])) - row_mean[r]) * static_cast<double>(rstd[r]));
        }
        part[b * L + j] = sg;
        part[(blocks + b) * L + j] = sgx;
    }
}

// dbeta[j], dgamma[j]: the partials of column j added in block order.
template <nb_dtype D>
__global__ void __launch_bounds__(kThreads)
    k_ln_bwd_final(const double *part, T_of<D> *dgamma, T_of<D> *dbeta, int64_t L, int64_t blocks)
{
    for (int64_t j = gtid(); j < L; j += gstride()) {
        double sg = 0, sgx = 0;
        for (int64_t b = 0; b < blocks; b++) {
            sg += part[b * L + j];
            sgx += part[(blocks + b) * L + j];
        }
        if (dbeta)
            dbeta[j] = st<D>(sg);
        if (dgamma)
            dgamma[j] = st<D>(sgx);
    }
}

template <class T> T *data_of(const nb_view *v) { return v ? static_cast<T *>(v->data) : nullptr; }

// Whether the views are what the table promises: contiguous rows, the dtypes.
bool ln_views_ok(nb_dtype d, nb_dtype stat, std::initializer_list<const nb_view *> data,
                 std::initializer_list<const nb_view *> stats)
{
    for (const nb_view *v : data)
        if (v && (v->dtype != d || !v->contiguous))
            return false;
    for (const nb_view *v : stats)
        if (v && (v->dtype != stat || !v->contiguous))
            return false;
    return true;
}

constexpr nb_dtype stat_dtype(nb_dtype d) { return d == NB_F64 ? NB_F64 : NB_F32; }

// How a row kernel is launched for rows of L: a warp per row up to 1024
// elements, else a block per row, with at most one wave of blocks.
struct RowLaunch {
    bool warp;
    unsigned blocks;
};

RowLaunch row_launch(const nb_gpu_ctx *c, int64_t rows, int64_t L)
{
    if (L <= 1024)
        return RowLaunch{true, grid_for(c, rows * 32, kRowThreads)};
    const int64_t cap = (int64_t)c->phys->sm_count * (2048 / kRowThreads);
    return RowLaunch{false, (unsigned)(rows < cap ? rows : cap)};
}

} // namespace

extern "C" nb_status nb__gpu_layer_norm_rows(nb_gpu_ctx *c, int64_t rows, int64_t L, const nb_view *out,
                                             const nb_view *mean, const nb_view *rstd, const nb_view *x,
                                             const nb_view *gamma, const nb_view *beta, double epsilon)
{
    if (!ln_views_ok(x->dtype, stat_dtype(x->dtype), {out, x, gamma, beta}, {mean, rstd}))
        return nb__fail(NB_ERR_INTERNAL, "layer_norm: the row kernel needs contiguous views of %s (statistics %s) on %s",
                        nb_dtype_name(x->dtype), nb_dtype_name(stat_dtype(x->dtype)), c->dev->name);
    if (rows <= 0)
        return NB_OK;
    return dispatch_float(x->dtype, c, "layer_norm", [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        using T = T_of<D>;
        if (L == 0) { // no elements: the statistics are NaN, as the CPU's 0/0
            const nb_view *st_views[2] = {mean, rstd};
            for (const nb_view *v : st_views)
                if (v)
                    NB_GPU_CALL(c, cudaMemsetAsync, v->data, 0xff, (size_t)rows * sizeof(Stat<D>), c->stream);
            return NB_OK; // all-ones bits: a NaN in f32 and f64
        }
        const T *xp = data_of<const T>(x), *gp = data_of<const T>(gamma), *bp = data_of<const T>(beta);
        T *op = data_of<T>(out);
        Stat<D> *mp = data_of<Stat<D>>(mean), *rp = data_of<Stat<D>>(rstd);
        const RowLaunch rl = row_launch(c, rows, L);
        if (rl.warp)
            k_ln_fwd<D, true><<<rl.blocks, kRowThreads, 0, c->stream>>>(xp, gp, bp, op, mp, rp, rows, L, epsilon);
        else
            k_ln_fwd<D, false><<<rl.blocks, kRowThreads, 0, c->stream>>>(xp, gp, bp, op, mp, rp, rows, L, epsilon);
        return nb__gpu_launched(c, "layer_norm");
    });
}

extern "C" nb_status nb__gpu_layer_norm_rows_grad(nb_gpu_ctx *c, int64_t rows, int64_t L, const nb_view *dx,
                                                  const nb_view *dgamma, const nb_view *dbeta, const nb_view *g,
                                                  const nb_view *x, const nb_view *rstd, const nb_view *gamma)
{
    if (!ln_views_ok(x->dtype, stat_dtype(x->dtype), {dx, dgamma, dbeta, g, x, gamma}, {rstd}))
        return nb__fail(NB_ERR_INTERNAL,
                        "layer_norm: the row gradient needs contiguous views of %s (statistics %s) on %s",
                        nb_dtype_name(x->dtype), nb_dtype_name(stat_dtype(x->dtype)), c->dev->name);
    const bool cols = dgamma || dbeta;
    return dispatch_float(x->dtype, c, "layer_norm", [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        using T = T_of<D>;
        T *dgp = data_of<T>(dgamma), *dbp = data_of<T>(dbeta);
        if (rows <= 0 || L == 0) { // dgamma, dbeta: sums of nothing
            if (cols && L > 0) {
                if (dgp)
                    NB_GPU_CALL(c, cudaMemsetAsync, dgp, 0, (size_t)L * sizeof(T), c->stream);
                if (dbp)
                    NB_GPU_CALL(c, cudaMemsetAsync, dbp, 0, (size_t)L * sizeof(T), c->stream);
            }
            return NB_OK;
        }
        const T *gp = data_of<const T>(g), *xp = data_of<const T>(x), *gmp = data_of<const T>(gamma);
        const Stat<D> *rp = data_of<const Stat<D>>(rstd);
        const int64_t blocks = (rows + kColRows - 1) / kColRows;
        Scratch means(c, cols ? (size_t)rows * sizeof(double) : 0);
        Scratch part(c, cols ? (size_t)(2 * blocks * L) * sizeof(double) : 0);
        if (cols && (!means.p || !part.p))
            return nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
        double *mean_p = static_cast<double *>(means.p);
        T *dxp = data_of<T>(dx);
        if (dxp || cols) {
            const RowLaunch rl = row_launch(c, rows, L);
            if (rl.warp)
                k_ln_bwd_rows<D, true><<<rl.blocks, kRowThreads, 0, c->stream>>>(gp, xp, rp, gmp, dxp, mean_p, rows, L);
            else
                k_ln_bwd_rows<D, false><<<rl.blocks, kRowThreads, 0, c->stream>>>(gp, xp, rp, gmp, dxp, mean_p, rows,
                                                                                   L);
            nb_status s = nb__gpu_launched(c, "layer_norm_grad");
            if (s)
                return s;
        }
        if (!cols)
            return NB_OK;
        double *pp = static_cast<double *>(part.p);
        k_ln_bwd_cols<D><<<grid_for(c, blocks * L), kThreads, 0, c->stream>>>(gp, xp, rp, mean_p, pp, rows, L, blocks);
        nb_status s = nb__gpu_launched(c, "layer_norm_grad");
        if (s)
            return s;
        k_ln_bwd_final<D><<<grid_for(c, L), kThreads, 0, c->stream>>>(pp, dgp, dbp, L, blocks);
        return nb__gpu_launched(c, "layer_norm_grad");
    });
}
