/* The fused chains' generated GPU kernels, run on the host: the CUDA source
 * gpu/gpu_fuse_source.c makes for a plan is compiled by the host's C++
 * compiler, with a prelude that stands in for CUDA (one thread walks every
 * element; the 16-bit conversions are lib/core/half.h's, rounding to nearest
 * even as the GPU's cvt.rn does), and called on host memory. Each of 160
 * random chains (2 to 14 fills, unary and binary calls, comparisons, casts
 * to any dtype and back, and where, in f32, f64, f16, bf16, i32 and i64;
 * operands dense, broadcast, transposed or
 * updated in place; 0, -0, ±inf, NaN, extreme integers among the values;
 * some results dead) must leave memory as the CPU's kernels leave it running
 * the same calls one by one (f16 and bf16 computed in float and rounded after
 * every call, as the GPU's kernels do): bit for bit, any NaN for a NaN. So
 * the generator's iteration, strides, loads, store mask and conversions are
 * checked without a GPU; the CUDA math functions and the prelude's PTX are
 * not (test_graph_fusion --gpu checks those on a GPU). Skips (77) where no
 * C++ compiler is found. CUDA builds only. */
#include "check.h"

#include "gpu/gpu_fuse.h"
#include "lib/core/backend.h"
#include "lib/core/half.h"

#include <dlfcn.h>
#include <stdint.h>
#include <unistd.h>

#ifndef NB_SOURCE_ROOT
#error "NB_SOURCE_ROOT (the project's source folder) must be defined"
#endif

extern const char nb__gpu_fuse_formulas_h[], nb__gpu_fuse_formulas_float_inc[], nb__gpu_fuse_formulas_int_inc[],
    nb__gpu_fuse_formulas_cmp_inc[];

/* CUDA, as far as the generated source uses it, for a host compiler. */
static const char k_host_prelude[] =
    "#pragma once\n"
    "#include <math.h>\n#include <stdint.h>\n#include <string.h>\n"
    "#include \"half.h\"\n"
    "#define __device__\n#define __host__\n#define __forceinline__ inline\n#define __global__\n"
    "#define __launch_bounds__(n)\n"
    "struct nbf_dim { unsigned x; };\n"
    "static const nbf_dim blockIdx = {0}, threadIdx = {0}, blockDim = {1}, gridDim = {1};\n"
    "static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }\n"
    "static inline double __longlong_as_double(long long u) { double f; memcpy(&f, &u, 8); return f; }\n"
    "static inline float nbf_h2f(unsigned short h) { return nb__f16_to_float(h); }\n"
    "static inline unsigned short nbf_f2h(float f) { return nb__f16_from_float(f); }\n"
    "static inline float nbf_b2f(unsigned short h) { return __uint_as_float((unsigned)h << 16); }\n"
    "static inline unsigned short nbf_f2b(float f) { return nb__bf16_from_float(f); }\n"
    "static inline unsigned short nbf_d2h(double d) { return nb__f16_from_double(d); }\n"
    "static inline unsigned short nbf_d2b(double d) { return nb__bf16_from_double(d); }\n"
    "static inline float nbf_keep(float v) { return v; }\n"
    "static inline double nbf_keep(double v) { return v; }\n";

/* ---- chains of calls on host buffers --------------------------------------------------- */

enum { N_CHAINS = 160, MAX_BUFS = 12, MAX_CALLS = 14 };

typedef struct buf {
    nb_dtype dt;
    int64_t n;
    char *ref, *emu; /* the CPU's run, the generated kernel's run: same start */
    bool temp, dead;
} buf;

/* A view of a buffer: element strides (0: broadcast), offset 0. */
typedef struct spec {
    int b;
    int64_t est[3];
} spec;

typedef struct ccall {
    nb_fuse_kind kind;
    int op;
    double alpha;
    spec out, x, y, cond; /* x: not for a fill; y: binary and where; cond: where */
} ccall;

