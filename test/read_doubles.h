/* One helper shared by the test harness (check.h) and the convolution search
 * (conv_search.h, which the fuzz target includes without the harness). */
#ifndef NB_TEST_READ_DOUBLES_H
#define NB_TEST_READ_DOUBLES_H

#include <nabla/nabla.h>
#include <stdlib.h>

/* A tensor of any floating dtype on any device as a malloc'd array of doubles
 * on the host (caller frees), read at once; NULL (the error recorded) when t
 * is NULL or cannot be read. Cast on its own device first: the CPU holds no
 * f16 or bf16. */
static inline double *check_read_doubles(const nb_tensor *t)
{
    nb_tensor *c = t ? nb_to_device(nb_cast(t, NB_F64), "/cpu:0") : NULL;
    if (!c)
        return NULL;
    int64_t n = nb_tensor_numel(c);
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (v && nb_tensor_read(c, v, sizeof(double) * (size_t)n) != NB_OK) {
        free(v);
        return NULL;
    }
    return v;
}

#endif
