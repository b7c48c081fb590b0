/* Variables as gradient sources: watching a variable on one tape and taking
 * gradients with respect to variables. They live here, not in tape/, because
 * the tape knows a read only by an opaque key (tape/sources.h); this file is
 * where that key is known to be a variable. */
#include "variable_impl.h"

#include "tape/sources.h"

#include <stdlib.h>

nb_status nb_tape_watch_variable(nb_tape *tape, nb_variable *v)
{
    if (!tape || !v)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_tape_watch_variable: %s is NULL", tape ? "variable" : "tape");
    nb_tensor *t = nb_read(v);
    if (!t)
        return nb_error();
    if (!nb__is_floating(t->dtype))
        return nb__fail(NB_ERR_DTYPE, "nb_tape_watch_variable: variable '%s' is %s: only floating dtypes have gradients",
                        nb_variable_name(v), nb_dtype_name(t->dtype));
    return nb__tape_note_read(tape, v, t);
}

nb_status nb_tape_gradient_vars_ex(nb_tape *tape, const nb_tensor *target, const nb_tensor *output_gradient,
                                   int n, nb_variable *const *vars, nb_tensor **grads, nb_unconnected unconnected)
{
    uint64_t small[16] = {0};
    nb_tensor *like_small[16] = {0};
    uint64_t *ids = n <= 16 ? small : malloc(sizeof *ids * (size_t)n);
    nb_tensor **like = n <= 16 ? like_small : malloc(sizeof *like * (size_t)n);
    if (!ids || !like) {
        if (ids != small)
            free(ids);
        if (like != like_small)
            free(like);
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_tape_gradient_vars_ex: out of host memory");
    }
    for (int i = 0; i < n; i++) {
        ids[i] = 0;
        like[i] = NULL;
        if (!vars || !vars[i])
            continue;
        /* The value this tape saw being read, else the current one. */
        ids[i] = nb__tape_read_id(tape, vars[i]);
        like[i] = nb_read(vars[i]);
        if (!ids[i] && like[i])
            ids[i] = like[i]->id;
    }
    nb_status st = nb__tape_gradient_ids(tape, target, output_gradient, n, ids, like, grads, unconnected);
    if (ids != small)
        free(ids);
    if (like != like_small)
        free(like);
    return st;
}

nb_status nb_tape_gradient_vars(nb_tape *tape, const nb_tensor *target, int n, nb_variable *const *vars,
                                nb_tensor **grads)
{
    return nb_tape_gradient_vars_ex(tape, target, NULL, n, vars, grads, NB_UNCONNECTED_NULL);
}