typedef struct chain {
    nb_dtype dt;
    int ndim;
    int64_t shape[3];
    int n_bufs, n_calls, k; /* k: the calls the plan took */
    buf bufs[MAX_BUFS];
    ccall calls[MAX_CALLS];
    nb_view ev[MAX_CALLS][4]; /* the planned calls' views of emu memory: out, x, y, cond */
    nb_gpu_fuse_args args;
    char *src;
} chain;

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static int pick(int n) { return (int)(rnd() % (uint64_t)n); }

static bool is_half(nb_dtype d) { return d == NB_F16 || d == NB_BF16; }
static bool is_float(nb_dtype d) { return d == NB_F32 || d == NB_F64 || is_half(d); }

static nb_view view_of(const chain *ch, spec s, bool emu)
{
    const buf *b = &ch->bufs[s.b];
    nb_view v = {.data = emu ? b->emu : b->ref, .dtype = b->dt, .ndim = ch->ndim, .numel = 1};
    int64_t es = (int64_t)nb_dtype_size(b->dt);
    for (int d = 0; d < ch->ndim; d++) {
        v.shape[d] = ch->shape[d];
        v.strides[d] = s.est[d] * es;
        v.numel *= ch->shape[d];
    }
    v.contiguous = nb__view_is_contiguous(&v);
    return v;
}

static void put_value(nb_dtype dt, char *p, double v)
{
    switch (dt) {
    case NB_F32: { float f = (float)v; memcpy(p, &f, 4); break; }
    case NB_F64: memcpy(p, &v, 8); break;
    case NB_F16: { uint16_t h = nb__f16_from_double(v); memcpy(p, &h, 2); break; }
    case NB_BF16: { uint16_t h = nb__bf16_from_double(v); memcpy(p, &h, 2); break; }
    case NB_I32: { int32_t i = (int32_t)v; memcpy(p, &i, 4); break; }
    case NB_I64: { int64_t i = (int64_t)v; memcpy(p, &i, 8); break; }
    default: *(uint8_t *)p = (uint8_t)v; break;
    }
}

static double random_value(nb_dtype dt)
{
    if (dt == NB_BOOL)
        return pick(2);
    if (dt == NB_U8)
        return pick(256);
    /* the last two: just above a tie of f16 and of bf16 in double, at a tie once in float */
    static const double float_edges[] = {0.0,  -0.0, INFINITY, -INFINITY, NAN, 1e30, -1e-30, 65504.0, 1e-7,
                                         1.0 + 0x1p-11 + 0x1p-40, -(1.0 + 0x1p-8 + 0x1p-40)};
    static const double int_edges[] = {0.0, 1.0, -1.0, 2147483647.0, -2147483648.0, 46341.0};
    if (is_float(dt)) {
        if (pick(8) == 0)
            return float_edges[pick((int)(sizeof float_edges / sizeof *float_edges))];
        return ((double)(rnd() % 2000001) - 1000000.0) / 250000.0; /* [-4, 4] */
    }
    if (pick(10) == 0)
        return int_edges[pick((int)(sizeof int_edges / sizeof *int_edges))];
    return (double)pick(41) - 20.0;
}

/* A new buffer of n elements of dt, filled at random, the same in ref and emu. */
static int new_buf(chain *ch, nb_dtype dt, int64_t n, bool temp)
{
    buf *b = &ch->bufs[ch->n_bufs];
    size_t es = nb_dtype_size(dt);
    *b = (buf){.dt = dt, .n = n, .ref = malloc((size_t)n * es), .emu = malloc((size_t)n * es), .temp = temp};
    if (!b->ref || !b->emu) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++)
        put_value(dt, b->ref + i * (int64_t)es, random_value(dt));
    memcpy(b->emu, b->ref, (size_t)n * es);
    return ch->n_bufs++;
}

static int64_t chain_numel(const chain *ch)
{
    int64_t n = 1;
    for (int d = 0; d < ch->ndim; d++)
        n *= ch->shape[d];
    return n;
}

/* A row-major buffer of the chain's shape: its spec. */
static spec dense(const chain *ch, int b)
{
    spec s = {.b = b};
    int64_t st = 1;
    for (int d = ch->ndim - 1; d >= 0; d--) {
        s.est[d] = ch->shape[d] == 1 ? 0 : st;
        st *= ch->shape[d];
    }
    return s;
}

