/* The kernel of a fused elementwise chain: its iteration, its CUDA source and
 * its compilation by NVRTC (gpu_fuse.h). Nothing here needs a GPU, so the
 * generated code is compiled by the tests on any machine with NVRTC. */
#include "gpu_fuse.h"

#include "lib/core/backend.h"
#include "lib/core/formulas.h"
#include "lib/core/half.h"

#include <dlfcn.h>
#include <cuda_runtime_api.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The formulas' files, embedded at build time (gpu_fuse_headers.c). */
extern const char nb__gpu_fuse_formulas_h[], nb__gpu_fuse_formulas_float_inc[], nb__gpu_fuse_formulas_int_inc[],
    nb__gpu_fuse_formulas_cmp_inc[];

/* What the formulas include, for a compiler without a C library: the fixed
 * width integers, and nothing from math.h (NVRTC declares the device math
 * functions itself). Then the 16-bit conversions the kernels use
 * (__float2half_rn, __half2float, __float2bfloat16_rn, __bfloat162float are
 * these instructions; __double2half and __double2bfloat16, which the cast
 * kernel uses from f64, round once: cvt.rn.*.f64, and below sm_90, which
 * lacks cvt.rn.bf16.f64, cuda_bf16.hpp's round-to-odd float first), and the
 * barrier between a chain's calls. */
static const char k_stdint_h[] =
    "#pragma once\n"
    "typedef signed char int8_t; typedef unsigned char uint8_t;\n"
    "typedef short int16_t; typedef unsigned short uint16_t;\n"
    "typedef int int32_t; typedef unsigned int uint32_t;\n"
    "typedef long long int64_t; typedef unsigned long long uint64_t;\n"
    "#define INT32_MAX 2147483647\n#define INT32_MIN (-INT32_MAX - 1)\n"
    "#define INT64_MAX 9223372036854775807LL\n#define INT64_MIN (-INT64_MAX - 1)\n"
    "#define UINT32_MAX 4294967295U\n#define UINT64_MAX 18446744073709551615ULL\n";
