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
    /* NULL: the update runs. Otherwise one device double, read when the
     * kernel runs: where it is not 0 (a loss scaler's check found a gradient
     * that is not finite) the update changes no slot, and param gets the
     * source's values (nothing moves when in place). */
    const double *skip;
    /* NULL: the step above (or device_params' bias corrections). Otherwise
     * one device double holding the count of updates applied before this one
     * (a loss scaler's captured step keeps it on the device): the step is
     * it + 1, and the kernel works out the bias corrections from it with
     * nb_update_bias, as nb_update_pack does from step. */
    const double *device_count;
} nb_update_params;

#ifdef __CUDACC__
#define NB_UPD_FN static inline __host__ __device__
#else
#define NB_UPD_FN static inline
#endif

/* a * b rounded once: nvcc may not fuse it into an add that follows, so the
 * host and a device give the same bits. */
NB_UPD_FN double nb_update_mul(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

/* 1 - beta^step (step < 1 counts as 1), the power by repeated squaring: the
 * same bits on the host and on a device, where libm's pow and CUDA's may
 * differ in the last one. */
NB_UPD_FN double nb_update_bias(double beta, int64_t step)
{
    double r = 1.0, b = beta;
    for (int64_t n = step > 0 ? step : 1; n > 0; n >>= 1) {
        if (n & 1)
            r = nb_update_mul(r, b);
        b = nb_update_mul(b, b);
    }
    return 1.0 - r;
}

/* The numbers a fused update reads, in device_params' order: the bias
 * corrections 1 - beta^step are worked out here, once, in double. */
enum { NB_UPD_LR, NB_UPD_MOMENTUM, NB_UPD_BETA1, NB_UPD_BETA2, NB_UPD_EPSILON, NB_UPD_WEIGHT_DECAY, NB_UPD_BC1,
       NB_UPD_BC2, NB_UPD_COUNT };

static inline void nb_update_pack(const nb_update_params *p, double out[NB_UPD_COUNT])
{
    out[NB_UPD_LR] = p->lr;
    out[NB_UPD_MOMENTUM] = p->momentum;
    out[NB_UPD_BETA1] = p->beta1;
    out[NB_UPD_BETA2] = p->beta2;
    out[NB_UPD_EPSILON] = p->epsilon;
    out[NB_UPD_WEIGHT_DECAY] = p->weight_decay;
    out[NB_UPD_BC1] = nb_update_bias(p->beta1, p->step);
    out[NB_UPD_BC2] = nb_update_bias(p->beta2, p->step);
}

/* A dynamic loss scaler's settings, and its state as the host and a device
 * keep it: NB_LS_SCALE, the count of applied steps since the scale last
 * changed (NB_LS_GOOD) and of skipped steps (NB_LS_SKIPPED), as doubles. */
typedef struct nb_scaler_params {
    double growth, backoff, min, max;
    double interval; /* a whole number >= 1 */
} nb_scaler_params;

enum { NB_LS_SCALE, NB_LS_GOOD, NB_LS_SKIPPED, NB_LS_COUNT };

/* The scaler's state after a step whose gradients were all finite or not:
 * the one rule, run by the host (an eager step) and by a device (a captured
 * step's scaler_update). */
NB_UPD_FN void nb_scaler_advance(double *state, bool finite, const nb_scaler_params *p)
{
    if (finite) {
        state[NB_LS_GOOD] += 1;
        if (state[NB_LS_GOOD] >= p->interval) {
            state[NB_LS_SCALE] = fmin(nb_update_mul(state[NB_LS_SCALE], p->growth), p->max);
            state[NB_LS_GOOD] = 0;
        }
    } else {
        state[NB_LS_SCALE] = fmax(nb_update_mul(state[NB_LS_SCALE], p->backoff), p->min);
        state[NB_LS_GOOD] = 0;
        state[NB_LS_SKIPPED] += 1;
    }
}

typedef struct nb_optim_kernels {
    /* SGD; slot1 = the momentum buffer (NULL for plain SGD). */
    nb_status (*sgd_update)(nb_device *dev, const nb_view *param, const nb_view *grad,
                            const nb_view *slot1, const nb_update_params *p);
    /* Adam; slot1 = m, slot2 = v; weight_decay > 0 gives AdamW. */
    nb_status (*adam_update)(nb_device *dev, const nb_view *param, const nb_view *grad,
                             const nb_view *slot1, const nb_view *slot2, const nb_update_params *p);
    /* n updates of one kind and dtype at once: update k is the single entry's
     * with param[k], grad[k], slot1[k] (slot1 NULL: none, as for plain SGD),
     * slot2[k] and p with source = sources[k]; the same values, bit for bit
     * (a GPU launches one kernel for them all, where a small model's step
     * launched one per variable). The parameters are distinct. Optional:
     * NULL, and lib/optim calls the single entry n times. */
    nb_status (*sgd_update_many)(nb_device *dev, int n, const nb_view *param, const nb_view *grad,
                                 const nb_view *slot1, const void *const *sources, const nb_update_params *p);
    nb_status (*adam_update_many)(nb_device *dev, int n, const nb_view *param, const nb_view *grad,
                                  const nb_view *slot1, const nb_view *slot2, const void *const *sources,
                                  const nb_update_params *p);
    /* A loss scaler's step on the device, after the updates that read check
     * (one device double: 0 when every gradient was finite, see
     * nb_update_params.skip): state (NB_LS_COUNT device doubles) advances by
     * nb_scaler_advance, and count (one device double, the optimizer's count
     * of applied updates; NULL: none) by one when the gradients were finite. */
    nb_status (*scaler_update)(nb_device *dev, double *state, const double *check, double *count,
                               const nb_scaler_params *p);
} nb_optim_kernels;

#endif
