/* The asynchronous trainer across processes: parameter servers and the
 * workers' messages to them (world.h's point-to-point calls; MPI stays in
 * world.c).
 *
 * Ranks 0 .. S-1 serve, the others work. Each variable belongs to one server
 * (the largest first, each to the least loaded server), which keeps its
 * master copy and applies every update of it. A worker's read sends PULL to
 * every server that holds a variable and takes their values; its update sends
 * PUSH with the gradients of each server's variables and the version it read
 * there, and the server answers with the staleness. The stale-synchronous
 * bound is the servers': a PULL for batch c waits on the server until the
 * other live workers have pushed c - b batches (bound 0: until the round
 * before was applied as one update). Every worker says DONE when it has no
 * batch left; each worker process then asks FINAL, answered once every
 * worker everywhere is done (or dead), with the trained values.
 *
 * A worker process silent past the deadline while none of its requests waits
 * on the server is dead to that server: its workers count as done. A server
 * that does not answer within the deadline is NB_ERR_TIMEOUT on the worker. */
#include "async_impl.h"
#include "world.h"

#include "lib/variable/variable_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TAG_REQUEST 7501
#define TAG_REPLY 7600 /* + the local worker; + NB_ASYNC_MAX: a process's FINAL */

enum { MSG_PULL = 1, MSG_PUSH, MSG_DONE, MSG_FINAL };

typedef struct msg {
    int32_t kind;
    int32_t worker;  /* local index on the sending rank */
    int64_t clock;   /* PULL, PUSH: the worker's count of batches before this one */
    int64_t batch;   /* PUSH: the batch's number among its process's */
    int64_t rows;
    int64_t version; /* PUSH: the server's version it read */
    double loss;
} msg;

typedef struct reply {
    int64_t version;   /* PULL/FINAL: updates the values had seen */
    int64_t staleness; /* PUSH */
    int64_t lost;      /* FINAL: worker processes the server gave up on */
    int64_t wait;      /* 1: no answer yet, keep waiting (sent while a PULL
                          or FINAL is held back, so the worker's deadline
                          measures the server's silence, not the others') */
} reply;

/* What a server knows of one worker. */
typedef struct remote {
    int64_t clock;     /* batches it pushed */
    bool done;
    bool pull_waiting; /* a PULL held back by the bound */
    int64_t pull_clock;
    nb_tensor **grads; /* bound 0: its gradients for the current round (or NULL) */
    int64_t rows;
    double loss;
    bool pushed;       /* bound 0: pushed the current round */
} remote;

struct nb_async_world {
    int servers, size, rank, per_rank, total;
    /* per variable of the current call, and per server: its share's bytes
     * and variables (a PUSH carries a byte per variable of the share) */
    int cap;
    int *server_of;
    size_t *share_bytes;
    int *share_count;
    /* worker side: per local worker, per server, the version it read */
    int64_t *read_version;
    /* server side */
    remote *remotes;
    double *heard;    /* per rank: when it was last heard from */
    bool *dead, *final_wanted;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

nb_status nb__async_world_open(nb_async *a, int servers, bool *world, const char *who)
{
    *world = false;
    nb_status st = nb__world_join(who);
    if (st || nb__world_size() <= 1)
        return st;
    int size = nb__world_size(), rank = nb__world_rank();
    if (servers >= size)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %d servers among %d processes leaves no worker process", who,
                        servers, size);
    /* every worker process has the same number of workers */
    char desc[64];
    snprintf(desc, sizeof desc, "%d servers", servers);
    int64_t sum = 0, min = 0;
    if ((st = nb__world_handshake(who, who, desc, a->n, &sum, &min)))
        return st;
    if (min * size != sum)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: the processes asked for different numbers of workers; every "
                        "process must ask for the same", who);
    struct nb_async_world *w = calloc(1, sizeof *w);
    if (!w)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    *w = (struct nb_async_world){.servers = servers, .size = size, .rank = rank, .per_rank = a->n};
    w->total = a->n * (size - servers);
    w->read_version = calloc((size_t)(a->n > 0 ? a->n : 1) * (size_t)servers, sizeof *w->read_version);
    w->share_bytes = calloc((size_t)servers, sizeof *w->share_bytes);
    w->share_count = calloc((size_t)servers, sizeof *w->share_count);
    if (rank < servers) {
        w->remotes = calloc((size_t)(w->total > 0 ? w->total : 1), sizeof *w->remotes);
        w->heard = calloc((size_t)size, sizeof *w->heard);
        w->dead = calloc((size_t)size, sizeof *w->dead);
        w->final_wanted = calloc((size_t)size, sizeof *w->final_wanted);
    }
    a->w = w;
    if (!w->read_version || !w->share_bytes || !w->share_count || (rank < servers && (!w->remotes || !w->heard || !w->dead || !w->final_wanted))) {
        nb__async_world_free(a);
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    }
    if (rank < servers)
        a->n = 0; /* a server runs no worker */
    *world = true;
    return NB_OK;
}

