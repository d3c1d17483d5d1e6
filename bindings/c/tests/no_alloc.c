/* The hot path allocates nothing: once pools have grown (here: sized up
 * front) a decode step through the C API (begin_step, then per layer plan,
 * update and single-threaded attend) makes no heap allocation, in float32,
 * float16 (rows written as float16 bits) and q8_0 pools. Linked against
 * the static library with the linker wrapping the C allocator, so every
 * allocation the library makes is counted. */
#include <stdlib.h>
#include <string.h>

#include "check.h"

static int counting;
static long allocs;

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);
int __wrap_posix_memalign(void **p, size_t a, size_t n);
void *__wrap_aligned_alloc(size_t a, size_t n);

void *__wrap_malloc(size_t n) {
    allocs += counting;
    return __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t m) {
    allocs += counting;
    return __real_calloc(n, m);
}
void *__wrap_realloc(void *p, size_t n) {
    allocs += counting;
    return __real_realloc(p, n);
}
int __wrap_posix_memalign(void **p, size_t a, size_t n) {
    allocs += counting;
    return __real_posix_memalign(p, a, n);
}
void *__wrap_aligned_alloc(size_t a, size_t n) {
    allocs += counting;
    return __real_aligned_alloc(a, n);
}

enum { LAYERS = 4, HEADS = 2, HD = 32, QH = 4, CAP = 512, WINDOW = 64 };

static okv_config *config(uint32_t dtype) {
    okv_config *cfg = NULL;
    okv_layer_config layers[LAYERS] = {
        {OKV_POLICY_RING, WINDOW, HEADS, HD},
        {OKV_POLICY_RING, WINDOW, HEADS, HD},
        {OKV_POLICY_RING, WINDOW, HEADS, HD},
        {OKV_POLICY_FLAT, 0, HEADS, HD},
    };
    EXPECT_OK(okv_config_new(CAP, LAYERS, &cfg));
    EXPECT_OK(okv_config_set_layers(cfg, layers, LAYERS));
    EXPECT_OK(okv_config_set_initial_capacity(cfg, CAP));
    EXPECT_OK(okv_config_set_dtypes(cfg, dtype, dtype));
    return cfg;
}

static void test_the_wrap_counts(void) {
    counting = 1;
    okv_config *cfg = NULL;
    EXPECT_OK(okv_config_new(CAP, LAYERS, &cfg));
    counting = 0;
    EXPECT(allocs > 0); /* the library's allocations do reach the counter */
    EXPECT_OK(okv_config_free(cfg));
    allocs = 0;
}

static void test_kv_sequence_decode(uint32_t dtype) {
    okv_config *cfg = config(dtype);
    okv_kv_seq_cache *kv = NULL;
    EXPECT_OK(okv_kv_seq_cache_new(cfg, &kv));
    static float k[HEADS * HD], v[HEADS * HD], q[QH * HD], out[QH * HD];
    static uint16_t kh[HEADS * HD], vh[HEADS * HD];
    okv_attend_options opts = {0.0f, 1, OKV_BACKEND_NATIVE};
    int failures = 0;
    for (int step = 0; step < 300; step++) {
        counting = step >= 20; /* the first steps warm thread-local scratch */
        size_t pos = 0;
        failures += okv_kv_seq_cache_begin_step(kv, 1, &pos) != OKV_OK;
        for (size_t l = 0; l < LAYERS; l++) {
            okv_seq_plan plan;
            k[0] = (float)step;
            kh[0] = (uint16_t)step;
            failures += okv_kv_seq_cache_plan(kv, l, &plan) != OKV_OK;
            if (dtype == OKV_DTYPE_F16)
                failures += okv_kv_seq_cache_update_f16(kv, l, kh, HEADS * HD, vh, HEADS * HD) != OKV_OK;
            else
                failures += okv_kv_seq_cache_update(kv, l, k, HEADS * HD, v, HEADS * HD) != OKV_OK;
            failures += okv_kv_seq_cache_attend(kv, l, q, QH * HD, QH, out, QH * HD, &opts) != OKV_OK;
        }
    }
    counting = 0;
    EXPECT(failures == 0);
    printf("kv sequence (%s): %ld allocations in 280 decode steps x %d layers\n", okv_dtype_name(dtype), allocs,
           LAYERS);
    EXPECT(allocs == 0);
    allocs = 0;
    EXPECT_OK(okv_kv_seq_cache_free(kv));
    EXPECT_OK(okv_config_free(cfg));
}

static void test_kv_cell_decode(uint32_t dtype) {
    /* Ring layers only: each sequence's ring cells stay bounded, so a steady
     * decode reuses every buffer (a flat layer's per-sequence lists grow by
     * doubling instead). */
    okv_layer_config ring = {OKV_POLICY_RING, WINDOW, HEADS, HD};
    okv_config *cfg = check_config(CAP, LAYERS, ring, 2);
    EXPECT_OK(okv_config_set_initial_capacity(cfg, CAP));
    EXPECT_OK(okv_config_set_dtypes(cfg, dtype, dtype));
    okv_kv_cell_cache *kc = NULL;
    EXPECT_OK(okv_kv_cell_cache_new(cfg, 4 * WINDOW, 2, &kc));
    uint64_t ids[2];
    EXPECT_OK(okv_kv_cell_cache_seq_new(kc, &ids[0]));
    EXPECT_OK(okv_kv_cell_cache_seq_new(kc, &ids[1]));
    static float k[HEADS * 2 * HD], v[HEADS * 2 * HD], q[QH * 2 * HD], out[QH * 2 * HD];
    static uint16_t kh[HEADS * 2 * HD], vh[HEADS * 2 * HD];
    okv_attend_options opts = {0.0f, 1, OKV_BACKEND_NATIVE};
    int failures = 0;
    for (size_t step = 0; step < 400; step++) {
        counting = step >= 2 * WINDOW; /* warm: every ring is full and scratch has grown */
        size_t pos[2] = {step, step};
        failures += okv_kv_cell_cache_begin_step(kc, ids, pos, 2) != OKV_OK;
        for (size_t l = 0; l < LAYERS; l++) {
            if (dtype == OKV_DTYPE_F16)
                failures += okv_kv_cell_cache_update_f16(kc, l, kh, HEADS * 2 * HD, vh, HEADS * 2 * HD) != OKV_OK;
            else
                failures += okv_kv_cell_cache_update(kc, l, k, HEADS * 2 * HD, v, HEADS * 2 * HD) != OKV_OK;
            failures += okv_kv_cell_cache_attend(kc, l, q, QH * 2 * HD, QH, out, QH * 2 * HD, &opts) != OKV_OK;
        }
    }
    counting = 0;
    EXPECT(failures == 0);
    printf("kv cell (%s, ring layers, 2 sequences): %ld allocations in %d decode steps x %d layers\n",
           okv_dtype_name(dtype), allocs, 400 - 2 * WINDOW, LAYERS);
    EXPECT(allocs == 0);
    allocs = 0;
    EXPECT_OK(okv_kv_cell_cache_free(kc));
    EXPECT_OK(okv_config_free(cfg));
}

int main(void) {
    test_the_wrap_counts();
    const uint32_t dtypes[3] = {OKV_DTYPE_F32, OKV_DTYPE_F16, OKV_DTYPE_Q8_0};
    for (int i = 0; i < 3; i++) {
        test_kv_sequence_decode(dtypes[i]);
        test_kv_cell_decode(dtypes[i]);
    }
    return CHECK_SUMMARY("no_alloc");
}