/* An input: dense, broadcast over some dims, or (2 dims and up) the
 * transpose of a buffer with the last two dims swapped. */
static spec new_input(chain *ch)
{
    int kind = pick(4);
    if (kind == 1) { /* broadcast: size 1 on a random nonempty set of dims */
        int64_t n = 1, st = 1;
        spec s = {0};
        unsigned mask = 1u + (unsigned)pick((1 << ch->ndim) - 1);
        for (int d = ch->ndim - 1; d >= 0; d--) {
            bool bc = (mask >> d) & 1u;
            s.est[d] = bc || ch->shape[d] == 1 ? 0 : st;
            if (!bc)
                st *= ch->shape[d], n *= ch->shape[d];
        }
        s.b = new_buf(ch, ch->dt, n, false);
        return s;
    }
    if (kind == 2 && ch->ndim >= 2) {
        int a = ch->ndim - 2, z = ch->ndim - 1;
        spec s = {.b = new_buf(ch, ch->dt, chain_numel(ch), false)};
        int64_t st = 1;
        int order[3] = {0, 1, 2};
        order[a] = z, order[z] = a; /* the buffer's dims, outermost first */
        for (int i = ch->ndim - 1; i >= 0; i--) {
            s.est[order[i]] = st;
            st *= ch->shape[order[i]];
        }
        return s;
    }
    return dense(ch, new_buf(ch, ch->dt, chain_numel(ch), false));
}

static int allowed_unary(nb_dtype dt, int *ops)
{
    int n = 0;
    for (int op = 0; op < NB_UN_COUNT; op++)
        if (nb__unary_dtypes((nb_unary_op)op) & NB_MASK(dt))
            ops[n++] = op;
    return n;
}

static int allowed_binary(nb_dtype dt, bool cmp, int *ops)
{
    int n = 0;
    for (int op = 0; op < NB_BIN_COUNT; op++)
        if ((nb__binary_dtypes((nb_binary_op)op) & NB_MASK(dt)) && nb__binary_is_comparison((nb_binary_op)op) == cmp)
            ops[n++] = op;
    return n;
}

static bool gpu_supported(void *user, const nb_fuse_call *c)
{
    (void)user;
    return nb__gpu_fuse_supported(c);
}

static bool dead_temp(void *user, const nb_view *v, int64_t last)
{
    (void)last;
    const chain *ch = user;
    for (int i = 0; i < ch->n_bufs; i++) {
        const buf *b = &ch->bufs[i];
        if (b->dead && (char *)v->data >= b->emu && (char *)v->data < b->emu + b->n * (int64_t)nb_dtype_size(b->dt))
            return true;
    }
    return false;
}

/* A random chain, planned; its source in ch->src (NULL where the plan took
 * fewer than two calls). */