void nb__async_world_free(nb_async *a)
{
    struct nb_async_world *w = a->w;
    if (!w)
        return;
    free(w->server_of);
    free(w->share_bytes);
    free(w->share_count);
    free(w->read_version);
    free(w->remotes);
    free(w->heard);
    free(w->dead);
    free(w->final_wanted);
    free(w);
    a->w = NULL;
}

bool nb__async_world_is_server(const nb_async *a) { return a->w && a->w->rank < a->w->servers; }
int nb__async_world_workers(const nb_async *a) { return a->w ? a->w->total : a->n; }

nb_status nb__async_world_variable(nb_async *a, const char *name, const nb_tensor *initial, nb_tensor **same,
                                   const char *who)
{
    (void)a;
    char desc[200], sh[NB_SHAPE_STR_MAX];
    snprintf(desc, sizeof desc, "'%s' %s %s", name, nb_dtype_name(initial->dtype),
             nb__shape_str(initial->ndim, initial->shape, sh, sizeof sh));
    nb_status st = nb__world_handshake(who, who, desc, 0, NULL, NULL);
    if (st)
        return st;
    size_t bytes = (size_t)initial->numel * nb_dtype_size(initial->dtype);
    void *buf = malloc(bytes ? bytes : 1);
    if (!buf)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory for '%s'", who, name);
    st = nb_tensor_read(initial, buf, bytes);
    if (!st)
        st = nb__world_broadcast(who, buf, bytes);
    if (!st) {
        nb_shape shape = {initial->ndim, {0}};
        memcpy(shape.dims, initial->shape, sizeof(int64_t) * (size_t)initial->ndim);
        nb_device_push(initial->device->name);
        *same = nb_from_buffer(initial->dtype, shape, buf);
        nb_device_pop();
        st = *same ? NB_OK : nb_error();
    }
    free(buf);
    return st;
}

static size_t var_bytes(nb_variable *v)
{
    nb_shape s = nb_variable_shape(v);
    size_t n = 1;
    for (int d = 0; d < s.ndim; d++)
        n *= (size_t)s.dims[d];
    return n * nb_dtype_size(nb_variable_dtype(v));
}

