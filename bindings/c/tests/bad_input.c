/* Bad input through the C API: NULL and foreign handles, freed handles,
 * out-of-range ids and layers, wrong buffer sizes. Each refusal must come back
 * as a status (never a crash) and leave the state it would have changed as it
 * was: the tests compare the state before and after. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

enum { HEADS = 2, HD = 8, CAP = 32, LAYERS = 2 };

static okv_config *make_config(uint32_t policy, size_t window, size_t max_step) {
    okv_layer_config l = {policy, window, HEADS, HD};
    return check_config(CAP, LAYERS, l, max_step);
}

static void fill(float *x, size_t n, float base) {
    for (size_t i = 0; i < n; i++) x[i] = base + 0.01f * (float)i;
}

static void test_status_names_and_last_error(void) {
    EXPECT(strcmp(okv_status_name(OKV_ERR_SHAPE), "OKV_ERR_SHAPE") == 0);
    EXPECT(strcmp(okv_status_name(999), "OKV_UNKNOWN_STATUS") == 0);
    EXPECT(strcmp(okv_status_name(-1), "OKV_UNKNOWN_STATUS") == 0);
    size_t n = 0;
    EXPECT_STATUS(okv_seq_cache_length(NULL, &n), OKV_ERR_NULL_POINTER);
    EXPECT(strstr(okv_last_error(), "okv_seq_cache_length") != NULL);
    EXPECT(strstr(okv_last_error(), "NULL") != NULL);
}

static void test_config_refusals(void) {
    okv_config *cfg = NULL;
    EXPECT_STATUS(okv_config_new(CAP, LAYERS, NULL), OKV_ERR_NULL_POINTER);
    EXPECT_OK(okv_config_new(CAP, LAYERS, &cfg));
    /* No layers yet: invalid, and no cache is built from it. */
    EXPECT_STATUS(okv_config_validate(cfg), OKV_ERR_INVALID_CONFIG);
    okv_seq_cache *sc = (okv_seq_cache *)(uintptr_t)0x1;
    EXPECT_STATUS(okv_seq_cache_new(cfg, &sc), OKV_ERR_INVALID_CONFIG);
    EXPECT(sc == (okv_seq_cache *)(uintptr_t)0x1); /* out untouched */

    okv_layer_config ring = {OKV_POLICY_RING, 8, HEADS, HD};
    EXPECT_OK(okv_config_set_layers(cfg, &ring, 1));
    size_t depth = 0, depth_after = 0;
    EXPECT_OK(okv_config_depth(cfg, 0, &depth));
    EXPECT(depth == 8);
    /* An unknown policy and a wrong count are refused; the layers stay. */
    okv_layer_config bad = {7, 8, HEADS, HD};
    EXPECT_STATUS(okv_config_set_layers(cfg, &bad, 1), OKV_ERR_INVALID_CONFIG);
    okv_layer_config three[3] = {ring, ring, ring};
    EXPECT_STATUS(okv_config_set_layers(cfg, three, 3), OKV_ERR_INVALID_CONFIG);
    EXPECT_STATUS(okv_config_set_layers(cfg, NULL, 1), OKV_ERR_NULL_POINTER);
    EXPECT_OK(okv_config_depth(cfg, 0, &depth_after));
    EXPECT(depth_after == depth);
    EXPECT_OK(okv_config_validate(cfg));
    EXPECT_STATUS(okv_config_depth(cfg, LAYERS, &depth_after), OKV_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(okv_config_depth(cfg, 0, NULL), OKV_ERR_NULL_POINTER);
    /* A window beyond the capacity is a full layer, bounded by the capacity;
     * a window of 0 and max_step 0 fail validation by name. */
    okv_layer_config wide = {OKV_POLICY_RING, CAP + 1, HEADS, HD};
    EXPECT_OK(okv_config_set_layers(cfg, &wide, 1));
    EXPECT_OK(okv_config_validate(cfg));
    EXPECT_OK(okv_config_depth(cfg, 1, &depth_after));
    EXPECT(depth_after == CAP);
    okv_layer_config empty = {OKV_POLICY_RING, 0, HEADS, HD};
    EXPECT_OK(okv_config_set_layers(cfg, &empty, 1));
    EXPECT_STATUS(okv_config_validate(cfg), OKV_ERR_INVALID_CONFIG);
    EXPECT(strstr(okv_last_error(), "window") != NULL);
    EXPECT_OK(okv_config_set_layers(cfg, &ring, 1));
    EXPECT_OK(okv_config_set_max_step(cfg, 0));
    EXPECT_STATUS(okv_config_validate(cfg), OKV_ERR_INVALID_CONFIG);
    EXPECT(strstr(okv_last_error(), "max_step") != NULL);
    EXPECT_OK(okv_config_free(cfg));
    EXPECT_OK(okv_config_free(NULL));
}

