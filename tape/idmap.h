/* nabla internal — an open-addressing map from tensor id (never 0) to a pointer,
 * used as the tape's watched set and as the gradient table. */
#ifndef NB_TAPE_IDMAP_H
#define NB_TAPE_IDMAP_H

#include <stdint.h>
#include <stdlib.h>

typedef struct nb_idmap {
    uint64_t *keys;
    void **vals;
    size_t cap; /* a power of two, or 0 */
    size_t n;
} nb_idmap;

static inline size_t nb__idmap_slot(uint64_t key, size_t cap)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)key & (cap - 1);
}

/* Returns the slot of key, or of the empty slot where it would go. */
static inline size_t nb__idmap_find(const nb_idmap *m, uint64_t key)
{
    size_t i = nb__idmap_slot(key, m->cap);
    while (m->keys[i] && m->keys[i] != key)
        i = (i + 1) & (m->cap - 1);
    return i;
}

static inline bool nb__idmap_has(const nb_idmap *m, uint64_t key)
{
    return m->cap && m->keys[nb__idmap_find(m, key)] == key;
}

static inline void *nb__idmap_get(const nb_idmap *m, uint64_t key)
{
    if (!m->cap)
        return NULL;
    size_t i = nb__idmap_find(m, key);
    return m->keys[i] == key ? m->vals[i] : NULL;
}

static inline bool nb__idmap_grow(nb_idmap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 64;
    uint64_t *keys = calloc(cap, sizeof *keys);
    void **vals = calloc(cap, sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return false;
    }
    nb_idmap g = {keys, vals, cap, 0};
    for (size_t i = 0; i < m->cap; i++) {
        if (m->keys[i]) {
            size_t j = nb__idmap_find(&g, m->keys[i]);
            g.keys[j] = m->keys[i];
            g.vals[j] = m->vals[i];
            g.n++;
        }
    }
    free(m->keys);
    free(m->vals);
    *m = g;
    return true;
}

/* Inserts or replaces; false when memory runs out. */
static inline bool nb__idmap_put(nb_idmap *m, uint64_t key, void *val)
{
    if ((m->n + 1) * 4 > m->cap * 3 && !nb__idmap_grow(m))
        return false;
    size_t i = nb__idmap_find(m, key);
    if (!m->keys[i]) {
        m->keys[i] = key;
        m->n++;
    }
    m->vals[i] = val;
    return true;
}

static inline void nb__idmap_clear(nb_idmap *m)
{
    if (m->n) {
        for (size_t i = 0; i < m->cap; i++)
            m->keys[i] = 0;
        m->n = 0;
    }
}

static inline void nb__idmap_free(nb_idmap *m)
{
    free(m->keys);
    free(m->vals);
    m->keys = NULL;
    m->vals = NULL;
    m->cap = m->n = 0;
}

#endif
