/* cuDNN's graph API for the GPU backend: handle, descriptors, plan cache.
 *
 * Only the graph API of cudnn_graph is used (its header alone is included):
 * no entry point cuDNN 9 marks deprecated.
 * The device reaches cuDNN through a device-property descriptor made from
 * the handle (cuDNN 9.8 and later); a cuDNN older than 9.8 at run time has
 * no such descriptor, and there the handle is set on the operation graph and
 * the plan, the only way those versions take it.
 *
 * Choosing a plan: cuDNN's heuristics (mode A, then the fallback list) rank
 * engine configurations; the first one the caller's flags allow whose plan
 * finalizes with a workspace of at most an eighth of the card (1 GiB at
 * most) wins, else the allowed one needing the least workspace. Engines that
 * compile kernels at run time come only when no precompiled one serves: a
 * first call would otherwise pay seconds of compilation per shape. */
#include "gpu_cudnn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cuDNN's failure as an nb_status (NB_ERR_BACKEND) naming the call and device. */
static nb_status cudnn_fail(const nb_gpu_ctx *c, const char *call, cudnnStatus_t s)
{
    return nb__fail(NB_ERR_BACKEND, "%s failed on %s: %s", call, c->dev->name, cudnnGetErrorString(s));
}

/* Whether the cuDNN loaded at run time has the device-property descriptor. */
static bool has_deviceprop(void) { return cudnnGetVersion() >= 90800; }

nb_status nb__cudnn_handle(nb_gpu_ctx *c, cudnnHandle_t *out)
{
    cudnnHandle_t h = __atomic_load_n((cudnnHandle_t *)&c->cudnn, __ATOMIC_ACQUIRE);
    if (h) {
        *out = h;
        return NB_OK;
    }
    nb_status st = NB_OK;
    pthread_mutex_lock(&c->lock);
    if (!c->cudnn) {
        cudnnStatus_t s = cudnnCreate(&h);
        cudnnBackendDescriptor_t prop = NULL;
        if (s != CUDNN_STATUS_SUCCESS) {
            st = cudnn_fail(c, "cudnnCreate", s);
        } else if ((s = cudnnSetStream(h, c->stream)) != CUDNN_STATUS_SUCCESS) {
            st = cudnn_fail(c, "cudnnSetStream", s);
        } else if (has_deviceprop()) {
#if CUDNN_VERSION >= 90800
            /* the device's properties, for the heuristics and the plans; a
             * cuDNN that will not make them is reached through the handle */
            if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &prop) != CUDNN_STATUS_SUCCESS)
                prop = NULL;
            else if (cudnnBackendSetAttribute(prop, CUDNN_ATTR_DEVICEPROP_HANDLE, CUDNN_TYPE_HANDLE, 1, &h) !=
                         CUDNN_STATUS_SUCCESS ||
                     cudnnBackendFinalize(prop) != CUDNN_STATUS_SUCCESS) {
                cudnnBackendDestroyDescriptor(prop);
                prop = NULL;
            }
            if (!prop)
                nb__log(NB_LOG_DEBUG, "%s: cuDNN's device-property descriptor failed; using the handle",
                        c->dev->name);
#endif
        }
        if (st) {
            if (h)
                cudnnDestroy(h);
        } else {
            c->cudnn_prop = prop;
            __atomic_store_n((cudnnHandle_t *)&c->cudnn, h, __ATOMIC_RELEASE);
        }
    }
    h = c->cudnn;
    pthread_mutex_unlock(&c->lock);
    *out = h;
    return st;
}

cudnnDataType_t nb__cudnn_dtype(nb_dtype dt)
{
    switch (dt) {
    case NB_F64: return CUDNN_DATA_DOUBLE;
    case NB_F16: return CUDNN_DATA_HALF;
    case NB_BF16: return CUDNN_DATA_BFLOAT16;
    default: return CUDNN_DATA_FLOAT;
    }
}

