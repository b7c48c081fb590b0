/* nabla internal — the fused optimizer updates a backend may provide, apart
 * from its kernel table: lib/optim calls them through dev->backend->optim.
 * param, grad and slots are contiguous views of one floating dtype. Each entry
 * returns NB_OK once the update is queued, or the error it recorded. */
#ifndef NB_OPTIM_KERNELS_H
#define NB_OPTIM_KERNELS_H

#include "core.h"

/* Hyper-parameters of a fused optimizer update. */
typedef struct nb_update_params {
    double lr, momentum, beta1, beta2, epsilon, weight_decay;
    bool nesterov;
    int64_t step; /* 1 on the first Adam step, for bias correction */
    /* NULL: param is updated in place. Otherwise the parameter's current values
     * are read from here (param's layout) and the result is written to param, so
     * a value still shared with a read costs no extra copy. */
    const void *source;
} nb_update_params;

typedef struct nb_optim_kernels {
    /* SGD; slot1 = the momentum buffer (NULL for plain SGD). */
    nb_status (*sgd_update)(nb_device *dev, const nb_view *param, const nb_view *grad,
                            const nb_view *slot1, const nb_update_params *p);
    /* Adam; slot1 = m, slot2 = v; weight_decay > 0 gives AdamW. */
    nb_status (*adam_update)(nb_device *dev, const nb_view *param, const nb_view *grad,
                             const nb_view *slot1, const nb_view *slot2, const nb_update_params *p);
} nb_optim_kernels;

#endif
