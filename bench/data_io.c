/* Data in and out beside PyTorch: a checkpoint of 8 f32 variables of 2M
 * elements (64 MiB) saved and restored (nabla: nb_checkpoint_save, which also
 * fsyncs the file and its folder, and nb_checkpoint_restore; PyTorch:
 * safetensors.torch save_file, and save_file followed by an fsync of the file
 * and its folder, and load_file copied into the tensors), and the cost of one
 * TensorBoard scalar (nb_summary_scalar; SummaryWriter.add_scalar), flushed
 * once at the end. Medians; same machine, same run. */
#include <nabla/nabla.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"

#define VARS 8
#define ELEMS (2 << 20)

int main(int argc, char **argv)
{
    int reps = 5;
    bool peer = true;
    BENCH_OPTIONS(argc, argv, BENCH_REPS(&reps), BENCH_NO_PEER(&peer));
    char scratch[] = "/tmp/nb_bench_data_XXXXXX";
    if (!mkdtemp(scratch)) {
        perror("mkdtemp");
        return 1;
    }
    nb_set_error_handler(nb_error_handler_exit, NULL);
    nb_scope *outer = nb_scope_begin();
    nb_variable *vars[VARS];
    for (int i = 0; i < VARS; i++) {
        char name[32];
        snprintf(name, sizeof name, "layer%d/kernel", i);
        vars[i] = nb_variable_new(name, nb_random_normal(NB_F32, NB_SHAPE(ELEMS), 0, 1, (uint64_t)i));
    }
    char path[128];
    snprintf(path, sizeof path, "%s/ours.safetensors", scratch);
    double save[64], restore[64];
    if (reps > 64)
        reps = 64;
    nb_checkpoint_save(path, VARS, vars, NULL); /* warm-up */
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        nb_checkpoint_save(path, VARS, vars, NULL);
        double t1 = bench_now();
        nb_checkpoint_restore(path, VARS, vars, NULL);
        save[r] = (t1 - t0) * 1e3;
        restore[r] = (bench_now() - t1) * 1e3;
    }
    unlink(path);

    char logdir[128];
    snprintf(logdir, sizeof logdir, "%s/logs", scratch);
    nb_summary_writer *w = nb_summary_writer_open(logdir);
    const int k = 10000;
    double t0 = bench_now();
    for (int i = 0; i < k; i++)
        nb_summary_scalar(w, "loss", i, 1.0 / (i + 1));
    nb_summary_writer_flush(w);
    double scalar_us = (bench_now() - t0) / k * 1e6;
    char ev[512];
    snprintf(ev, sizeof ev, "%s", nb_summary_writer_path(w));
    nb_summary_writer_close(w);
    unlink(ev);
    rmdir(logdir);

    bench_peer p;
    bench_peer_run(&p, peer, "data_io.py", "'%s' %d %d %d", scratch, VARS, ELEMS, reps);
    bench_header("Checkpoints (8 x 2M f32 = 64 MiB) and TensorBoard scalars, medians", "", &p);
    bench_row("save, ms (nabla also fsyncs)", bench_median(save, reps), bench_peer_get(&p, "save_ms"));
    bench_row("save, ms (both fsync)", bench_median(save, reps), bench_peer_get(&p, "save_fsync_ms"));
    bench_row("restore, ms", bench_median(restore, reps), bench_peer_get(&p, "restore_ms"));
    bench_row("one scalar summary, us", scalar_us, bench_peer_get(&p, "scalar_us"));

    for (int i = 0; i < VARS; i++)
        nb_variable_free(vars[i]);
    nb_scope_end(outer);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch);
    return system(cmd) == 0 ? 0 : 1;
}
