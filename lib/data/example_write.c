/* tf.train.Example writing: one Example of named features, serialized with the
 * encoder of pb_encode.h and written as one TFRecord record. The message layout
 * is the one example.c reads (see there). */
#include "../core/core.h"
#include "pb_encode.h"

#include <stdlib.h>
#include <string.h>

#define WHO "nb_example_write"

/* t's n values cast to dt and read to the host. Returns a malloc'd array of
 * elem-byte values (NULL when out of memory) that the caller frees, whatever
 * *st says: NB_OK, or the error of the allocation, the cast or the read. */
static void *read_as(const char *name, const nb_tensor *t, int64_t n, nb_dtype dt, size_t elem, nb_status *st)
{
    void *v = malloc(n > 0 ? (size_t)n * elem : 1);
    const nb_tensor *c = nb_cast(t, dt);
    *st = !v ? nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory for '%s'", WHO, name)
          : !c ? nb_error()
               : nb_tensor_read(c, v, (size_t)n * elem);
    return v;
}

/* The Feature message for t: its values read to the host and put in the list
 * its dtype calls for. */
static nb_status feature(const char *name, const nb_tensor *t, nb_pb *f)
{
    nb_dtype dt = nb_tensor_dtype(t);
    int64_t n = nb_tensor_numel(t);
    nb_pb list = {0};
    nb_status st = NB_OK;
    nb_scope *s = nb_scope_begin();
    if (!s)
        return nb_error();
    if (dt == NB_U8) { /* bytes_list of one value: the tensor's bytes */
        uint8_t *bytes = malloc(n > 0 ? (size_t)n : 1);
        st = bytes ? nb_tensor_read(t, bytes, (size_t)n)
                   : nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory for '%s'", WHO, name);
        if (st == NB_OK) {
            nb__pb_bytes(&list, 1, bytes, (size_t)n);
            nb__pb_message(f, 1, &list);
        }
        free(bytes);
    } else if (dt == NB_F32 || dt == NB_F64) { /* float_list, packed */
        float *v = read_as(name, t, n, NB_F32, sizeof *v, &st);
        if (st == NB_OK) {
            nb__pb_packed_floats(&list, 1, v, (size_t)n);
            nb__pb_message(f, 2, &list);
        }
        free(v);
    } else if (dt == NB_I32 || dt == NB_I64 || dt == NB_BOOL) { /* int64_list, packed */
        int64_t *v = read_as(name, t, n, NB_I64, sizeof *v, &st);
        if (st == NB_OK) {
            nb__pb_packed_varints(&list, 1, v, (size_t)n);
            nb__pb_message(f, 3, &list);
        }
        free(v);
    } else {
        st = nb__fail(NB_ERR_DTYPE, "%s: feature '%s' is %s; an Example holds floats, integers or bytes", WHO,
                      name, nb_dtype_name(dt));
    }
    nb__pb_free(&list);
    nb_scope_end(s);
    return st;
}

nb_status nb_example_write(struct nb_tfrecord_writer *w, int n, const char *const *names, nb_tensor *const *values)
{
    if (!w || !names || !values || n < 1)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s", WHO,
                        n < 1 ? "n must be at least 1" : "writer, names and values must not be NULL");
    for (int i = 0; i < n; i++)
        if (!names[i] || !names[i][0] || !values[i])
            return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: feature %d has %s", WHO, i,
                            !values[i] ? "no tensor" : "no name");
    nb_pb features = {0}, entry = {0}, f = {0}, example = {0};
    nb_status st = NB_OK;
    for (int i = 0; i < n && st == NB_OK; i++) {
        nb__pb_clear(&f);
        nb__pb_clear(&entry);
        st = feature(names[i], values[i], &f);
        nb__pb_bytes(&entry, 1, names[i], strlen(names[i])); /* map entry: key = 1, value = 2 */
        nb__pb_message(&entry, 2, &f);
        nb__pb_message(&features, 1, &entry);
    }
    if (st == NB_OK) {
        nb__pb_message(&example, 1, &features);
        st = example.failed ? nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", WHO)
                            : nb_tfrecord_write(w, example.data, example.size);
    }
    nb__pb_free(&features);
    nb__pb_free(&entry);
    nb__pb_free(&f);
    nb__pb_free(&example);
    return st;
}
