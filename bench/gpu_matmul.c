/* A large f32 matmul on /gpu:0, TF32 off and on (nb_gpu_set_tf32), in TFLOP/s,
 * beside cuBLAS called directly from here on its own buffers (cublasSgemm, and
 * cublasGemmEx with CUBLAS_COMPUTE_32F_FAST_TF32) and beside PyTorch from Python
 * (bench/gpu_matmul.py; TF32 through torch.backends.cuda.matmul). Then a
 * second table, nabla beside PyTorch alone: N^3 in bf16, and the shapes of a
 * training step in TF32 and bf16 (an MLP layer [64,784]x[784,256] and its two
 * gradients with a transposed operand, a batched [16,128,64]x[16,64,128], and
 * the same batch against one [64,128] matrix, a broadcast operand). The small
 * shapes run 20 B matmuls per timed batch. NB_MATMUL_CUBLAS=1 in the
 * environment runs nabla's matmuls through cuBLAS instead of cuBLASLt.
 *
 *   gpu_matmul [--n N] [--batch B] [--reps R] [--no-peer]
 *
 * N x N times N x N (default 4096: three 64 MiB matrices, larger than the L2
 * cache). Each figure is the median over R batches of B matmuls (after a
 * warm-up), timed by the host clock between two synchronizes, per matmul; nabla
 * and cuBLAS take turns batch by batch. The inputs are uniform random; before
 * timing, 16 rows of each product are checked against a double-precision
 * reference on the host (outputs poisoned with NaN first). Built only with CUDA;
 * prints why and exits 0 where there is no GPU (1 with NB_REQUIRE_GPU=1). */
#include "bench_util.h"
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <nabla/nabla.h>

#define TITLE "Matmul on /gpu:0"
#define CHECK_ROWS 16

static int B = 10, R = 20;
static int n = 4096;
static nb_tensor *a, *b;
static cublasHandle_t handle;
static float *da, *db, *dc;
static bool tf32;

static void cuda_check(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "gpu_matmul: %s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

static void cublas_check(cublasStatus_t s, const char *what)
{
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "gpu_matmul: %s: %s\n", what, cublasGetStatusString(s));
        exit(1);
    }
}

/* dc = da @ db, all row-major: to cuBLAS (column-major) that is dc^T = db^T da^T. */
static void cublas_matmul(void)
{
    const float one = 1.0f, zero = 0.0f;
    if (tf32)
        cublas_check(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, db, CUDA_R_32F, n, da,
                                  CUDA_R_32F, n, &zero, dc, CUDA_R_32F, n, CUBLAS_COMPUTE_32F_FAST_TF32,
                                  CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx");
    else
        cublas_check(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, db, n, da, n, &zero, dc, n),
                     "cublasSgemm");
}

static void batch_nabla(void)
{
    for (int i = 0; i < B; i++) {
        nb_scope *s = nb_scope_begin();
        nb_matmul(a, b);
        nb_scope_end(s);
    }
}

static void batch_cublas(void)
{
    for (int i = 0; i < B; i++)
        cublas_matmul();
    cuda_check(cudaGetLastError(), "after cuBLAS");
}