nb_status nb__async_world_begin(nb_async *a, const char *who)
{
    struct nb_async_world *w = a->w;
    if (a->n_vars > w->cap) {
        int *so = realloc(w->server_of, sizeof *so * (size_t)a->n_vars);
        if (!so)
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
        w->server_of = so;
        w->cap = a->n_vars;
    }
    /* the largest variable first, each to the least loaded server (ties: the
     * lower rank, the earlier variable), the same on every rank */
    size_t load[NB_ASYNC_MAX * 4] = {0};
    if (w->servers > (int)(sizeof load / sizeof *load))
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %d servers is more than %d", who, w->servers,
                        (int)(sizeof load / sizeof *load));
    for (int i = 0; i < a->n_vars; i++)
        w->server_of[i] = -1;
    for (int q = 0; q < w->servers; q++)
        w->share_count[q] = 0;
    uint64_t hash = 1469598103934665603ull;
    for (int k = 0; k < a->n_vars; k++) {
        int best = -1;
        for (int i = 0; i < a->n_vars; i++)
            if (w->server_of[i] < 0 && (best < 0 || var_bytes(a->vars[i]) > var_bytes(a->vars[best])))
                best = i;
        int s = 0;
        for (int q = 1; q < w->servers; q++)
            if (load[q] < load[s])
                s = q;
        w->server_of[best] = s;
        load[s] += var_bytes(a->vars[best]);
        w->share_count[s]++;
        for (const char *c = nb_variable_name(a->vars[k]); *c; c++)
            hash = (hash ^ (unsigned char)*c) * 1099511628211ull;
        hash = (hash ^ var_bytes(a->vars[k])) * 1099511628211ull;
    }
    for (int q = 0; q < w->servers; q++)
        w->share_bytes[q] = load[q];
    char desc[96];
    snprintf(desc, sizeof desc, "%d variables (%016llx), bound %lld", a->n_vars, (unsigned long long)hash,
             (long long)a->bound);
    nb_status st = nb__world_handshake(who, who, desc, 0, NULL, NULL);
    if (st || !nb__async_world_is_server(a))
        return st;
    for (int g = 0; g < w->total; g++)
        w->remotes[g] = (remote){0};
    double t = now_s();
    for (int r = 0; r < w->size; r++) {
        w->heard[r] = t;
        w->dead[r] = false;
        w->final_wanted[r] = false;
    }
    return NB_OK;
}

/* The bytes of server s's share (0: it holds no variable). */
static size_t share_bytes(const nb_async *a, int s) { return a->w->share_bytes[s]; }

/* ---- the worker's side ---------------------------------------------------------------- */

/* Receives server s's reply to local worker `worker` (a reply and then bytes). */
static nb_status take_reply(nb_async *a, int s, int tag, reply *r, char *buf, size_t bytes, const char *who)
{
    (void)a;
    size_t got = 0;
    char *msgbuf = malloc(sizeof *r + bytes);
    if (!msgbuf)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    nb_status st;
    bool kept = false;
    do {
        st = nb__world_recv(who, s, tag, msgbuf, sizeof *r + bytes, &got, &kept);
        if (!st && got >= sizeof *r)
            memcpy(r, msgbuf, sizeof *r);
    } while (!st && got == sizeof *r && r->wait);
    if (!st && got != sizeof *r + bytes)
        st = nb__fail(NB_ERR_INTERNAL, "%s: server %d answered %zu bytes where %zu were due", who, s, got,
                      sizeof *r + bytes);
    if (!st) {
        memcpy(r, msgbuf, sizeof *r);
        if (bytes)
            memcpy(buf, msgbuf + sizeof *r, bytes);
    }
    if (kept) /* a receive into it may still complete */
        nb__world_keep(msgbuf);
    else
        free(msgbuf);
    return st;
}

/* Writes a server's share (bytes in variable order) into the plain copies
 * copy_of(i). */
static nb_status unpack_share(nb_async *a, int s, const char *buf, int copy, const char *who)
{
    size_t off = 0;
    nb_status st = NB_OK;
    for (int i = 0; i < a->n_vars && !st; i++) {
        if (a->w->server_of[i] != s)
            continue;
        nb_variable *v = nb__variable_copy(a->vars[i], copy);
        nb_tensor *cur = nb__variable_value(v);
        nb_shape shape = nb_variable_shape(v);
        nb_scope *scope = nb_scope_begin(); /* the staging tensor goes at once */
        nb_device_push(cur->device->name);
        nb_tensor *t = nb_from_buffer(cur->dtype, shape, buf + off);
        nb_device_pop();
        st = !scope ? NB_ERR_OUT_OF_MEMORY : t ? nb_variable_assign(v, t) : nb_error();
        nb_scope_end(scope);
        off += var_bytes(a->vars[i]);
    }
    (void)who;
    return st;
}

nb_status nb__async_world_pull(nb_async *a, nb_async_worker *ws, int64_t clock)
{
    const char *who = "nb_async_train";
    struct nb_async_world *w = a->w;
    msg m = {MSG_PULL, ws->index, clock, 0, 0, 0, 0};
    nb_status st = NB_OK;
    for (int s = 0; s < w->servers && !st; s++)
        if (share_bytes(a, s))
            st = nb__world_send(who, s, TAG_REQUEST, &m, sizeof m);
    for (int s = 0; s < w->servers && !st; s++) {
        size_t bytes = share_bytes(a, s);
        if (!bytes)
            continue;
        char *buf = malloc(bytes);
        reply r;
        st = buf ? take_reply(a, s, TAG_REPLY + ws->index, &r, buf, bytes, who)
                 : nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
        if (!st) {
            w->read_version[ws->index * w->servers + s] = r.version;
            st = unpack_share(a, s, buf, ws->index + 1, who);
        }
        free(buf);
    }
    return st;
}

