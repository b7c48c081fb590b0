/* The convolution and pooling search (conv_search.h) over a fixed set of
 * seeds: each seed is a byte string, decoded as the fuzz target fuzz_conv
 * decodes its inputs, so a configuration found here or there reruns in the
 * other. The three findings lead the list by name.
 *
 *   test_conv_search            the CPU's paths (and a GPU's, where there is one)
 *   test_conv_search --gpu      a GPU's paths only (77 without one)
 *
 * NB_SEARCH_CONFIGS sets how many seeded configurations run (default 5000);
 * NB_SEARCH_SEED moves the seeds. Every mismatch is printed with the
 * configuration in words. */
#include "check.h"
#include "conv_search.h"

/* A configuration in the decoder's bytes (see cs_decode). */
static cs_config decoded(const uint8_t *bytes, size_t n)
{
    cs_config c;
    cs_decode(bytes, n, &c);
    return c;
}

static int configs_run, configs_empty;

static void run_one(const cs_config *c, bool cpu, bool gpu)
{
    char what[400];
    cs_describe(c, what, sizeof what);
    for (int side = 0; side < 2; side++) {
        if ((side == 0 && !cpu) || (side == 1 && !gpu))
            continue;
        cs_result r = cs_run(c, side == 1);
        CHECKF(r.ok, "%s: %s", what, r.why);
    }
    configs_run++;
}

static bool g_cpu = true, g_gpu = true;

/* The findings the search exists for, as configurations of the space. */
static void known_findings(void)
{
    /* a 1x1 stride-1 convolution padded only on the right, f64 (the plain path
     * took it for pointwise): x [1, 2, 2, 2], filter [1, 1, 2, 1], pads (0, 0, 0, 1) */
    cs_config a = {0};
    a.kind = CS_CONV, a.N = 1, a.H = 2, a.W = 2, a.C = 2, a.K = 1, a.R = 1, a.S = 1, a.dtype = NB_F64;
    a.conv = (nb_conv2d_opts){{1, 1}, {1, 1}, NB_PAD_EXPLICIT, {0, 0, 0, 1}, 1, NB_NHWC};
    run_one(&a, g_cpu, g_gpu);
    a.dtype = NB_F32; /* both f32 paths */
    a.conv.pad[1] = 2, a.conv.pad[3] = 0;
    run_one(&a, g_cpu, g_gpu);
    /* a strided 1x1 convolution whose last row is never read, f32 (oneDNN's
     * filter gradient overran the heap): x [1, 4, 9, 8], strides (2, 1) */
    cs_config b = {0};
    b.kind = CS_CONV, b.N = 1, b.H = 4, b.W = 9, b.C = 8, b.K = 8, b.R = 1, b.S = 1, b.dtype = NB_F32;
    b.conv = (nb_conv2d_opts){{2, 1}, {1, 1}, NB_PAD_VALID, {0}, 1, NB_NHWC};
    for (int i = 0; i < 3; i++)
        run_one(&b, g_cpu, g_gpu);
    b.conv.format = NB_NCHW;
    run_one(&b, g_cpu, g_gpu);
    /* and a 3x3 whose last row and column are unread, groups 2 */
    b.H = 8, b.W = 8, b.R = 3, b.S = 3, b.conv.stride[1] = 2, b.conv.groups = 2, b.conv.format = NB_NHWC;
    run_one(&b, g_cpu, g_gpu);
}

/* Configurations from seeded byte strings. */
static void seeded(void)
{
    const char *env = getenv("NB_SEARCH_CONFIGS"), *seed_env = getenv("NB_SEARCH_SEED");
    long count = env && *env ? strtol(env, NULL, 10) : 5000;
    uint64_t state = 0x51ED5EEDull + (seed_env && *seed_env ? strtoull(seed_env, NULL, 10) : 0);
    for (long i = 0; i < count; i++) {
        uint8_t bytes[24];
        for (size_t k = 0; k < sizeof bytes; k++) {
            state ^= state << 13, state ^= state >> 7, state ^= state << 17;
            bytes[k] = (uint8_t)(state >> 24);
        }
        cs_config c = decoded(bytes, sizeof bytes);
        conv_geo g = {c.N, c.H, c.W, c.C, c.K, c.R, c.S, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        pool_case pc = {c.N, c.H, c.W, c.C, c.pool};
        if (c.kind == CS_CONV ? !conv_resolve(&g, &c.conv) : pool_geo_of(&pc).P < 1 || pool_geo_of(&pc).Q < 1)
            configs_empty++;
        run_one(&c, g_cpu, g_gpu);
    }
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--gpu") == 0) {
        if (nb_device_count(NB_DEVICE_GPU) == 0)
            return check_no_gpu("test_conv_search --gpu");
        g_cpu = false;
    }
    g_gpu = nb_device_count(NB_DEVICE_GPU) > 0;
    RUN(known_findings);
    RUN(seeded);
    printf("test_conv_search: %d configurations (%d with no output) on %s%s\n", configs_run, configs_empty,
           g_cpu ? "the CPU" : "", g_gpu ? (g_cpu ? " and a GPU" : "a GPU") : "");
    return check_finish();
}