void nb__cudnn_dims(bool nchw, int64_t n, int64_t c, int64_t h, int64_t w, int64_t dims[4], int64_t st[4])
{
    dims[0] = n, dims[1] = c, dims[2] = h, dims[3] = w;
    if (nchw) {
        st[3] = 1, st[2] = w, st[1] = h * w, st[0] = c * h * w;
    } else {
        st[1] = 1, st[3] = c, st[2] = w * c, st[0] = h * w * c;
    }
}

int64_t nb__cudnn_alignment(size_t elem_size, int n, void *const *ptrs)
{
    uintptr_t bits = 16;
    for (int i = 0; i < n; i++)
        bits |= (uintptr_t)ptrs[i];
    int64_t a = (int64_t)(bits & (~bits + 1)); /* the lowest set bit, at most 16 */
    return a < (int64_t)elem_size ? (int64_t)elem_size : a;
}

/* Why this thread's last plan could not be made: a build step's refusal is
 * not an error of its own (the caller may have another way), so it is noted
 * here and kept with the cached miss. */
static _Thread_local char t_why[NB_CUDNN_WHY_MAX];

static nb_status refused(const char *what, cudnnStatus_t s)
{
    snprintf(t_why, sizeof t_why, "%s: %s", what, cudnnGetErrorString(s));
    return NB_ERR_UNSUPPORTED;
}

nb_status nb__cudnn_make(const nb_gpu_ctx *c, nb_cudnn_descs *keep, cudnnBackendDescriptorType_t type,
                         cudnnBackendDescriptor_t *out)
{
    (void)c;
    *out = NULL;
    if (keep->n >= NB_CUDNN_MAX_DESCS) {
        snprintf(t_why, sizeof t_why, "more than %d descriptors in one plan", NB_CUDNN_MAX_DESCS);
        return NB_ERR_UNSUPPORTED;
    }
    cudnnStatus_t s = cudnnBackendCreateDescriptor(type, out);
    if (s != CUDNN_STATUS_SUCCESS) {
        *out = NULL;
        return refused("cudnnBackendCreateDescriptor", s);
    }
    keep->d[keep->n++] = *out;
    return NB_OK;
}

nb_status nb__cudnn_set(const nb_gpu_ctx *c, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                        cudnnBackendAttributeType_t type, int64_t count, const void *values)
{
    (void)c;
    cudnnStatus_t s = cudnnBackendSetAttribute(d, name, type, count, values);
    if (s == CUDNN_STATUS_SUCCESS)
        return NB_OK;
    char what[64];
    snprintf(what, sizeof what, "setting attribute %d", (int)name);
    return refused(what, s);
}

nb_status nb__cudnn_finalize(const nb_gpu_ctx *c, cudnnBackendDescriptor_t d, const char *what)
{
    (void)c;
    cudnnStatus_t s = cudnnBackendFinalize(d);
    return s == CUDNN_STATUS_SUCCESS ? NB_OK : refused(what, s);
}