nb_status nb__async_world_push(nb_async *a, nb_async_worker *ws, int64_t clock, int64_t *staleness)
{
    const char *who = "nb_async_train";
    struct nb_async_world *w = a->w;
    nb_status st = NB_OK;
    *staleness = 0;
    for (int s = 0; s < w->servers && !st; s++) {
        size_t bytes = share_bytes(a, s);
        if (!bytes)
            continue;
        /* the message: its header, a byte per variable of the share (whether a
         * gradient follows), then the gradients */
        int n_share = w->share_count[s];
        size_t total = sizeof(msg) + (size_t)n_share + bytes;
        char *buf = calloc(1, total);
        if (!buf)
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
        msg m = {MSG_PUSH, ws->index, clock, ws->batch, ws->rows, w->read_version[ws->index * w->servers + s],
                 ws->loss};
        memcpy(buf, &m, sizeof m);
        size_t off = sizeof m + (size_t)n_share;
        int k = 0;
        for (int i = 0; i < a->n_vars && !st; i++) {
            if (w->server_of[i] != s)
                continue;
            size_t vb = var_bytes(a->vars[i]);
            if (ws->grads[i]) {
                buf[sizeof m + (size_t)k] = 1;
                st = nb_tensor_read(ws->grads[i], buf + off, vb);
            }
            off += vb;
            k++;
        }
        if (!st)
            st = nb__world_send(who, s, TAG_REQUEST, buf, total);
        free(buf);
        reply r;
        if (!st)
            st = take_reply(a, s, TAG_REPLY + ws->index, &r, NULL, 0, who);
        if (!st && r.staleness > *staleness)
            *staleness = r.staleness;
    }
    return st;
}

nb_status nb__async_world_done(nb_async *a, nb_async_worker *ws)
{
    const char *who = "nb_async_train";
    msg m = {MSG_DONE, ws->index, 0, 0, 0, 0, 0};
    nb_status st = NB_OK;
    for (int s = 0; s < a->w->servers; s++) {
        nb_status e = nb__world_send(who, s, TAG_REQUEST, &m, sizeof m);
        st = st ? st : e;
    }
    return st;
}

nb_status nb__async_world_finish(nb_async *a, bool ok, const char *who)
{
    (void)ok;
    struct nb_async_world *w = a->w;
    nb_status st = NB_OK;
    msg m = {MSG_FINAL, 0, 0, 0, 0, 0, 0};
    for (int s = 0; s < w->servers && !st; s++)
        st = nb__world_send(who, s, TAG_REQUEST, &m, sizeof m);
    /* the final values go into the masters (copy 0) */
    for (int s = 0; s < w->servers && !st; s++) {
        size_t bytes = share_bytes(a, s);
        char *buf = malloc(bytes ? bytes : 1);
        reply r;
        st = buf ? take_reply(a, s, TAG_REPLY + NB_ASYNC_MAX, &r, buf, bytes, who)
                 : nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
        if (!st)
            st = unpack_share(a, s, buf, 0, who);
        if (!st && r.lost)
            nb__world_lost();
        free(buf);
    }
    return st;
}

/* ---- the server's side ------------------------------------------------------------------- */

static int worker_rank(const struct nb_async_world *w, int g) { return w->servers + g / w->per_rank; }

/* This server's share of the masters, in variable order, to buf. */
static nb_status pack_share(nb_async *a, char *buf, const char *who)
{
    size_t off = 0;
    nb_status st = NB_OK;
    (void)who;
    for (int i = 0; i < a->n_vars && !st; i++) {
        if (a->w->server_of[i] != a->w->rank)
            continue;
        size_t vb = var_bytes(a->vars[i]);
        st = nb_tensor_read(nb__variable_value(a->masters[i]), buf + off, vb);
        off += vb;
    }
    return st;
}