static const char k_math_h[] = "#pragma once\n";
static const char k_prelude_h[] =
    "#pragma once\n"
    "#define NBF __device__ __forceinline__\n"
    "NBF float nbf_h2f(unsigned short h) { float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f; }\n"
    "NBF unsigned short nbf_f2h(float f) { unsigned short h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n"
    "NBF float nbf_b2f(unsigned short h) { return __uint_as_float((unsigned)h << 16); }\n"
    "NBF unsigned short nbf_f2b(float f) { unsigned short h; asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n"
    "NBF unsigned short nbf_d2h(double d) { unsigned short h; asm(\"cvt.rn.f16.f64 %0, %1;\" : \"=h\"(h) : \"d\"(d)); return h; }\n"
    "NBF unsigned short nbf_d2b(double d) {\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "  unsigned short h; asm(\"cvt.rn.bf16.f64 %0, %1;\" : \"=h\"(h) : \"d\"(d)); return h;\n"
    "#else\n"
    "  float f = __double2float_rn(d); double b = (double)f; unsigned u = __float_as_uint(f);\n"
    "  bool num = (u << 1) <= 0xFF000000U;\n"
    "  if ((d > 0.0 && b > d) || (d < 0.0 && b < d)) u--;\n"
    "  if (b != d && num) u |= 1U;\n"
    "  return nbf_f2b(__uint_as_float(u));\n"
    "#endif\n"
    "}\n"
    /* Each call's result rounded on its own: an add of -0 with .rn, which
     * ptxas never contracts into an fma with the next call's add (an empty asm
     * leaves nothing in the PTX). x + -0 is x but for a NaN's payload, so a
     * NaN passes as it came, as from the call's own kernel. */
    "NBF float nbf_keep(float v) {\n"
    "  float w; asm volatile(\"add.rn.f32 %0, %1, 0f80000000;\" : \"=f\"(w) : \"f\"(v)); return v == v ? w : v;\n"
    "}\n"
    "NBF double nbf_keep(double v) {\n"
    "  double w; asm volatile(\"add.rn.f64 %0, %1, 0d8000000000000000;\" : \"=d\"(w) : \"d\"(v)); return v == v ? w : v;\n"
    "}\n";

/* ---- the iteration --------------------------------------------------------------------- */

static uint64_t step_scalar(const nb_fuse_plan *p, const nb_fuse_step *st);

void nb__gpu_fuse_geometry(const nb_fuse_plan *p, nb_gpu_fuse_geo *g, nb_gpu_fuse_args *a)
{
    memset(g, 0, sizeof *g);
    memset(a, 0, sizeof *a);
    const nb_view *views[NB_FUSE_MAX_SLOTS];
    bool written[NB_FUSE_MAX_SLOTS] = {false};
    for (int i = 0; i < p->n_steps; i++)
        written[p->steps[i].slot[0]] = true;
    for (int i = 0; i < p->n_slots; i++) {
        a->p[i] = p->slots[i].v.data;
        views[i] = &p->slots[i].v;
        if (written[i] && !p->slots[i].internal)
            a->store |= 1u << i;
    }
    for (int i = 0; i < p->n_steps; i++)
        a->k[i] = step_scalar(p, &p->steps[i]);
    /* size-1 dims dropped; a dim merged into the one before it where every
     * operand steps over it exactly */
    const nb_view *v0 = views[0];
    int nd = 0;
    for (int d = 0; d < v0->ndim; d++) {
        int64_t size = v0->shape[d];
        if (size == 1)
            continue;
        bool merge = nd > 0;
        for (int o = 0; o < p->n_slots && merge; o++)
            merge = g->strides[o][nd - 1] == views[o]->strides[d] * size;
        if (merge) {
            g->shape[nd - 1] *= size;
            for (int o = 0; o < p->n_slots; o++)
                g->strides[o][nd - 1] = views[o]->strides[d];
            continue;
        }
        g->shape[nd] = size;
        for (int o = 0; o < p->n_slots; o++)
            g->strides[o][nd] = views[o]->strides[d];
        nd++;
    }
    if (nd == 0) {
        g->shape[0] = 1;
        nd = 1;
    }
    g->nd = nd;
    a->n = 1;
    for (int d = 0; d < nd; d++) {
        a->shape[d] = g->shape[d];
        a->n *= g->shape[d];
        for (int o = 0; o < p->n_slots; o++)
            a->st[o][d] = g->strides[o][d];
    }
}

/* ---- what the kernel computes ------------------------------------------------------------ */

static bool fusable_dtype(nb_dtype d)
{
    switch (d) {
    case NB_F32: case NB_F64: case NB_F16: case NB_BF16: case NB_I32: case NB_I64: case NB_BOOL: case NB_U8:
        return true;
    default:
        return false;
    }
}

bool nb__gpu_fuse_supported(const nb_fuse_call *c)
{
    nb_dtype d = c->out->dtype;
    if (!fusable_dtype(d))
        return false;
    switch (c->kind) {
    case NB_FUSE_FILL:
        return true;
    case NB_FUSE_COPY: /* the cast kernel converts between every two of them */
        return fusable_dtype(c->x->dtype);
    case NB_FUSE_WHERE: /* the where kernel moves elements by size, cond read as bytes */
        return (c->cond->dtype == NB_BOOL || c->cond->dtype == NB_U8) && c->x->dtype == d && c->y->dtype == d;
    case NB_FUSE_UNARY:
        return (unsigned)c->op < NB_UN_COUNT && c->x->dtype == d && (nb__unary_dtypes((nb_unary_op)c->op) & NB_MASK(d));
    case NB_FUSE_BINARY: {
        if ((unsigned)c->op >= NB_BIN_COUNT)
            return false;
        nb_binary_op op = (nb_binary_op)c->op;
        nb_dtype in = c->x->dtype;
        return c->y->dtype == in && fusable_dtype(in) && d == (nb__binary_is_comparison(op) ? NB_BOOL : in) &&
               (nb__binary_dtypes(op) & NB_MASK(in));
    }
    default:
        return false;
    }
}

/* ---- the source ------------------------------------------------------------------------- */

typedef struct text {
    char *s;
    size_t n, cap;
    bool failed;
} text;

static void put(text *t, const char *fmt, ...)
{
    if (t->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(t->s ? t->s + t->n : NULL, t->s ? t->cap - t->n : 0, fmt, ap);
        va_end(ap);
        if (w < 0) {
            t->failed = true;
            return;
        }
        if (t->s && (size_t)w < t->cap - t->n) {
            t->n += (size_t)w;
            return;
        }
        size_t cap = t->cap ? 2 * t->cap : 8192;
        while (cap < t->n + (size_t)w + 1)
            cap *= 2;
        char *s = realloc(t->s, cap);
        if (!s) {
            t->failed = true;
            return;
        }
        t->s = s;
        t->cap = cap;
    }
}

static const char *storage_type(nb_dtype d)
{
    switch (d) {
    case NB_F32: return "float";
    case NB_F64: return "double";
    case NB_F16: case NB_BF16: return "unsigned short";
    case NB_I32: return "int";
    case NB_I64: return "long long";
    default: return "unsigned char";
    }
}

/* The formulas' suffix for the compute type of d (f16, bf16: float; bool, u8:
 * int32, as the kernels widen them). */
static const char *compute_suffix(nb_dtype d)
{
    switch (d) {
    case NB_F64: return "f64";
    case NB_F32: case NB_F16: case NB_BF16: return "f32";
    case NB_I64: return "i64";
    default: return "i32";
    }
}

/* Slot s's value in its compute type. */
static void put_load(text *t, nb_dtype d, int s)
{
    switch (d) {
    case NB_F16: put(t, "nbf_h2f(s%d)", s); break;
    case NB_BF16: put(t, "nbf_b2f(s%d)", s); break;
    case NB_BOOL: put(t, "(int)(s%d != 0)", s); break;
    case NB_U8: put(t, "(int)s%d", s); break;
    default: put(t, "s%d", s); break;
    }
}

/* Step i's scalar, as the kernel reads it: the bits of a.k[i] (see
 * step_scalar) as a double. */
static void put_scalar_double(text *t, int i) { put(t, "__longlong_as_double((long long)a.k[%d])", i); }

/* A fill's value, converted on the device from the double as the fill
 * kernel's st<D> converts it (a NaN's bits are then the device's). */
static void put_fill(text *t, nb_dtype d, int i)
{
    static const char *const conv[] = {[NB_F32] = "(float)", [NB_F64] = "", [NB_F16] = "nbf_d2h",
                                       [NB_BF16] = "nbf_d2b", [NB_I32] = "nb_cast_to_i32",
                                       [NB_I64] = "nb_cast_to_i64", [NB_U8] = "nb_cast_to_u8"};
    if (d == NB_BOOL) {
        put(t, "(unsigned char)(");
        put_scalar_double(t, i);
        put(t, " != 0.0 ? 1 : 0)");
        return;
    }
    put(t, "%s(", conv[d]);
    put_scalar_double(t, i);
    put(t, ")");
}

/* Whether a unary step on integers applies its scalar in double: a scalar
 * that is not a whole number, to add or multiply (UnaryF's alpha_frac). */
static bool unary_frac(const nb_fuse_step *st, int64_t *whole)
{
    double a = st->alpha;
    int64_t ia = !(a == a) ? 0 : a >= 9223372036854775807.0 ? INT64_MAX
                               : a <= -9223372036854775808.0 ? INT64_MIN : (int64_t)a;
    *whole = ia;
    return (double)ia != a && (st->op == NB_UN_ADD_SCALAR || st->op == NB_UN_MUL_SCALAR);
}

/* Step st's scalar as the kernel's argument carries it (a.k), so that a
 * chain that differs only in its values is the same source, compiled once:
 * a fill's value and an integer's fractional scalar as a double's bits; an
 * integer's scalar saturated to int64, as UnaryF's alpha; a floating
 * unary's scalar in its compute type (float converted on the host, as
 * unary_op converts it). */
static uint64_t step_scalar(const nb_fuse_plan *p, const nb_fuse_step *st)
{
    uint64_t bits = 0;
    nb_dtype d = p->slots[st->slot[0]].v.dtype;
    if (st->kind == NB_FUSE_FILL || (st->kind == NB_FUSE_UNARY && d == NB_F64)) {
        memcpy(&bits, &st->alpha, sizeof bits);
    } else if (st->kind == NB_FUSE_UNARY && (d == NB_I32 || d == NB_I64)) {
        int64_t whole;
        if (unary_frac(st, &whole))
            memcpy(&bits, &st->alpha, sizeof bits);
        else
            bits = (uint64_t)whole;
    } else if (st->kind == NB_FUSE_UNARY) {
        float f = (float)st->alpha;
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        bits = u;
    }
    return bits;
}

/* Stores the compute-type expression that follows (closed by put_store_end)
 * into slot s of dtype d. */
static void put_store_begin(text *t, nb_dtype d, int s)
{
    switch (d) {
    case NB_F32: put(t, "    s%d = nbf_keep((float)(", s); break;
    case NB_F64: put(t, "    s%d = nbf_keep((double)(", s); break;
    case NB_F16: put(t, "    s%d = nbf_f2h((float)(", s); break;
    case NB_BF16: put(t, "    s%d = nbf_f2b((float)(", s); break;
    default: put(t, "    s%d = (%s)((", s, storage_type(d)); break;
    }
}

static void put_store_end(text *t) { put(t, "));\n"); }

static bool is_real(nb_dtype d) { return d == NB_F32 || d == NB_F64 || d == NB_F16 || d == NB_BF16; }

/* A cast from slot x into slot out as the cast kernel converts
 * (gpu_kernels.cuh, cvt<To, From>): the same dtype moves the bits; f16 and
 * bf16 are read as float, bool as int (x != 0); the value is then stored as
 * st<To> does: to f16 and bf16 rounded once from double, else through float;
 * to bool x != 0 (NaN true); floating to an integer by nb_cast_to_* (through
 * double: NaN to 0, saturating, u8 through i32); the rest by C conversion. */
static void put_copy(text *t, const nb_fuse_plan *p, const nb_fuse_step *st)
{
    int so = st->slot[0], sx = st->slot[1];
    nb_dtype to = p->slots[so].v.dtype, from = p->slots[sx].v.dtype;
    if (to == from) {
        put(t, "    s%d = s%d;\n", so, sx);
        return;
    }
    char v[32];
    nb_dtype vt = from; /* the value's type: float for a half, int for bool */
    if (from == NB_F16 || from == NB_BF16) {
        snprintf(v, sizeof v, "%s(s%d)", from == NB_F16 ? "nbf_h2f" : "nbf_b2f", sx);
        vt = NB_F32;
    } else if (from == NB_BOOL) {
        snprintf(v, sizeof v, "(int)(s%d != 0)", sx);
        vt = NB_I32;
    } else {
        snprintf(v, sizeof v, "s%d", sx);
    }
    put(t, "    s%d = ", so);
    switch (to) {
    case NB_F16: put(t, vt == NB_F64 ? "nbf_d2h(%s)" : "nbf_f2h((float)%s)", v); break;
    case NB_BF16: put(t, vt == NB_F64 ? "nbf_d2b(%s)" : "nbf_f2b((float)%s)", v); break;
    case NB_BOOL: put(t, "(unsigned char)(%s != 0 ? 1 : 0)", v); break;
    case NB_U8: put(t, is_real(vt) ? "nb_cast_to_u8((double)%s)" : "(unsigned char)%s", v); break;
    case NB_I32: put(t, is_real(vt) ? "nb_cast_to_i32((double)%s)" : "(int)%s", v); break;
    case NB_I64: put(t, is_real(vt) ? "nb_cast_to_i64((double)%s)" : "(long long)%s", v); break;
    default: put(t, "(%s)%s", storage_type(to), v); break;
    }
    put(t, ";\n");
}

static void put_step(text *t, const nb_fuse_plan *p, int i)
{
    const nb_fuse_step *st = &p->steps[i];
    const nb_fuse_slot *out = &p->slots[st->slot[0]];
    nb_dtype d = out->v.dtype;
    if (st->kind == NB_FUSE_FILL) {
        put(t, "    s%d = ", st->slot[0]);
        put_fill(t, d, i);
        put(t, ";\n");
        return;
    }
    if (st->kind == NB_FUSE_COPY) {
        put_copy(t, p, st);
        return;
    }
    if (st->kind == NB_FUSE_WHERE) { /* the where kernel's select: the elements' bits, cond a byte */
        put(t, "    s%d = s%d ? s%d : s%d;\n", st->slot[0], st->slot[1], st->slot[2], st->slot[3]);
        return;
    }
    if (st->kind == NB_FUSE_UNARY) {
        const char *name = nb__unary_name((nb_unary_op)st->op);
        put_store_begin(t, d, st->slot[0]);
        if (d == NB_I32 || d == NB_I64) {
            int64_t whole;
            if (unary_frac(st, &whole)) { /* not a whole number: applied in double */
                put(t, "nb_un_%s_frac_%s(s%d, ", st->op == NB_UN_ADD_SCALAR ? "add" : "mul", compute_suffix(d),
                    st->slot[1]);
                put_scalar_double(t, i);
                put(t, ")");
            } else {
                put(t, "nb_un_%s_%s(s%d, (%s)(long long)a.k[%d])", name, compute_suffix(d), st->slot[1],
                    storage_type(d), i);
            }
        } else {
            put(t, "nb_un_%s_%s(", name, compute_suffix(d));
            put_load(t, d, st->slot[1]);
            put(t, ", ");
            if (d == NB_F64)
                put_scalar_double(t, i);
            else
                put(t, "__uint_as_float((unsigned)a.k[%d])", i);
            put(t, ")");
        }
        put_store_end(t);
        return;
    }
    nb_dtype in = p->slots[st->slot[1]].v.dtype;
    const char *name = nb__binary_name((nb_binary_op)st->op);
    if (nb__binary_is_comparison((nb_binary_op)st->op))
        put(t, "    s%d = (unsigned char)(", st->slot[0]);
    else
        put_store_begin(t, d, st->slot[0]);
    put(t, "nb_bin_%s_%s(", name, compute_suffix(in));
    put_load(t, in, st->slot[1]);
    put(t, ", ");
    put_load(t, in, st->slot[2]);
    put(t, ")");
    if (nb__binary_is_comparison((nb_binary_op)st->op))
        put(t, ");\n");
    else
        put_store_end(t);
}

char *nb__gpu_fuse_source(const nb_fuse_plan *p, const nb_gpu_fuse_geo *g)
{
    text t = {0};
    put(&t, "#include \"nb_fuse_prelude.h\"\n#include \"formulas.h\"\n");
    put(&t, "struct nbf_args { char *p[%d]; long long st[%d][%d]; long long shape[%d]; unsigned long long k[%d]; "
            "long long n; unsigned store; };\n",
        NB_FUSE_MAX_SLOTS, NB_FUSE_MAX_SLOTS, NB_GPU_FUSE_MAX_DIMS, NB_GPU_FUSE_MAX_DIMS, NB_FUSE_MAX_CALLS);
    put(&t, "extern \"C\" __global__ void __launch_bounds__(256) nb_fused(const nbf_args a)\n{\n");
    put(&t, "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < a.n;"
            " i += (long long)gridDim.x * blockDim.x) {\n");
    /* the operands' byte offsets */
    for (int o = 0; o < p->n_slots; o++)
        put(&t, "    long long o%d = 0;\n", o);
    if (g->nd == 1) {
        for (int o = 0; o < p->n_slots; o++)
            put(&t, "    o%d = i * a.st[%d][0];\n", o, o);
    } else {
        put(&t, "    long long r = i, x;\n");
        for (int d = g->nd - 1; d >= 0; d--) {
            put(&t, "    x = r %% a.shape[%d]; r /= a.shape[%d];\n", d, d);
            for (int o = 0; o < p->n_slots; o++)
                put(&t, "    o%d += x * a.st[%d][%d];\n", o, o, d);
        }
    }
    /* every slot a variable of its storage type; those read first come from memory */
    for (int s = 0; s < p->n_slots; s++) {
        const char *T = storage_type(p->slots[s].v.dtype);
        if (!p->slots[s].first_write)
            put(&t, "    %s s%d = *(const %s *)(a.p[%d] + o%d);\n", T, s, T, s, s);
        else
            put(&t, "    %s s%d;\n", T, s);
    }
    for (int i = 0; i < p->n_steps; i++)
        put_step(&t, p, i);
    /* what the chain wrote, back to memory where the launch asks for it */
    bool written[NB_FUSE_MAX_SLOTS] = {false};
    for (int i = 0; i < p->n_steps; i++)
        written[p->steps[i].slot[0]] = true;
    for (int s = 0; s < p->n_slots; s++)
        if (written[s])
            put(&t, "    if (a.store & %uu) *(%s *)(a.p[%d] + o%d) = s%d;\n", 1u << s,
                storage_type(p->slots[s].v.dtype), s, s, s);
    put(&t, "  }\n}\n");
    if (t.failed) {
        free(t.s);
        return NULL;
    }
    return t.s;
}

/* ---- NVRTC, loaded when first needed ------------------------------------------------------ */

typedef struct nvrtc_api {
    bool loaded;
    nvrtcResult (*version)(int *, int *);
    const char *(*error_string)(nvrtcResult);
    nvrtcResult (*create)(nvrtcProgram *, const char *, const char *, int, const char *const *, const char *const *);
    nvrtcResult (*compile)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*log_size)(nvrtcProgram, size_t *);
    nvrtcResult (*log)(nvrtcProgram, char *);
    nvrtcResult (*cubin_size)(nvrtcProgram, size_t *);
    nvrtcResult (*cubin)(nvrtcProgram, char *);
    nvrtcResult (*destroy)(nvrtcProgram *);
} nvrtc_api;

