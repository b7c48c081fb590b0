/* The kernels of fused elementwise chains on a GPU (gpu/gpu_fuse.h), made
 * and compiled without one: for every op and dtype a chain may hold (each
 * unary op in f32, f64, f16, bf16, i32, i64; each binary op, comparisons on
 * bool and u8 too; fills of edge values; a fractional integer scalar), the
 * source generated from the plan compiles with NVRTC for sm_90 and sm_100;
 * the iteration coalesces dims and keeps broadcast and transposed operands'
 * strides; results a chain lets go of are neither read nor stored. Skips (77)
 * where NVRTC cannot be loaded. Whether the kernels compute the unfused bits
 * is test_graph_fusion --gpu's work, on a GPU. */
#include "check.h"

#include "gpu/gpu_fuse.h"
#include "lib/core/backend.h"

static const int g_arch[] = {90, 100};

/* A dense view of shape dims at a made-up address: the planner and the
 * generator only compare addresses, nothing is read. */
static nb_view view_at(uintptr_t at, nb_dtype dt, int ndim, const int64_t *dims)
{
    nb_view v = {.data = (void *)at, .dtype = dt, .ndim = ndim, .contiguous = true, .numel = 1};
    int64_t stride = (int64_t)nb_dtype_size(dt);
    for (int d = ndim - 1; d >= 0; d--) {
        v.shape[d] = dims[d];
        v.strides[d] = stride;
        stride *= dims[d];
        v.numel *= dims[d];
    }
    return v;
}

static bool always_dead(void *user, const nb_view *v, int64_t last)
{
    (void)user, (void)v, (void)last;
    return true;
}

static bool never_dead(void *user, const nb_view *v, int64_t last)
{
    (void)user, (void)v, (void)last;
    return false;
}

static bool gpu_supported(void *user, const nb_fuse_call *c)
{
    (void)user;
    return nb__gpu_fuse_supported(c);
}

static int g_compiled;

/* Plans calls[0 .. n) as one chain, generates its kernel and compiles it for
 * every architecture; the source in *src_out when wanted. */
static void compile_chain(const char *what, const nb_fuse_call *calls, int n, bool dead, nb_gpu_fuse_geo *geo,
                          char **src_out)
{
    nb_fuse_plan plan;
    int k = nb__fuse_plan(calls, n, NB_FUSE_MAX_SLOTS, gpu_supported, dead ? always_dead : never_dead, NULL, &plan);
    CHECKF(k == n, "%s: %d of %d calls planned", what, k, n);
    if (k != n)
        return;
    nb_gpu_fuse_geo g;
    nb_gpu_fuse_args a;
    nb__gpu_fuse_geometry(&plan, &g, &a);
    char *src = nb__gpu_fuse_source(&plan, &g);
    CHECK(src != NULL);
    for (size_t i = 0; src && i < sizeof g_arch / sizeof *g_arch; i++) {
        void *cubin = NULL;
        size_t size = 0;
        nb_status st = nb__gpu_fuse_compile(src, g_arch[i], &cubin, &size);
        CHECKF(st == NB_OK && cubin && size > 0, "%s for sm_%d: %s\n%s", what, g_arch[i], nb_error_message(), src);
        nb_error_clear();
        free(cubin);
        g_compiled++;
    }
    if (geo)
        *geo = g;
    if (src_out)
        *src_out = src;
    else
        free(src);
}

static const nb_dtype k_floats[] = {NB_F32, NB_F64, NB_F16, NB_BF16};
static const nb_dtype k_ints[] = {NB_I32, NB_I64};