static nb_status send_reply(nb_async *a, int rank, int tag, reply r, bool with_share, const char *who)
{
    size_t bytes = with_share ? share_bytes(a, a->w->rank) : 0;
    char *buf = malloc(sizeof r + bytes);
    if (!buf)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    memcpy(buf, &r, sizeof r);
    nb_status st = with_share ? pack_share(a, buf + sizeof r, who) : NB_OK;
    if (!st) {
        st = nb__world_send(who, rank, tag, buf, sizeof r + bytes);
        if (st == NB_ERR_TIMEOUT) { /* a dead worker process: the others go on */
            nb__log(NB_LOG_WARNING, "%s: %s", who, nb_error_message());
            nb_error_clear();
            a->w->dead[rank] = true;
            nb__world_lost();
            st = NB_OK;
        }
    }
    free(buf);
    return st;
}

/* Whether worker g may start batch clock now (the server's bound). */
static bool may_start(nb_async *a, int g, int64_t clock)
{
    struct nb_async_world *w = a->w;
    if (a->bound < 0)
        return true;
    if (a->bound == 0)
        return a->rounds_done >= clock;
    for (int x = 0; x < w->total; x++)
        if (x != g && !w->remotes[x].done && !w->dead[worker_rank(w, x)] && w->remotes[x].clock < clock - a->bound)
            return false;
    return true;
}

/* Gradients from a PUSH's payload as tensors on the masters' device (NULL
 * where none came), owned by the current scope. */
static nb_status grads_of(nb_async *a, const char *payload, nb_tensor **grads)
{
    struct nb_async_world *w = a->w;
    size_t off = (size_t)w->share_count[w->rank];
    int k = 0;
    nb_device_push(a->master->name);
    for (int i = 0; i < a->n_vars; i++) {
        grads[i] = NULL;
        if (w->server_of[i] != w->rank)
            continue;
        if (payload[k++]) {
            nb_tensor *cur = nb__variable_value(a->masters[i]);
            nb_shape shape = {cur->ndim, {0}};
            memcpy(shape.dims, cur->shape, sizeof(int64_t) * (size_t)cur->ndim);
            if (!(grads[i] = nb_from_buffer(cur->dtype, shape, payload + off)))
                break;
        }
        off += var_bytes(a->vars[i]);
    }
    nb_device_pop();
    return nb_error();
}

/* Bound 0: whether worker g's gradients count in the round (a process that
 * died after pushing them is left out, as from the round's rows). */
static bool in_round(const struct nb_async_world *w, int g)
{
    return w->remotes[g].pushed && w->remotes[g].grads && !w->dead[worker_rank(w, g)];
}

/* Bound 0: applies the round when every live worker has pushed it or is done. */
static nb_status try_round(nb_async *a, const char *who)
{
    struct nb_async_world *w = a->w;
    int64_t rows = 0;
    int count = 0;
    for (int g = 0; g < w->total; g++) {
        remote *x = &w->remotes[g];
        if (w->dead[worker_rank(w, g)] || (x->done && !x->pushed))
            continue;
        if (!x->pushed)
            return NB_OK;
        rows += x->rows;
        count++;
    }
    if (!count)
        return NB_OK;
    nb_scope *scope = nb_scope_begin();
    nb_device_push(a->master->name);
    nb_tensor *small[16];
    nb_tensor **sum = a->n_vars <= 16 ? small : calloc((size_t)a->n_vars, sizeof *sum);
    nb_status st = sum ? NB_OK : nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    for (int i = 0; i < a->n_vars && !st; i++) {
        sum[i] = NULL;
        for (int g = 0; g < w->total && !st; g++) {
            remote *x = &w->remotes[g];
            if (!in_round(w, g) || !x->grads[i])
                continue;
            double wt = (double)x->rows / (double)rows;
            nb_tensor *t = wt == 1.0 ? x->grads[i] : nb_mul(x->grads[i], nb_scalar(x->grads[i]->dtype, wt));
            sum[i] = sum[i] ? nb_add(sum[i], t) : t;
            st = sum[i] ? NB_OK : nb_error();
        }
    }
    if (!st)
        st = nb__async_apply(a, sum, who);
    if (!st) {
        double loss = 0;
        for (int g = 0; g < w->total; g++)
            if (in_round(w, g))
                loss += (double)w->remotes[g].rows / (double)rows * w->remotes[g].loss;
        a->gradients += count - 1; /* the round's gradients, one update */
        nb__async_count(a, -1, a->rounds_done * w->per_rank, rows, 0, loss);
        a->rounds_done++;
    }
    for (int g = 0; g < w->total; g++) {
        remote *x = &w->remotes[g];
        if (x->grads)
            for (int i = 0; i < a->n_vars; i++)
                nb__release(x->grads[i]);
        free(x->grads);
        x->grads = NULL;
        x->pushed = false;
    }
    if (sum != small)
        free(sum);
    nb_device_pop();
    nb_scope_end(scope);
    return st;
}

