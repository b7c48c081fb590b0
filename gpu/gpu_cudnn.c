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

#include <stdlib.h>
#include <string.h>

nb_status nb__cudnn_fail(const nb_gpu_ctx *c, const char *call, cudnnStatus_t s)
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
            st = nb__cudnn_fail(c, "cudnnCreate", s);
        } else if ((s = cudnnSetStream(h, c->stream)) != CUDNN_STATUS_SUCCESS) {
            st = nb__cudnn_fail(c, "cudnnSetStream", s);
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

int64_t nb__cudnn_alignment(size_t elem_size, int n, void *const *ptrs)
{
    uintptr_t bits = 16;
    for (int i = 0; i < n; i++)
        bits |= (uintptr_t)ptrs[i];
    int64_t a = (int64_t)(bits & (~bits + 1)); /* the lowest set bit, at most 16 */
    return a < (int64_t)elem_size ? (int64_t)elem_size : a;
}

nb_status nb__cudnn_make(const nb_gpu_ctx *c, nb_cudnn_descs *keep, cudnnBackendDescriptorType_t type,
                         cudnnBackendDescriptor_t *out)
{
    *out = NULL;
    if (keep->n >= NB_CUDNN_MAX_DESCS)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "cuDNN graph on %s: more than %d descriptors", c->dev->name,
                        NB_CUDNN_MAX_DESCS);
    cudnnStatus_t s = cudnnBackendCreateDescriptor(type, out);
    if (s != CUDNN_STATUS_SUCCESS) {
        *out = NULL;
        return nb__cudnn_fail(c, "cudnnBackendCreateDescriptor", s);
    }
    keep->d[keep->n++] = *out;
    return NB_OK;
}

nb_status nb__cudnn_set(const nb_gpu_ctx *c, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                        cudnnBackendAttributeType_t type, int64_t count, const void *values)
{
    cudnnStatus_t s = cudnnBackendSetAttribute(d, name, type, count, values);
    if (s == CUDNN_STATUS_SUCCESS)
        return NB_OK;
    return nb__fail(NB_ERR_BACKEND, "cudnnBackendSetAttribute (attribute %d) failed on %s: %s", (int)name,
                    c->dev->name, cudnnGetErrorString(s));
}