static void make_chain(chain *ch, nb_dtype dt, int seq)
{
    static const int64_t sizes[] = {1, 2, 3, 7, 16, 31, 64, 255, 257};
    memset(ch, 0, sizeof *ch);
    ch->dt = dt;
    do {
        ch->ndim = 1 + pick(3);
        for (int d = 0; d < ch->ndim; d++)
            ch->shape[d] = sizes[pick((int)(sizeof sizes / sizeof *sizes))];
    } while (chain_numel(ch) > 4096 || chain_numel(ch) < 2);
    int n_in = 1 + pick(3);
    spec readable[MAX_BUFS];
    int n_read = 0;
    for (int i = 0; i < n_in; i++)
        readable[n_read++] = new_input(ch);
    int n_temps = 2 + pick(4);
    int first_temp = ch->n_bufs;
    for (int i = 0; i < n_temps; i++)
        (void)new_buf(ch, dt, chain_numel(ch), true);
    int flags = new_buf(ch, NB_BOOL, chain_numel(ch), true);
    /* a cast's other dtype, and a condition from outside the chain */
    static const nb_dtype all[] = {NB_F32, NB_F64, NB_F16, NB_BF16, NB_I32, NB_I64, NB_BOOL, NB_U8};
    nb_dtype other = all[(seq / 6) % 8]; /* every pair of dtypes in turn */
    if (other == dt)
        other = all[(seq / 6 + 1) % 8];
    int side = new_buf(ch, other, chain_numel(ch), true);
    bool side_written = false, flags_written = false;
    nb_dtype saved_dt = ch->dt;
    ch->dt = pick(2) ? NB_BOOL : NB_U8;
    spec cond_in = new_input(ch);
    ch->dt = saved_dt;
    int un[NB_UN_COUNT], bin[NB_BIN_COUNT], cmp[NB_BIN_COUNT];
    int n_un = allowed_unary(dt, un), n_bin = allowed_binary(dt, false, bin), n_cmp = allowed_binary(dt, true, cmp);
    static const double float_alphas[] = {0.5, 2.0, -1.5, 3.0, 0.0, 0.01};
    static const double int_alphas[] = {2.0, -3.0, 0.0, 2.5, -0.5, 1e10};
    ch->n_calls = 2 + pick(MAX_CALLS - 1);
    for (int i = 0; i < ch->n_calls; i++) {
        ccall *c = &ch->calls[i];
        int r = pick(13);
        spec x = readable[pick(n_read)], y = readable[pick(n_read)];
        /* in place on a dense operand, or a temporary */
        spec out = dense(ch, first_temp + pick(n_temps));
        if (pick(3) == 0 && !memcmp(x.est, dense(ch, x.b).est, sizeof x.est))
            out = x;
        if (r == 0) {
            *c = (ccall){.kind = NB_FUSE_FILL, .alpha = random_value(dt), .out = out};
        } else if (r <= 4) {
            *c = (ccall){.kind = NB_FUSE_UNARY, .op = un[pick(n_un)], .out = out, .x = x};
            c->alpha = is_float(dt) ? float_alphas[pick(6)] : int_alphas[pick(6)];
        } else if (r <= 8) {
            *c = (ccall){.kind = NB_FUSE_BINARY, .op = bin[pick(n_bin)], .out = out, .x = x, .y = y};
        } else if (r == 9) {
            *c = (ccall){.kind = NB_FUSE_BINARY, .op = cmp[pick(n_cmp)], .out = dense(ch, flags), .x = x, .y = y};
            flags_written = true;
        } else if (r == 10 || (r == 11 && !side_written)) { /* to the other dtype */
            *c = (ccall){.kind = NB_FUSE_COPY, .out = dense(ch, side), .x = x};
            side_written = true;
        } else if (r == 11) { /* and back */
            *c = (ccall){.kind = NB_FUSE_COPY, .out = out, .x = dense(ch, side)};
        } else {
            *c = (ccall){.kind = NB_FUSE_WHERE, .out = out, .x = x, .y = y,
                         .cond = flags_written && pick(2) ? dense(ch, flags) : cond_in};
        }
        if (c->out.b != flags && c->out.b != side) {
            bool known = false;
            for (int j = 0; j < n_read; j++)
                known = known || readable[j].b == c->out.b;
            if (!known)
                readable[n_read++] = c->out;
        }
    }
    bool some_dead = pick(2) == 0;
    for (int b = first_temp; b < ch->n_bufs; b++)
        ch->bufs[b].dead = some_dead && pick(2) == 0;
    nb_fuse_call calls[MAX_CALLS];
    for (int i = 0; i < ch->n_calls; i++) {
        const ccall *c = &ch->calls[i];
        ch->ev[i][0] = view_of(ch, c->out, true);
        bool has_y = c->kind == NB_FUSE_BINARY || c->kind == NB_FUSE_WHERE;
        if (c->kind != NB_FUSE_FILL)
            ch->ev[i][1] = view_of(ch, c->x, true);
        if (has_y)
            ch->ev[i][2] = view_of(ch, c->y, true);
        if (c->kind == NB_FUSE_WHERE)
            ch->ev[i][3] = view_of(ch, c->cond, true);
        calls[i] = (nb_fuse_call){.kind = c->kind, .op = c->op, .alpha = c->alpha, .out = &ch->ev[i][0],
                                  .x = c->kind != NB_FUSE_FILL ? &ch->ev[i][1] : NULL,
                                  .y = has_y ? &ch->ev[i][2] : NULL,
                                  .cond = c->kind == NB_FUSE_WHERE ? &ch->ev[i][3] : NULL, .index = i};
    }
    nb_fuse_plan plan;
    ch->k = nb__fuse_plan(calls, ch->n_calls, NB_FUSE_MAX_SLOTS, gpu_supported, dead_temp, ch, &plan);
    if (ch->k < 2)
        return;
    nb_gpu_fuse_geo g;
    nb__gpu_fuse_geometry(&plan, &g, &ch->args);
    ch->src = nb__gpu_fuse_source(&plan, &g);
    CHECK(ch->src != NULL);
    /* a result the plan keeps inside the chain is not compared */
    for (int b = 0; b < ch->n_bufs; b++)
        ch->bufs[b].dead = false;
    for (int s = 0; s < plan.n_slots; s++)
        for (int b = 0; b < ch->n_bufs; b++)
            if (plan.slots[s].internal && (char *)plan.slots[s].v.data == ch->bufs[b].emu)
                ch->bufs[b].dead = true;
}