/* Answers the PULLs the bound held back that may go now. */
static nb_status release_pulls(nb_async *a, const char *who)
{
    struct nb_async_world *w = a->w;
    nb_status st = NB_OK;
    for (int g = 0; g < w->total && !st; g++) {
        remote *x = &w->remotes[g];
        if (x->pull_waiting && may_start(a, g, x->pull_clock)) {
            x->pull_waiting = false;
            st = send_reply(a, worker_rank(w, g), TAG_REPLY + g % w->per_rank, (reply){a->version, 0, 0, 0}, true, who);
        }
    }
    return st;
}

/* One request from rank src. */
static nb_status handle(nb_async *a, int src, const char *buf, size_t got, const char *who)
{
    struct nb_async_world *w = a->w;
    msg m;
    if (got < sizeof m || src < w->servers)
        return nb__fail(NB_ERR_INTERNAL, "%s: rank %d sent a request that is not a worker's", who, src);
    memcpy(&m, buf, sizeof m);
    if (m.kind == MSG_FINAL) {
        w->final_wanted[src] = true;
        return NB_OK;
    }
    if (m.worker < 0 || m.worker >= w->per_rank)
        return nb__fail(NB_ERR_INTERNAL, "%s: rank %d named worker %d of %d", who, src, m.worker, w->per_rank);
    int g = (src - w->servers) * w->per_rank + m.worker;
    remote *x = &w->remotes[g];
    int tag = TAG_REPLY + m.worker;
    switch (m.kind) {
    case MSG_PULL:
        if (may_start(a, g, m.clock))
            return send_reply(a, src, tag, (reply){a->version, 0, 0, 0}, true, who);
        x->pull_waiting = true;
        x->pull_clock = m.clock;
        return NB_OK;
    case MSG_PUSH: {
        nb_scope *scope = nb_scope_begin();
        nb_tensor *small[16];
        nb_tensor **grads = a->n_vars <= 16 ? small : calloc((size_t)a->n_vars, sizeof *grads);
        nb_status st = grads ? grads_of(a, buf + sizeof m, grads) : NB_ERR_OUT_OF_MEMORY;
        int64_t staleness = a->version - m.version;
        if (!st && a->bound == 0) {
            x->grads = calloc((size_t)(a->n_vars > 0 ? a->n_vars : 1), sizeof *x->grads);
            if (!x->grads)
                st = nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
            for (int i = 0; i < a->n_vars && !st; i++) {
                nb__retain(grads[i]);
                x->grads[i] = grads[i];
            }
            x->pushed = true;
            x->rows = m.rows;
            x->loss = m.loss;
            staleness = 0;
        } else if (!st) {
            st = nb__async_apply(a, grads, who);
            if (!st)
                nb__async_count(a, g, m.batch, m.rows, staleness, m.loss);
        }
        if (grads != small)
            free(grads);
        nb_scope_end(scope);
        x->clock = m.clock + 1;
        if (!st)
            st = send_reply(a, src, tag, (reply){a->version, staleness, 0, 0}, false, who);
        if (!st && a->bound == 0)
            st = try_round(a, who);
        return st ? st : release_pulls(a, who);
    }
    case MSG_DONE:
        x->done = true;
        {
            nb_status st = a->bound == 0 ? try_round(a, who) : NB_OK;
            return st ? st : release_pulls(a, who);
        }
    default:
        return nb__fail(NB_ERR_INTERNAL, "%s: rank %d sent a request of unknown kind %d", who, src, m.kind);
    }
}