/* Every unary op the dtype allows, in place on one tensor. */
static void unary_ops(void)
{
    int64_t dims[1] = {1000};
    for (int f = 0; f < 2; f++) {
        const nb_dtype *dts = f ? k_ints : k_floats;
        int n_dt = f ? 2 : 4;
        for (int d = 0; d < n_dt; d++) {
            nb_view x = view_at(0x100000, dts[d], 1, dims);
            nb_fuse_call calls[NB_FUSE_MAX_CALLS];
            int n = 0;
            for (int op = 0; op < NB_UN_COUNT; op++) {
                if (!(nb__unary_dtypes((nb_unary_op)op) & NB_MASK(dts[d])))
                    continue;
                /* a scalar that is not a whole number: integers apply it in double */
                double alpha = op == NB_UN_LEAKY_RELU ? 0.01 : op == NB_UN_POW_SCALAR ? 1.5 : 2.5;
                calls[n++] = (nb_fuse_call){NB_FUSE_UNARY, op, alpha, &x, &x, NULL, n, NULL};
            }
            CHECK(n >= (f ? 7 : 25));
            char what[64];
            snprintf(what, sizeof what, "unary ops on %s", nb_dtype_name(dts[d]));
            compile_chain(what, calls, n, false, NULL, NULL);
        }
    }
}

/* Every binary op the dtype allows: arithmetic in place, comparisons into a bool. */
static void binary_ops(void)
{
    int64_t dims[2] = {7, 9};
    static const nb_dtype all[] = {NB_F32, NB_F64, NB_F16, NB_BF16, NB_I32, NB_I64, NB_BOOL, NB_U8};
    for (size_t d = 0; d < sizeof all / sizeof *all; d++) {
        nb_dtype dt = all[d];
        nb_view a = view_at(0x100000, dt, 2, dims), b = view_at(0x200000, dt, 2, dims);
        nb_view c = view_at(0x300000, NB_BOOL, 2, dims);
        nb_fuse_call calls[NB_FUSE_MAX_CALLS];
        int n = 0;
        for (int op = 0; op < NB_BIN_COUNT; op++) {
            if (!(nb__binary_dtypes((nb_binary_op)op) & NB_MASK(dt)))
                continue;
            bool cmp = nb__binary_is_comparison((nb_binary_op)op);
            calls[n++] = (nb_fuse_call){NB_FUSE_BINARY, op, 0, cmp ? &c : &a, &a, &b, n, NULL};
        }
        CHECK(n >= 6);
        char what[64];
        snprintf(what, sizeof what, "binary ops on %s", nb_dtype_name(dt));
        compile_chain(what, calls, n, false, NULL, NULL);
    }
}

/* Fills of edge values in every dtype, then one use each. */
static void fills(void)
{
    static const nb_dtype all[] = {NB_F32, NB_F64, NB_F16, NB_BF16, NB_I32, NB_I64, NB_BOOL, NB_U8};
    static const double values[] = {0.0, -0.0, 1e300, -1e300, 65520.0, 1e-40, 3.7, NAN, INFINITY, -INFINITY};
    int64_t dims[1] = {33};
    for (size_t d = 0; d < sizeof all / sizeof *all; d++) {
        nb_view v = view_at(0x100000, all[d], 1, dims), w = view_at(0x200000, all[d], 1, dims);
        nb_view same = view_at(0x300000, NB_BOOL, 1, dims);
        nb_fuse_call calls[NB_FUSE_MAX_CALLS];
        int n = 0;
        for (size_t i = 0; i < sizeof values / sizeof *values; i++)
            calls[n++] = (nb_fuse_call){NB_FUSE_FILL, 0, values[i], i % 2 ? &w : &v, NULL, NULL, n, NULL};
        calls[n++] = (nb_fuse_call){NB_FUSE_BINARY, NB_BIN_EQ, 0, &same, &v, &w, n, NULL};
        char what[64];
        snprintf(what, sizeof what, "fills of %s", nb_dtype_name(all[d]));
        compile_chain(what, calls, n, false, NULL, NULL);
    }
}

static const nb_dtype k_all[] = {NB_F32, NB_F64, NB_F16, NB_BF16, NB_I32, NB_I64, NB_BOOL, NB_U8};
enum { N_ALL = sizeof k_all / sizeof *k_all };