/* ---- the CPU's run of the same calls --------------------------------------------------- */

/* A float copy of a 16-bit buffer, and back (rounded to nearest even). */
static float *widen(const buf *b)
{
    float *f = malloc((size_t)b->n * sizeof *f);
    for (int64_t i = 0; f && i < b->n; i++) {
        uint16_t h;
        memcpy(&h, b->ref + 2 * i, 2);
        f[i] = b->dt == NB_F16 ? nb__f16_to_float(h) : nb__bf16_to_float(h);
    }
    return f;
}

static void narrow(const buf *b, const float *f)
{
    for (int64_t i = 0; i < b->n; i++) {
        uint16_t h = b->dt == NB_F16 ? nb__f16_from_float(f[i]) : nb__bf16_from_float(f[i]);
        memcpy(b->ref + 2 * i, &h, 2);
    }
}

/* Call c by the CPU's kernel on ref memory; 16-bit floats through float
 * copies of the buffers it touches. */
static nb_status cpu_call(nb_device *cpu, chain *ch, const ccall *c)
{
    const nb_backend *be = cpu->backend;
    bool has_y = c->kind == NB_FUSE_BINARY || c->kind == NB_FUSE_WHERE;
    const spec *ops[4] = {&c->out, c->kind != NB_FUSE_FILL ? &c->x : NULL, has_y ? &c->y : NULL,
                          c->kind == NB_FUSE_WHERE ? &c->cond : NULL};
    nb_view v[4];
    float *wide[MAX_BUFS] = {NULL};
    buf saved[MAX_BUFS];
    memcpy(saved, ch->bufs, sizeof saved);
    /* the CPU fills and casts 16-bit floats itself */
    bool through_float = c->kind != NB_FUSE_FILL && c->kind != NB_FUSE_COPY;
    for (int o = 0; o < 4; o++) {
        if (!ops[o])
            continue;
        buf *b = &ch->bufs[ops[o]->b];
        if (is_half(b->dt) && through_float) {
            if (!wide[ops[o]->b])
                wide[ops[o]->b] = widen(b);
            b->dt = NB_F32; /* views of the float copy */
            b->ref = (char *)wide[ops[o]->b];
        }
    }
    for (int o = 0; o < 4; o++)
        if (ops[o])
            v[o] = view_of(ch, *ops[o], false);
    nb_status st;
    switch (c->kind) {
    case NB_FUSE_FILL: st = be->fill(cpu, &v[0], c->alpha); break;
    case NB_FUSE_UNARY: st = be->unary(cpu, (nb_unary_op)c->op, &v[0], &v[1], c->alpha); break;
    case NB_FUSE_COPY: st = be->copy(cpu, &v[0], &v[1]); break;
    case NB_FUSE_WHERE: st = be->where(cpu, &v[0], &v[3], &v[1], &v[2]); break;
    default: st = be->binary(cpu, (nb_binary_op)c->op, &v[0], &v[1], &v[2]); break;
    }
    memcpy(ch->bufs, saved, sizeof saved);
    if (wide[c->out.b] && st == NB_OK)
        narrow(&ch->bufs[c->out.b], wide[c->out.b]);
    for (int b = 0; b < MAX_BUFS; b++)
        free(wide[b]);
    return st;
}

