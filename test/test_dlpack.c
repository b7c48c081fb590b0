/* DLPack exchange: nb_to_dlpack describes a tensor as it is (views, slices,
 * broadcasts) over its own memory and its deleter releases it once;
 * nb_from_dlpack takes memory in without copying (strided, offset,
 * unversioned) and calls the producer's deleter once when the last tensor over
 * it goes, copies a read-only tensor, and refuses what it cannot take with the
 * deleter still called. With --gpu, the same on /gpu:0 (77 without a GPU). */
#include "test/check.h"

#include <pthread.h>
#include <stdint.h>

static bool gpu_mode;
static const char *dev_name = "/cpu:0";

/* A buffer some other library owns, and how often its deleter ran. */
typedef struct owned {
    DLManagedTensorVersioned m;
    DLManagedTensor legacy;
    int64_t shape[4], strides[4];
    int deleted;
} owned;

static void owned_delete(DLManagedTensorVersioned *m) { ((owned *)m->manager_ctx)->deleted++; }
static void owned_delete_legacy(DLManagedTensor *m) { ((owned *)m->manager_ctx)->deleted++; }

/* o describes data as a 2-d tensor of f64 with the given shape and strides
 * (NULL: row-major) and byte offset. */
static DLManagedTensorVersioned *describe(owned *o, double *data, int64_t rows, int64_t cols, const int64_t *strides,
                                          uint64_t byte_offset)
{
    memset(o, 0, sizeof *o);
    o->shape[0] = rows;
    o->shape[1] = cols;
    if (strides)
        memcpy(o->strides, strides, 2 * sizeof(int64_t));
    o->m = (DLManagedTensorVersioned){
        .version = {1, 0},
        .manager_ctx = o,
        .deleter = owned_delete,
        .dl_tensor = {.data = data,
                      .device = {kDLCPU, 0},
                      .ndim = 2,
                      .dtype = {kDLFloat, 64, 1},
                      .shape = o->shape,
                      .strides = strides ? o->strides : NULL,
                      .byte_offset = byte_offset},
    };
    return &o->m;
}

/* The tensor's values, read through the DLTensor's own description. */
static double dl_get(const DLTensor *dl, int64_t i, int64_t j)
{
    const char *base = (const char *)dl->data + dl->byte_offset;
    int64_t si = dl->strides ? dl->strides[0] : dl->shape[1], sj = dl->strides ? dl->strides[1] : 1;
    switch (dl->dtype.code) {
    case kDLFloat: return dl->dtype.bits == 64 ? ((const double *)base)[i * si + j * sj]
                                               : ((const float *)base)[i * si + j * sj];
    case kDLInt: return (double)((const int64_t *)base)[i * si + j * sj];
    default: return NAN;
    }
}

