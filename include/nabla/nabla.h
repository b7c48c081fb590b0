/* nabla — eager-mode automatic differentiation in C. One header for the whole API. */
#ifndef NABLA_H
#define NABLA_H

#include <nabla/types.h>
#include <nabla/error.h>
#include <nabla/tensor.h>
#include <nabla/device.h>
#include <nabla/ops.h>
#include <nabla/nn.h>
#include <nabla/layers.h>
#include <nabla/tape.h>
#include <nabla/variable.h>
#include <nabla/optimizer.h>
#include <nabla/data.h>
#include <nabla/checkpoint.h>
#include <nabla/tfrecord.h>
#include <nabla/summary.h>
#include <nabla/gpu.h>
#include <nabla/graph.h>
#include <nabla/dlpack.h>
#include <nabla/distribute.h>
#include <nabla/async.h>
#include <nabla/pipeline.h>
#include <nabla/profile.h>

#define NB_VERSION_MAJOR 0
#define NB_VERSION_MINOR 1
#define NB_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif
/* Returns the library version as "major.minor.patch"; a static string. */
const char *nb_version(void);
#ifdef __cplusplus
}
#endif

#endif