nb_status nb__cudnn_tensor(const nb_gpu_ctx *c, nb_cudnn_descs *keep, int64_t uid, cudnnDataType_t dt, int nd,
                           const int64_t *dims, const int64_t *strides, int64_t alignment,
                           cudnnBackendDescriptor_t *out)
{
    nb_status st = nb__cudnn_make(c, keep, CUDNN_BACKEND_TENSOR_DESCRIPTOR, out);
    if (!st)
        st = nb__cudnn_set(c, *out, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    if (!st)
        st = nb__cudnn_set(c, *out, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    if (!st)
        st = nb__cudnn_set(c, *out, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, nd, dims);
    if (!st)
        st = nb__cudnn_set(c, *out, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, nd, strides);
    if (!st)
        st = nb__cudnn_set(c, *out, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    if (!st)
        st = nb__cudnn_finalize(c, *out, "a tensor descriptor");
    return st;
}

/* ---- the plan cache ---- */

/* Plans are kept per logical device: two devices on one card run on their
 * own handles and streams, possibly from two threads at once, and a plan is
 * not shared between concurrent executions. */
typedef struct plan_entry {
    struct plan_entry *next;
    const nb_gpu_ctx *owner;
    int nkey;
    int64_t *key;
    nb_cudnn_plan plan; /* plan.plan NULL: cuDNN has no engine for it */
    nb_cudnn_descs keep;
    char why[NB_CUDNN_WHY_MAX]; /* with no plan, why not */
} plan_entry;

#define PLAN_BUCKETS 128
static plan_entry *g_plans[PLAN_BUCKETS];
static pthread_mutex_t g_plan_lock = PTHREAD_MUTEX_INITIALIZER;

static unsigned plan_hash(const nb_gpu_ctx *owner, const int64_t *key, int nkey)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)(uintptr_t)owner;
    for (int i = 0; i < nkey; i++)
        h = (h ^ (uint64_t)key[i]) * 1099511628211ull;
    return (unsigned)(h % PLAN_BUCKETS);
}

/* Under g_plan_lock. */
static plan_entry *plan_find(unsigned b, const nb_gpu_ctx *owner, const int64_t *key, int nkey)
{
    for (plan_entry *e = g_plans[b]; e; e = e->next)
        if (e->owner == owner && e->nkey == nkey && memcmp(e->key, key, (size_t)nkey * sizeof *key) == 0)
            return e;
    return NULL;
}

static void descs_destroy(nb_cudnn_descs *keep)
{
    /* later descriptors refer to earlier ones: destroy in reverse */
    while (keep->n > 0)
        cudnnBackendDestroyDescriptor(keep->d[--keep->n]);
}

/* Whether the flags allow the engine of cfg; never fails (an engine whose
 * notes cannot be read is refused). *jit: it compiles kernels at run time. */
static bool engine_allowed(cudnnBackendDescriptor_t cfg, unsigned flags, bool *jit)
{
    cudnnBackendDescriptor_t eng = NULL;
    bool ok = false;
    int64_t n = 0;
    *jit = false;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) != CUDNN_STATUS_SUCCESS)
        return false;
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng) !=
            CUDNN_STATUS_SUCCESS ||
        n != 1)
        goto done;
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                 CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes) != CUDNN_STATUS_SUCCESS)
        goto done;
    for (int64_t i = 0; i < n && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; i++) {
        if (notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE && !(flags & NB_CUDNN_ALLOW_TENSOR_CORE))
            goto done;
        if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC && (flags & NB_CUDNN_DETERMINISTIC))
            goto done;
        if ((notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS ||
             notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION) &&
            (flags & NB_CUDNN_EXACT_INPUTS))
            goto done;
        if (notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION && (flags & NB_CUDNN_FLOAT_REDUCTION))
            goto done;
    }
    cudnnBackendBehaviorNote_t behaviour[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
    if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                 CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n, behaviour) == CUDNN_STATUS_SUCCESS)
        for (int64_t i = 0; i < n && i < CUDNN_BEHAVIOR_NOTE_TYPE_COUNT; i++)
            if (behaviour[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION)
                *jit = true;
    ok = true;
done:
    cudnnBackendDestroyDescriptor(eng);
    return ok;
}

/* Gives the heuristics the device: its device-property descriptor, or,
 * before cuDNN 9.8, nothing (the graph carries the handle). */
static cudnnStatus_t heur_device(const nb_gpu_ctx *c, cudnnBackendDescriptor_t heur)
{
#if CUDNN_VERSION >= 90800
    if (c->cudnn_prop) {
        cudnnBackendDescriptor_t prop = c->cudnn_prop;
        return cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                        &prop);
    }
#endif
    (void)c, (void)heur;
    return CUDNN_STATUS_SUCCESS;
}

/* An execution plan of cfg, finalized, with its workspace size; NULL when it
 * does not finalize. Before cuDNN 9.8 a plan takes the handle (its only way);
 * after, it is tried as cuDNN's own front end makes it (from the engine
 * configuration alone), then with the device-property descriptor. */