/* ---- compiling the kernels on the host --------------------------------------------------- */

static bool write_file(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f)
        return false;
    bool ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

typedef void (*kernel_fn)(nb_gpu_fuse_args);

/* One translation unit of every chain's kernel (nb_fused_<i>), built as a
 * shared library and loaded; NULL where that failed (the compiler's log
 * printed). */
static void *build_kernels(const char *dir, chain *chains, int n)
{
    if (!write_file(dir, "nb_fuse_prelude.h", k_host_prelude) || !write_file(dir, "formulas.h", nb__gpu_fuse_formulas_h) ||
        !write_file(dir, "formulas_float.inc", nb__gpu_fuse_formulas_float_inc) ||
        !write_file(dir, "formulas_int.inc", nb__gpu_fuse_formulas_int_inc) ||
        !write_file(dir, "formulas_cmp.inc", nb__gpu_fuse_formulas_cmp_inc))
        return NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/kernels.cpp", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return NULL;
    fputs("#include \"nb_fuse_prelude.h\"\n#include \"formulas.h\"\n", f);
    for (int i = 0; i < n; i++)
        if (chains[i].src)
            fprintf(f, "#define nb_fused nb_fused_%d\nnamespace k%d {\n%s}\n#undef nb_fused\n", i, i, chains[i].src);
    if (fclose(f) != 0)
        return NULL;
    char cmd[2048];
    /* no contraction of a multiply into an add (the CPU's kernels have none),
     * and libm's functions called, not folded by the compiler where a fill
     * makes their argument a constant (it folds them correctly rounded) */
    snprintf(cmd, sizeof cmd,
             "c++ -std=c++17 -O1 -fPIC -shared -ffp-contract=off -fno-builtin -w -I%s -I%s/lib/core -o %s/kernels.so %s "
             "> %s/log 2>&1",
             dir, NB_SOURCE_ROOT, dir, path, dir);
    if (system(cmd) != 0) {
        snprintf(cmd, sizeof cmd, "head -c 4000 %s/log >&2", dir);
        (void)system(cmd);
        return NULL;
    }
    snprintf(path, sizeof path, "%s/kernels.so", dir);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        fprintf(stderr, "dlopen: %s\n", dlerror());
    return h;
}

/* ---- the comparison ---------------------------------------------------------------------- */

static bool same_element(nb_dtype dt, const char *a, const char *b)
{
    if (dt == NB_F32) {
        float x, y;
        memcpy(&x, a, 4), memcpy(&y, b, 4);
        if (x != x && y != y)
            return true;
    } else if (dt == NB_F64) {
        double x, y;
        memcpy(&x, a, 8), memcpy(&y, b, 8);
        if (x != x && y != y)
            return true;
    } else if (is_half(dt)) {
        uint16_t x, y;
        memcpy(&x, a, 2), memcpy(&y, b, 2);
        float fx = dt == NB_F16 ? nb__f16_to_float(x) : nb__bf16_to_float(x);
        float fy = dt == NB_F16 ? nb__f16_to_float(y) : nb__bf16_to_float(y);
        if (fx != fx && fy != fy)
            return true;
    }
    return !memcmp(a, b, nb_dtype_size(dt));
}

static int g_compared, g_skipped, g_fused_calls, g_whole, g_internal_bufs, g_kinds[5];