static void test_to_dlpack(void)
{
    nb_tensor *x = nb_reshape(nb_arange(NB_F32, 0, 12, 1), NB_SHAPE(3, 4));
    int64_t live = nb_live_tensors();
    DLManagedTensorVersioned *m = nb_to_dlpack(x);
    CHECK(m && m->version.major == 1 && m->flags == 0 && m->deleter);
    if (!m)
        return;
    DLTensor *dl = &m->dl_tensor;
    CHECK(dl->device.device_type == kDLCPU && dl->device.device_id == 0);
    CHECK(dl->ndim == 2 && dl->shape[0] == 3 && dl->shape[1] == 4 && dl->strides[0] == 4 && dl->strides[1] == 1);
    CHECK(dl->dtype.code == kDLFloat && dl->dtype.bits == 32 && dl->dtype.lanes == 1);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++)
            CHECK(dl_get(dl, i, j) == 4 * i + j);
    /* the reference it holds outlives the caller's */
    nb_tensor *y = nb_transpose(x, 0, 1);
    DLManagedTensorVersioned *mt = nb_to_dlpack(y); /* a transposed view: strides (1, 4) */
    CHECK(mt && mt->dl_tensor.strides[0] == 1 && mt->dl_tensor.strides[1] == 4 && dl_get(&mt->dl_tensor, 3, 2) == 11);
    nb_tensor *z = nb_slice(x, NB_SHAPE(1, 1), NB_SHAPE(2, 2)); /* a slice: element 0 is element 5 */
    DLManagedTensorVersioned *ms = nb_to_dlpack(z);
    CHECK(ms && ms->dl_tensor.byte_offset == 5 * sizeof(float) && dl_get(&ms->dl_tensor, 1, 1) == 10);
    nb_tensor *b = nb_broadcast_to(nb_reshape(nb_arange(NB_I64, 0, 3, 1), NB_SHAPE(3, 1)), NB_SHAPE(3, 5));
    DLManagedTensorVersioned *mb = nb_to_dlpack(b); /* broadcast: stride 0 */
    CHECK(mb && mb->dl_tensor.strides[1] == 0 && mb->dl_tensor.dtype.code == kDLInt && dl_get(&mb->dl_tensor, 2, 4) == 2);
    CHECK(nb_live_tensors() > live);
    m->deleter(m);
    if (mt)
        mt->deleter(mt);
    if (ms)
        ms->deleter(ms);
    if (mb)
        mb->deleter(mb);
    /* every dtype has its code */
    static const struct {
        nb_dtype d;
        uint8_t code, bits;
    } codes[] = {{NB_F64, kDLFloat, 64}, {NB_I32, kDLInt, 32}, {NB_BOOL, kDLBool, 8}, {NB_U8, kDLUInt, 8}};
    for (size_t k = 0; k < sizeof codes / sizeof codes[0]; k++) {
        DLManagedTensorVersioned *mc = nb_to_dlpack(nb_zeros(codes[k].d, NB_SHAPE(2)));
        CHECK(mc && mc->dl_tensor.dtype.code == codes[k].code && mc->dl_tensor.dtype.bits == codes[k].bits);
        if (mc)
            mc->deleter(mc);
    }
    CHECK(nb_to_dlpack(NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_to_dlpack");
}

/* A deleter run on another thread (receivers may let go anywhere). */
static void *delete_on_thread(void *arg)
{
    DLManagedTensorVersioned *m = arg;
    m->deleter(m);
    return NULL;
}

static void test_deleter_elsewhere(void)
{
    int64_t live = nb_live_tensors();
    nb_scope *s = nb_scope_begin();
    DLManagedTensorVersioned *m = nb_to_dlpack(nb_ones(NB_F64, NB_SHAPE(1000)));
    nb_scope_end(s);
    CHECK(m && nb_live_tensors() == live + 1); /* the scope's tensor lives on in m */
    if (!m)
        return;
    pthread_t th;
    int rc = pthread_create(&th, NULL, delete_on_thread, m);
    CHECK(rc == 0);
    if (rc == 0)
        pthread_join(th, NULL);
    else
        m->deleter(m);
    CHECK(nb_live_tensors() == live);
}

static void test_from_dlpack(void)
{
    double data[24];
    for (int i = 0; i < 24; i++)
        data[i] = i * 0.5;
    owned o;
    /* row-major, then read and computed with */
    nb_scope *outer = nb_scope_begin();
    nb_scope *s = nb_scope_begin();
    nb_tensor *t = nb_from_dlpack(describe(&o, data, 4, 6, NULL, 0));
    CHECK(t && nb_tensor_dim(t, 0) == 4 && nb_tensor_dim(t, 1) == 6 && nb_tensor_dtype(t) == NB_F64);
    CHECK(t && nb_tensor_get(t, 7) == 3.5 && nb_tensor_is_contiguous(t));
    nb_tensor *u = nb_mul_scalar(t, 2);
    CHECK(u && nb_tensor_get(u, 23) == 23);
    data[0] = 100; /* the same memory */
    CHECK(t && nb_tensor_get(t, 0) == 100);
    nb_tensor *v = nb_slice(t, NB_SHAPE(1, 0), NB_SHAPE(1, 6));
    nb_keep(v); /* a view keeps the memory past the scope */
    nb_scope_end(s);
    CHECK(o.deleted == 0);
    CHECK(nb_tensor_get(v, 0) == 3);
    nb_scope_end(outer);
    CHECK(o.deleted == 1);
    data[0] = 0;

    /* strided (every other column, rows of 6) at a byte offset (from column 1) */
    s = nb_scope_begin();
    t = nb_from_dlpack(describe(&o, data, 4, 3, (int64_t[]){6, 2}, sizeof(double)));
    CHECK(t && !nb_tensor_is_contiguous(t) && nb_tensor_get(t, 0) == 0.5 && nb_tensor_get(t, 4) == 4.5);
    nb_tensor *sum = nb_sum_all(t);
    double want = 0;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            want += data[6 * i + 1 + 2 * j];
    CHECK(sum && nb_tensor_item(sum) == want);
    nb_scope_end(s);
    CHECK(o.deleted == 1);

    /* a size-1 dim's stride steps nowhere, however large (no overflow in bytes) */
    s = nb_scope_begin();
    t = nb_from_dlpack(describe(&o, data, 1, 6, (int64_t[]){INT64_MAX, 1}, 0));
    CHECK(t && nb_tensor_is_contiguous(t) && nb_tensor_get(t, 5) == 2.5);
    nb_scope_end(s);
    CHECK(o.deleted == 1);
    o.deleted = 0;
    s = nb_scope_begin();
    t = nb_from_dlpack(describe(&o, data, 0, 6, (int64_t[]){INT64_MAX, INT64_MAX}, 0));
    CHECK(t && nb_tensor_numel(t) == 0);
    nb_scope_end(s);
    CHECK(o.deleted == 1);

    /* the unversioned form */
    s = nb_scope_begin();
    describe(&o, data, 2, 3, NULL, 0);
    o.legacy = (DLManagedTensor){.dl_tensor = o.m.dl_tensor, .manager_ctx = &o, .deleter = owned_delete_legacy};
    t = nb_from_dlpack_unversioned(&o.legacy);
    CHECK(t && nb_tensor_get(t, 5) == 2.5);
    nb_scope_end(s);
    CHECK(o.deleted == 1);

    /* read-only: copied, and let go at once */
    s = nb_scope_begin();
    DLManagedTensorVersioned *m = describe(&o, data, 2, 2, NULL, 0);
    m->flags = DLPACK_FLAG_BITMASK_READ_ONLY;
    t = nb_from_dlpack(m);
    CHECK(o.deleted == 1 && t && nb_tensor_get(t, 3) == 1.5);
    data[3] = -7;
    CHECK(t && nb_tensor_get(t, 3) == 1.5);
    data[3] = 1.5;
    nb_scope_end(s);

    /* ours, handed out and taken back: the same memory, one reference each */
    s = nb_scope_begin();
    nb_tensor *a = nb_reshape(nb_arange(NB_F64, 0, 6, 1), NB_SHAPE(2, 3));
    nb_tensor *back = nb_from_dlpack(nb_to_dlpack(nb_transpose(a, 0, 1)));
    CHECK(back && nb_tensor_dim(back, 0) == 3 && nb_tensor_get(back, 1) == 3);
    nb_scope_end(s);
}

/* Inside a captured step, taking in memory is refused (a replay would use
 * memory the producer took back), and the deleter is called. */
static nb_status import_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)n_in, (void)in, (void)n_out, (void)out;
    static double data[4] = {1, 2, 3, 4};
    return nb_from_dlpack(describe(user, data, 2, 2, NULL, 0)) ? NB_OK : nb_error();
}

