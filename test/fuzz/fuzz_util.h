/* What the fuzz targets share. Define FUZZ_NAME ("fuzz_idx") before including.
 *
 * REQUIRE(cond, fmt, ...): a broken promise is a finding: prints the target,
 * the place, the condition and the message, and aborts so libFuzzer keeps the
 * input. REQUIRE_CLEAN(live): the run left no pending error and, of the
 * tensors (nabla's own count), as many live as live (the count at its start);
 * it needs <nabla/nabla.h>. fuzz_temp_file makes an empty temporary file (under $TMPDIR, else
 * /tmp) for targets whose reader takes a path; the caller removes it at exit. */
#ifndef NB_FUZZ_UTIL_H
#define NB_FUZZ_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define REQUIRE(cond, ...)                                                                   \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, FUZZ_NAME ": %s:%d: %s: ", __FILE__, __LINE__, #cond);           \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fprintf(stderr, "\n");                                                           \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

#define REQUIRE_CLEAN(live)                                                                               \
    do {                                                                                                  \
        REQUIRE(nb_error() == NB_OK, "pending error: %s", nb_error_message());                            \
        REQUIRE(nb_live_tensors() == (live), "%lld tensors leaked", (long long)(nb_live_tensors() - (live))); \
    } while (0)

/* Writes the new file's path ("<tmp>/nb_fuzz_<tag>_XXXXXX" made unique) to p;
 * exits when it cannot be made (no fuzzing without it). */
static inline void fuzz_temp_file(char *p, size_t n, const char *tag)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(p, n, "%s/nb_fuzz_%s_XXXXXX", tmp && *tmp ? tmp : "/tmp", tag);
    int fd = mkstemp(p);
    if (fd < 0) {
        perror(FUZZ_NAME ": mkstemp");
        exit(1);
    }
    close(fd);
}

#endif
