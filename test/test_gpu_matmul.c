/* Matmul on /gpu:0 against the CPU, through cuBLASLt's cached algorithms
 * (and, as test_gpu_matmul_cublas with NB_MATMUL_CUBLAS=1, through cuBLAS
 * alone): every dtype (f32 with TF32 off and on, f64, f16, bf16); m, n, k over
 * 1, 3, 17 and 257 with each operand plain or a transposed view; empty k
 * (zeros, the output poisoned first under NB_DEBUG_POISON=1); batches with a
 * broadcast operand (batch stride 0, from rank 2 or from broadcast_to), one
 * looped over an outer batch dim, and the training shapes; operands starting
 * at an odd element (a slice one column in), so the alignment in cuBLASLt's
 * key differs from a fresh tensor's; and in deterministic mode the same bits
 * twice. Exits 77 (skipped) where there is no GPU, 1 with NB_REQUIRE_GPU=1.
 *
 * The reference is the CPU's f64 product of the very values the GPU got (f16
 * and bf16 rounded on the GPU first), and each element's error is measured
 * against sum_k |a_ik b_kj| (the CPU's product of the absolute values), so
 * the tolerances follow the precision of each dtype and a wrong index, stride
 * or transpose (an error near 1) cannot pass. */
#include "check.h"

#include <nabla/gpu.h>

#define GPU "/gpu:0"
#define CPU "/cpu:0"

typedef struct mode {
    const char *name;
    nb_dtype dt;
    bool tf32;
    double tol; /* on |gpu - ref| / sum |a b| */
} mode;

/* f32: k u at k = 257; TF32 and the halves: their inputs' or output's rounding. */
static const mode modes[] = {
    {"f32", NB_F32, false, 3e-5}, {"tf32", NB_F32, true, 4e-3}, {"f64", NB_F64, false, 1e-12},
    {"f16", NB_F16, false, 2e-3}, {"bf16", NB_BF16, false, 1.2e-2},
};
#define N_MODES (int)(sizeof modes / sizeof *modes)

/* How an operand of a given logical shape is laid out on the GPU. */
typedef enum kind {
    PLAIN,      /* contiguous */
    TRANSPOSED, /* a view swapping the last two dims of a contiguous tensor */
    OFFSET,     /* a slice one column in: starts at an odd element, odd row stride */
    BROADCAST,  /* broadcast_to from a leading dim of 1: batch stride 0 */
} kind;
static const char *const kind_names[] = {"", "^T", "+1", "(bcast)"};

static bool is_half(nb_dtype dt) { return dt == NB_F16 || dt == NB_BF16; }

/* t (any device, any float dtype) as a CPU f64 tensor. */
static nb_tensor *cpu_f64(const nb_tensor *t)
{
    const nb_tensor *w = is_half(nb_tensor_dtype(t)) ? nb_cast(t, NB_F32) : t;
    return nb_cast(nb_to_device((nb_tensor *)w, CPU), NB_F64);
}

static nb_tensor *view_of(nb_tensor *x, kind k, nb_shape logical)
{
    const int nd = logical.ndim;
    switch (k) {
    case TRANSPOSED: return nb_transpose(x, nd - 2, nd - 1);
    case OFFSET: {
        nb_shape begin = {nd, {0}}, size = logical;
        begin.dims[nd - 1] = 1;
        return nb_slice(x, begin, size);
    }
    case BROADCAST: return nb_broadcast_to(x, logical);
    default: return x;
    }
}

/* A random operand of logical shape s on the GPU in m's dtype (*g), laid out
 * as k says, and the same values as a CPU f64 tensor (*ref). */
static void operand(const mode *m, nb_shape s, kind k, uint64_t seed, nb_tensor **g, nb_tensor **ref)
{
    const int nd = s.ndim;
    nb_shape stored = s;
    if (k == TRANSPOSED) {
        stored.dims[nd - 1] = s.dims[nd - 2];
        stored.dims[nd - 2] = s.dims[nd - 1];
    } else if (k == OFFSET) {
        stored.dims[nd - 1] += 1;
    } else if (k == BROADCAST) {
        stored.dims[0] = 1;
    }
    nb_tensor *base = nb_random_normal(is_half(m->dt) ? NB_F32 : m->dt, stored, 0, 1, seed);
    nb_tensor *gbase = nb_to_device(base, GPU);
    if (is_half(m->dt))
        gbase = nb_cast(gbase, m->dt); /* rounded on the GPU: the reference takes these values */
    *g = view_of(gbase, k, s);
    *ref = view_of(cpu_f64(gbase), k, s);
}

/* t's values as doubles (malloc'd); NULL on failure. */
static double *values(const nb_tensor *t, int64_t *n)
{
    nb_tensor *d = t ? cpu_f64(t) : NULL;
    *n = d ? nb_tensor_numel(d) : 0;
    double *v = d ? malloc(sizeof(double) * (size_t)(*n > 0 ? *n : 1)) : NULL;
    if (v && nb_tensor_read(d, v, sizeof(double) * (size_t)*n) != NB_OK) {
        free(v);
        v = NULL;
    }
    return v;
}

