/* nabla — what the datasets need of the IDX reader beyond nabla/data.h: an
 * IDX file's header alone, so that a dataset can know its rows before (and
 * without) reading them. */
#ifndef NB_DATA_IDX_H
#define NB_DATA_IDX_H

#include "lib/core/core.h"

typedef struct nb_idx_header {
    nb_dtype dtype;
    int ndim;
    int64_t shape[NB_MAX_DIMS];
} nb_idx_header;

/* Reads and checks the header of the IDX file at path (magic, element type,
 * dims, their size) into *header without reading the data. Returns NB_OK, or
 * the error nb_idx_read would give for the header, its message starting with
 * who. */
nb_status nb__idx_read_header(const char *who, const char *path, nb_idx_header *header);

#endif
