/* All-reduce of the mirrored strategy: nb_mirrored_all_reduce (SUM) of one f32
 * tensor per replica, 4 KiB to 256 MiB, on 2 and 4 replicas. The replicas are
 * GPUs when there are two or more, else logical GPUs on the one GPU, else
 * logical CPU devices. Where there are two or more GPUs, NCCL's own all-reduce
 * is shown beside it: ncclAllReduce called directly (bench/allreduce_nccl.c) in a
 * build with NCCL, else through PyTorch (bench/allreduce_nccl.py).
 *
 *   allreduce [--reps R] [--max-bytes N] [--quick] [--no-peer]
 *
 * Each time is the median of R reps (fewer for large sizes) after a warm-up and
 * covers the call and nb_synchronize(). algbw = bytes / time; busbw = algbw *
 * 2(n-1)/n, the bytes each replica moves, as nccl-tests defines it. --quick stops
 * at 4 MiB with 10 reps; --max-bytes N stops at N bytes. */
#include "bench_util.h"
#include <nabla/nabla.h>
#if NB_BENCH_NCCL
#include "allreduce_nccl.h"
#endif

#define MIN_BYTES ((size_t)4 << 10)
#define MAX_BYTES ((size_t)256 << 20)

static const char *size_name(size_t bytes, char *buf, size_t n)
{
    if (bytes >= (1u << 20))
        snprintf(buf, n, "%zu MiB", bytes >> 20);
    else
        snprintf(buf, n, "%zu KiB", bytes >> 10);
    return buf;
}

/* Median microseconds of one all-reduce of `bytes` on every replica of s. */
static double time_all_reduce(nb_mirrored *s, size_t bytes, int reps)
{
    int n = nb_mirrored_replicas(s);
    nb_scope *outer = nb_scope_begin();
    nb_tensor *in[64], *out[64];
    for (int r = 0; r < n; r++) { /* made once per size, each on its replica's device */
        nb_device_push(nb_mirrored_device(s, r));
        in[r] = nb_full(NB_F32, NB_SHAPE((int64_t)(bytes / 4)), r + 1);
        nb_device_pop();
    }
    nb_synchronize();
    double *v = malloc(sizeof *v * (size_t)reps);
    int warm = reps < 5 ? 1 : 3;
    for (int i = 0; i < warm + reps; i++) {
        nb_scope *sc = nb_scope_begin(); /* releases the outputs every rep */
        double t0 = bench_now();
        nb_mirrored_all_reduce(s, NB_REDUCE_SUM, in, out);
        nb_synchronize();
        if (i >= warm)
            v[i - warm] = (bench_now() - t0) * 1e6;
        nb_scope_end(sc);
    }
    double m = bench_median(v, reps);
    free(v);
    nb_scope_end(outer);
    return m;
}

#if NB_BENCH_NCCL
/* Prints ncclAllReduce's times and bus bandwidth beside ours; false when NCCL
 * could not be used (the PyTorch reference is tried then). */
static bool nccl_direct(nb_mirrored *const *s, const int *counts, int gpus, size_t max_bytes, int max_reps,
                        int n_sizes, double (*ours)[16])
{
    bool any = false;
    for (int c = 0; c < 2; c++) {
        if (!s[c] || counts[c] > gpus)
            continue;
        nccl_ref *r = nccl_ref_new(counts[c], max_bytes);
        if (!r)
            continue;
        if (!any)
            printf("\nNCCL reference (ncclAllReduce called directly, grouped from one thread):\n");
        any = true;
        printf("%-10s | %d: %10s %9s %12s\n", "size", counts[c], "NCCL us", "busbw", "ours/NCCL bw");
        int i = 0;
        for (size_t bytes = MIN_BYTES; i < n_sizes; bytes *= 4, i++) {
            int reps = (int)((size_t)max_reps * (1u << 20) / bytes);
            reps = reps < 3 ? 3 : reps > max_reps ? max_reps : reps;
            double us = nccl_ref_time(r, bytes, reps);
            char name[32];
            if (us <= 0)
                break;
            double busbw = (double)bytes / (us * 1e-6) / 1e9 * 2.0 * (counts[c] - 1) / counts[c];
            printf("%-10s | %d: %10.1f %9.3f %11.0f%%\n", size_name(bytes, name, sizeof name), counts[c], us, busbw,
                   100.0 * us / ours[c][i]);
        }
        nccl_ref_free(r);
    }
    return any;
}
#endif

