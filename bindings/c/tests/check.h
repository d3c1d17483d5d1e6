/* A tiny check harness for the C tests: counts, never aborts. */
#ifndef OKV_TEST_CHECK_H
#define OKV_TEST_CHECK_H
#include <stdio.h>

#include "offgraph_kv.h"

static int checks_passed, checks_failed;

#define EXPECT(cond)                                                                                              \
    do {                                                                                                          \
        if (cond) {                                                                                               \
            checks_passed++;                                                                                      \
        } else {                                                                                                  \
            checks_failed++;                                                                                      \
            fprintf(stderr, "%s:%d: FAILED: %s (last error: %s)\n", __FILE__, __LINE__, #cond, okv_last_error()); \
        }                                                                                                         \
    } while (0)

#define EXPECT_STATUS(call, want)                                                                          \
    do {                                                                                                   \
        okv_status got_ = (call);                                                                          \
        if (got_ == (want)) {                                                                              \
            checks_passed++;                                                                               \
        } else {                                                                                           \
            checks_failed++;                                                                               \
            fprintf(stderr, "%s:%d: FAILED: %s returned %s, expected %s (last error: %s)\n", __FILE__,     \
                    __LINE__, #call, okv_status_name(got_), okv_status_name(want), okv_last_error());      \
        }                                                                                                  \
    } while (0)

#define EXPECT_OK(call) EXPECT_STATUS(call, OKV_OK)

/* A config of `n_layers` layers alike, admitting steps of up to `max_step`
 * tokens: the setup most tests start from. */
static inline okv_config *check_config(size_t capacity, size_t n_layers, okv_layer_config layer, size_t max_step) {
    okv_config *cfg = NULL;
    EXPECT_OK(okv_config_new(capacity, n_layers, &cfg));
    EXPECT_OK(okv_config_set_layers(cfg, &layer, 1));
    EXPECT_OK(okv_config_set_max_step(cfg, max_step));
    return cfg;
}

/* The closing line scripts/test-c.sh adds up; the exit code fails the run. */
#define CHECK_SUMMARY(name)                                                                    \
    (printf("%s: %d passed, %d failed\n", name, checks_passed, checks_failed), checks_failed ? 1 : 0)

#endif