/* Whether src has the line "<slot of out> = <what>" (what up to its end). */
static bool has_step(const char *src, int out, const char *what)
{
    char line[160];
    snprintf(line, sizeof line, "    s%d = %s;\n", out, what);
    return src && strstr(src, line);
}

/* A cast from each dtype to every dtype (itself too): four sources a chain,
 * each converted into the same eight results (32 calls, 12 slots); and the
 * conversions the cast kernel makes where rounding differs by path. */
static void casts(void)
{
    int64_t dims[1] = {513};
    nb_view out[N_ALL];
    for (int t = 0; t < N_ALL; t++)
        out[t] = view_at(0x200000 + 0x10000 * (uintptr_t)t, k_all[t], 1, dims);
    for (int f0 = 0; f0 < N_ALL; f0 += 4) {
        nb_view x[4];
        nb_fuse_call calls[4 * N_ALL];
        int n = 0;
        for (int k = 0; k < 4; k++) {
            x[k] = view_at(0x100000 + 0x10000 * (uintptr_t)k, k_all[f0 + k], 1, dims);
            for (int t = 0; t < N_ALL; t++, n++) {
                calls[n] = (nb_fuse_call){.kind = NB_FUSE_COPY, .out = &out[t], .x = &x[k], .index = n};
                CHECK(nb__gpu_fuse_supported(&calls[n]));
            }
        }
        char what[64], *src = NULL;
        snprintf(what, sizeof what, "casts from %s .. %s", nb_dtype_name(k_all[f0]), nb_dtype_name(k_all[f0 + 3]));
        compile_chain(what, calls, n, false, NULL, &src);
        /* slots: the first source 0, the results 1 + t, the other sources 8 + k */
        for (int k = 0; k < 4; k++) {
            int sx = k ? N_ALL + k : 0;
            char e[4][64];
            bool ok = true;
            switch (k_all[f0 + k]) {
            case NB_F64: /* to 16 bits rounded once, from double; to i32 saturating, NaN 0 */
                snprintf(e[0], 64, "nbf_d2h(s%d)", sx), snprintf(e[1], 64, "nbf_d2b(s%d)", sx);
                snprintf(e[2], 64, "nb_cast_to_i32((double)s%d)", sx);
                ok = has_step(src, 3, e[0]) && has_step(src, 4, e[1]) && has_step(src, 5, e[2]);
                break;
            case NB_I32: /* to bf16 through float, as st<BF16> does; to itself the bits */
                snprintf(e[0], 64, "nbf_f2b((float)s%d)", sx), snprintf(e[1], 64, "s%d", sx);
                ok = has_step(src, 4, e[0]) && has_step(src, 5, e[1]);
                break;
            case NB_BF16: /* read as float; NaN to bool is true */
                snprintf(e[0], 64, "nbf_f2h((float)nbf_b2f(s%d))", sx);
                snprintf(e[1], 64, "(unsigned char)(nbf_b2f(s%d) != 0 ? 1 : 0)", sx);
                snprintf(e[2], 64, "nb_cast_to_u8((double)nbf_b2f(s%d))", sx);
                ok = has_step(src, 3, e[0]) && has_step(src, 7, e[1]) && has_step(src, 8, e[2]);
                break;
            case NB_BOOL: /* read as 0 or 1 */
                snprintf(e[0], 64, "(unsigned char)(int)(s%d != 0)", sx);
                ok = has_step(src, 8, e[0]);
                break;
            default:
                break;
            }
            CHECKF(ok, "casts from %s:\n%s", nb_dtype_name(k_all[f0 + k]), src ? src : "");
        }
        free(src);
    }
}

/* where in every dtype, two dtypes a chain: its condition from a comparison
 * the chain makes, and a u8 condition read from memory. */