static nvrtc_api g_nvrtc;
static pthread_once_t g_nvrtc_once = PTHREAD_ONCE_INIT;

static const char *const k_nvrtc_names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};

/* NVRTC beside the CUDA runtime this process loaded: the toolkit keeps both
 * in one folder, Python's CUDA wheels in sibling folders (nvidia/cuda_runtime/lib,
 * nvidia/cuda_nvrtc/lib), neither always on the loader's path. */
static void *nvrtc_beside_cudart(void)
{
    Dl_info info;
    if (!dladdr((void *)&cudaGetDevice, &info) || !info.dli_fname)
        return NULL;
    const char *slash = strrchr(info.dli_fname, '/');
    if (!slash)
        return NULL;
    int dir = (int)(slash - info.dli_fname);
    static const char *const folders[] = {"", "/../../cuda_nvrtc/lib"};
    void *h = NULL;
    for (size_t f = 0; f < sizeof folders / sizeof *folders && !h; f++)
        for (size_t i = 0; i < sizeof k_nvrtc_names / sizeof *k_nvrtc_names && !h; i++) {
            char path[4096];
            int n = snprintf(path, sizeof path, "%.*s%s/%s", dir, info.dli_fname, folders[f], k_nvrtc_names[i]);
            if (n > 0 && (size_t)n < sizeof path)
                h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        }
    return h;
}

