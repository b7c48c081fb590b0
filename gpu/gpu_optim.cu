// Fused optimizer updates: one pass over param, grad and slots; several
// updates of one kind in one launch (the _many entries), blockIdx.y picking
// the update, each as its single kernel computes it.
//
// SGD:       g' = g + weight_decay * p (weight_decay is 0 for the public SGDs)
//            plain:    p -= lr * g'
//            momentum: m = momentum * m + g';  p -= lr * m, or with Nesterov
//                      p -= lr * (g' + momentum * m)
// Adam:      m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//            p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
//            AdamW (weight_decay > 0) also p -= lr * weight_decay * p, from the
//            value before the step (decoupled).
// f16/bf16/f32 compute in float, f64 in double; the bias corrections are
// computed once on the host in double (nb_update_pack), and come from device
// memory instead in a recorded graph (nb_update_params.device_params).
// A loss scaler's captured step adds two device doubles: a skip flag (not 0:
// the update only copies its source to param) and the count of applied
// updates, from which Adam's bias corrections are worked out on the device
// (nb_update_bias, the host's own arithmetic). scaler_update advances the
// scaler's state there (nb_scaler_advance).
#include "gpu_kernels.cuh"

using namespace nbg;

namespace {

// The numbers of one update (nb_update_pack's layout), by value, or read from
// device memory that a recorded graph refreshes before each replay.
struct Upd {
    double v[NB_UPD_COUNT];
};

__device__ inline double upd(const Upd &a, const double *dp, int i) { return dp ? dp[i] : a.v[i]; }

// Whether a set skip flag stops the update; param then gets the source's
// values (a fresh buffer must still hold the parameter).
template <class T>
__device__ inline bool skipped(const double *skip, T *param, const T *source, int64_t n)
{
    if (!skip || *skip == 0)
        return false;
    if (source != param)
        for (int64_t i = gtid(); i < n; i += gstride())
            param[i] = source[i];
    return true;
}

// One update's buffers; mom and m2 may be nullptr.
template <nb_dtype D> struct Bufs {
    T_of<D> *param;
    const T_of<D> *source, *grad;
    T_of<D> *m1, *m2;
    int64_t n;
};

// Up to kMany updates of one launch: blockIdx.y picks the update, and its
// blocks run the single kernel's body over it.
constexpr int kMany = 32;
template <nb_dtype D> struct ManyBufs {
    Bufs<D> b[kMany];
};

template <nb_dtype D>
__device__ __forceinline__ void sgd_body(T_of<D> *param, const T_of<D> *source, const T_of<D> *grad, T_of<D> *mom,
                                         int64_t n, const Upd &a, const double *dp, bool nesterov, const double *skip)
{
    using C = typename DT<D>::Acc;
    if (skipped(skip, param, source, n))
        return;
    const C lr = (C)upd(a, dp, NB_UPD_LR), momentum = (C)upd(a, dp, NB_UPD_MOMENTUM),
            wd = (C)upd(a, dp, NB_UPD_WEIGHT_DECAY);
    for (int64_t i = gtid(); i < n; i += gstride()) {
        C p = ld<D>(source[i]); // param itself for an in-place update
        C g = ld<D>(grad[i]) + wd * p;
        if (mom) {
            C m = momentum * static_cast<C>(ld<D>(mom[i])) + g;
            mom[i] = st<D>(m);
            g = nesterov ? g + momentum * m : m;
        }
        param[i] = st<D>(p - lr * g);
    }
}

template <nb_dtype D>
__global__ void __launch_bounds__(kThreads) k_sgd(T_of<D> *param, const T_of<D> *source, const T_of<D> *grad,
                                                  T_of<D> *mom, int64_t n, Upd a, const double *dp, bool nesterov,
                                                  const double *skip)
{
    sgd_body<D>(param, source, grad, mom, n, a, dp, nesterov, skip);
}

template <nb_dtype D>
__global__ void __launch_bounds__(kThreads) k_sgd_many(ManyBufs<D> m, Upd a, const double *dp, bool nesterov,
                                                       const double *skip)
{
    const Bufs<D> &b = m.b[blockIdx.y];
    sgd_body<D>(b.param, b.source, b.grad, b.m1, b.n, a, dp, nesterov, skip);
}

template <nb_dtype D>
__device__ __forceinline__ void adam_body(T_of<D> *param, const T_of<D> *source, const T_of<D> *grad, T_of<D> *m1,
                                          T_of<D> *m2, int64_t n, const Upd &a, const double *dp, const double *skip,
                                          const double *count)
{
    using C = typename DT<D>::Acc;
    if (skipped(skip, param, source, n))
        return;
    const double b1_ = upd(a, dp, NB_UPD_BETA1), b2_ = upd(a, dp, NB_UPD_BETA2);
    const int64_t step = count ? (int64_t)*count + 1 : 0;
    const C lr = (C)upd(a, dp, NB_UPD_LR), b1 = (C)b1_, b2 = (C)b2_, eps = (C)upd(a, dp, NB_UPD_EPSILON),
            wd = (C)upd(a, dp, NB_UPD_WEIGHT_DECAY);
    const C inv_bc1 = (C)(1.0 / (count ? nb_update_bias(b1_, step) : upd(a, dp, NB_UPD_BC1))),
            inv_bc2 = (C)(1.0 / (count ? nb_update_bias(b2_, step) : upd(a, dp, NB_UPD_BC2)));
    const C c1 = (C)(1.0 - b1_), c2 = (C)(1.0 - b2_); // in double, as the CPU
    for (int64_t i = gtid(); i < n; i += gstride()) {
        const C p = ld<D>(source[i]), g = ld<D>(grad[i]);
        const C m = b1 * static_cast<C>(ld<D>(m1[i])) + c1 * g;
        const C v = b2 * static_cast<C>(ld<D>(m2[i])) + c2 * g * g;
        m1[i] = st<D>(m);
        m2[i] = st<D>(v);
        const C step = (m * inv_bc1) / (m_sqrt(v * inv_bc2) + eps);
        param[i] = st<D>(p - lr * step - lr * wd * p);
    }
}

template <nb_dtype D>
__global__ void __launch_bounds__(kThreads)
    k_adam(T_of<D> *param, const T_of<D> *source, const T_of<D> *grad, T_of<D> *m1, T_of<D> *m2, int64_t n, Upd a,
           const double *dp, const double *skip, const double *count)
{
    adam_body<D>(param, source, grad, m1, m2, n, a, dp, skip, count);
}

template <nb_dtype D>
__global__ void __launch_bounds__(kThreads)
    k_adam_many(ManyBufs<D> m, Upd a, const double *dp, const double *skip, const double *count)
{
    const Bufs<D> &b = m.b[blockIdx.y];
    adam_body<D>(b.param, b.source, b.grad, b.m1, b.m2, b.n, a, dp, skip, count);
}

__global__ void k_scaler(double *state, const double *check, double *count, nb_scaler_params p)
{
    const bool finite = *check == 0;
    nb_scaler_advance(state, finite, &p);
    if (count && finite)
        *count += 1;
}

Upd packed(const nb_update_params *p)
{
    Upd a;
    nb_update_pack(p, a.v);
    return a;
}

nb_status check_same(const nb_gpu_ctx *c, const char *op, const nb_view *param, const nb_view *v, const char *what)
{
    if (!v->contiguous || v->numel != param->numel || v->dtype != param->dtype)
        return nb__fail(NB_ERR_INTERNAL, "%s: %s must be contiguous with the parameter's size and dtype on %s", op,
                        what, c->dev->name);
    return NB_OK;
}

} // namespace