nb_status nb__cudnn_finalize(const nb_gpu_ctx *c, cudnnBackendDescriptor_t d, const char *what)
{
    cudnnStatus_t s = cudnnBackendFinalize(d);
    if (s == CUDNN_STATUS_SUCCESS)
        return NB_OK;
    /* a problem no engine takes is not an error yet: the caller may fall back */
    if (s == CUDNN_STATUS_NOT_SUPPORTED || (s >= 3000 && s < 4000))
        return NB_ERR_UNSUPPORTED;
    return nb__fail(NB_ERR_BACKEND, "cuDNN refused %s on %s: %s", what, c->dev->name, cudnnGetErrorString(s));
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

/* Sets the device on a heuristics or plan descriptor: its device-property
 * descriptor, or, for a cuDNN before 9.8, the handle (a plan's only way there). */
static cudnnStatus_t set_device(const nb_gpu_ctx *c, cudnnBackendDescriptor_t d, bool is_plan, cudnnHandle_t h)
{
#if CUDNN_VERSION >= 90800
    if (c->cudnn_prop) {
        cudnnBackendDescriptor_t prop = c->cudnn_prop;
        return cudnnBackendSetAttribute(d, is_plan ? CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP
                                                   : CUDNN_ATTR_ENGINEHEUR_DEVICEPROP,
                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &prop);
    }
#endif
    if (!is_plan)
        return CUDNN_STATUS_SUCCESS; /* the graph carries the handle */
    return cudnnBackendSetAttribute(d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
}

/* Builds the problem, runs the heuristics and finalizes the chosen plan into
 * e (e->plan.plan stays NULL when no engine takes it). */
static nb_status plan_build(nb_gpu_ctx *c, unsigned flags, nb_cudnn_build_fn build, const void *arg,
                            plan_entry *e)
{
    cudnnHandle_t h;
    nb_status st = nb__cudnn_handle(c, &h);
    if (st)
        return st;
    cudnnBackendDescriptor_t ops[8];
    int nops = 0;
    if ((st = build(c, &e->keep, ops, &nops, arg)))
        return st == NB_ERR_UNSUPPORTED ? NB_OK : st; /* no plan, cached as such */
    cudnnBackendDescriptor_t graph;
    if ((st = nb__cudnn_make(c, &e->keep, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &graph)) ||
        (st = nb__cudnn_set(c, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, nops, ops)))
        return st;
    if (!c->cudnn_prop) {
        /* before cuDNN 9.8 (since deprecated) */
        if ((st = nb__cudnn_set(c, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h)))
            return st;
    }
    if ((st = nb__cudnn_finalize(c, graph, "the operation graph")))
        return st == NB_ERR_UNSUPPORTED ? NB_OK : st;

    size_t limit = c->phys->total_memory / 8;
    if (limit > ((size_t)1 << 30) || limit == 0)
        limit = (size_t)1 << 30;
    cudnnBackendDescriptor_t best = NULL, best_cfg = NULL;
    int64_t best_ws = 0;
    bool best_fits = false;
    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    /* pass 0: precompiled engines only; pass 1 also those compiled at run time */
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
                s = set_device(c, heur, false, h);
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
            for (int64_t i = 0; s == CUDNN_STATUS_SUCCESS && i < got && i < made && !best_fits; i++) {
                bool jit;
                if (!engine_allowed(cfgs[i], flags, &jit) || jit != (pass == 1))
                    continue;
                cudnnBackendDescriptor_t plan = NULL;
                int64_t ws = 0, n = 0;
                if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) !=
                    CUDNN_STATUS_SUCCESS)
                    continue;
                bool ok = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]) ==
                              CUDNN_STATUS_SUCCESS &&
                          set_device(c, plan, true, h) == CUDNN_STATUS_SUCCESS &&
                          cudnnBackendFinalize(plan) == CUDNN_STATUS_SUCCESS &&
                          cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                                   1, &n, &ws) == CUDNN_STATUS_SUCCESS &&
                          ws >= 0;
                if (!ok) {
                    cudnnBackendDestroyDescriptor(plan);
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
    if (best && e->keep.n == NB_CUDNN_MAX_DESCS) { /* no room to keep its configuration */
        cudnnBackendDestroyDescriptor(best);
        cudnnBackendDestroyDescriptor(best_cfg);
        best = NULL;
    } else if (best) {
        e->keep.d[e->keep.n++] = best_cfg;
    }
    e->plan.plan = best;
    e->plan.workspace = best_ws;
    return NB_OK;
}

nb_status nb__cudnn_plan_for(nb_gpu_ctx *c, const char *op, const int64_t *key, int nkey, unsigned flags,
                             nb_cudnn_build_fn build, const void *arg, const nb_cudnn_plan **out)
{
    *out = NULL;
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
    if (!e->plan.plan)
        return NB_ERR_UNSUPPORTED; /* recorded by the caller, if it has no other way */
    *out = &e->plan;
    return NB_OK;
}

nb_status nb__cudnn_run(nb_gpu_ctx *c, const char *op, const nb_cudnn_plan *plan, int n, const int64_t *uids,
                        void *const *ptrs)
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
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendExecute(h, plan->plan, vp);
    if (s != CUDNN_STATUS_SUCCESS)
        st = nb__fail(NB_ERR_BACKEND, "%s: cuDNN's plan failed on %s: %s", op, c->dev->name, cudnnGetErrorString(s));
    if (vp)
        cudnnBackendDestroyDescriptor(vp);
    if (ws)
        nb__gpu_free(c, ws); /* stream-ordered: the queued plan still owns it */
    return st;
}