/* The NVRTC of the runtime's toolkit: the one beside it, else the loader's
 * of the runtime's major version, else any; one of another major version is
 * not used (its libdevice may round expf or powf otherwise than the unfused
 * kernels, its CUBIN may not load on the driver): the chains run unfused. */
static void nvrtc_load(void)
{
    int runtime = 0;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess)
        runtime = 0;
    void *h = nvrtc_beside_cudart();
    char own[32];
    snprintf(own, sizeof own, "libnvrtc.so.%d", runtime / 1000);
    if (!h && runtime)
        h = dlopen(own, RTLD_NOW | RTLD_LOCAL);
    for (size_t i = 0; i < sizeof k_nvrtc_names / sizeof *k_nvrtc_names && !h; i++)
        h = dlopen(k_nvrtc_names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return;
    nvrtc_api a;
#define SYM(field, name) *(void **)(&a.field) = dlsym(h, name)
    SYM(version, "nvrtcVersion");
    SYM(error_string, "nvrtcGetErrorString");
    SYM(create, "nvrtcCreateProgram");
    SYM(compile, "nvrtcCompileProgram");
    SYM(log_size, "nvrtcGetProgramLogSize");
    SYM(log, "nvrtcGetProgramLog");
    SYM(cubin_size, "nvrtcGetCUBINSize");
    SYM(cubin, "nvrtcGetCUBIN");
    SYM(destroy, "nvrtcDestroyProgram");
#undef SYM
    a.loaded = a.error_string && a.create && a.compile && a.log_size && a.log && a.cubin_size && a.cubin && a.destroy;
    int major = 0, minor = 0;
    if (a.loaded && runtime && (!a.version || a.version(&major, &minor) != NVRTC_SUCCESS || major != runtime / 1000))
        a.loaded = false;
    if (a.loaded)
        g_nvrtc = a;
    else
        dlclose(h);
}

