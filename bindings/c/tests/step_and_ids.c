/* Two refusals through the C API, each leaving the state as it was:
 * attending a layer the open step has not updated (OKV_ERR_STEP_PROTOCOL,
 * naming the layer, `out` untouched), and a sequence id of another cache
 * (ids are unique in the process: OKV_ERR_UNKNOWN_SEQUENCE). */
#include <stdint.h>
#include <string.h>

#include "check.h"

enum { HEADS = 2, QH = 4, HD = 8, CAP = 32, LAYERS = 2, N = HEADS * HD, QN = QH * HD };

static okv_config *make_config(void) {
    okv_config *cfg = NULL;
    okv_layer_config layers[LAYERS] = {{OKV_POLICY_FLAT, 0, HEADS, HD}, {OKV_POLICY_RING, 4, HEADS, HD}};
    EXPECT_OK(okv_config_new(CAP, LAYERS, &cfg));
    EXPECT_OK(okv_config_set_layers(cfg, layers, LAYERS));
    EXPECT_OK(okv_config_set_max_step(cfg, 4));
    return cfg;
}

static void fill(float *x, size_t n, float base) {
    for (size_t i = 0; i < n; i++) x[i] = base + 0.01f * (float)i;
}

/* `out` is all `sentinel`, as the refused call must leave it. */
static int untouched(const float *out, size_t n, float sentinel) {
    for (size_t i = 0; i < n; i++)
        if (out[i] != sentinel) return 0;
    return 1;
}

static int names_layer(size_t layer) {
    char want[32];
    snprintf(want, sizeof want, "layer %zu", layer);
    return strstr(okv_last_error(), want) != NULL && strstr(okv_last_error(), "not updated") != NULL;
}

static void test_seq_attend_before_update(void) {
    okv_config *cfg = make_config();
    okv_kv_seq_cache *kv = NULL;
    EXPECT_OK(okv_kv_seq_cache_new(cfg, &kv));
    float k[N], v[N], q[QN], out[QN];
    fill(k, N, 0.5f);
    fill(v, N, -0.5f);
    fill(q, QN, 0.1f);
    size_t pos = 0, len = 0, bytes = 0, bytes_after = 0;
    /* No step open: refused too. */
    for (size_t i = 0; i < QN; i++) out[i] = 7.0f;
    EXPECT_STATUS(okv_kv_seq_cache_attend(kv, 0, q, QN, QH, out, QN, NULL), OKV_ERR_STEP_PROTOCOL);
    EXPECT(untouched(out, QN, 7.0f));
    EXPECT_OK(okv_kv_seq_cache_begin_step(kv, 1, &pos));
    EXPECT_OK(okv_kv_seq_cache_nbytes(kv, &bytes));
    for (size_t layer = 0; layer < LAYERS; layer++) {
        EXPECT_STATUS(okv_kv_seq_cache_attend(kv, layer, q, QN, QH, out, QN, NULL), OKV_ERR_STEP_PROTOCOL);
        EXPECT(names_layer(layer));
        EXPECT(untouched(out, QN, 7.0f));
    }
    EXPECT_OK(okv_kv_seq_cache_length(kv, &len));
    EXPECT_OK(okv_kv_seq_cache_nbytes(kv, &bytes_after));
    EXPECT(len == 1 && bytes_after == bytes);
    EXPECT_OK(okv_kv_seq_cache_update(kv, 0, k, N, v, N));
    EXPECT_OK(okv_kv_seq_cache_attend(kv, 0, q, QN, QH, out, QN, NULL));
    EXPECT(!untouched(out, QN, 7.0f));
    /* Layer 1 is still unwritten in this step. */
    for (size_t i = 0; i < QN; i++) out[i] = 7.0f;
    EXPECT_STATUS(okv_kv_seq_cache_attend(kv, 1, q, QN, QH, out, QN, NULL), OKV_ERR_STEP_PROTOCOL);
    EXPECT(names_layer(1));
    EXPECT(untouched(out, QN, 7.0f));
    EXPECT_OK(okv_kv_seq_cache_update(kv, 1, k, N, v, N));
    /* The next step: the last step's writes do not count. */
    EXPECT_OK(okv_kv_seq_cache_begin_step(kv, 1, &pos));
    EXPECT_STATUS(okv_kv_seq_cache_attend(kv, 0, q, QN, QH, out, QN, NULL), OKV_ERR_STEP_PROTOCOL);
    EXPECT(names_layer(0));
    /* A refused update (wrong length) marks nothing. */
    EXPECT_STATUS(okv_kv_seq_cache_update(kv, 0, k, N - 1, v, N), OKV_ERR_SHAPE);
    EXPECT_STATUS(okv_kv_seq_cache_attend(kv, 0, q, QN, QH, out, QN, NULL), OKV_ERR_STEP_PROTOCOL);
    EXPECT(untouched(out, QN, 7.0f));
    EXPECT_OK(okv_kv_seq_cache_update(kv, 0, k, N, v, N));
    EXPECT_OK(okv_kv_seq_cache_attend(kv, 0, q, QN, QH, out, QN, NULL));
    EXPECT_OK(okv_kv_seq_cache_free(kv));
    EXPECT_OK(okv_config_free(cfg));
}