static void run_chain(nb_device *cpu, void *lib, chain *ch, int i)
{
    if (!ch->src) {
        g_skipped++;
        return;
    }
    for (int c = 0; c < ch->k; c++) {
        nb_status st = cpu_call(cpu, ch, &ch->calls[c]);
        CHECKF(st == NB_OK, "chain %d: the CPU refused call %d: %s", i, c, nb_error_message());
        nb_error_clear();
    }
    char name[32];
    snprintf(name, sizeof name, "nb_fused_%d", i);
    kernel_fn fn;
    *(void **)&fn = dlsym(lib, name);
    CHECK(fn != NULL);
    if (!fn)
        return;
    /* what the chain keeps inside it is neither read nor written in memory */
    char *before[MAX_BUFS] = {NULL};
    for (int b = 0; b < ch->n_bufs; b++) {
        const buf *bf = &ch->bufs[b];
        size_t bytes = (size_t)bf->n * nb_dtype_size(bf->dt);
        if (bf->dead && (before[b] = malloc(bytes)) != NULL)
            memcpy(before[b], bf->emu, bytes);
    }
    fn(ch->args);
    g_compared++;
    g_fused_calls += ch->k;
    g_whole += ch->k == ch->n_calls;
    for (int c = 0; c < ch->k; c++)
        g_kinds[ch->calls[c].kind]++;
    for (int b = 0; b < ch->n_bufs; b++) {
        const buf *bf = &ch->bufs[b];
        if (bf->dead) {
            g_internal_bufs++;
            CHECKF(before[b] && !memcmp(before[b], bf->emu, (size_t)bf->n * nb_dtype_size(bf->dt)),
                   "chain %d: buffer %d, internal to the chain, was written\n%s", i, b, ch->src);
            free(before[b]);
            continue;
        }
        size_t es = nb_dtype_size(bf->dt);
        for (int64_t e = 0; e < bf->n; e++) {
            if (!same_element(bf->dt, bf->ref + e * (int64_t)es, bf->emu + e * (int64_t)es)) {
                uint64_t r = 0, m = 0;
                memcpy(&r, bf->ref + e * (int64_t)es, es), memcpy(&m, bf->emu + e * (int64_t)es, es);
                CHECKF(false, "chain %d (%s, %d of %d calls): buffer %d (%s) element %lld differs: %#llx on the CPU, "
                       "%#llx from the kernel\n%s", i, nb_dtype_name(ch->dt), ch->k, ch->n_calls, b,
                       nb_dtype_name(bf->dt), (long long)e, (unsigned long long)r, (unsigned long long)m, ch->src);
                return;
            }
        }
    }
}

/* ---- the values are arguments, not source -------------------------------------------- */

static bool never_dead(void *user, const nb_view *v, int64_t last)
{
    (void)user, (void)v, (void)last;
    return false;
}

/* The source and argument of the chain t = fill(v); u = x * s (mul_scalar);
 * out = t + u, in dtype dt over 4 elements. */
static char *scalar_chain(nb_dtype dt, double v, double s, nb_gpu_fuse_args *a)
{
    static char mem[4][64];
    nb_view views[4];
    for (int i = 0; i < 4; i++)
        views[i] = (nb_view){.data = mem[i], .dtype = dt, .ndim = 1, .numel = 4, .shape = {4},
                             .strides = {(int64_t)nb_dtype_size(dt)}, .contiguous = true};
    nb_fuse_call calls[3] = {
        {.kind = NB_FUSE_FILL, .alpha = v, .out = &views[0], .index = 0},
        {.kind = NB_FUSE_UNARY, .op = NB_UN_MUL_SCALAR, .alpha = s, .out = &views[1], .x = &views[2], .index = 1},
        {.kind = NB_FUSE_BINARY, .op = NB_BIN_ADD, .out = &views[3], .x = &views[0], .y = &views[1], .index = 2},
    };
    nb_fuse_plan plan;
    if (nb__fuse_plan(calls, 3, NB_FUSE_MAX_SLOTS, gpu_supported, never_dead, NULL, &plan) != 3)
        return NULL;
    nb_gpu_fuse_geo g;
    nb__gpu_fuse_geometry(&plan, &g, a);
    return nb__gpu_fuse_source(&plan, &g);
}

/* A chain that differs only in its fill value or scalar is the same source
 * (one compile for every value: a step's hyperparameters do not fill the
 * cache of kernels), its values in the argument; an integer's fractional
 * scalar, applied in double, is another source. */
