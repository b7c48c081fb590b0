/* Which replica of a mirrored strategy the calling thread runs for.
 *
 * The strategy marks each replica's thread here, so that reading a mirrored
 * variable picks that replica's copy while the variable module knows nothing of
 * strategies. Strategies are named by a process-unique id, never by address, so a
 * freed strategy's address reused by a new one cannot be mistaken for it. */
#include "core.h"

static _Thread_local uint64_t tl_strategy;
static _Thread_local int tl_index = -1;

void nb__replica_enter(uint64_t strategy, int index)
{
    tl_strategy = strategy;
    tl_index = index;
}

void nb__replica_leave(void)
{
    tl_strategy = 0;
    tl_index = -1;
}

int nb__replica_of(uint64_t strategy) { return strategy && strategy == tl_strategy ? tl_index : -1; }

uint64_t nb__replica_strategy(void) { return tl_strategy; }

static atomic_uint_fast64_t g_next_owner = 1;

uint64_t nb__replica_owner_new(void) { return atomic_fetch_add_explicit(&g_next_owner, 1, memory_order_relaxed); }
