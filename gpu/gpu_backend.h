/* nabla internal — the CUDA backend as the build's list of backends sees it:
 * its one table, declared in plain C (no CUDA header), so lib/backends.c can
 * name it. The backend's shared pieces are in gpu_internal.h. */
#ifndef NB_GPU_BACKEND_H
#define NB_GPU_BACKEND_H

#include "lib/core/backend.h"

/* The GPU kernel table (gpu_backend.c, built only with CUDA): static storage,
 * never freed; cannot fail. */
extern const nb_backend nb__gpu_backend;

#endif