static void wheres(void)
{
    int64_t dims[2] = {5, 77};
    nb_view ucond = view_at(0x100000, NB_U8, 2, dims);
    for (int d = 0; d < N_ALL; d += 2) {
        nb_view v[2][5]; /* a, b, a > b, where(a > b, a, b), where(u, that, b) */
        nb_fuse_call calls[6];
        int n = 0;
        for (int k = 0; k < 2; k++) {
            nb_dtype dt = k_all[d + k];
            for (int i = 0; i < 5; i++)
                v[k][i] = view_at(0x200000 + 0x100000 * (uintptr_t)(5 * k + i), i == 2 ? NB_BOOL : dt, 2, dims);
            calls[n] = (nb_fuse_call){.kind = NB_FUSE_BINARY, .op = NB_BIN_GT, .out = &v[k][2], .x = &v[k][0],
                                      .y = &v[k][1], .index = n};
            n++;
            calls[n] = (nb_fuse_call){.kind = NB_FUSE_WHERE, .out = &v[k][3], .cond = &v[k][2], .x = &v[k][0],
                                      .y = &v[k][1], .index = n};
            n++;
            calls[n] = (nb_fuse_call){.kind = NB_FUSE_WHERE, .out = &v[k][4], .cond = &ucond, .x = &v[k][3],
                                      .y = &v[k][1], .index = n};
            n++;
        }
        char what[64], *src = NULL;
        snprintf(what, sizeof what, "where on %s and %s", nb_dtype_name(k_all[d]), nb_dtype_name(k_all[d + 1]));
        compile_chain(what, calls, n, true, NULL, &src);
        /* slots in first-seen order, reads first: b, a, a > b, where, u, where(u) */
        CHECKF(has_step(src, 3, "s2 ? s1 : s0") && has_step(src, 5, "s4 ? s3 : s0"), "%s", src ? src : "");
        free(src);
    }
}

/* where(x > 0, x, 0.1 * x): the zeros a fill, every temporary dead. */
static void leaky_relu(void)
{
    int64_t dims[1] = {1 << 16};
    nb_view x = view_at(0x100000, NB_F32, 1, dims), zero = view_at(0x200000, NB_F32, 1, dims);
    nb_view pos = view_at(0x300000, NB_BOOL, 1, dims), scaled = view_at(0x400000, NB_F32, 1, dims);
    nb_view out = view_at(0x500000, NB_F32, 1, dims);
    nb_fuse_call calls[4] = {
        {.kind = NB_FUSE_FILL, .alpha = 0.0, .out = &zero, .index = 0},
        {.kind = NB_FUSE_BINARY, .op = NB_BIN_GT, .out = &pos, .x = &x, .y = &zero, .index = 1},
        {.kind = NB_FUSE_UNARY, .op = NB_UN_MUL_SCALAR, .alpha = 0.1, .out = &scaled, .x = &x, .index = 2},
        {.kind = NB_FUSE_WHERE, .out = &out, .cond = &pos, .x = &x, .y = &scaled, .index = 3}};
    compile_chain("where(x > 0, x, 0.1 x)", calls, 4, true, NULL, NULL);
    nb_fuse_plan plan;
    nb_gpu_fuse_geo g;
    nb_gpu_fuse_args a;
    CHECK(nb__fuse_plan(calls, 4, NB_FUSE_MAX_SLOTS, gpu_supported, always_dead, NULL, &plan) == 4);
    nb__gpu_fuse_geometry(&plan, &g, &a);
    CHECKF(plan.n_slots == 5 && plan.n_internal == 3 && a.store == 1u << plan.steps[3].slot[0],
           "%d slots, %d internal, store %#x", plan.n_slots, plan.n_internal, a.store);
    CHECK(plan.steps[3].n_ops == 4 && plan.steps[3].slot[1] == plan.steps[1].slot[0] &&
          plan.steps[3].slot[3] == plan.steps[2].slot[0]);
}