/* Whether every worker process has finished (or died) and asked for the end. */
static bool all_finished(const nb_async *a)
{
    const struct nb_async_world *w = a->w;
    for (int r = w->servers; r < w->size; r++)
        if (!w->dead[r] && !w->final_wanted[r])
            return false;
    return true;
}

/* Marks as dead the worker processes silent past the deadline while none of
 * their requests waits here. */
static nb_status check_silent(nb_async *a, const char *who)
{
    struct nb_async_world *w = a->w;
    double t = now_s(), limit = nb__world_timeout();
    bool changed = false;
    for (int r = w->servers; r < w->size; r++) {
        if (w->dead[r] || w->final_wanted[r] || t - w->heard[r] < limit)
            continue;
        bool waiting = false;
        for (int k = 0; k < w->per_rank; k++)
            waiting |= w->remotes[(r - w->servers) * w->per_rank + k].pull_waiting;
        if (waiting)
            continue;
        nb__log(NB_LOG_WARNING, "%s: worker process %d has not been heard from for %g s; training goes on without it",
                who, r, limit);
        w->dead[r] = true;
        nb__world_lost();
        changed = true;
    }
    if (!changed)
        return NB_OK;
    nb_status st = a->bound == 0 ? try_round(a, who) : NB_OK;
    return st ? st : release_pulls(a, who);
}

/* Tells every worker whose PULL or FINAL is held back to keep waiting. */
static nb_status keep_waiting(nb_async *a, const char *who)
{
    struct nb_async_world *w = a->w;
    const reply r = {a->version, 0, 0, 1};
    nb_status st = NB_OK;
    for (int g = 0; g < w->total && !st; g++)
        if (w->remotes[g].pull_waiting && !w->dead[worker_rank(w, g)])
            st = send_reply(a, worker_rank(w, g), TAG_REPLY + g % w->per_rank, r, false, who);
    for (int rank = w->servers; rank < w->size && !st; rank++)
        if (w->final_wanted[rank] && !w->dead[rank])
            st = send_reply(a, rank, TAG_REPLY + NB_ASYNC_MAX, r, false, who);
    return st;
}

nb_status nb__async_world_serve(nb_async *a, const char *who)
{
    struct nb_async_world *w = a->w;
    nb_status st = NB_OK;
    char *buf = NULL;
    size_t cap = 0;
    double last_check = now_s(), last_keepalive = now_s();
    while (!st && !all_finished(a)) {
        int src = -1;
        size_t bytes = 0;
        if (now_s() - last_keepalive > nb__world_timeout() / 4) {
            st = keep_waiting(a, who);
            last_keepalive = now_s();
            if (st)
                break;
        }
        if (!nb__world_probe(TAG_REQUEST, &src, &bytes)) {
            if (now_s() - last_check > 0.05) {
                st = check_silent(a, who);
                last_check = now_s();
            }
            nanosleep(&(struct timespec){0, 20000}, NULL);
            continue;
        }
        if (bytes > cap) {
            char *b = realloc(buf, bytes);
            if (!b) {
                st = nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
                break;
            }
            buf = b;
            cap = bytes;
        }
        size_t got = 0;
        bool kept = false;
        st = nb__world_recv(who, src, TAG_REQUEST, buf, bytes, &got, &kept);
        if (kept) { /* a receive into it may still complete: the world's now */
            nb__world_keep(buf);
            buf = NULL;
            cap = 0;
        }
        if (!st) {
            w->heard[src] = now_s();
            st = handle(a, src, buf, got, who);
        }
    }
    /* the trained values to every live worker process */
    int64_t lost = 0;
    for (int r = w->servers; r < w->size; r++)
        lost += w->dead[r];
    for (int r = w->servers; r < w->size && !st; r++)
        if (!w->dead[r])
            st = send_reply(a, r, TAG_REPLY + NB_ASYNC_MAX, (reply){a->version, 0, lost, 0}, true, who);
    free(buf);
    return st;
}