// What an update reads the parameter from: p->source where the update writes
// to a fresh buffer, else the parameter itself.
template <nb_dtype D> static const T_of<D> *source_of(const nb_view *param, const nb_update_params *p)
{
    return static_cast<const T_of<D> *>(p->source ? p->source : param->data);
}

extern "C" nb_status nb__gpu_sgd_update(nb_gpu_ctx *c, const nb_view *param, const nb_view *grad,
                                        const nb_view *slot1, const nb_update_params *p)
{
    static const char op[] = "sgd_update";
    const int64_t n = param->numel;
    if (n <= 0)
        return NB_OK;
    nb_status s;
    if ((s = check_same(c, op, param, param, "the parameter")) != NB_OK ||
        (s = check_same(c, op, param, grad, "the gradient")) != NB_OK ||
        (slot1 && (s = check_same(c, op, param, slot1, "the momentum slot")) != NB_OK))
        return s;
    return launch_float(c, op, param->dtype, n, [&](auto tag) {
        constexpr nb_dtype D = decltype(tag)::value;
        k_sgd<D><<<grid_for(c, n), kThreads, 0, c->stream>>>(out_ptr<D>(param), source_of<D>(param, p),
                                                             in_ptr<D>(grad), out_ptr<D>(slot1), n, packed(p),
                                                             p->device_params, p->nesterov, p->skip);
    });
}

