// Random tensors: the CPU backend's counter-based generator (ops/cpu/cpu_random.c)
// run on the GPU, so one seed gives the same tensor on /cpu:0 and /gpu:N.
//
// Philox4x32-10 (the generator cuRAND also offers) keyed by the seed, with the
// counter (i, i >> 32, try, "nabl") for row-major element i: element i depends
// only on (seed, i), never on the shape, the grid or the stream.
//  uniform:   a + (b - a) * u, u in [0, 1) with 53 random bits (results that
//             round up to b are moved just below it);
//  normal:    a + b * z, z by Box-Muller (the cosine branch) from one draw;
//  truncated: the same, drawn again with the next try number until |z| <= 2.
// The arithmetic is done in double as on the CPU, with CUDA's log and cospi
// where the CPU has its own (within 2.5 units of 2^-52): f64 results agree to
// a few units in the last place, f32 results exactly but for about 1 in 10^7.
// The cosine takes its argument in turns, 2 u2 exactly, as the CPU's does
// (cos(2 pi u2) would round 2 pi u2 first: near a zero of the cosine, a
// normal of 1e-8 then differed from the CPU's in its leading digits).
// Not cuRAND's own API: its host generators do not document the per-element
// guarantee, and its device API's counter layout differs from the CPU's.
#include "gpu_kernels.cuh"

using namespace nbg;

namespace {

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

// Host-callable too, so it can be checked against the CPU's on any machine.
NBG_HD void philox(uint32_t c[4], uint64_t seed)
{
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        const uint64_t p0 = (uint64_t)kM0 * c[0], p1 = (uint64_t)kM1 * c[2]; // mul.hi/lo on the GPU
        const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c[0] = hi1 ^ c[1] ^ k0;
        c[1] = lo1;
        c[2] = hi0 ^ c[3] ^ k1;
        c[3] = lo0;
        k0 += kW0;
        k1 += kW1;
    }
}

NBG_HD void draw(uint64_t seed, uint64_t i, uint32_t t, uint64_t &w0, uint64_t &w1)
{
    uint32_t c[4] = {(uint32_t)i, (uint32_t)(i >> 32), t, 0x6e61626cu /* "nabl" */};
    philox(c, seed);
    w0 = ((uint64_t)c[0] << 32) | c[1];
    w1 = ((uint64_t)c[2] << 32) | c[3];
}

NBG_HD double uniform01(uint64_t seed, uint64_t i)
{
    uint64_t w0, w1;
    draw(seed, i, 0, w0, w1);
    return (double)(w0 >> 11) * 0x1.0p-53;
}

NBG_HD double normal01(uint64_t seed, uint64_t i, uint32_t t)
{
    uint64_t w0, w1;
    draw(seed, i, t, w0, w1);
    const double u1 = ((double)(w0 >> 11) + 1.0) * 0x1.0p-53; // (0, 1]
    const double u2 = (double)(w1 >> 11) * 0x1.0p-53;         // [0, 1)
#ifdef __CUDA_ARCH__
    return sqrt(-2.0 * log(u1)) * cospi(2.0 * u2);
#else
    return sqrt(-2.0 * log(u1)) * cos(6.28318530717958647692 * u2);
#endif
}

__device__ __forceinline__ double truncated01(uint64_t seed, uint64_t i)
{
    for (uint32_t t = 0; t < 1000; t++) {
        const double z = normal01(seed, i, t);
        if (fabs(z) <= 2.0)
            return z;
    }
    return 0.0; // unreachable in practice: 1000 tries all beyond 2 sigma
}

// The largest value of dtype D below hi (hi > lo), for uniform results that
// rounded up to hi.
template <nb_dtype D> __device__ __forceinline__ T_of<D> below(double hi, double lo)
{
    if constexpr (D == NB_F64) {
        return nextafter(hi, lo);
    } else if constexpr (D == NB_F32) {
        return nextafterf((float)hi, (float)lo);
    } else {
        // f16/bf16: step the bit pattern of hi's rounding one unit towards lo
        T_of<D> h = st<D>(hi);
        uint16_t bits;
        memcpy(&bits, &h, sizeof bits);
        const float hf = ld<D>(h);
        if (hf > 0.0f)
            bits = (uint16_t)(bits - 1);
        else if (hf == 0.0f)
            bits = 0x8001u; // the smallest negative subnormal
        else
            bits = (uint16_t)(bits + 1);
        memcpy(&h, &bits, sizeof bits);
        return h;
    }
}