static cudnnBackendDescriptor_t make_plan(const nb_gpu_ctx *c, cudnnBackendDescriptor_t cfg, cudnnHandle_t h,
                                          int64_t *ws, cudnnStatus_t *why)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        cudnnBackendDescriptor_t plan = NULL;
        int64_t n = 0;
        cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
        if (s != CUDNN_STATUS_SUCCESS) {
            *why = s;
            return NULL;
        }
        s = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                     &cfg);
        if (s == CUDNN_STATUS_SUCCESS && !c->cudnn_prop)
            s = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
#if CUDNN_VERSION >= 90800
        if (s == CUDNN_STATUS_SUCCESS && c->cudnn_prop && attempt == 1) {
            cudnnBackendDescriptor_t prop = c->cudnn_prop;
            s = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                         1, &prop);
        }
#endif
        if (s == CUDNN_STATUS_SUCCESS)
            s = cudnnBackendFinalize(plan);
        if (s == CUDNN_STATUS_SUCCESS)
            s = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, ws);
        if (s == CUDNN_STATUS_SUCCESS && *ws >= 0)
            return plan;
        cudnnBackendDestroyDescriptor(plan);
        *why = s;
        if (!c->cudnn_prop)
            break;
    }
    return NULL;
}

/* Builds the problem, runs the heuristics and finalizes the chosen plan into
 * e; with no plan, e->plan.plan stays NULL and e->why says why. Fails (the
 * error recorded) only when cuDNN cannot be started on the device. */
