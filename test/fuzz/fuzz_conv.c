/* libFuzzer target for the convolutions and pooling: each input decodes into
 * one configuration of the option space (test/conv_search.h's cs_decode: the
 * op, batch, sizes, channels and groups, kernel or window, strides,
 * dilations, padding mode and pads, layout, dtype, value seed), which runs on
 * every CPU path the build has (oneDNN and the plain path for f32) and must
 * agree with the nested-loop references in values, first- and second-order
 * gradients, or fail with NB_ERR_SHAPE when it has no output. A mismatch, a
 * sanitizer report or a leaked tensor is a finding. test_conv_search runs the
 * same decoder over seeded byte strings, so a finding's bytes rerun there. */
#define FUZZ_NAME "fuzz_conv"
#include "../conv_search.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cs_config c;
    cs_decode(data, size, &c);
    int64_t live = nb_live_tensors();
    cs_result r = cs_run(&c, false);
    char what[400];
    cs_describe(&c, what, sizeof what);
    REQUIRE(r.ok, "%s: %s", what, r.why);
    REQUIRE(nb_live_tensors() == live, "%s: %lld tensors leaked", what, (long long)(nb_live_tensors() - live));
    REQUIRE(nb_error() == NB_OK, "%s: an error was left pending: %s", what, nb_error_message());
    return 0;
}
