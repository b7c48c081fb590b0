/* The samples' command lines: a table of options, read in order (header-only).
 *
 *   int steps = 200;
 *   const char *device = "/cpu:0";
 *   OPTIONS_READ(argc, argv, "usage: %s [--device NAME] [--steps N] [--quick]\n",
 *                OPTION_TEXT("--device", &device), OPTION_NUMBER("--steps", &steps),
 *                OPTION_SETS("--quick", &steps, 100));
 *
 * --help prints the usage line and exits 0; an option the table lacks, or one
 * without its value, prints it to stderr and exits 2. */
#ifndef NB_SAMPLES_COMMAND_LINE_H
#define NB_SAMPLES_COMMAND_LINE_H

#include <nabla/nabla.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sample_option {
    const char *name;  /* "--steps" */
    bool takes_value;  /* --name VALUE, or --name alone */
    int *number;       /* VALUE as a whole number; for --name alone, set to `to` */
    const char **text; /* VALUE as it stands */
    bool *flag;        /* --name alone sets it */
    int to;
} sample_option;

#define OPTION_NUMBER(name, p) {(name), true, (p), NULL, NULL, 0}
#define OPTION_TEXT(name, p) {(name), true, NULL, (p), NULL, 0}
/* --name alone sets *p to `to` (--quick: fewer steps). */
#define OPTION_SETS(name, p, to) {(name), false, (p), NULL, NULL, (to)}
/* --name alone sets the bool *p. */
#define OPTION_FLAG(name, p) {(name), false, NULL, NULL, (p), 0}
/* --quick in the Fashion-MNIST samples: a short run of one epoch. */
#define OPTION_QUICK(quick, epochs) {"--quick", false, (epochs), NULL, (quick), 1}

/* Reads argv by the table; every entry named by an argument takes effect, in
 * the order the arguments come. usage is a printf format given argv[0]. */
static inline void options_read(int argc, char **argv, const char *usage, int n, const sample_option *opts)
{
    for (int i = 1; i < argc; i++) {
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        bool known = false, took_value = false;
        for (int k = 0; k < n; k++) {
            const sample_option *o = &opts[k];
            if (strcmp(argv[i], o->name) != 0 || (o->takes_value && !value))
                continue;
            known = true;
            took_value |= o->takes_value;
            if (o->takes_value && o->number)
                *o->number = atoi(value);
            else if (o->takes_value)
                *o->text = value;
            else if (o->flag)
                *o->flag = true;
            if (!o->takes_value && o->number)
                *o->number = o->to;
        }
        if (!known) {
            bool help = !strcmp(argv[i], "--help");
            fprintf(help ? stdout : stderr, usage, argv[0]);
            exit(help ? 0 : 2);
        }
        if (took_value)
            i++;
    }
}

/* The options fashion_mnist and fashion_cnn share, in their usage order:
 * --data DIR --device NAME --epochs N --steps N --quick --logdir DIR. */
#define FASHION_OPTIONS(dir, device, epochs, steps, quick, logdir)                                  \
    OPTION_TEXT("--data", dir), OPTION_TEXT("--device", device), OPTION_NUMBER("--epochs", epochs), \
        OPTION_NUMBER("--steps", steps), OPTION_QUICK(quick, epochs), OPTION_TEXT("--logdir", logdir)

/* OPTIONS_READ(argc, argv, usage, OPTION_...(...), ...): the table inline. */
#define OPTIONS_READ(argc, argv, usage, ...)                                                  \
    do {                                                                                      \
        const sample_option table_[] = {__VA_ARGS__};                                         \
        options_read((argc), (argv), (usage), (int)(sizeof table_ / sizeof *table_), table_); \
    } while (0)

/* The command line of the samples that train for a number of steps: --device
 * NAME (by default the first GPU, else the CPU), --steps N, and --quick (sets
 * quick_steps). Reads argv into *steps and pushes the device, which the
 * caller pops. */
static inline void steps_options_read(int argc, char **argv, int *steps, int quick_steps)
{
    const char *device = nb_device_count(NB_DEVICE_GPU) > 0 ? "/gpu:0" : "/cpu:0";
    OPTIONS_READ(argc, argv, "usage: %s [--device NAME] [--steps N] [--quick]\n", OPTION_TEXT("--device", &device),
                 OPTION_NUMBER("--steps", steps), OPTION_SETS("--quick", steps, quick_steps));
    nb_device_push(device);
}

#endif