int main(int argc, char **argv)
{
    int max_reps = 50;
    size_t max_bytes = MAX_BYTES;
    bool peer = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            max_reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--max-bytes") && i + 1 < argc)
            max_bytes = (size_t)strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--quick"))
            max_bytes = (size_t)4 << 20, max_reps = 10;
        else if (!strcmp(argv[i], "--no-peer"))
            peer = false;
        else {
            fprintf(stderr, "usage: %s [--reps R] [--max-bytes N] [--quick] [--no-peer]\n", argv[0]);
            return 2;
        }
    }
    if (max_reps < 1)
        max_reps = 1;

    /* Choose the replicas' devices before any other nabla call. */
    int gpus = nb_physical_gpu_count();
    if (gpus == 0 && bench_gpu_required()) /* never pass off CPU figures as GPU ones */
        return bench_no_gpu("nb_mirrored_all_reduce over GPUs", nb_gpu_unavailable_reason());
    const char *kind = gpus >= 2 ? "GPUs" : gpus == 1 ? "logical GPUs on one GPU" : "logical CPU devices";
    if (gpus == 1)
        nb_set_logical_gpu_devices(4);
    else if (gpus == 0)
        nb_set_logical_cpu_devices(4);
    nb_set_error_handler(nb_error_handler_exit, NULL);

    int counts[2] = {2, 4};
    nb_mirrored *s[2] = {NULL, NULL};
    for (int c = 0; c < 2; c++) {
        if (gpus >= 2 && gpus < counts[c])
            continue; /* 4 replicas need 4 GPUs here: the split is process-wide */
        s[c] = nb_mirrored_new(counts[c], NULL);
    }

    printf("\nnb_mirrored_all_reduce (SUM, f32) over %s; median microseconds, warm-up first\n", kind);
    for (int c = 0; c < 2; c++) {
        if (!s[c]) {
            printf("(%d replicas: skipped, %d GPUs)\n", counts[c], gpus);
            continue;
        }
        nb_mirrored_stats st;
        nb_mirrored_get_stats(s[c], &st);
        printf("%d replicas on", counts[c]);
        for (int r = 0; r < counts[c]; r++)
            printf(" %s", nb_mirrored_device(s[c], r));
        printf(": algorithm \"%s\"\n", st.algorithm);
    }
    printf("%-10s", "size");
    for (int c = 0; c < 2; c++)
        if (s[c])
            printf(" | %d: %10s %9s %9s", counts[c], "us", "algbw", "busbw");
    printf("\n");

    double ours[2][16];
    int n_sizes = 0;
    for (size_t bytes = MIN_BYTES; bytes <= max_bytes && bytes <= MAX_BYTES; bytes *= 4, n_sizes++) {
        /* Enough reps for a steady median, few for the big sizes (about 1 MiB * R in all). */
        int reps = (int)((size_t)max_reps * (1u << 20) / bytes);
        reps = reps < 3 ? 3 : reps > max_reps ? max_reps : reps;
        char name[32];
        printf("%-10s", size_name(bytes, name, sizeof name));
        for (int c = 0; c < 2; c++) {
            if (!s[c])
                continue;
            double us = ours[c][n_sizes] = time_all_reduce(s[c], bytes, reps);
            double algbw = (double)bytes / (us * 1e-6) / 1e9;
            printf(" | %d: %10.1f %9.3f %9.3f", counts[c], us, algbw,
                   algbw * 2.0 * (counts[c] - 1) / counts[c]);
            fflush(stdout);
        }
        printf("\n");
    }
    printf("(algbw and busbw in GB/s)\n");

    /* NCCL on the same GPUs: called directly where it is built in, else from PyTorch. */
    if (gpus < 2) {
        printf("\nNCCL reference: skipped (needs >= 2 GPUs)\n");
#if NB_BENCH_NCCL
    } else if (nccl_direct(s, counts, gpus, max_bytes, max_reps, n_sizes, ours)) {
#endif
    } else if (!peer) {
        printf("\nNCCL reference: not run (--no-peer)\n");
    } else {
        bench_peer p;
        char args[64];
        snprintf(args, sizeof args, "%zu %d", max_bytes, max_reps);
        bench_run_peer(&p, "allreduce_nccl.py", args);
        printf("\nNCCL reference (torch.distributed, one process per GPU): ");
        if (p.status[0]) {
            printf("%s\n", p.status);
        } else {
            printf("PyTorch %s; microseconds, nabla's time / NCCL's\n", p.version);
            int i = 0;
            for (size_t bytes = MIN_BYTES; i < n_sizes; bytes *= 4, i++) {
                char name[32], key[48];
                printf("%-10s", size_name(bytes, name, sizeof name));
                for (int c = 0; c < 2; c++) {
                    snprintf(key, sizeof key, "nccl%d_%zu", counts[c], bytes);
                    double t = bench_peer_get(&p, key);
                    if (s[c] && t > 0)
                        printf(" | %d: %10.1f %8.2fx", counts[c], t, ours[c][i] / t);
                }
                printf("\n");
            }
        }
    }
    for (int c = 0; c < 2; c++)
        nb_mirrored_free(s[c]);
    return 0;
}
