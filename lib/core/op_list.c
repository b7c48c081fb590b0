/* Names, dtype masks and costs of the ops in ops.def: the one place every
 * backend, front end and test reads them from. */
#include "backend.h"

#define FLOAT_DTYPES NB_FLOATS
#define NUMERIC_DTYPES NB_NUMERIC
#define ANY_DTYPES NB_ALL_DTYPES

static const char *const kernel_names[] = {
#define NB_KERNEL(ID, name) [NB_K_##ID] = #name,
#include "ops.def"
};
static const char *const unary_names[] = {
#define NB_UNARY(ID, name, dtypes, cost, api) [NB_UN_##ID] = #name,
#include "ops.def"
};
static const char *const binary_names[] = {
#define NB_BINARY(ID, name, dtypes, cost, kind, api) [NB_BIN_##ID] = #name,
#include "ops.def"
};
static const char *const reduce_names[] = {
#define NB_REDUCE(ID, name) [NB_RED_##ID] = #name,
#include "ops.def"
};
static const unsigned unary_masks[] = {
#define NB_UNARY(ID, name, dtypes, cost, api) [NB_UN_##ID] = dtypes##_DTYPES,
#include "ops.def"
};
static const unsigned binary_masks[] = {
#define NB_BINARY(ID, name, dtypes, cost, kind, api) [NB_BIN_##ID] = dtypes##_DTYPES,
#include "ops.def"
};
#define LIGHT false
#define HEAVY true
static const bool unary_heavy[] = {
#define NB_UNARY(ID, name, dtypes, cost, api) [NB_UN_##ID] = cost,
#include "ops.def"
};
static const bool binary_heavy[] = {
#define NB_BINARY(ID, name, dtypes, cost, kind, api) [NB_BIN_##ID] = cost,
#include "ops.def"
};

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))
_Static_assert(COUNT_OF(kernel_names) == NB_K_COUNT, "kernel names and nb_kernel disagree");
_Static_assert(COUNT_OF(unary_names) == NB_UN_COUNT, "unary names and nb_unary_op disagree");
_Static_assert(COUNT_OF(binary_names) == NB_BIN_COUNT, "binary names and nb_binary_op disagree");
_Static_assert(COUNT_OF(reduce_names) == NB_RED_COUNT, "reduce names and nb_reduce_op disagree");
_Static_assert(COUNT_OF(unary_masks) == NB_UN_COUNT && COUNT_OF(unary_heavy) == NB_UN_COUNT,
               "unary tables disagree");
_Static_assert(COUNT_OF(binary_masks) == NB_BIN_COUNT && COUNT_OF(binary_heavy) == NB_BIN_COUNT,
               "binary tables disagree");

#define NAME_OF(table, i) ((unsigned)(i) < COUNT_OF(table) ? table[i] : "?")

const char *nb__kernel_name(nb_kernel k) { return NAME_OF(kernel_names, k); }
const char *nb__unary_name(nb_unary_op op) { return NAME_OF(unary_names, op); }
const char *nb__binary_name(nb_binary_op op) { return NAME_OF(binary_names, op); }
const char *nb__reduce_name(nb_reduce_op op) { return NAME_OF(reduce_names, op); }
unsigned nb__unary_dtypes(nb_unary_op op) { return (unsigned)op < NB_UN_COUNT ? unary_masks[op] : 0; }
unsigned nb__binary_dtypes(nb_binary_op op) { return (unsigned)op < NB_BIN_COUNT ? binary_masks[op] : 0; }
bool nb__list_defines(nb_kernel k, int variant, nb_dtype dtype)
{
    if ((unsigned)dtype >= NB_DTYPE_COUNT)
        return false;
    switch (k) {
    case NB_K_UNARY: return (nb__unary_dtypes((nb_unary_op)variant) & NB_MASK(dtype)) != 0;
    case NB_K_BINARY: return (nb__binary_dtypes((nb_binary_op)variant) & NB_MASK(dtype)) != 0;
    default: return true;
    }
}

bool nb__unary_heavy(nb_unary_op op) { return (unsigned)op < NB_UN_COUNT && unary_heavy[op]; }
bool nb__binary_heavy(nb_binary_op op) { return (unsigned)op < NB_BIN_COUNT && binary_heavy[op]; }