static void test_cell_attend_before_update(void) {
    okv_config *cfg = make_config();
    okv_kv_cell_cache *kc = NULL;
    EXPECT_OK(okv_kv_cell_cache_new(cfg, 16, 2, &kc));
    uint64_t s = 0;
    EXPECT_OK(okv_kv_cell_cache_seq_new(kc, &s));
    float k[N], v[N], q[QN], out[QN];
    fill(k, N, 0.5f);
    fill(v, N, -0.5f);
    fill(q, QN, 0.1f);
    size_t p0 = 0, p1 = 1, free0 = 0, free1 = 0;
    EXPECT_OK(okv_kv_cell_cache_begin_step(kc, &s, &p0, 1));
    EXPECT_OK(okv_kv_cell_cache_free_cells(kc, &free0));
    for (size_t i = 0; i < QN; i++) out[i] = 7.0f;
    EXPECT_STATUS(okv_kv_cell_cache_attend(kc, 1, q, QN, QH, out, QN, NULL), OKV_ERR_STEP_PROTOCOL);
    EXPECT(names_layer(1));
    EXPECT(untouched(out, QN, 7.0f));
    EXPECT_OK(okv_kv_cell_cache_free_cells(kc, &free1));
    EXPECT(free1 == free0);
    EXPECT_OK(okv_kv_cell_cache_update(kc, 1, k, N, v, N));
    EXPECT_OK(okv_kv_cell_cache_attend(kc, 1, q, QN, QH, out, QN, NULL));
    EXPECT_OK(okv_kv_cell_cache_update(kc, 0, k, N, v, N));
    EXPECT_OK(okv_kv_cell_cache_begin_step(kc, &s, &p1, 1));
    for (size_t i = 0; i < QN; i++) out[i] = 7.0f;
    EXPECT_STATUS(okv_kv_cell_cache_attend(kc, 0, q, QN, QH, out, QN, NULL), OKV_ERR_STEP_PROTOCOL);
    EXPECT(names_layer(0));
    EXPECT(untouched(out, QN, 7.0f));
    EXPECT_OK(okv_kv_cell_cache_free(kc));
    EXPECT_OK(okv_config_free(cfg));
}

static void test_ids_across_caches(void) {
    okv_config *cfg = make_config();
    okv_cell_cache *a = NULL, *b = NULL;
    okv_kv_cell_cache *c = NULL;
    EXPECT_OK(okv_cell_cache_new(cfg, 8, 2, &a));
    EXPECT_OK(okv_cell_cache_new(cfg, 8, 2, &b));
    EXPECT_OK(okv_kv_cell_cache_new(cfg, 8, 2, &c));
    uint64_t x = 0, y = 0, z = 0, kept = 12345;
    EXPECT_OK(okv_cell_cache_seq_new(a, &x));
    EXPECT_OK(okv_cell_cache_seq_new(b, &y));
    EXPECT_OK(okv_kv_cell_cache_seq_new(c, &z));
    EXPECT(x != y && y != z && x != z);
    EXPECT(x <= (uint64_t)INT64_MAX && y <= (uint64_t)INT64_MAX && z <= (uint64_t)INT64_MAX);
    size_t p = 0, n = 0, free_before = 0, free_after = 0;
    EXPECT_OK(okv_cell_cache_begin_step(b, &y, &p, 1));
    EXPECT_OK(okv_cell_cache_free_cells(b, &free_before));
    /* x belongs to a: b refuses it in every verb, out-parameters untouched. */
    n = 99;
    EXPECT_STATUS(okv_cell_cache_next_pos(b, x, &n), OKV_ERR_UNKNOWN_SEQUENCE);
    EXPECT(n == 99);
    EXPECT_STATUS(okv_cell_cache_seq_len(b, x, &n), OKV_ERR_UNKNOWN_SEQUENCE);
    EXPECT(n == 99);
    EXPECT_STATUS(okv_cell_cache_seq_clone(b, x, OKV_NONE, &kept), OKV_ERR_UNKNOWN_SEQUENCE);
    EXPECT(kept == 12345);
    EXPECT_STATUS(okv_cell_cache_seq_rm(b, x, 0, OKV_NONE), OKV_ERR_UNKNOWN_SEQUENCE);
    EXPECT_STATUS(okv_cell_cache_begin_step(b, &x, &p, 1), OKV_ERR_UNKNOWN_SEQUENCE);
    EXPECT_STATUS(okv_cell_cache_seq_free(b, x), OKV_ERR_UNKNOWN_SEQUENCE);
    EXPECT_STATUS(okv_kv_cell_cache_seq_free(c, x), OKV_ERR_UNKNOWN_SEQUENCE);
    EXPECT(strstr(okv_last_error(), "not live in this cache") != NULL);
    /* b's step is still open, its cells as they were; x and y still live. */
    okv_cell_plan plan;
    EXPECT_OK(okv_cell_cache_plan(b, 0, &plan));
    EXPECT_OK(okv_cell_cache_free_cells(b, &free_after));
    EXPECT(free_after == free_before);
    EXPECT_OK(okv_cell_cache_next_pos(a, x, &n));
    EXPECT_OK(okv_cell_cache_seq_len(b, y, &n));
    /* Freed and new ids never meet an old one. */
    uint64_t seen[64];
    size_t n_seen = 0;
    seen[n_seen++] = x;
    seen[n_seen++] = y;
    seen[n_seen++] = z;
    for (int i = 0; i < 20; i++) {
        uint64_t s = 0;
        EXPECT_OK(okv_cell_cache_seq_new(i % 2 ? a : b, &s));
        for (size_t j = 0; j < n_seen; j++) EXPECT(seen[j] != s);
        if (n_seen < 64) seen[n_seen++] = s;
        EXPECT_OK(okv_cell_cache_seq_free(i % 2 ? a : b, s));
    }
    EXPECT_OK(okv_cell_cache_free(a));
    EXPECT_OK(okv_cell_cache_free(b));
    EXPECT_OK(okv_kv_cell_cache_free(c));
    EXPECT_OK(okv_config_free(cfg));
}

int main(void) {
    test_seq_attend_before_update();
    test_cell_attend_before_update();
    test_ids_across_caches();
    return CHECK_SUMMARY("step_and_ids");
}
