/* nabla — devices and placement.
 *
 * Devices are named as in TensorFlow: "/cpu:0", "/gpu:0", "/gpu:1" (also
 * "/device:GPU:1", "cpu:0", "gpu" meaning index 0). Each thread has a device stack:
 * with nothing pushed an op runs where its inputs are, and inputs on two devices
 * are an error (NB_ERR_DEVICE); with a device pushed, ops run there and inputs on
 * other devices are copied there (the copy is recorded, so gradients flow back).
 *
 * Soft placement (the default): pushing "/gpu:N" where there is no such GPU
 * falls back to the CPU with a one-line warning through the log callback. With
 * strict placement it is an error. NB_LOG_DEVICE_PLACEMENT=1 in the environment
 * (or nb_set_log_device_placement) logs each op with its device. */
#ifndef NABLA_DEVICE_H
#define NABLA_DEVICE_H

#include <nabla/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nb_device_kind { NB_DEVICE_CPU = 0, NB_DEVICE_GPU = 1 } nb_device_kind;

/* Splits the CPU into n logical devices /cpu:0 .. /cpu:n-1 (each with its own
 * worker, so a mirrored strategy can be tested without GPUs), or each physical GPU
 * into n logical GPUs. Must be called before the first use of any device:
 * returns NB_ERR_INVALID_ARGUMENT afterwards or for n < 1 or n > 64. */
nb_status nb_set_logical_cpu_devices(int n);
nb_status nb_set_logical_gpu_devices(int n_per_gpu);

/* Number of physical GPUs (0 when none is found or CUDA is off). Unlike
 * nb_device_count it does not fix the device settings, so a program can ask it
 * before choosing how to split GPUs with nb_set_logical_gpu_devices. */
int nb_physical_gpu_count(void);

/* Number of devices of a kind (GPUs: 0 when none is found or CUDA is off). */
int nb_device_count(nb_device_kind kind);

/* Name of the i-th device of a kind ("/gpu:1"); NULL when out of range. Static. */
const char *nb_device_name(nb_device_kind kind, int index);

/* Whether this build has the CUDA backend compiled in. */
bool nb_cuda_built(void);

/* Pushes a device onto the calling thread's stack. Returns NB_ERR_DEVICE for a
 * malformed name, or for a missing device under strict placement; under soft
 * placement a missing GPU pushes /cpu:0 and logs one warning. */
nb_status nb_device_push(const char *name);

/* Pops the top device; NB_ERR_INVALID_ARGUMENT when the stack is empty. */
nb_status nb_device_pop(void);

/* The device that creation functions use now: the top of the stack, "/cpu:0" when
 * it is empty. A static string. */
const char *nb_device_current(void);

/* Deterministic mode: every kernel whose result could depend on the order of
 * parallel floating-point additions (scatter_add, embedding gradients,
 * reductions and cumulative sums on a GPU) uses a fixed order instead of
 * atomics, so two runs on the same device and build give bit-identical values
 * and gradients, at some cost in speed. The CPU kernels are deterministic
 * already (for a given NB_NUM_THREADS). Off by default; NB_DETERMINISTIC=1 in
 * the environment turns it on. Process-wide; takes effect from the next op.
 * Returns the old setting. */
bool nb_set_deterministic(bool on);

/* Whether deterministic mode is on. */
bool nb_deterministic(void);

/* Soft placement on (default) or off. Process-wide; returns the old setting. */
bool nb_set_soft_placement(bool on);

/* Log every op with its device through the log callback. Returns the old setting. */
bool nb_set_log_device_placement(bool on);

/* Waits until every device has finished the work queued so far. Returns
 * NB_OK, or the first device's failure (an out-of-range index a GPU kernel
 * met, a device error, a wait inside a captured step, or on a device another
 * thread is recording a step on: NB_ERR_UNSUPPORTED), with its message; the
 * devices after a failing one are waited for all the same. */
nb_status nb_synchronize(void);

/* Copies t to the named device (a differentiable op; the gradient is copied
 * back). Returns a new tensor, or t itself with a new reference when it is
 * already there. NULL and NB_ERR_DEVICE for an unknown device. */
nb_tensor *nb_to_device(nb_tensor *t, const char *device);

#ifdef __cplusplus
}
#endif
#endif