template <nb_dtype D, nb_random_dist DIST, class Idx>
__global__ void __launch_bounds__(kThreads) k_random(Geo<1> g, char *out, Idx n, double a, double b, uint64_t seed,
                                                     const double *seed_add)
{
    if (seed_add) { // a recorded step's mask seed, refreshed before each replay: 64 bits in a double's place
        uint64_t add;
        memcpy(&add, seed_add, sizeof add);
        seed += add;
    }
    for (Idx i = (Idx)gtid(); i < n; i += (Idx)gstride()) {
        T_of<D> v;
        if constexpr (DIST == NB_RAND_UNIFORM) {
            // _rn: no FMA contraction, so the values are the CPU's (a mul, then an add)
            v = st<D>(__dadd_rn(a, __dmul_rn(b - a, uniform01(seed, (uint64_t)i))));
            if (b > a && (double)ld<D>(v) >= b)
                v = below<D>(b, a);
        } else if constexpr (DIST == NB_RAND_NORMAL) {
            v = st<D>(__dadd_rn(a, __dmul_rn(b, normal01(seed, (uint64_t)i, 0))));
        } else {
            v = st<D>(__dadd_rn(a, __dmul_rn(b, truncated01(seed, (uint64_t)i))));
        }
        int64_t off[1];
        geo_offsets<Idx, 1>(g, i, off);
        *reinterpret_cast<T_of<D> *>(out + off[0]) = v;
    }
}

template <nb_dtype D, class Idx>
nb_status launch(nb_gpu_ctx *c, const Geo<1> &g, char *out, Idx n, nb_random_dist dist, double a, double b,
                 uint64_t seed, const double *seed_add)
{
    const unsigned blocks = grid_for(c, (int64_t)n);
    switch (dist) {
    case NB_RAND_NORMAL:
        k_random<D, NB_RAND_NORMAL, Idx><<<blocks, kThreads, 0, c->stream>>>(g, out, n, a, b, seed, seed_add);
        break;
    case NB_RAND_UNIFORM:
        k_random<D, NB_RAND_UNIFORM, Idx><<<blocks, kThreads, 0, c->stream>>>(g, out, n, a, b, seed, seed_add);
        break;
    case NB_RAND_TRUNCATED_NORMAL:
        k_random<D, NB_RAND_TRUNCATED_NORMAL, Idx><<<blocks, kThreads, 0, c->stream>>>(g, out, n, a, b, seed, seed_add);
        break;
    default:
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "random: unknown distribution %d on %s", (int)dist,
                        c->dev->name);
    }
    return nb__gpu_launched(c, "random");
}

} // namespace

extern "C" nb_status nb__gpu_random(nb_gpu_ctx *c, const nb_view *out, nb_random_dist dist, double a, double b,
                                    uint64_t seed, const double *seed_add)
{
    const int64_t n = out->numel;
    if (n <= 0)
        return NB_OK;
    Geo<1> g = geo_of<1>(out);
    geo_collapse(g); // keeps row-major order: element i stays element i
    if (g.nd == 0) {
        g.nd = 1;
        g.shape[0] = 1;
    }
    char *p = static_cast<char *>(out->data);
    return dispatch_float(out->dtype, c, "random", [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        if (n <= (int64_t)INT32_MAX) // not UINT32_MAX: i += stride must not wrap
            return launch<D, uint32_t>(c, g, p, (uint32_t)n, dist, a, b, seed, seed_add);
        return launch<D, uint64_t>(c, g, p, (uint64_t)n, dist, a, b, seed, seed_add);
    });
}