static void test_foreign_freed_and_mistyped_handles(void) {
    /* A pointer that was never a handle: refused without being read. */
    long not_a_handle[8] = {0};
    size_t n = 123;
    EXPECT_STATUS(okv_seq_cache_length((const okv_seq_cache *)(void *)not_a_handle, &n), OKV_ERR_BAD_HANDLE);
    EXPECT_STATUS(okv_kv_cell_cache_free((okv_kv_cell_cache *)(void *)not_a_handle), OKV_ERR_BAD_HANDLE);
    EXPECT(n == 123);

    okv_config *cfg = make_config(OKV_POLICY_FLAT, 0, 4);
    okv_seq_cache *sc = NULL;
    EXPECT_OK(okv_seq_cache_new(cfg, &sc));
    /* A handle of another type. */
    EXPECT_STATUS(okv_kv_seq_cache_length((const okv_kv_seq_cache *)(void *)sc, &n), OKV_ERR_BAD_HANDLE);
    EXPECT_STATUS(okv_config_validate((const okv_config *)(void *)sc), OKV_ERR_BAD_HANDLE);
    EXPECT_STATUS(okv_cell_cache_free((okv_cell_cache *)(void *)sc), OKV_ERR_BAD_HANDLE);
    /* ... which is still alive and well after those refusals. */
    size_t pos = 99;
    EXPECT_OK(okv_seq_cache_begin_step(sc, 2, &pos));
    EXPECT(pos == 0);
    EXPECT_OK(okv_seq_cache_length(sc, &n));
    EXPECT(n == 2);
    /* Use after free and double free (no handle is made in between, so the
     * address cannot have been reused). */
    EXPECT_OK(okv_seq_cache_free(sc));
    n = 7;
    EXPECT_STATUS(okv_seq_cache_length(sc, &n), OKV_ERR_BAD_HANDLE);
    EXPECT(n == 7);
    EXPECT_STATUS(okv_seq_cache_begin_step(sc, 1, &pos), OKV_ERR_BAD_HANDLE);
    EXPECT_STATUS(okv_seq_cache_free(sc), OKV_ERR_BAD_HANDLE);
    EXPECT_OK(okv_config_free(cfg));
    EXPECT_STATUS(okv_config_validate(cfg), OKV_ERR_BAD_HANDLE);
    okv_seq_cache *sc2 = NULL;
    EXPECT_STATUS(okv_seq_cache_new(cfg, &sc2), OKV_ERR_BAD_HANDLE);
    EXPECT(sc2 == NULL);
}

/* Field by field: the struct has padding, which no call defines. */
static int plan_eq(const okv_seq_plan *a, const okv_seq_plan *b) {
    int same = a->position == b->position && a->n_tokens == b->n_tokens && a->n_write == b->n_write &&
               a->n_read == b->n_read && a->read_base_pos == b->read_base_pos && a->mask_kind == b->mask_kind &&
               a->window == b->window && a->depth == b->depth;
    for (int i = 0; i < 2; i++)
        same = same && a->write[i].start == b->write[i].start && a->write[i].len == b->write[i].len &&
               a->read[i].start == b->read[i].start && a->read[i].len == b->read[i].len;
    return same;
}

