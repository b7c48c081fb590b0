/* nabla internal — the CPU backend as the build's list of backends sees it:
 * its one table. The kernels' shared pieces are in cpu_internal.h. */
#ifndef NB_CPU_BACKEND_H
#define NB_CPU_BACKEND_H

#include "lib/core/backend.h"

/* The CPU kernel table (cpu_backend.c): static storage, never freed; cannot
 * fail. */
extern const nb_backend nb__cpu_backend;

#endif