/* Largest |g - r| / sum |a b| over the product's elements (exact equality
 * where that sum is 0, as for an empty k); INFINITY for a missing result, a
 * wrong shape or dtype, or a NaN. */
static double product_error(const nb_tensor *g, nb_dtype dt, const nb_tensor *ra, const nb_tensor *rb)
{
    nb_tensor *r = nb_matmul(ra, rb), *s = nb_matmul(nb_abs(ra), nb_abs(rb));
    if (!g || !r || !s || nb_tensor_dtype(g) != dt || strncmp(nb_tensor_device(g), "/gpu:", 5) != 0)
        return INFINITY;
    nb_shape sg = nb_tensor_shape(g), sr = nb_tensor_shape(r);
    if (sg.ndim != sr.ndim || memcmp(sg.dims, sr.dims, sizeof(int64_t) * (size_t)sg.ndim) != 0)
        return INFINITY;
    int64_t n1, n2, n3;
    double *vg = values(g, &n1), *vr = values(r, &n2), *vs = values(s, &n3), worst = 0;
    if (!vg || !vr || !vs || n1 != n2 || n1 != n3)
        worst = INFINITY;
    for (int64_t i = 0; worst < INFINITY && i < n1; i++) {
        double e = fabs(vg[i] - vr[i]);
        if (isnan(e))
            worst = INFINITY;
        else if (vs[i] == 0)
            worst = e == 0 ? worst : INFINITY;
        else if (e / vs[i] > worst)
            worst = e / vs[i];
    }
    free(vg);
    free(vr);
    free(vs);
    return worst;
}

/* a @ b of the given logical shapes and kinds on the GPU, checked. */
static void check_product(const mode *m, nb_shape sa, kind ka, nb_shape sb, kind kb, uint64_t seed)
{
    nb_scope *scope = nb_scope_begin();
    nb_tensor *ga, *gb, *ra, *rb;
    operand(m, sa, ka, seed, &ga, &ra);
    operand(m, sb, kb, seed + 1, &gb, &rb);
    double e = product_error(nb_matmul(ga, gb), m->dt, ra, rb);
    if (!(e <= m->tol)) {
        char a[96], b[96];
        nb_shape_format(sa, a, sizeof a);
        nb_shape_format(sb, b, sizeof b);
        fprintf(stderr, "[%s] %s: %s%s x %s%s: error %.3g > %.3g (%s)\n", check_current, m->name, a,
                kind_names[ka], b, kind_names[kb], e, m->tol, nb_error_message());
        check_failures++;
        nb_error_clear();
    }
    nb_scope_end(scope);
}

static void test_sizes(void)
{
    static const int64_t sizes[] = {1, 3, 17, 257};
    uint64_t seed = 1;
    for (int mi = 0; mi < N_MODES; mi++) {
        const mode *m = &modes[mi];
        bool was = nb_gpu_set_tf32(m->tf32);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 4; l++)
                    for (int t = 0; t < 4; t++) {
                        const int64_t M = sizes[i], N = sizes[j], K = sizes[l];
                        check_product(m, NB_SHAPE(M, K), t & 1 ? TRANSPOSED : PLAIN, NB_SHAPE(K, N),
                                      t & 2 ? TRANSPOSED : PLAIN, seed += 2);
                    }
        nb_gpu_set_tf32(was);
    }
}

/* Operands at an odd element: the alignment cuBLASLt is promised must be the
 * element's, not a fresh block's 256 bytes. */
static void test_unaligned(void)
{
    uint64_t seed = 5000;
    for (int mi = 0; mi < N_MODES; mi++) {
        const mode *m = &modes[mi];
        bool was = nb_gpu_set_tf32(m->tf32);
        check_product(m, NB_SHAPE(64, 96), OFFSET, NB_SHAPE(96, 128), PLAIN, seed += 2);
        check_product(m, NB_SHAPE(64, 96), PLAIN, NB_SHAPE(96, 128), OFFSET, seed += 2);
        check_product(m, NB_SHAPE(17, 257), OFFSET, NB_SHAPE(257, 3), OFFSET, seed += 2);
        check_product(m, NB_SHAPE(4, 17, 33), OFFSET, NB_SHAPE(4, 33, 9), PLAIN, seed += 2);
        check_product(m, NB_SHAPE(4, 17, 33), PLAIN, NB_SHAPE(4, 33, 9), OFFSET, seed += 2);
        nb_gpu_set_tf32(was);
    }
}

/* Batches: strided, broadcast (stride 0), looped over an outer dim, and the
 * shapes of a training step (an MLP layer, its gradients, attention-like). */