static void test_sequence_refusals(void) {
    okv_config *cfg = make_config(OKV_POLICY_RING, 8, 4);
    okv_seq_cache *sc = NULL;
    EXPECT_OK(okv_seq_cache_new(cfg, &sc));
    okv_seq_plan plan, again;
    memset(&plan, 0, sizeof plan);
    /* No open step yet. */
    EXPECT_STATUS(okv_seq_cache_plan(sc, 0, &plan), OKV_ERR_STEP_PROTOCOL);
    size_t pos = 0, len = 0;
    for (int i = 0; i < 10; i++) EXPECT_OK(okv_seq_cache_begin_step(sc, 3, &pos));
    EXPECT(pos == 27);
    EXPECT_OK(okv_seq_cache_plan(sc, 1, &plan));
    EXPECT(plan.position == 27 && plan.n_tokens == 3 && plan.window == 8 && plan.depth == 11);
    EXPECT(plan.n_read >= 1 && plan.read_base_pos == 20);

    /* Each refusal: status, and length and open step's plan unchanged. */
    EXPECT_STATUS(okv_seq_cache_begin_step(sc, 0, &pos), OKV_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(okv_seq_cache_begin_step(sc, 5, &pos), OKV_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(okv_seq_cache_begin_step(sc, 3, NULL), OKV_ERR_NULL_POINTER);
    EXPECT_STATUS(okv_seq_cache_begin_step(sc, 4, &pos), OKV_ERR_OUT_OF_CAPACITY);
    EXPECT_STATUS(okv_seq_cache_rewind(sc, 31), OKV_ERR_INVALID_ARGUMENT);
    size_t lo = 0;
    EXPECT_OK(okv_seq_cache_min_rewind(sc, &lo));
    EXPECT(lo > 0);
    EXPECT_STATUS(okv_seq_cache_rewind(sc, lo - 1), OKV_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(okv_seq_cache_plan(sc, LAYERS, &again), OKV_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(okv_seq_cache_plan(sc, SIZE_MAX, &again), OKV_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(okv_seq_cache_plan(sc, 0, NULL), OKV_ERR_NULL_POINTER);
    EXPECT_OK(okv_seq_cache_length(sc, &len));
    EXPECT(len == 30);
    EXPECT_OK(okv_seq_cache_plan(sc, 1, &again));
    EXPECT(plan_eq(&plan, &again));
    EXPECT(pos == 27);
    /* Filling to capacity: the next step is out of capacity, state unchanged. */
    bool ok = true;
    EXPECT_OK(okv_seq_cache_begin_step(sc, 2, &pos));
    EXPECT_OK(okv_seq_cache_can_extend(sc, 1, &ok));
    EXPECT(!ok);
    EXPECT_STATUS(okv_seq_cache_begin_step(sc, 1, &pos), OKV_ERR_OUT_OF_CAPACITY);
    EXPECT_OK(okv_seq_cache_length(sc, &len));
    EXPECT(len == CAP);
    /* rewind and clear close the step. */
    EXPECT_OK(okv_seq_cache_rewind(sc, 31));
    EXPECT_STATUS(okv_seq_cache_plan(sc, 0, &again), OKV_ERR_STEP_PROTOCOL);
    EXPECT_OK(okv_seq_cache_clear(sc));
    EXPECT_OK(okv_seq_cache_length(sc, &len));
    EXPECT(len == 0);
    EXPECT_OK(okv_seq_cache_free(sc));
    EXPECT_OK(okv_config_free(cfg));
}

/* softmax(q k^T / sqrt(HD)) v for one token of one query head over `n` keys. */
static void reference(const float *q, const float *k, const float *v, size_t n, float *out) {
    double w[CAP], mx = -INFINITY, sum = 0;
    for (size_t j = 0; j < n; j++) {
        double s = 0;
        for (size_t d = 0; d < HD; d++) s += (double)q[d] * k[j * HD + d];
        w[j] = s / sqrt((double)HD);
        if (w[j] > mx) mx = w[j];
    }
    for (size_t j = 0; j < n; j++) sum += (w[j] = exp(w[j] - mx));
    for (size_t d = 0; d < HD; d++) {
        double acc = 0;
        for (size_t j = 0; j < n; j++) acc += w[j] * v[j * HD + d];
        out[d] = (float)(acc / sum);
    }
}

static void test_kv_sequence(void) {
    okv_config *cfg = make_config(OKV_POLICY_FLAT, 0, 4);
    okv_kv_seq_cache *kv = NULL;
    EXPECT_OK(okv_kv_seq_cache_new(cfg, &kv));
    enum { T = 3, ROWS = HEADS * T * HD, QH = 4 };
    float k[ROWS], v[ROWS], q[QH * HD], out[QH * HD], out2[QH * HD];
    float hist_k[HEADS][CAP * HD], hist_v[HEADS][CAP * HD];
    size_t pos = 0;
    /* Two steps of 3 tokens, then one decode token, on both layers. */
    for (int step = 0; step < 2; step++) {
        EXPECT_OK(okv_kv_seq_cache_begin_step(kv, T, &pos));
        fill(k, ROWS, (float)step);
        fill(v, ROWS, -(float)step);
        for (size_t layer = 0; layer < LAYERS; layer++) EXPECT_OK(okv_kv_seq_cache_update(kv, layer, k, ROWS, v, ROWS));
        for (size_t h = 0; h < HEADS; h++)
            for (size_t t = 0; t < T; t++) {
                memcpy(hist_k[h] + (pos + t) * HD, k + (h * T + t) * HD, HD * sizeof(float));
                memcpy(hist_v[h] + (pos + t) * HD, v + (h * T + t) * HD, HD * sizeof(float));
            }
    }
    EXPECT_OK(okv_kv_seq_cache_begin_step(kv, 1, &pos));
    EXPECT(pos == 6);
    float k1[HEADS * HD], v1[HEADS * HD];
    fill(k1, HEADS * HD, 0.5f);
    fill(v1, HEADS * HD, 0.25f);
    for (size_t h = 0; h < HEADS; h++) {
        memcpy(hist_k[h] + 6 * HD, k1 + h * HD, HD * sizeof(float));
        memcpy(hist_v[h] + 6 * HD, v1 + h * HD, HD * sizeof(float));
    }

    okv_pool_view before, after;
    EXPECT_OK(okv_kv_seq_cache_pool(kv, 0, &before));
    size_t pool_n = before.n_kv_heads * before.slots * before.head_dim;
    float *snap = (float *)malloc(pool_n * sizeof(float));
    memcpy(snap, before.k, pool_n * sizeof(float));
    /* Wrong sizes, NULL rows, rows aliasing the pool: refused, pool unchanged. */
    EXPECT_STATUS(okv_kv_seq_cache_update(kv, 0, k1, HEADS * HD - 1, v1, HEADS * HD), OKV_ERR_SHAPE);
    EXPECT_STATUS(okv_kv_seq_cache_update(kv, 0, k1, HEADS * HD, v1, HEADS * HD + 1), OKV_ERR_SHAPE);
    EXPECT_STATUS(okv_kv_seq_cache_update(kv, 0, NULL, HEADS * HD, v1, HEADS * HD), OKV_ERR_NULL_POINTER);
    EXPECT_STATUS(okv_kv_seq_cache_update(kv, 0, before.k, HEADS * HD, v1, HEADS * HD), OKV_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(okv_kv_seq_cache_update(kv, 0, (const float *)((const char *)k1 + 1), HEADS * HD, v1, HEADS * HD),
                  OKV_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(okv_kv_seq_cache_update(kv, LAYERS, k1, HEADS * HD, v1, HEADS * HD), OKV_ERR_INVALID_ARGUMENT);
    EXPECT_OK(okv_kv_seq_cache_pool(kv, 0, &after));
    EXPECT(after.k == before.k && after.slots == before.slots);
    EXPECT(memcmp(snap, after.k, pool_n * sizeof(float)) == 0);
    free(snap);

    for (size_t layer = 0; layer < LAYERS; layer++)
        EXPECT_OK(okv_kv_seq_cache_update(kv, layer, k1, HEADS * HD, v1, HEADS * HD));
    fill(q, QH * HD, 0.1f);
    for (size_t i = 0; i < QH * HD; i++) out[i] = out2[i] = 42.0f;
    /* Bad attend calls leave `out` untouched. */
    EXPECT_STATUS(okv_kv_seq_cache_attend(kv, 0, q, QH * HD, QH, out, QH * HD - 1, NULL), OKV_ERR_SHAPE);
    EXPECT_STATUS(okv_kv_seq_cache_attend(kv, 0, q, QH * HD - 1, QH, out, QH * HD, NULL), OKV_ERR_SHAPE);
    EXPECT_STATUS(okv_kv_seq_cache_attend(kv, 0, q, QH * HD, 3, out, QH * HD, NULL), OKV_ERR_SHAPE);
    EXPECT_STATUS(okv_kv_seq_cache_attend(kv, 0, q, QH * HD, QH, NULL, QH * HD, NULL), OKV_ERR_NULL_POINTER);
    EXPECT_STATUS(okv_kv_seq_cache_attend(kv, 0, q, QH * HD, QH, q, QH * HD, NULL), OKV_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(okv_kv_seq_cache_attend(kv, 0, q, QH * HD, QH, (float *)after.k, QH * HD, NULL),
                  OKV_ERR_INVALID_ARGUMENT);
    okv_attend_options bad_backend = {0.0f, 1, 9};
    EXPECT_STATUS(okv_kv_seq_cache_attend(kv, 0, q, QH * HD, QH, out, QH * HD, &bad_backend), OKV_ERR_INVALID_ARGUMENT);
    okv_attend_options nan_scale = {NAN, 1, OKV_BACKEND_NATIVE};
    EXPECT_STATUS(okv_kv_seq_cache_attend(kv, 0, q, QH * HD, QH, out, QH * HD, &nan_scale), OKV_ERR_INVALID_ARGUMENT);
    EXPECT(memcmp(out, out2, sizeof out) == 0);

    /* The real call matches a float64 reference over the 7 tokens written. */
    okv_attend_options opts = {0.0f, 1, OKV_BACKEND_NATIVE};
    EXPECT_OK(okv_kv_seq_cache_attend(kv, 1, q, QH * HD, QH, out, QH * HD, &opts));
    double worst = 0;
    for (size_t h = 0; h < QH; h++) {
        float ref[HD];
        size_t kvh = h / (QH / HEADS);
        reference(q + h * HD, hist_k[kvh], hist_v[kvh], 7, ref);
        for (size_t d = 0; d < HD; d++) {
            double e = fabs((double)ref[d] - out[h * HD + d]);
            if (e > worst) worst = e;
        }
    }
    EXPECT(worst < 1e-5);
    size_t nbytes = 0;
    EXPECT_OK(okv_kv_seq_cache_nbytes(kv, &nbytes));
    EXPECT(nbytes > 0);
    EXPECT_OK(okv_kv_seq_cache_free(kv));
    EXPECT_OK(okv_config_free(cfg));
}

static void test_cell_refusals(void) {
    okv_config *cfg = make_config(OKV_POLICY_FLAT, 0, 8);
    okv_cell_cache *cc = NULL;
    EXPECT_STATUS(okv_cell_cache_new(cfg, 0, 4, &cc), OKV_ERR_INVALID_ARGUMENT);
    EXPECT(cc == NULL);
    EXPECT_OK(okv_cell_cache_new(cfg, 16, 4, &cc));
    uint64_t a = 0, b = 0;
    EXPECT_OK(okv_cell_cache_seq_new(cc, &a));
    uint64_t ids[3] = {a, a, a};
    size_t pos[3] = {0, 1, 2};
    EXPECT_OK(okv_cell_cache_begin_step(cc, ids, pos, 3));
    EXPECT_OK(okv_cell_cache_seq_clone(cc, a, OKV_NONE, &b));
    EXPECT(b != a);

    size_t free0 = 0, free1 = 0, len_a = 0, len_b = 0, n = 0;
    EXPECT_OK(okv_cell_cache_free_cells(cc, &free0));
    EXPECT(free0 == 13);
    /* Unknown ids (never handed out, beyond any SeqId), bad positions, NULL
     * arrays: refused, nothing placed. */
    uint64_t unknown[2] = {a, 777};
    size_t p2[2] = {3, 3};
    EXPECT_STATUS(okv_cell_cache_begin_step(cc, unknown, p2, 2), OKV_ERR_UNKNOWN_SEQUENCE);
    uint64_t huge[1] = {(uint64_t)1 << 40};
    EXPECT_STATUS(okv_cell_cache_begin_step(cc, huge, p2, 1), OKV_ERR_UNKNOWN_SEQUENCE);
    uint64_t twice[2] = {a, a};
    EXPECT_STATUS(okv_cell_cache_begin_step(cc, twice, p2, 2), OKV_ERR_INVALID_ARGUMENT);
    size_t rewrite[1] = {1};
    EXPECT_STATUS(okv_cell_cache_begin_step(cc, ids, rewrite, 1), OKV_ERR_STEP_PROTOCOL);
    EXPECT_STATUS(okv_cell_cache_begin_step(cc, NULL, p2, 1), OKV_ERR_NULL_POINTER);
    EXPECT_STATUS(okv_cell_cache_begin_step(cc, ids, NULL, 1), OKV_ERR_NULL_POINTER);
    uint64_t many[9] = {a, a, a, a, a, a, a, a, a};
    size_t mpos[9] = {3, 4, 5, 6, 7, 8, 9, 10, 11};
    EXPECT_STATUS(okv_cell_cache_begin_step(cc, many, mpos, 9), OKV_ERR_INVALID_ARGUMENT); /* > max_step */
    EXPECT_OK(okv_cell_cache_free_cells(cc, &free1));
    EXPECT(free1 == free0);
    EXPECT_OK(okv_cell_cache_seq_len(cc, a, &len_a));
    EXPECT_OK(okv_cell_cache_seq_len(cc, b, &len_b));
    EXPECT(len_a == 3 && len_b == 3);
    EXPECT_STATUS(okv_cell_cache_seq_len(cc, 777, &n), OKV_ERR_UNKNOWN_SEQUENCE);
    EXPECT_STATUS(okv_cell_cache_next_pos(cc, a, NULL), OKV_ERR_NULL_POINTER);

    /* The clone closed the step: plan refuses rather than serve it stale. */
    okv_cell_plan plan;
    EXPECT_STATUS(okv_cell_cache_plan(cc, 0, &plan), OKV_ERR_STEP_PROTOCOL);
    uint64_t both[2] = {a, b};
    size_t at3[2] = {3, 3};
    EXPECT_OK(okv_cell_cache_begin_step(cc, both, at3, 2));
    EXPECT_OK(okv_cell_cache_plan(cc, 0, &plan));
    EXPECT(plan.n_tokens == 2 && plan.positions[0] == 3 && plan.positions[1] == 3);
    EXPECT(plan.cells[0] != plan.cells[1] && plan.read_len == 5);
    EXPECT_STATUS(okv_cell_cache_plan(cc, LAYERS, &plan), OKV_ERR_INVALID_ARGUMENT);

    /* visible: too small a buffer reports the count needed and writes nothing. */
    okv_run runs[4];
    memset(runs, 0xAB, sizeof runs);
    okv_run pristine[4];
    memcpy(pristine, runs, sizeof runs);
    EXPECT_STATUS(okv_cell_cache_visible(cc, 0, 1, runs, 1, &n), OKV_ERR_BUFFER_TOO_SMALL);
    EXPECT(n == 2);
    EXPECT(memcmp(runs, pristine, sizeof runs) == 0);
    EXPECT_OK(okv_cell_cache_visible(cc, 0, 1, runs, 4, &n));
    EXPECT(n == 2 && runs[0].start == 0 && runs[0].len == 3 && runs[1].start == plan.cells[1] && runs[1].len == 1);
    EXPECT_STATUS(okv_cell_cache_visible(cc, 0, 2, runs, 4, &n), OKV_ERR_INVALID_ARGUMENT);
    /* The dense mask agrees with the runs. */
    const uint8_t *mask = NULL;
    size_t rows = 0, cols = 0;
    EXPECT_OK(okv_cell_cache_dense_mask(cc, 0, &mask, &rows, &cols));
    EXPECT(rows == 2 && cols == 5);
    if (mask && rows == 2 && cols == 5) {
        EXPECT(mask[cols + 0] && mask[cols + 1] && mask[cols + 2] && mask[cols + plan.cells[1]]);
        EXPECT(!mask[cols + plan.cells[0]]);
    }

    /* seq_free twice, and a freed id everywhere. */
    EXPECT_OK(okv_cell_cache_seq_free(cc, b));
    EXPECT_STATUS(okv_cell_cache_seq_free(cc, b), OKV_ERR_UNKNOWN_SEQUENCE);
    uint64_t c = 555;
    EXPECT_STATUS(okv_cell_cache_seq_clone(cc, b, OKV_NONE, &c), OKV_ERR_UNKNOWN_SEQUENCE);
    EXPECT(c == 555);
    EXPECT_STATUS(okv_cell_cache_seq_rm(cc, b, 0, OKV_NONE), OKV_ERR_UNKNOWN_SEQUENCE);
    EXPECT_OK(okv_cell_cache_seq_rm(cc, a, 2, OKV_NONE));
    EXPECT_OK(okv_cell_cache_next_pos(cc, a, &n));
    EXPECT(n == 2);
    EXPECT_OK(okv_cell_cache_clear(cc));
    EXPECT_STATUS(okv_cell_cache_seq_len(cc, a, &n), OKV_ERR_UNKNOWN_SEQUENCE);
    EXPECT_OK(okv_cell_cache_free(cc));
    EXPECT_OK(okv_config_free(cfg));
}

static void test_kv_cell(void) {
    okv_config *cfg = make_config(OKV_POLICY_RING, 4, 2);
    okv_kv_cell_cache *kc = NULL;
    EXPECT_OK(okv_kv_cell_cache_new(cfg, 16, 2, &kc));
    uint64_t s = 0;
    EXPECT_OK(okv_kv_cell_cache_seq_new(kc, &s));
    float k[HEADS * HD], v[HEADS * HD], q[HEADS * HD], out[HEADS * HD];
    fill(k, HEADS * HD, 1.0f);
    fill(v, HEADS * HD, 2.0f);
    fill(q, HEADS * HD, 0.3f);
    for (size_t p = 0; p < 6; p++) {
        EXPECT_OK(okv_kv_cell_cache_begin_step(kc, &s, &p, 1));
        for (size_t layer = 0; layer < LAYERS; layer++) {
            EXPECT_OK(okv_kv_cell_cache_update(kc, layer, k, HEADS * HD, v, HEADS * HD));
            EXPECT_OK(okv_kv_cell_cache_attend(kc, layer, q, HEADS * HD, HEADS, out, HEADS * HD, NULL));
        }
    }
    /* Every key holds the same rows, so attention returns v exactly-ish. */
    EXPECT(fabsf(out[0] - v[0]) < 1e-5f && fabsf(out[HD + 3] - v[HD + 3]) < 1e-5f);
    okv_pool_view pv;
    EXPECT_OK(okv_kv_cell_cache_pool(kc, 0, &pv));
    EXPECT(pv.n_kv_heads == HEADS && pv.head_dim == HD && pv.slots >= 5);
    /* The ring keeps 4 + 2 - 1 positions of the sequence. */
    okv_cell_plan plan;
    EXPECT_OK(okv_kv_cell_cache_plan(kc, 0, &plan));
    EXPECT(plan.window == 4);
    size_t n = 0;
    okv_run runs[8];
    EXPECT_OK(okv_kv_cell_cache_visible(kc, 0, 0, runs, 8, &n));
    size_t seen = 0;
    for (size_t i = 0; i < n; i++) seen += runs[i].len;
    EXPECT(seen == 4);
    /* A rewrite of a held position, a wrong-size row: refused. */
    size_t old = 3;
    EXPECT_STATUS(okv_kv_cell_cache_begin_step(kc, &s, &old, 1), OKV_ERR_STEP_PROTOCOL);
    EXPECT_OK(okv_kv_cell_cache_plan(kc, 0, &plan)); /* the previous step stays open */
    EXPECT(plan.positions[0] == 5);
    EXPECT_STATUS(okv_kv_cell_cache_update(kc, 0, k, HD, v, HEADS * HD), OKV_ERR_SHAPE);
    /* The registry: install, a taken key, lookup, erase on free. */
    EXPECT_OK(okv_registry_install("c-test-kv", kc));
    EXPECT_STATUS(okv_registry_install("c-test-kv", kc), OKV_ERR_KEY_EXISTS);
    EXPECT_STATUS(okv_registry_install("", kc), OKV_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(okv_registry_install(NULL, kc), OKV_ERR_NULL_POINTER);
    int local = 0;
    EXPECT_STATUS(okv_registry_install("c-test-foreign", &local), OKV_ERR_BAD_HANDLE);
    EXPECT_STATUS(okv_registry_install("c-test-bad-utf8-\xff", kc), OKV_ERR_INVALID_ARGUMENT);
    okv_handle_kind kind = OKV_HANDLE_CONFIG;
    void *got = NULL;
    EXPECT_OK(okv_registry_get("c-test-kv", &kind, &got));
    EXPECT(kind == OKV_HANDLE_KV_CELL_CACHE && got == (void *)kc);
    EXPECT_STATUS(okv_registry_get("c-test-missing", &kind, &got), OKV_ERR_NOT_FOUND);
    EXPECT(got == (void *)kc);
    char key[8];
    size_t key_len = 0;
    memset(key, 'x', sizeof key);
    EXPECT_STATUS(okv_registry_unique_key("c-test-prefix-", key, sizeof key, &key_len), OKV_ERR_BUFFER_TOO_SMALL);
    EXPECT(key_len > sizeof key && key[0] == 'x');
    char big[64];
    EXPECT_OK(okv_registry_unique_key("c-test-", big, sizeof big, &key_len));
    EXPECT(strncmp(big, "c-test-", 7) == 0 && strlen(big) == key_len);
    bool found = false;
    EXPECT_OK(okv_kv_cell_cache_free(kc));
    EXPECT_OK(okv_registry_contains("c-test-kv", &found));
    EXPECT(!found);
    EXPECT_STATUS(okv_registry_erase("c-test-kv"), OKV_ERR_NOT_FOUND);
    EXPECT_OK(okv_config_free(cfg));
}

/* A builder that makes a KV sequence cache; user_data counts its calls. */
static int32_t build_kv_seq(const okv_config *cfg, void *user_data, void **out) {
    (*(int *)user_data)++;
    okv_kv_seq_cache *kv = NULL;
    okv_status s = okv_kv_seq_cache_new(cfg, &kv);
    if (s != OKV_OK) return (int32_t)s;
    *out = kv;
    return 0;
}

static int32_t build_fails(const okv_config *cfg, void *user_data, void **out) {
    (void)cfg, (void)out;
    (*(int *)user_data)++;
    return 42;
}

static int32_t build_garbage(const okv_config *cfg, void *user_data, void **out) {
    (void)cfg;
    *out = user_data; /* not a handle */
    return 0;
}

/* The cell count a forked workload needs (the runners size their caches with it). */
static void test_cells_for_forks(void) {
    /* Ring layers, window 8, max_step 4: a sequence keeps at most 8 + 4 - 1 = 11
     * positions, plus one cell of headroom: min(100, 11) + 3 * min(20, 11) + 3. */
    okv_config *cfg = make_config(OKV_POLICY_RING, 8, 4);
    size_t n = 0;
    EXPECT_OK(okv_cells_for_forks(cfg, 100, 3, 20, &n));
    EXPECT(n == 47);
    size_t depth = 0, depth_after = 0;
    EXPECT_OK(okv_config_depth(cfg, 0, &depth));

    /* Each refusal leaves the out-parameter and the config as they were. */
    long not_a_handle[8] = {0};
    size_t kept = 777;
    EXPECT_STATUS(okv_cells_for_forks(NULL, 100, 3, 20, &kept), OKV_ERR_NULL_POINTER);
    EXPECT_STATUS(okv_cells_for_forks(cfg, 100, 3, 20, NULL), OKV_ERR_NULL_POINTER);
    EXPECT_STATUS(okv_cells_for_forks((const okv_config *)(void *)not_a_handle, 100, 3, 20, &kept),
                  OKV_ERR_BAD_HANDLE);
    EXPECT_STATUS(okv_cells_for_forks(cfg, 100, SIZE_MAX, 2, &kept), OKV_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(okv_last_error(), "okv_cells_for_forks") != NULL);
    EXPECT(kept == 777);
    EXPECT_OK(okv_config_set_max_step(cfg, 0));
    EXPECT_STATUS(okv_cells_for_forks(cfg, 100, 3, 20, &kept), OKV_ERR_INVALID_CONFIG);
    EXPECT(kept == 777);
    EXPECT_OK(okv_config_set_max_step(cfg, 4));
    EXPECT_OK(okv_config_depth(cfg, 0, &depth_after));
    EXPECT(depth_after == depth);
    EXPECT_OK(okv_cells_for_forks(cfg, 100, 3, 20, &n));
    EXPECT(n == 47);

    /* A flat layer holds the prefix once plus every sequence's tokens: 100 + 3 * 20. */
    okv_layer_config mixed[LAYERS] = {{OKV_POLICY_RING, 8, HEADS, HD}, {OKV_POLICY_FLAT, 0, HEADS, HD}};
    EXPECT_OK(okv_config_set_layers(cfg, mixed, LAYERS));
    EXPECT_OK(okv_cells_for_forks(cfg, 100, 3, 20, &n));
    EXPECT(n == 160);

    /* The count is enough: a cache of exactly that many cells takes the whole
     * workload (a 10-token prefix in steps of 4, two forks, 6 steps of 3 tokens). */
    EXPECT_OK(okv_config_set_layers(cfg, mixed, 1));
    EXPECT_OK(okv_cells_for_forks(cfg, 10, 3, 6, &n));
    EXPECT(n == 10 + 3 * 6 + 3);
    okv_cell_cache *cc = NULL;
    EXPECT_OK(okv_cell_cache_new(cfg, n, 4, &cc));
    uint64_t ids[3] = {0, 0, 0};
    size_t pos[4] = {0, 0, 0, 0};
    EXPECT_OK(okv_cell_cache_seq_new(cc, &ids[0]));
    for (size_t p = 0; p < 10; p += 4) {
        size_t t = 10 - p < 4 ? 10 - p : 4;
        uint64_t same[4] = {ids[0], ids[0], ids[0], ids[0]};
        for (size_t i = 0; i < t; i++) pos[i] = p + i;
        EXPECT_OK(okv_cell_cache_begin_step(cc, same, pos, t));
    }
    EXPECT_OK(okv_cell_cache_seq_clone(cc, ids[0], OKV_NONE, &ids[1]));
    EXPECT_OK(okv_cell_cache_seq_clone(cc, ids[0], OKV_NONE, &ids[2]));
    for (size_t step = 0; step < 6; step++) {
        for (size_t i = 0; i < 3; i++) pos[i] = 10 + step;
        EXPECT_OK(okv_cell_cache_begin_step(cc, ids, pos, 3));
    }
    EXPECT_OK(okv_cell_cache_free(cc));
    EXPECT_OK(okv_config_free(cfg));
}

static void test_registry_builders(void) {
    int calls = 0;
    EXPECT_STATUS(okv_registry_register_builder("c-test", "kv", NULL, &calls), OKV_ERR_NULL_POINTER);
    bool found = true;
    EXPECT_OK(okv_registry_has_builder("c-test", "kv", &found));
    EXPECT(!found);
    EXPECT_OK(okv_registry_register_builder("c-test", "kv", build_kv_seq, &calls));
    EXPECT_OK(okv_registry_register_builder("c-test", "fails", build_fails, &calls));
    EXPECT_OK(okv_registry_register_builder("c-test", "garbage", build_garbage, &calls));
    EXPECT_OK(okv_registry_has_builder("c-test", "kv", &found));
    EXPECT(found);
    /* The pair is the key, not a concatenation. */
    EXPECT_OK(okv_registry_has_builder("c-testkv", "", &found));
    EXPECT(!found);

    okv_config *good = make_config(OKV_POLICY_FLAT, 0, 2), *bad = NULL;
    EXPECT_OK(okv_config_new(CAP, LAYERS, &bad)); /* no layers: invalid */
    okv_handle_kind kind = OKV_HANDLE_CONFIG;
    void *h = NULL;
    /* An invalid config is refused before the builder runs. */
    EXPECT_STATUS(okv_registry_build("c-test", "kv", bad, &kind, &h), OKV_ERR_INVALID_CONFIG);
    EXPECT(calls == 0 && h == NULL);
    EXPECT_STATUS(okv_registry_build("c-test", "nope", good, &kind, &h), OKV_ERR_NOT_FOUND);
    EXPECT_STATUS(okv_registry_build("c-test", "fails", good, &kind, &h), OKV_ERR_BACKEND);
    EXPECT(calls == 1 && h == NULL);
    EXPECT_STATUS(okv_registry_build("c-test", "garbage", good, &kind, &h), OKV_ERR_INVALID_ARGUMENT);
    EXPECT(h == NULL);
    EXPECT_STATUS(okv_registry_build("c-test", "kv", good, NULL, &h), OKV_ERR_NULL_POINTER);
    EXPECT(calls == 1);
    EXPECT_OK(okv_registry_build("c-test", "kv", good, &kind, &h));
    EXPECT(calls == 2 && kind == OKV_HANDLE_KV_SEQ_CACHE && h != NULL);
    size_t cap = 0;
    EXPECT_OK(okv_kv_seq_cache_capacity((const okv_kv_seq_cache *)h, &cap));
    EXPECT(cap == CAP);
    EXPECT_OK(okv_kv_seq_cache_free((okv_kv_seq_cache *)h));
    EXPECT_OK(okv_config_free(good));
    EXPECT_OK(okv_config_free(bad));
}

int main(void) {
    test_status_names_and_last_error();
    test_config_refusals();
    test_foreign_freed_and_mistyped_handles();
    test_sequence_refusals();
    test_kv_sequence();
    test_cell_refusals();
    test_kv_cell();
    test_cells_for_forks();
    test_registry_builders();
    return CHECK_SUMMARY("bad_input");
}