static void sync_all(void)
{
    nb_synchronize();
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

/* Median milliseconds per matmul of nabla (out[0]) and cuBLAS (out[1]), batches
 * alternating so that clock drift hits both alike. */
static void time_both(double out[2])
{
    for (int i = 0; i < 3; i++) {
        batch_nabla();
        batch_cublas();
    }
    double *v[2] = {malloc(sizeof(double) * (size_t)R), malloc(sizeof(double) * (size_t)R)};
    void (*fn[2])(void) = {batch_nabla, batch_cublas};
    for (int i = 0; i < R; i++) {
        for (int k = 0; k < 2; k++) {
            sync_all();
            double t0 = bench_now();
            fn[k]();
            sync_all();
            v[k][i] = (bench_now() - t0) / B * 1e3;
        }
    }
    for (int k = 0; k < 2; k++) {
        out[k] = bench_median(v[k], R);
        free(v[k]);
    }
}

/* ---- the second table: shapes, nabla beside PyTorch ---- */

/* One row: a @ b of these logical shapes, an operand transposed being a view
 * of a contiguous tensor of the swapped shape (as a gradient's nb_transpose
 * is). bench/gpu_matmul.py lists the same rows under the same keys. */
typedef struct shape_row {
    const char *key, *what;
    nb_shape a, b;
    bool ta, tb;
    bool small; /* 20 B matmuls per timed batch */
} shape_row;

static const shape_row shape_rows[] = {
    {"square", "N^3", NB_SHAPE(0, 0), NB_SHAPE(0, 0), false, false, false}, /* N filled in */
    {"mlp", "[64,784]x[784,256]", NB_SHAPE(64, 784), NB_SHAPE(784, 256), false, false, true},
    {"mlp_dw", "[784,64]^T x[64,256]", NB_SHAPE(784, 64), NB_SHAPE(64, 256), true, false, true},
    {"mlp_dx", "[64,256]x[256,784]^T", NB_SHAPE(64, 256), NB_SHAPE(256, 784), false, true, true},
    {"bmm", "[16,128,64]x[16,64,128]", NB_SHAPE(16, 128, 64), NB_SHAPE(16, 64, 128), false, false, true},
    {"bmm_bcast", "[16,128,64]x[64,128]", NB_SHAPE(16, 128, 64), NB_SHAPE(64, 128), false, false, true},
};
#define N_SHAPE_ROWS (int)(sizeof shape_rows / sizeof *shape_rows)
/* The dtypes of the second table: TF32 (f32 tensors) and bf16. */
static const char *const shape_modes[2] = {"tf32", "bf16"};

static nb_tensor *sa, *sb;
static int shape_per;

static nb_tensor *shape_operand(nb_shape s, bool transposed, nb_dtype dt, uint64_t seed)
{
    nb_shape stored = s;
    if (transposed) {
        stored.dims[s.ndim - 1] = s.dims[s.ndim - 2];
        stored.dims[s.ndim - 2] = s.dims[s.ndim - 1];
    }
    nb_tensor *t = nb_random_uniform(NB_F32, stored, -1, 1, seed);
    if (dt != NB_F32) {
        nb_tensor *c = nb_cast(t, dt);
        nb_release(t);
        t = c;
    }
    if (transposed) {
        nb_tensor *v = nb_transpose(t, s.ndim - 2, s.ndim - 1);
        nb_release(t);
        t = v;
    }
    return t;
}

static void batch_shape(void *unused)
{
    (void)unused;
    for (int i = 0; i < shape_per; i++) {
        nb_scope *s = nb_scope_begin();
        nb_matmul(sa, sb);
        nb_scope_end(s);
    }
}

/* 2 m n k (times the batch) of a row. */
static double shape_flops(const shape_row *r)
{
    double f = 2.0 * (double)r->a.dims[r->a.ndim - 2] * (double)r->a.dims[r->a.ndim - 1] *
               (double)r->b.dims[r->b.ndim - 1];
    return r->a.ndim == 3 ? f * (double)r->a.dims[0] : f;
}

/* Median milliseconds per matmul of nabla for one row (the square one N^3)
 * and dtype (shape_modes). */
static double time_shape(const shape_row *row, int mode)
{
    shape_row sq = *row;
    if (!strcmp(row->key, "square"))
        sq.a = sq.b = NB_SHAPE(n, n);
    const shape_row *r = &sq;
    nb_dtype dt = mode == 1 ? NB_BF16 : NB_F32;
    nb_gpu_set_tf32(mode == 0);
    sa = shape_operand(r->a, r->ta, dt, 11);
    sb = shape_operand(r->b, r->tb, dt, 12);
    shape_per = r->small ? 20 * B : B;
    double ms = bench_median_ms(batch_shape, NULL, 3, R) / shape_per;
    nb_release(sa);
    nb_release(sb);
    nb_gpu_set_tf32(false);
    return ms;
}

/* The rows checked: spread over the matrix. */
static int64_t check_row(int r) { return ((int64_t)r * 2654435761u) % n; }

/* ||rows - ref|| / ||ref|| over the checked rows; NaN when any element is NaN. */
static double rel_err(const float *rows, const double *ref)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < (int64_t)CHECK_ROWS * n; i++) {
        if (isnan(rows[i]))
            return NAN;
        double d = rows[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return sqrt(num / den);
}

/* nabla's product, poisoned first through the allocator's cache; its checked rows. */
static double check_nabla(float *full, float *rows, const double *ref)
{
    nb_release(nb_full(NB_F32, NB_SHAPE(n, n), NAN));
    nb_scope *s = nb_scope_begin();
    nb_tensor_read(nb_matmul(a, b), full, (size_t)n * n * sizeof(float));
    nb_scope_end(s);
    for (int r = 0; r < CHECK_ROWS; r++)
        memcpy(rows + (size_t)r * n, full + check_row(r) * n, (size_t)n * sizeof(float));
    return rel_err(rows, ref);
}

static double check_cublas(float *rows, const double *ref)
{
    cuda_check(cudaMemset(dc, 0xff, (size_t)n * n * sizeof(float)), "cudaMemset"); /* NaN */
    cublas_matmul();
    cuda_check(cudaDeviceSynchronize(), "cuBLAS check");
    for (int r = 0; r < CHECK_ROWS; r++)
        cuda_check(cudaMemcpy(rows + (size_t)r * n, dc + check_row(r) * n, (size_t)n * sizeof(float),
                              cudaMemcpyDeviceToHost),
                   "cudaMemcpy");
    return rel_err(rows, ref);
}

static void print_row(const char *what, double ms_nb, double ms_cu, double ms_pt)
{
    double fl = 2.0 * n * (double)n * n;
    double t_nb = fl / (ms_nb * 1e-3) / 1e12, t_cu = fl / (ms_cu * 1e-3) / 1e12;
    printf("%-34s %8.1f %8.1f", what, t_nb, t_cu);
    if (ms_pt > 0)
        printf(" %8.1f %9.3fx %9.3fx\n", fl / (ms_pt * 1e-3) / 1e12, ms_cu / ms_nb, ms_pt / ms_nb);
    else
        printf(" %8s %9.3fx %10s\n", "-", ms_cu / ms_nb, "-");
}

int main(int argc, char **argv)
{
    bool peer = true;
    BENCH_OPTIONS(argc, argv, BENCH_NUMBER("--n", "N", &n, CHECK_ROWS), BENCH_NUMBER("--batch", "B", &B, 1), BENCH_REPS(&R),
                  BENCH_NO_PEER(&peer));
    nb_set_error_handler(nb_error_handler_exit, NULL);
    nb_gpu_properties props;
    if (!bench_gpu_ready(&props))
        return bench_no_gpu(TITLE, nb_gpu_unavailable_reason());
    nb_device_push("/gpu:0");

    a = nb_random_uniform(NB_F32, NB_SHAPE(n, n), -1, 1, 1);
    b = nb_random_uniform(NB_F32, NB_SHAPE(n, n), -1, 1, 2);

    /* cuBLAS gets the same inputs in buffers of its own. */
    size_t bytes = (size_t)n * n * sizeof(float);
    float *ha = malloc(bytes), *hb = malloc(bytes), *full = malloc(bytes);
    float *rows = malloc((size_t)CHECK_ROWS * n * sizeof(float));
    double *ref = calloc((size_t)CHECK_ROWS * n, sizeof(double));
    if (!ha || !hb || !full || !rows || !ref) {
        fprintf(stderr, "gpu_matmul: no host memory\n");
        return 1;
    }
    nb_tensor_read(a, ha, bytes);
    nb_tensor_read(b, hb, bytes);
    cuda_check(cudaSetDevice(props.physical), "cudaSetDevice");
    cuda_check(cudaMalloc((void **)&da, bytes), "cudaMalloc");
    cuda_check(cudaMalloc((void **)&db, bytes), "cudaMalloc");
    cuda_check(cudaMalloc((void **)&dc, bytes), "cudaMalloc");
    cuda_check(cudaMemcpy(da, ha, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    cuda_check(cudaMemcpy(db, hb, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    cudaStream_t stream;
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cublas_check(cublasCreate(&handle), "cublasCreate");
    cublas_check(cublasSetStream(handle, stream), "cublasSetStream");
    int cublas_version = 0;
    cublas_check(cublasGetVersion(handle, &cublas_version), "cublasGetVersion");

    /* Correct first: CHECK_ROWS rows of a @ b in double. */
    for (int r = 0; r < CHECK_ROWS; r++) {
        const float *ar = ha + check_row(r) * n;
        double *out = ref + (size_t)r * n;
        for (int k = 0; k < n; k++) {
            double x = ar[k];
            const float *bk = hb + (size_t)k * n;
            for (int j = 0; j < n; j++)
                out[j] += x * bk[j];
        }
    }
    double err[2][2]; /* [tf32][nabla, cuBLAS] */
    double ms[2][2];
    for (int t = 0; t < 2; t++) {
        tf32 = t;
        nb_gpu_set_tf32(tf32);
        err[t][0] = check_nabla(full, rows, ref);
        err[t][1] = check_cublas(rows, ref);
    }
    free(ha);
    free(hb);
    free(full);
    free(rows);
    free(ref);
    /* f32 results are good to about 1e-6 here, TF32 ones to about 3e-4. */
    bool ok = err[0][0] < 1e-5 && err[0][1] < 1e-5 && err[1][0] < 1e-2 && err[1][1] < 1e-2;

    for (int t = 0; t < 2; t++) {
        tf32 = t;
        nb_gpu_set_tf32(tf32);
        time_both(ms[t]);
    }
    nb_gpu_set_tf32(false);

    /* the second table: the square product in bf16 alone (TF32 is above) */
    double shape_ms[N_SHAPE_ROWS][2];
    for (int r = 0; r < N_SHAPE_ROWS; r++)
        for (int m = 0; m < 2; m++)
            shape_ms[r][m] = r == 0 && m == 0 ? -1 : time_shape(&shape_rows[r], m);

    cublasDestroy(handle);
    cudaStreamDestroy(stream);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    nb_release(a);
    nb_release(b);
    nb_device_pop();

    bench_peer p;
    if (peer)
        nb_gpu_empty_cache("/gpu:0"); /* leave the card's memory to PyTorch */
    bench_peer_run(&p, peer, "gpu_matmul.py", "%d %d %d", n, B, R);
    printf("\n%s (%s): %d x %d x %d, f32 in and out\n", TITLE, props.name, n, n, n);
    printf("(median of %d batches of %d, warm-up first; nabla and cuBLAS alternate batches)\n", R, B);
    bench_peer_line(&p, "nabla's and cuBLAS's figures only");
    printf("(cuBLAS %d.%d.%d called directly from C on its own buffers)\n", cublas_version / 10000,
           cublas_version / 100 % 100, cublas_version % 100);
    printf("%-34s %8s %8s %8s %10s %10s\n", "TFLOP/s", "nabla", "cuBLAS", "PyTorch", "vs cuBLAS",
           "vs PyTorch");
    print_row("f32, TF32 off", ms[0][0], ms[0][1], bench_peer_get(&p, "f32"));
    print_row("TF32 (nb_gpu_set_tf32(true))", ms[1][0], ms[1][1], bench_peer_get(&p, "tf32"));
    printf("(vs: how many times faster nabla is; cuBLAS TF32 is cublasGemmEx with "
           "CUBLAS_COMPUTE_32F_FAST_TF32)\n");
    printf("check, ||C - f64 reference|| / ||reference|| on %d rows:\n", CHECK_ROWS);
    printf("  f32  nabla %.1e, cuBLAS %.1e", err[0][0], err[0][1]);
    if (bench_peer_get(&p, "f32_err") >= 0)
        printf(", PyTorch %.1e", bench_peer_get(&p, "f32_err"));
    printf("\n  TF32 nabla %.1e, cuBLAS %.1e", err[1][0], err[1][1]);
    if (bench_peer_get(&p, "tf32_err") >= 0)
        printf(", PyTorch %.1e", bench_peer_get(&p, "tf32_err"));
    printf("\n%s\n", ok ? "(f32 under 1e-5, TF32 under 1e-2; TF32 near 1e-6 would mean it was not used)"
                        : "CHECK FAILED: a product is wrong; the times above mean nothing");
    printf("\n%s, shapes of a training step: TFLOP/s, nabla beside PyTorch%s\n", TITLE,
           getenv("NB_MATMUL_CUBLAS") && getenv("NB_MATMUL_CUBLAS")[0] == '1' ? " (NB_MATMUL_CUBLAS=1)" : "");
    printf("%-26s %-5s %9s %9s %10s\n", "a @ b", "dtype", "nabla", "PyTorch", "vs PyTorch");
    for (int r = 0; r < N_SHAPE_ROWS; r++)
        for (int m = 0; m < 2; m++) {
            if (shape_ms[r][m] < 0)
                continue;
            shape_row sq = shape_rows[r];
            char what[64];
            if (r == 0) {
                sq.a = sq.b = NB_SHAPE(n, n);
                snprintf(what, sizeof what, "%d^3", n);
            } else {
                snprintf(what, sizeof what, "%s", sq.what);
            }
            char key[64];
            snprintf(key, sizeof key, "%s_%s", sq.key, shape_modes[m]);
            double fl = shape_flops(&sq), pt = bench_peer_get(&p, key);
            printf("%-26s %-5s %9.1f", what, shape_modes[m], fl / (shape_ms[r][m] * 1e-3) / 1e12);
            if (pt > 0)
                printf(" %9.1f %9.3fx\n", fl / (pt * 1e-3) / 1e12, pt / shape_ms[r][m]);
            else
                printf(" %9s %10s\n", "-", "-");
        }
    printf("(^T: a transposed view, as a gradient takes it; the last row's [64,128] is broadcast over the batch;\n"
           " the small shapes time %d matmuls per batch, host clock for nabla, CUDA events for PyTorch)\n",
           20 * B);
    return ok ? 0 : 1;
}