nb_status nb__gpu_fuse_compile(const char *src, int arch, void **cubin, size_t *size)
{
    *cubin = NULL;
    *size = 0;
    if (pthread_once(&g_nvrtc_once, nvrtc_load) != 0 || !g_nvrtc.loaded)
        return nb__fail(NB_ERR_UNSUPPORTED, "fused kernel: no NVRTC of the CUDA runtime's major version could be "
                        "loaded, beside libcudart or on the loader's path");
    static const char *const names[] = {"nb_fuse_prelude.h", "stdint.h", "math.h", "formulas.h",
                                        "formulas_float.inc", "formulas_int.inc", "formulas_cmp.inc"};
    const char *const headers[] = {k_prelude_h, k_stdint_h, k_math_h, nb__gpu_fuse_formulas_h,
                                   nb__gpu_fuse_formulas_float_inc, nb__gpu_fuse_formulas_int_inc,
                                   nb__gpu_fuse_formulas_cmp_inc};
    nvrtcProgram prog;
    nvrtcResult r = g_nvrtc.create(&prog, src, "nb_fused.cu", 7, headers, names);
    if (r != NVRTC_SUCCESS)
        return nb__fail(NB_ERR_BACKEND, "fused kernel: nvrtcCreateProgram failed: %s", g_nvrtc.error_string(r));
    char opt_arch[48];
    snprintf(opt_arch, sizeof opt_arch, "--gpu-architecture=sm_%d", arch);
    /* the defaults nvcc compiles the kernels with: FMA contraction within a
     * formula, IEEE division and square root, no flush to zero */
    const char *opts[] = {opt_arch, "--std=c++17", "--fmad=true", "--prec-div=true", "--prec-sqrt=true",
                          "--ftz=false"};
    r = g_nvrtc.compile(prog, (int)(sizeof opts / sizeof *opts), opts);
    nb_status st = NB_OK;
    if (r != NVRTC_SUCCESS) {
        char log[1024] = "";
        size_t n = 0;
        if (g_nvrtc.log_size(prog, &n) == NVRTC_SUCCESS && n > 1) {
            char *full = malloc(n);
            if (full && g_nvrtc.log(prog, full) == NVRTC_SUCCESS)
                snprintf(log, sizeof log, "%s", full);
            free(full);
        }
        st = nb__fail(NB_ERR_BACKEND, "fused kernel: NVRTC failed for sm_%d (%s): %s", arch,
                      g_nvrtc.error_string(r), log);
    } else if (g_nvrtc.cubin_size(prog, size) != NVRTC_SUCCESS || *size == 0 || !(*cubin = malloc(*size)) ||
               g_nvrtc.cubin(prog, *cubin) != NVRTC_SUCCESS) {
        free(*cubin);
        *cubin = NULL;
        *size = 0;
        st = nb__fail(NB_ERR_BACKEND, "fused kernel: no CUBIN from NVRTC for sm_%d", arch);
    }
    g_nvrtc.destroy(&prog);
    return st;
}
