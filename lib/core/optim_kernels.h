/* nabla internal — the fused optimizer updates a backend may provide, apart
 * from its kernel table: lib/optim calls them through dev->backend->optim.
 * param, grad and slots are contiguous views of one floating dtype. Each entry
 * returns NB_OK once the update is queued, or the error it recorded. */
#ifndef NB_OPTIM_KERNELS_H
#define NB_OPTIM_KERNELS_H

#include "core.h"

#include <math.h>

/* Hyper-parameters of a fused optimizer update. */
typedef struct nb_update_params {
    double lr, momentum, beta1, beta2, epsilon, weight_decay;
    bool nesterov;
    int64_t step; /* 1 on the first Adam step, for bias correction */
    /* NULL: param is updated in place. Otherwise the parameter's current values
     * are read from here (param's layout) and the result is written to param, so
     * a value still shared with a read costs no extra copy. */
    const void *source;
    /* NULL: the numbers above. Otherwise the kernel reads them from these
     * NB_UPD_COUNT device doubles (nb_update_pack's layout), which a recorded
     * graph refreshes before each replay: the step and the learning rate
     * change between replays. */
    const double *device_params;
} nb_update_params;

/* The numbers a fused update reads, in device_params' order: the bias
 * corrections 1 - beta^step are worked out here, once, in double. */
enum { NB_UPD_LR, NB_UPD_MOMENTUM, NB_UPD_BETA1, NB_UPD_BETA2, NB_UPD_EPSILON, NB_UPD_WEIGHT_DECAY, NB_UPD_BC1,
       NB_UPD_BC2, NB_UPD_COUNT };

static inline void nb_update_pack(const nb_update_params *p, double out[NB_UPD_COUNT])
{
    const double t = (double)(p->step > 0 ? p->step : 1);
    out[NB_UPD_LR] = p->lr;
    out[NB_UPD_MOMENTUM] = p->momentum;
    out[NB_UPD_BETA1] = p->beta1;
    out[NB_UPD_BETA2] = p->beta2;
    out[NB_UPD_EPSILON] = p->epsilon;
    out[NB_UPD_WEIGHT_DECAY] = p->weight_decay;
    out[NB_UPD_BC1] = 1.0 - pow(p->beta1, t);
    out[NB_UPD_BC2] = 1.0 - pow(p->beta2, t);
}

typedef struct nb_optim_kernels {
    /* SGD; slot1 = the momentum buffer (NULL for plain SGD). */
    nb_status (*sgd_update)(nb_device *dev, const nb_view *param, const nb_view *grad,
                            const nb_view *slot1, const nb_update_params *p);
    /* Adam; slot1 = m, slot2 = v; weight_decay > 0 gives AdamW. */
    nb_status (*adam_update)(nb_device *dev, const nb_view *param, const nb_view *grad,
                             const nb_view *slot1, const nb_view *slot2, const nb_update_params *p);
} nb_optim_kernels;

#endif