static void test_batches(void)
{
    uint64_t seed = 9000;
    for (int mi = 0; mi < N_MODES; mi++) {
        const mode *m = &modes[mi];
        bool was = nb_gpu_set_tf32(m->tf32);
        /* rank-2 b against a batch: b's batch stride 0 */
        check_product(m, NB_SHAPE(16, 17, 3), PLAIN, NB_SHAPE(3, 257), PLAIN, seed += 2);
        check_product(m, NB_SHAPE(16, 17, 3), TRANSPOSED, NB_SHAPE(3, 257), TRANSPOSED, seed += 2);
        check_product(m, NB_SHAPE(4, 33), PLAIN, NB_SHAPE(5, 33, 9), PLAIN, seed += 2);
        /* broadcast_to views */
        check_product(m, NB_SHAPE(4, 17, 33), BROADCAST, NB_SHAPE(4, 33, 3), PLAIN, seed += 2);
        check_product(m, NB_SHAPE(4, 17, 33), PLAIN, NB_SHAPE(4, 33, 3), BROADCAST, seed += 2);
        /* two batch dims that do not merge: an outer loop of strided batches */
        check_product(m, NB_SHAPE(2, 3, 17, 5), PLAIN, NB_SHAPE(2, 1, 5, 9), PLAIN, seed += 2);
        check_product(m, NB_SHAPE(2, 3, 17, 5), TRANSPOSED, NB_SHAPE(2, 1, 5, 9), OFFSET, seed += 2);
        /* training shapes: x w, x^T dy, dy w^T; batched attention-like */
        check_product(m, NB_SHAPE(64, 784), PLAIN, NB_SHAPE(784, 256), PLAIN, seed += 2);
        check_product(m, NB_SHAPE(784, 64), TRANSPOSED, NB_SHAPE(64, 256), PLAIN, seed += 2);
        check_product(m, NB_SHAPE(64, 256), PLAIN, NB_SHAPE(256, 784), TRANSPOSED, seed += 2);
        check_product(m, NB_SHAPE(16, 128, 64), PLAIN, NB_SHAPE(16, 64, 128), PLAIN, seed += 2);
        check_product(m, NB_SHAPE(16, 128, 64), PLAIN, NB_SHAPE(16, 64, 128), BROADCAST, seed += 2);
        nb_gpu_set_tf32(was);
    }
}

/* k = 0: zeros, in every dtype, plain and batched. */
static void test_empty_k(void)
{
    for (int mi = 0; mi < N_MODES; mi++) {
        const mode *m = &modes[mi];
        check_product(m, NB_SHAPE(3, 0), PLAIN, NB_SHAPE(0, 4), PLAIN, 1);
        check_product(m, NB_SHAPE(2, 5, 0), PLAIN, NB_SHAPE(0, 7), PLAIN, 3);
    }
}

/* The bits of t (a GPU tensor) on the host, malloc'd; *bytes their size. */
static void *bits_of(const nb_tensor *t, size_t *bytes)
{
    *bytes = t ? (size_t)nb_tensor_numel(t) * nb_dtype_size(nb_tensor_dtype(t)) : 0;
    nb_tensor *h = t ? nb_to_device((nb_tensor *)t, CPU) : NULL;
    void *v = h ? malloc(*bytes ? *bytes : 1) : NULL;
    if (v && nb_tensor_read(h, v, *bytes) != NB_OK) {
        free(v);
        v = NULL;
    }
    return v;
}

/* Deterministic mode: a long-k product (where split-K pays) gives the same
 * bits twice, in f32, TF32 and bf16, and is still right. */
static void test_deterministic(void)
{
    const int modes_det[] = {0, 1, 4};
    bool was_det = nb_set_deterministic(true);
    for (int i = 0; i < 3; i++) {
        const mode *m = &modes[modes_det[i]];
        bool was = nb_gpu_set_tf32(m->tf32);
        nb_scope *scope = nb_scope_begin();
        nb_tensor *ga, *gb, *ra, *rb;
        operand(m, NB_SHAPE(64, 16384), PLAIN, 77, &ga, &ra);
        operand(m, NB_SHAPE(16384, 48), TRANSPOSED, 78, &gb, &rb);
        nb_tensor *y1 = nb_matmul(ga, gb), *y2 = nb_matmul(ga, gb);
        size_t n1, n2;
        void *b1 = bits_of(y1, &n1), *b2 = bits_of(y2, &n2);
        CHECK(b1 && b2 && n1 == n2 && n1 == 64 * 48 * nb_dtype_size(m->dt) && memcmp(b1, b2, n1) == 0);
        free(b1);
        free(b2);
        /* a long sum: f32's tolerance grows with k (u k at worst, far less here) */
        double e = product_error(y1, m->dt, ra, rb);
        CHECK(e <= (m->tf32 || is_half(m->dt) ? m->tol : 1e-4));
        nb_scope_end(scope);
        nb_gpu_set_tf32(was);
    }
    nb_set_deterministic(was_det);
}

int main(void)
{
    if (nb_device_count(NB_DEVICE_GPU) == 0)
        return check_no_gpu("test_gpu_matmul");
    RUN(test_sizes);
    RUN(test_unaligned);
    RUN(test_batches);
    RUN(test_empty_k);
    RUN(test_deterministic);
    return check_finish();
}
