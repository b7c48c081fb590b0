// Random tensors from cuRAND's Philox4x32-10 generator (its device API).
//
// The backend promises that element i depends only on (seed, i): element i of
// a normal or uniform tensor comes from Philox counter block i / 4 (f32, f16,
// bf16: four values a block) or i / 2 (f64: two values a block) under key seed,
// however large the tensor and however the grid is laid out. cuRAND's host API
// (curandGenerateNormal) does not document that guarantee and wants even
// counts, so the kernels call curand_init(seed, block, 0) themselves; for
// Philox that is a constant-time counter set, not a skip-ahead.
// Truncated normal redraws from element i's own Philox subsequence until the
// value lies within two standard deviations.
#include "gpu_kernels.cuh"

#include <curand_kernel.h>

using namespace nbg;

namespace {

template <nb_dtype D, class Idx>
__device__ __forceinline__ void put(const Geo<1> &g, char *out, Idx i, double v)
{
    int64_t off[1];
    geo_offsets<Idx, 1>(g, i, off);
    *reinterpret_cast<T_of<D> *>(out + off[0]) = st<D>(v);
}

// One thread per group of G consecutive elements (G = 4 for float draws, 2 for
// double ones).
template <nb_dtype D, nb_random_dist DIST, class Idx>
__global__ void __launch_bounds__(kThreads)
    k_random(Geo<1> g, char *out, Idx n, double a, double b, unsigned long long seed)
{
    constexpr int G = D == NB_F64 ? 2 : 4;
    const Idx groups = (n + G - 1) / G;
    for (Idx grp = (Idx)gtid(); grp < groups; grp += (Idx)gstride()) {
        curandStatePhilox4_32_10_t state;
        curand_init(seed, (unsigned long long)grp, 0ull, &state);
        double v[4];
        if constexpr (D == NB_F64) {
            double2 r = DIST == NB_RAND_NORMAL ? curand_normal2_double(&state) : curand_uniform2_double(&state);
            v[0] = r.x;
            v[1] = r.y;
        } else {
            float4 r = DIST == NB_RAND_NORMAL ? curand_normal4(&state) : curand_uniform4(&state);
            v[0] = r.x;
            v[1] = r.y;
            v[2] = r.z;
            v[3] = r.w;
        }
#pragma unroll
        for (int k = 0; k < G; k++) {
            const Idx i = grp * G + k;
            if (i >= n)
                break;
            // curand_uniform is in (0, 1]; 1 - u is in [0, 1), so low <= value < high.
            const double x = DIST == NB_RAND_NORMAL ? a + b * v[k] : a + (b - a) * (1.0 - v[k]);
            put<D>(g, out, i, x);
        }
    }
}

template <nb_dtype D, class Idx>
__global__ void __launch_bounds__(kThreads)
    k_truncated_normal(Geo<1> g, char *out, Idx n, double mean, double stddev, unsigned long long seed)
{
    for (Idx i = (Idx)gtid(); i < n; i += (Idx)gstride()) {
        curandStatePhilox4_32_10_t state;
        curand_init(seed, (unsigned long long)i, 0ull, &state);
        double z;
        for (;;) { // accepts with probability 0.954 per draw
            if constexpr (D == NB_F64) {
                double2 r = curand_normal2_double(&state);
                if (fabs(r.x) <= 2.0) { z = r.x; break; }
                if (fabs(r.y) <= 2.0) { z = r.y; break; }
            } else {
                float4 r = curand_normal4(&state);
                if (fabsf(r.x) <= 2.0f) { z = r.x; break; }
                if (fabsf(r.y) <= 2.0f) { z = r.y; break; }
                if (fabsf(r.z) <= 2.0f) { z = r.z; break; }
                if (fabsf(r.w) <= 2.0f) { z = r.w; break; }
            }
        }
        put<D>(g, out, i, mean + stddev * z);
    }
}

template <nb_dtype D, class Idx>
nb_status launch(nb_gpu_ctx *c, const Geo<1> &g, char *out, Idx n, nb_random_dist dist, double a, double b,
                 unsigned long long seed)
{
    constexpr int G = D == NB_F64 ? 2 : 4;
    switch (dist) {
    case NB_RAND_NORMAL:
        k_random<D, NB_RAND_NORMAL, Idx><<<grid_for(c, ((int64_t)n + G - 1) / G), kThreads, 0, c->stream>>>(
            g, out, n, a, b, seed);
        break;
    case NB_RAND_UNIFORM:
        k_random<D, NB_RAND_UNIFORM, Idx><<<grid_for(c, ((int64_t)n + G - 1) / G), kThreads, 0, c->stream>>>(
            g, out, n, a, b, seed);
        break;
    case NB_RAND_TRUNCATED_NORMAL:
        k_truncated_normal<D, Idx><<<grid_for(c, (int64_t)n), kThreads, 0, c->stream>>>(g, out, n, a, b, seed);
        break;
    default:
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "random: unknown distribution %d on %s", (int)dist,
                        c->dev->name);
    }
    return nb__gpu_launched(c, "random");
}

} // namespace

extern "C" nb_status nb__gpu_random(nb_gpu_ctx *c, const nb_view *out, nb_random_dist dist, double a, double b,
                                    uint64_t seed)
{
    const int64_t n = out->numel;
    if (n <= 0)
        return NB_OK;
    Geo<1> g = geo_of<1>(out);
    if (g.nd == 0) {
        g.nd = 1;
        g.shape[0] = 1;
    }
    char *p = static_cast<char *>(out->data);
    return dispatch_float(out->dtype, c, "random", [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        if (n <= (int64_t)UINT32_MAX - 4)
            return launch<D, uint32_t>(c, g, p, (uint32_t)n, dist, a, b, (unsigned long long)seed);
        return launch<D, uint64_t>(c, g, p, (uint64_t)n, dist, a, b, (unsigned long long)seed);
    });
}