static int popcount(unsigned v)
{
    int n = 0;
    for (; v; v &= v - 1)
        n++;
    return n;
}

/* exp((a + b) * c) with its temporaries dead: only the result is stored; and
 * the source does not depend on which results are dead (the kernel compiled
 * while preparing serves the recording), only the launch's store mask does. */
static void dead_results(void)
{
    int64_t dims[1] = {4096};
    nb_view a = view_at(0x100000, NB_F32, 1, dims), b = view_at(0x200000, NB_F32, 1, dims);
    nb_view c = view_at(0x300000, NB_F32, 1, dims), t1 = view_at(0x400000, NB_F32, 1, dims);
    nb_view t2 = view_at(0x500000, NB_F32, 1, dims), r = view_at(0x600000, NB_F32, 1, dims);
    nb_fuse_call calls[3] = {{NB_FUSE_BINARY, NB_BIN_ADD, 0, &t1, &a, &b, 0, NULL},
                             {NB_FUSE_BINARY, NB_BIN_MUL, 0, &t2, &t1, &c, 1, NULL},
                             {NB_FUSE_UNARY, NB_UN_EXP, 0, &r, &t2, NULL, 2, NULL}};
    char *dead_src = NULL, *alive_src = NULL;
    nb_gpu_fuse_geo g;
    compile_chain("exp((a + b) * c)", calls, 3, true, &g, &dead_src);
    compile_chain("exp((a + b) * c), kept", calls, 3, false, &g, &alive_src);
    CHECK(dead_src && alive_src && !strcmp(dead_src, alive_src));
    CHECK(g.nd == 1 && g.shape[0] == 4096);
    int loads = 0;
    for (const char *s = alive_src; s && (s = strstr(s, "*(const float *)(a.p[")); s++)
        loads++;
    CHECKF(loads == 3, "%d loads in\n%s", loads, alive_src ? alive_src : "(none)");
    free(dead_src);
    free(alive_src);
    for (int dead = 0; dead < 2; dead++) {
        nb_fuse_plan plan;
        nb_gpu_fuse_args args;
        CHECK(nb__fuse_plan(calls, 3, NB_FUSE_MAX_SLOTS, gpu_supported, dead ? always_dead : never_dead, NULL,
                            &plan) == 3);
        nb__gpu_fuse_geometry(&plan, &g, &args);
        CHECKF(popcount(args.store) == (dead ? 1 : 3) && args.n == 4096, "store mask %#x", args.store);
    }
}

/* A bias broadcast over rows, a transposed operand: the strided iteration. */
static void strided(void)
{
    int64_t dims[2] = {6, 10};
    nb_view x = view_at(0x100000, NB_F16, 2, dims), out = view_at(0x200000, NB_F16, 2, dims);
    nb_view bias = x;
    bias.data = (void *)0x300000;
    bias.strides[0] = 0; /* [10] broadcast over 6 rows */
    bias.contiguous = false;
    nb_view xt = x;
    xt.data = (void *)0x400000;
    xt.strides[0] = 2, xt.strides[1] = 12; /* a [10, 6] tensor transposed */
    xt.contiguous = false;
    nb_fuse_call calls[3] = {{NB_FUSE_BINARY, NB_BIN_ADD, 0, &out, &x, &bias, 0, NULL},
                             {NB_FUSE_UNARY, NB_UN_RELU, 0, &out, &out, NULL, 1, NULL},
                             {NB_FUSE_BINARY, NB_BIN_MUL, 0, &out, &out, &xt, 2, NULL}};
    nb_gpu_fuse_geo g;
    compile_chain("relu(x + bias) * x.T", calls, 3, false, &g, NULL);
    CHECKF(g.nd == 2 && g.shape[0] == 6 && g.shape[1] == 10, "%d dims", g.nd);
    /* a dense chain coalesces to one dim */
    int64_t d3[3] = {2, 3, 5};
    nb_view p = view_at(0x100000, NB_F64, 3, d3), q = view_at(0x200000, NB_F64, 3, d3);
    nb_fuse_call dense[2] = {{NB_FUSE_UNARY, NB_UN_TANH, 0, &q, &p, NULL, 0, NULL},
                             {NB_FUSE_BINARY, NB_BIN_SUB, 0, &q, &q, &p, 1, NULL}};
    compile_chain("tanh(p) - p", dense, 2, false, &g, NULL);
    CHECKF(g.nd == 1 && g.shape[0] == 30, "%d dims of %lld", g.nd, (long long)g.shape[0]);
}

