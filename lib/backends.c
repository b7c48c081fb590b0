/* The backends linked into this build: the one file that names them all. It
 * sits above every room (it is the build's list, like a linker script): the
 * core asks for the list and names no backend itself. */
#include "lib/core/backend.h"
#include "nb_config.h"
#include "ops/cpu/cpu_backend.h"
#if NB_HAVE_CUDA
#include "gpu/gpu_backend.h"
#endif

static const nb_backend *const builtin[] = {
    &nb__cpu_backend,
#if NB_HAVE_CUDA
    &nb__gpu_backend,
#endif
};

nb_backend_list nb__builtin_backends(void)
{
    nb_backend_list list = {(int)(sizeof builtin / sizeof builtin[0]), builtin};
    return list;
}