static nb_status plan_build_with(nb_gpu_ctx *c, cudnnHandle_t h, unsigned flags, nb_cudnn_build_fn build,
                                 const void *arg, plan_entry *e)
{
    cudnnBackendDescriptor_t ops[8], graph;
    int nops = 0;
    t_why[0] = 0;
    if (build(c, &e->keep, ops, &nops, arg) ||
        nb__cudnn_make(c, &e->keep, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &graph) ||
        nb__cudnn_set(c, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, nops, ops) ||
        /* before cuDNN 9.8 the graph takes the handle (since deprecated) */
        (!c->cudnn_prop &&
         nb__cudnn_set(c, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h)) ||
        nb__cudnn_finalize(c, graph, "the operation graph")) {
        snprintf(e->why, sizeof e->why, "%s", t_why[0] ? t_why : "the problem was not described");
        return NB_OK; /* no plan, cached as such */
    }

    size_t limit = c->phys->total_memory / 8;
    if (limit > ((size_t)1 << 30) || limit == 0)
        limit = (size_t)1 << 30;
    cudnnBackendDescriptor_t best = NULL, best_cfg = NULL;
    int64_t best_ws = 0;
    bool best_fits = false;
    int offered = 0, refused_by_flags = 0, unfinalized = 0;
    cudnnStatus_t heur_status = CUDNN_STATUS_SUCCESS, plan_status = CUDNN_STATUS_SUCCESS;
    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    /* round 1 again without NB_CUDNN_FLOAT_REDUCTION when round 0 found no
     * plan; pass 0: precompiled engines only; pass 1 also those compiled at
     * run time */
    for (int round = 0; round < 2 && !best; round++) {
        if (round == 1 && !(flags & NB_CUDNN_FLOAT_REDUCTION))
            break;
        if (round == 1)
            flags &= ~(unsigned)NB_CUDNN_FLOAT_REDUCTION;
        for (int pass = 0; pass < 2 && !best_fits; pass++) {
            for (int m = 0; m < 2 && !best_fits; m++) {
                cudnnBackendDescriptor_t heur = NULL, cfgs[64] = {0};
                int64_t count = 0;
                cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur);
                if (s == CUDNN_STATUS_SUCCESS)
                    s = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
                if (s == CUDNN_STATUS_SUCCESS)
                    s = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m]);
                if (s == CUDNN_STATUS_SUCCESS)
                    s = heur_device(c, heur);
                if (s == CUDNN_STATUS_SUCCESS)
                    s = cudnnBackendFinalize(heur);
                if (s == CUDNN_STATUS_SUCCESS)
                    s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                                 &count, NULL);
                if (count > 64)
                    count = 64;
                int64_t made = 0;
                while (s == CUDNN_STATUS_SUCCESS && made < count &&
                       (s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[made])) ==
                           CUDNN_STATUS_SUCCESS)
                    made++;
                int64_t got = 0;
                if (s == CUDNN_STATUS_SUCCESS && made > 0)
                    s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                                 made, &got, cfgs);
                if (s != CUDNN_STATUS_SUCCESS)
                    heur_status = s;
                for (int64_t i = 0; s == CUDNN_STATUS_SUCCESS && i < got && i < made && !best_fits; i++) {
                    bool jit;
                    if (!engine_allowed(cfgs[i], flags, &jit)) {
                        refused_by_flags += pass == 0;
                        continue;
                    }
                    if (jit != (pass == 1))
                        continue;
                    offered++;
                    int64_t ws = 0;
                    cudnnBackendDescriptor_t plan = make_plan(c, cfgs[i], h, &ws, &plan_status);
                    if (!plan) {
                        unfinalized++;
                        continue;
                    }
                    bool fits = (uint64_t)ws <= limit;
                    if (!best || fits || ws < best_ws) {
                        if (best) {
                            cudnnBackendDestroyDescriptor(best);
                            cudnnBackendDestroyDescriptor(best_cfg);
                        }
                        /* the configuration the plan was made from stays with it */
                        best = plan, best_cfg = cfgs[i], best_ws = ws, best_fits = fits;
                        cfgs[i] = NULL;
                    } else {
                        cudnnBackendDestroyDescriptor(plan);
                    }
                }
                for (int64_t i = 0; i < made; i++)
                    if (cfgs[i])
                        cudnnBackendDestroyDescriptor(cfgs[i]);
                if (heur)
                    cudnnBackendDestroyDescriptor(heur);
            }
        }
    }
    if (best && e->keep.n == NB_CUDNN_MAX_DESCS) { /* no room to keep its configuration */
        cudnnBackendDestroyDescriptor(best);
        cudnnBackendDestroyDescriptor(best_cfg);
        best = NULL;
    } else if (best) {
        e->keep.d[e->keep.n++] = best_cfg;
    }
    if (!best)
        snprintf(e->why, sizeof e->why,
                 "of the heuristics' engine configurations, %d refused by the numerics switches, %d offered, %d "
                 "did not finalize%s%s%s%s",
                 refused_by_flags, offered, unfinalized, unfinalized ? " (last: " : "",
                 unfinalized ? cudnnGetErrorString(plan_status) : "", unfinalized ? ")" : "",
                 heur_status ? "; the heuristics failed" : "");
    e->plan.plan = best;
    e->plan.workspace = best_ws;
    return NB_OK;
}

/* plan_build_with c's handle, which no other thread uses meanwhile. */
static nb_status plan_build(nb_gpu_ctx *c, unsigned flags, nb_cudnn_build_fn build, const void *arg, plan_entry *e)
{
    cudnnHandle_t h;
    nb_status st = nb__cudnn_handle(c, &h);
    if (st)
        return st;
    pthread_mutex_lock(&c->cudnn_lock);
    st = plan_build_with(c, h, flags, build, arg, e);
    pthread_mutex_unlock(&c->cudnn_lock);
    return st;
}