extern "C" nb_status nb__gpu_adam_update(nb_gpu_ctx *c, const nb_view *param, const nb_view *grad,
                                         const nb_view *slot1, const nb_view *slot2, const nb_update_params *p)
{
    static const char op[] = "adam_update";
    const int64_t n = param->numel;
    if (n <= 0)
        return NB_OK;
    if (!slot1 || !slot2)
        return nb__fail(NB_ERR_INTERNAL, "%s: Adam needs both moment slots on %s", op, c->dev->name);
    nb_status s;
    if ((s = check_same(c, op, param, param, "the parameter")) != NB_OK ||
        (s = check_same(c, op, param, grad, "the gradient")) != NB_OK ||
        (s = check_same(c, op, param, slot1, "the first-moment slot")) != NB_OK ||
        (s = check_same(c, op, param, slot2, "the second-moment slot")) != NB_OK)
        return s;
    return launch_float(c, op, param->dtype, n, [&](auto tag) {
        constexpr nb_dtype D = decltype(tag)::value;
        k_adam<D><<<grid_for(c, n), kThreads, 0, c->stream>>>(out_ptr<D>(param), source_of<D>(param, p),
                                                              in_ptr<D>(grad), out_ptr<D>(slot1), out_ptr<D>(slot2), n,
                                                              packed(p), p->device_params, p->skip,
                                                              p->device_count);
    });
}

extern "C" nb_status nb__gpu_scaler_update(nb_gpu_ctx *c, double *state, const double *check, double *count,
                                           const nb_scaler_params *p)
{
    return launch(c, "scaler_update", k_scaler, 1, 1, state, check, count, *p);
}

// Several updates: their views checked as the single entries check them, then
// one launch per kMany of them (grid x: enough blocks for the largest).
static nb_status many_updates(nb_gpu_ctx *c, const char *op, bool adam, int n, const nb_view *param,
                              const nb_view *grad, const nb_view *slot1, const nb_view *slot2,
                              const void *const *sources, const nb_update_params *p)
{
    if (adam && (!slot1 || !slot2))
        return nb__fail(NB_ERR_INTERNAL, "%s: Adam needs both moment slots on %s", op, c->dev->name);
    for (int k = 0; k < n; k++) {
        nb_status s;
        if (param[k].dtype != param[0].dtype)
            return nb__fail(NB_ERR_INTERNAL, "%s: updates of one dtype expected on %s", op, c->dev->name);
        if ((s = check_same(c, op, &param[k], &param[k], "the parameter")) != NB_OK ||
            (s = check_same(c, op, &param[k], &grad[k], "the gradient")) != NB_OK ||
            (slot1 && (s = check_same(c, op, &param[k], &slot1[k], "the first slot")) != NB_OK) ||
            (slot2 && (s = check_same(c, op, &param[k], &slot2[k], "the second slot")) != NB_OK))
            return s;
    }
    const Upd a = packed(p);
    for (int first = 0; first < n; first += kMany) {
        const int count = n - first < kMany ? n - first : kMany;
        int64_t most = 0;
        for (int k = first; k < first + count; k++)
            most = param[k].numel > most ? param[k].numel : most;
        if (most == 0)
            continue;
        nb_status s = launch_float(c, op, param[first].dtype, most, [&](auto tag) {
            constexpr nb_dtype D = decltype(tag)::value;
            ManyBufs<D> m{};
            for (int k = 0; k < count; k++) {
                const nb_view *v = &param[first + k];
                T_of<D> *pp = out_ptr<D>(v);
                m.b[k] = Bufs<D>{pp, sources[first + k] ? static_cast<const T_of<D> *>(sources[first + k]) : pp,
                                 in_ptr<D>(&grad[first + k]), slot1 ? out_ptr<D>(&slot1[first + k]) : nullptr,
                                 slot2 ? out_ptr<D>(&slot2[first + k]) : nullptr, v->numel};
            }
            const dim3 grid(grid_for(c, most), (unsigned)count);
            if (adam)
                k_adam_many<D><<<grid, kThreads, 0, c->stream>>>(m, a, p->device_params, p->skip, p->device_count);
            else
                k_sgd_many<D><<<grid, kThreads, 0, c->stream>>>(m, a, p->device_params, p->nesterov, p->skip);
        });
        if (s)
            return s;
    }
    return NB_OK;
}

extern "C" nb_status nb__gpu_sgd_update_many(nb_gpu_ctx *c, int n, const nb_view *param, const nb_view *grad,
                                             const nb_view *slot1, const void *const *sources,
                                             const nb_update_params *p)
{
    return many_updates(c, "sgd_update", false, n, param, grad, slot1, NULL, sources, p);
}

extern "C" nb_status nb__gpu_adam_update_many(nb_gpu_ctx *c, int n, const nb_view *param, const nb_view *grad,
                                              const nb_view *slot1, const nb_view *slot2, const void *const *sources,
                                              const nb_update_params *p)
{
    return many_updates(c, "adam_update", true, n, param, grad, slot1, slot2, sources, p);
}