/* What a chain refuses: another shape, a partial overlap, an op NVRTC has no
 * formula for in that dtype. */
static void refusals(void)
{
    int64_t dims[1] = {100}, half[1] = {50};
    nb_view a = view_at(0x100000, NB_F32, 1, dims), b = view_at(0x200000, NB_F32, 1, dims);
    nb_view small = view_at(0x300000, NB_F32, 1, half), shifted = view_at(0x100000 + 8, NB_F32, 1, dims);
    nb_fuse_plan plan;
    nb_fuse_call other_shape[2] = {{NB_FUSE_UNARY, NB_UN_EXP, 0, &b, &a, NULL, 0, NULL},
                                   {NB_FUSE_UNARY, NB_UN_EXP, 0, &small, &small, NULL, 1, NULL}};
    CHECK(nb__fuse_plan(other_shape, 2, NB_FUSE_MAX_SLOTS, gpu_supported, never_dead, NULL, &plan) == 0);
    nb_fuse_call overlap[2] = {{NB_FUSE_UNARY, NB_UN_EXP, 0, &b, &a, NULL, 0, NULL},
                               {NB_FUSE_UNARY, NB_UN_NEG, 0, &shifted, &b, NULL, 1, NULL}};
    CHECK(nb__fuse_plan(overlap, 2, NB_FUSE_MAX_SLOTS, gpu_supported, never_dead, NULL, &plan) == 0);
    nb_view i = view_at(0x400000, NB_I32, 1, dims);
    nb_fuse_call no_formula = {NB_FUSE_UNARY, NB_UN_EXP, 0, &i, &i, NULL, 0, NULL};
    CHECK(!nb__gpu_fuse_supported(&no_formula));
    nb_view h = view_at(0x500000, NB_F16, 1, dims);
    nb_fuse_call mixed = {NB_FUSE_BINARY, NB_BIN_ADD, 0, &a, &a, &h, 0, NULL};
    CHECK(!nb__gpu_fuse_supported(&mixed));
    /* where: a condition that is not bool or u8, branches of two dtypes */
    nb_fuse_call float_cond = {.kind = NB_FUSE_WHERE, .out = &a, .cond = &b, .x = &a, .y = &b};
    CHECK(!nb__gpu_fuse_supported(&float_cond));
    nb_view u = view_at(0x600000, NB_U8, 1, dims);
    nb_fuse_call mixed_where = {.kind = NB_FUSE_WHERE, .out = &a, .cond = &u, .x = &a, .y = &h};
    CHECK(!nb__gpu_fuse_supported(&mixed_where));
}

int main(void)
{
    void *cubin = NULL;
    size_t size = 0;
    if (nb__gpu_fuse_compile("extern \"C\" __global__ void nb_fused() {}", 90, &cubin, &size) ==
        NB_ERR_UNSUPPORTED) {
        printf("test_gpu_fuse: skipped (%s)\n", nb_error_message());
        return 77;
    }
    nb_error_clear();
    free(cubin);
    RUN(unary_ops);
    RUN(binary_ops);
    RUN(fills);
    RUN(casts);
    RUN(wheres);
    RUN(leaky_relu);
    RUN(dead_results);
    RUN(strided);
    RUN(refusals);
    printf("%d kernels compiled\n", g_compiled);
    return check_finish();
}