static void test_refused_in_capture(void)
{
    owned o;
    memset(&o, 0, sizeof o);
    nb_graph *g = NULL;
    nb_status st = nb_graph_capture(dev_name, import_step, &o, 0, NULL, 0, NULL, &g);
    CHECK(st == NB_ERR_UNSUPPORTED && g == NULL && strstr(nb_error_message(), "nb_from_dlpack"));
    nb_error_clear();
    CHECKF(o.deleted == 1, "the deleter ran %d times", o.deleted);
}

/* Each refusal names the function and the problem, and calls the deleter. */
static void refuse(owned *o, nb_status code, const char *what)
{
    int before = o->deleted;
    CHECK(nb_from_dlpack(&o->m) == NULL);
    CHECK_ERROR(code, "nb_from_dlpack", what);
    CHECKF(o->deleted == before + 1, "the deleter ran %d times for '%s'", o->deleted - before, what);
}

static void test_refusals(void)
{
    double data[8] = {0};
    owned o;
    describe(&o, data, 2, 4, NULL, 0);
    o.m.version.major = 2;
    o.m.dl_tensor.shape = (int64_t *)1; /* not read */
    refuse(&o, NB_ERR_UNSUPPORTED, "version 2.0");
    describe(&o, data, 2, 4, NULL, 0);
    o.m.dl_tensor.dtype.lanes = 4;
    refuse(&o, NB_ERR_UNSUPPORTED, "4 lanes");
    describe(&o, data, 2, 4, NULL, 0);
    o.m.dl_tensor.dtype = (DLDataType){kDLComplex, 64, 1};
    refuse(&o, NB_ERR_DTYPE, "type code 5 with 64 bits");
    describe(&o, data, 2, 4, (int64_t[]){-4, 1}, 32);
    refuse(&o, NB_ERR_UNSUPPORTED, "strides");
    describe(&o, data, 2, 4, NULL, 3);
    refuse(&o, NB_ERR_UNSUPPORTED, "not aligned");
    describe(&o, data, -2, 4, NULL, 0);
    refuse(&o, NB_ERR_INVALID_ARGUMENT, "negative dim");
    describe(&o, data, 2, 4, NULL, 0);
    o.m.dl_tensor.ndim = 9;
    refuse(&o, NB_ERR_INVALID_ARGUMENT, "9 dims");
    describe(&o, NULL, 2, 4, NULL, 0);
    refuse(&o, NB_ERR_INVALID_ARGUMENT, "no data");
    describe(&o, data, 2, 4, (int64_t[]){INT64_MAX / 2, 1}, 0);
    refuse(&o, NB_ERR_UNSUPPORTED, "2^63");
    describe(&o, data, 2, 4, NULL, 0);
    o.m.dl_tensor.device = (DLDevice){kDLCUDA, 7};
    refuse(&o, NB_ERR_DEVICE, "kDLCUDA 7");
    describe(&o, data, 2, 4, NULL, 0);
    o.m.dl_tensor.device = (DLDevice){kDLMetal, 0};
    refuse(&o, NB_ERR_DEVICE, "kDLMetal 0");
    /* f16 and bf16: the CPU holds them (and converts them), computes in neither */
    uint16_t halves[4] = {0x3C00, 0xC000, 0x7C00, 0x0001}; /* 1, -2, inf, 2^-24 */
    describe(&o, (double *)(void *)halves, 2, 2, NULL, 0);
    o.m.dl_tensor.dtype = (DLDataType){kDLFloat, 16, 1};
    nb_scope *hs = nb_scope_begin();
    nb_tensor *h = nb_from_dlpack(&o.m);
    CHECK(h && nb_tensor_dtype(h) == NB_F16 && nb_tensor_get(h, 0) == 1 && nb_tensor_get(h, 1) == -2);
    nb_tensor *hf = h ? nb_cast(h, NB_F32) : NULL;
    CHECK(hf && isinf(nb_tensor_get(hf, 2)) && nb_tensor_get(hf, 3) == 0x1p-24);
    CHECK(h && nb_add(h, h) == NULL);
    CHECK_ERROR(NB_ERR_UNSUPPORTED, "add", "f16", "/cpu:0");
    nb_scope_end(hs);
    CHECK(o.deleted == 1);
    /* an empty tensor needs no data */
    describe(&o, NULL, 0, 4, NULL, 0);
    nb_scope *s = nb_scope_begin();
    nb_tensor *e = nb_from_dlpack(&o.m);
    CHECK(e && nb_tensor_numel(e) == 0);
    nb_scope_end(s);
    CHECK(o.deleted == 1);
    CHECK(nb_from_dlpack(NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_from_dlpack");
    CHECK(nb_from_dlpack_unversioned(NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_from_dlpack_unversioned");
}

/* The GPU: a tensor handed out names the card and holds its values; taken
 * back, the same memory on /gpu:0; f16 and bf16 have their codes. */
static void test_gpu(void)
{
    nb_device_push(dev_name);
    nb_tensor *x = nb_reshape(nb_arange(NB_F32, 0, 12, 1), NB_SHAPE(3, 4));
    nb_device_pop();
    DLManagedTensorVersioned *m = nb_to_dlpack(x);
    CHECK(m && m->dl_tensor.device.device_type == kDLCUDA && m->dl_tensor.device.device_id == 0);
    nb_tensor *back = m ? nb_from_dlpack(m) : NULL;
    CHECK(back && strcmp(nb_tensor_device(back), "/gpu:0") == 0 && nb_tensor_get(back, 11) == 11);
    nb_tensor *h = nb_cast(x, NB_BF16);
    DLManagedTensorVersioned *mh = nb_to_dlpack(h);
    CHECK(mh && mh->dl_tensor.dtype.code == kDLBfloat && mh->dl_tensor.dtype.bits == 16);
    nb_tensor *hb = mh ? nb_from_dlpack(mh) : NULL;
    CHECK(hb && nb_tensor_dtype(hb) == NB_BF16 && nb_tensor_get(hb, 5) == 5);
}

int main(int argc, char **argv)
{
    gpu_mode = argc > 1 && strcmp(argv[1], "--gpu") == 0;
    if (gpu_mode) {
        if (nb_device_count(NB_DEVICE_GPU) == 0)
            return check_no_gpu("test_dlpack --gpu");
        dev_name = "/gpu:0";
        RUN(test_gpu);
        return check_finish();
    }
    RUN(test_to_dlpack);
    RUN(test_deleter_elsewhere);
    RUN(test_from_dlpack);
    RUN(test_refusals);
    RUN(test_refused_in_capture);
    return check_finish();
}