static void test_values_not_in_source(void)
{
    static const nb_dtype dts[] = {NB_F32, NB_F64, NB_F16, NB_BF16, NB_I32, NB_I64};
    for (size_t i = 0; i < sizeof dts / sizeof *dts; i++) {
        nb_gpu_fuse_args a1, a2;
        char *s1 = scalar_chain(dts[i], 2.0, 3.0, &a1);
        char *s2 = scalar_chain(dts[i], NAN, -7.0, &a2);
        CHECKF(s1 && s2, "%s: the chain was not planned", nb_dtype_name(dts[i]));
        CHECKF(s1 && s2 && !strcmp(s1, s2), "%s: the values changed the source", nb_dtype_name(dts[i]));
        CHECKF(memcmp(a1.k, a2.k, sizeof a1.k) != 0, "%s: the values are not in the argument",
               nb_dtype_name(dts[i]));
        CHECK(!s1 || !strstr(s1, "0x4000000000000000")); /* 2.0's bits */
        if (dts[i] == NB_I32 || dts[i] == NB_I64) {
            nb_gpu_fuse_args a3;
            char *s3 = scalar_chain(dts[i], 2.0, 2.5, &a3);
            CHECKF(s3 && s1 && strcmp(s1, s3) != 0, "%s: a fractional scalar is not applied in double",
                   nb_dtype_name(dts[i]));
            CHECK(a3.k[1] == 0x4004000000000000ull); /* 2.5's bits */
            CHECK(a1.k[1] == 3 && a2.k[1] == (unsigned long long)-7);
            free(s3);
        }
        free(s1);
        free(s2);
    }
}

static char g_dir[256];
static chain g_chains[N_CHAINS];

static void random_chains(void)
{
    static const nb_dtype dts[] = {NB_F32, NB_F64, NB_F16, NB_BF16, NB_I32, NB_I64};
    for (int i = 0; i < N_CHAINS; i++)
        make_chain(&g_chains[i], dts[i % 6], i);
    void *lib = build_kernels(g_dir, g_chains, N_CHAINS);
    CHECK(lib != NULL);
    nb_device *cpu = nb__device_find("/cpu:0", "test_gpu_fuse_host");
    CHECK(cpu != NULL);
    for (int i = 0; lib && cpu && i < N_CHAINS; i++)
        run_chain(cpu, lib, &g_chains[i], i);
    CHECKF(g_compared >= N_CHAINS * 3 / 4, "only %d of %d chains fused", g_compared, N_CHAINS);
    printf("%d chains (%d calls; %d whole, the others cut by the plan) compared, %d left unfused; %d results kept "
           "inside their chain\n",
           g_compared, g_fused_calls, g_whole, g_skipped, g_internal_bufs);
    CHECKF(g_internal_bufs >= 20, "only %d results internal", g_internal_bufs);
    printf("fills %d, unary %d, binary %d, casts %d, where %d\n", g_kinds[NB_FUSE_FILL], g_kinds[NB_FUSE_UNARY],
           g_kinds[NB_FUSE_BINARY], g_kinds[NB_FUSE_COPY], g_kinds[NB_FUSE_WHERE]);
    CHECK(g_kinds[NB_FUSE_COPY] >= 50 && g_kinds[NB_FUSE_WHERE] >= 30);
    if (lib)
        dlclose(lib);
    for (int i = 0; i < N_CHAINS; i++) {
        for (int b = 0; b < g_chains[i].n_bufs; b++) {
            free(g_chains[i].bufs[b].ref);
            free(g_chains[i].bufs[b].emu);
        }
        free(g_chains[i].src);
    }
}

int main(void)
{
    if (system("c++ --version > /dev/null 2>&1") != 0) {
        printf("test_gpu_fuse_host: skipped (no C++ compiler, c++)\n");
        return 77;
    }
    const char *seed = getenv("NB_FUSE_HOST_SEED"); /* another set of chains */
    if (seed && strtoull(seed, NULL, 10))
        g_rng = strtoull(seed, NULL, 10);
    const char *tmp = getenv("TMPDIR");
    int len = snprintf(g_dir, sizeof g_dir, "%s/nb_fuse_host_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (len < 0 || (size_t)len >= sizeof g_dir || !mkdtemp(g_dir)) {
        printf("test_gpu_fuse_host: cannot make a temporary folder under %s\n", tmp && tmp[0] ? tmp : "/tmp");
        return 1;
    }
    RUN(test_values_not_in_source);
    RUN(random_chains);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    (void)system(cmd);
    return check_finish();
}