nb_status nb__cudnn_plan_for(nb_gpu_ctx *c, const char *op, const int64_t *key, int nkey, unsigned flags,
                             nb_cudnn_build_fn build, const void *arg, const nb_cudnn_plan **out, const char **why)
{
    *out = NULL;
    if (why)
        *why = NULL;
    const unsigned b = plan_hash(c, key, nkey);
    pthread_mutex_lock(&g_plan_lock);
    plan_entry *e = plan_find(b, c, key, nkey);
    pthread_mutex_unlock(&g_plan_lock);
    if (!e) {
        plan_entry *ne = calloc(1, sizeof *ne);
        int64_t *k = malloc((size_t)nkey * sizeof *k);
        if (!ne || !k) {
            free(ne);
            free(k);
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
        }
        memcpy(k, key, (size_t)nkey * sizeof *k);
        ne->key = k, ne->nkey = nkey, ne->owner = c;
        nb_status st = plan_build(c, flags, build, arg, ne);
        if (st) {
            if (ne->plan.plan)
                cudnnBackendDestroyDescriptor(ne->plan.plan);
            descs_destroy(&ne->keep);
            free(k);
            free(ne);
            return st;
        }
        pthread_mutex_lock(&g_plan_lock);
        e = plan_find(b, c, key, nkey);
        if (!e) {
            ne->next = g_plans[b];
            g_plans[b] = e = ne;
            ne = NULL;
        }
        pthread_mutex_unlock(&g_plan_lock);
        if (ne) { /* another thread cached it first */
            if (ne->plan.plan)
                cudnnBackendDestroyDescriptor(ne->plan.plan);
            descs_destroy(&ne->keep);
            free(k);
            free(ne);
        }
    }
    if (!e->plan.plan) {
        if (why)
            *why = e->why;
        return NB_ERR_UNSUPPORTED; /* recorded by the caller, if it has no other way */
    }
    *out = &e->plan;
    return NB_OK;
}

static nb_status run_plan(nb_gpu_ctx *c, const char *op, const nb_cudnn_plan *plan, int n, const int64_t *uids,
                          void *const *ptrs, bool refusable)
{
    cudnnHandle_t h;
    nb_status st = nb__cudnn_handle(c, &h);
    if (st)
        return st;
    void *ws = NULL;
    if (plan->workspace > 0 && !(ws = nb__gpu_malloc(c, (size_t)plan->workspace)))
        return NB_ERR_OUT_OF_MEMORY;
    cudnnBackendDescriptor_t vp = NULL;
    cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendFinalize(vp);
    bool executed = false;
    if (s == CUDNN_STATUS_SUCCESS) {
        pthread_mutex_lock(&c->cudnn_lock); /* it only queues the kernels */
        s = cudnnBackendExecute(h, plan->plan, vp);
        pthread_mutex_unlock(&c->cudnn_lock);
        executed = true;
    }
    const cudnnStatus_t category = (cudnnStatus_t)CUDNN_STATUS_CATEGORY(s);
    if (s != CUDNN_STATUS_SUCCESS && refusable && executed &&
        (category == CUDNN_STATUS_BAD_PARAM || category == CUDNN_STATUS_NOT_SUPPORTED)) {
        (void)cudaGetLastError(); /* nothing was launched: keep it from a later check */
        snprintf(t_why, sizeof t_why, "execution refused: %s", cudnnGetErrorString(s));
        st = NB_ERR_UNSUPPORTED;
    } else if (s != CUDNN_STATUS_SUCCESS) {
        st = nb__fail(NB_ERR_BACKEND, "%s: cuDNN's plan failed on %s: %s", op, c->dev->name, cudnnGetErrorString(s));
    }
    if (vp)
        cudnnBackendDestroyDescriptor(vp);
    if (ws)
        nb__gpu_free(c, ws); /* stream-ordered: the queued plan still owns it */
    return st;
}

nb_status nb__cudnn_run(nb_gpu_ctx *c, const char *op, const nb_cudnn_plan *plan, int n, const int64_t *uids,
                        void *const *ptrs)
{
    return run_plan(c, op, plan, n, uids, ptrs, false);
}

nb_status nb__cudnn_run_or_refuse(nb_gpu_ctx *c, const char *op, const nb_cudnn_plan *plan, int n,
                                  const int64_t *uids, void *const *ptrs)
{
    return run_plan(c, op, plan, n, uids, ptrs, true);
}
