/* Snapshots cross languages: this program builds a known state through the C
 * API and writes its snapshots to DIR; bindings/c/tests/exchange.py builds the
 * same state through Python, compares the bytes and loads the C snapshots
 * (scripts/test-c.sh runs both). Then `exchange --load DIR` loads what Python
 * wrote there and checks it restores the same state.
 *
 *   exchange DIR          # writes DIR/c-seq.snap and DIR/c-cell.snap
 *   exchange --load DIR   # loads DIR/py-seq.snap and DIR/py-cell.snap */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rows.h"

enum { HEADS = 2, HD = 32, CAP = 64, N_SEQ = 10 };

/* The values exchange.py writes (rows.h). */
static void rows(size_t t0, size_t n, float *k, float *v) { test_rows(HEADS, HD, t0, n, k, v); }

/* Two layers: a ring of window 4 and a flat one; max_step 3. */
static okv_config *config(uint32_t kd, uint32_t vd) {
    okv_layer_config layers[2] = {{OKV_POLICY_RING, 4, HEADS, HD}, {OKV_POLICY_FLAT, 0, HEADS, HD}};
    okv_config *cfg = NULL;
    EXPECT_OK(okv_config_new(CAP, 2, &cfg));
    EXPECT_OK(okv_config_set_layers(cfg, layers, 2));
    EXPECT_OK(okv_config_set_max_step(cfg, 3));
    EXPECT_OK(okv_config_set_dtypes(cfg, kd, vd));
    return cfg;
}

/* float16 K, q8_0 V; tokens 0..9 in steps of 3 then 1. */
static okv_kv_seq_cache *seq_state(void) {
    okv_config *cfg = config(OKV_DTYPE_F16, OKV_DTYPE_Q8_0);
    okv_kv_seq_cache *kv = NULL;
    EXPECT_OK(okv_kv_seq_cache_new(cfg, &kv));
    EXPECT_OK(okv_config_free(cfg));
    float k[HEADS * 3 * HD], v[HEADS * 3 * HD];
    for (size_t t = 0; t < N_SEQ;) {
        size_t n = t == 0 ? 3 : 1, pos = 0;
        EXPECT_OK(okv_kv_seq_cache_begin_step(kv, n, &pos));
        rows(t, n, k, v);
        for (size_t l = 0; l < 2; l++) EXPECT_OK(okv_kv_seq_cache_update(kv, l, k, HEADS * n * HD, v, HEADS * n * HD));
        t += n;
    }
    return kv;
}

/* bfloat16 K and V; sequence a gets tokens 0..4 (3 + 2), b forks it whole,
 * then both decode 2 tokens (b's rows are those of token t + 20). */
static okv_kv_cell_cache *cell_state(uint64_t *b) {
    okv_config *cfg = config(OKV_DTYPE_BF16, OKV_DTYPE_BF16);
    okv_kv_cell_cache *kc = NULL;
    EXPECT_OK(okv_kv_cell_cache_new(cfg, 32, 4, &kc));
    EXPECT_OK(okv_config_free(cfg));
    uint64_t a = 0;
    EXPECT_OK(okv_kv_cell_cache_seq_new(kc, &a));
    float k[HEADS * 3 * HD], v[HEADS * 3 * HD];
    for (size_t t = 0; t < 5;) {
        size_t n = t == 0 ? 3 : 2, pos[3];
        uint64_t ids[3] = {a, a, a};
        for (size_t i = 0; i < n; i++) pos[i] = t + i;
        EXPECT_OK(okv_kv_cell_cache_begin_step(kc, ids, pos, n));
        rows(t, n, k, v);
        for (size_t l = 0; l < 2; l++) EXPECT_OK(okv_kv_cell_cache_update(kc, l, k, HEADS * n * HD, v, HEADS * n * HD));
        t += n;
    }
    EXPECT_OK(okv_kv_cell_cache_seq_clone(kc, a, OKV_NONE, b));
    for (size_t t = 5; t < 7; t++) {
        uint64_t ids[2] = {a, *b};
        size_t pos[2] = {t, t};
        EXPECT_OK(okv_kv_cell_cache_begin_step(kc, ids, pos, 2));
        float k2[HEADS * 2 * HD], v2[HEADS * 2 * HD], kb[HEADS * HD], vb[HEADS * HD];
        rows(t, 1, k, v);
        rows(t + 20, 1, kb, vb);
        for (size_t h = 0; h < HEADS; h++) {
            memcpy(k2 + (h * 2) * HD, k + h * HD, HD * sizeof(float));
            memcpy(k2 + (h * 2 + 1) * HD, kb + h * HD, HD * sizeof(float));
            memcpy(v2 + (h * 2) * HD, v + h * HD, HD * sizeof(float));
            memcpy(v2 + (h * 2 + 1) * HD, vb + h * HD, HD * sizeof(float));
        }
        for (size_t l = 0; l < 2; l++) EXPECT_OK(okv_kv_cell_cache_update(kc, l, k2, HEADS * 2 * HD, v2, HEADS * 2 * HD));
    }
    return kc;
}

static int write_file(const char *dir, const char *name, const uint8_t *data, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static uint8_t *read_file(const char *dir, const char *name, size_t *n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    uint8_t *buf = (uint8_t *)malloc(1 << 20);
    *n = fread(buf, 1, 1 << 20, f);
    fclose(f);
    return buf;
}

static uint8_t *seq_bytes(okv_kv_seq_cache *kv, size_t *n) {
    EXPECT_STATUS(okv_kv_seq_cache_save_state(kv, OKV_NONE, OKV_NONE, NULL, 0, n), OKV_ERR_BUFFER_TOO_SMALL);
    uint8_t *buf = (uint8_t *)malloc(*n);
    EXPECT_OK(okv_kv_seq_cache_save_state(kv, OKV_NONE, OKV_NONE, buf, *n, n));
    return buf;
}

static uint8_t *cell_bytes(okv_kv_cell_cache *kc, uint64_t seq, size_t *n) {
    EXPECT_STATUS(okv_kv_cell_cache_save_seq(kc, seq, OKV_NONE, NULL, 0, n), OKV_ERR_BUFFER_TOO_SMALL);
    uint8_t *buf = (uint8_t *)malloc(*n);
    EXPECT_OK(okv_kv_cell_cache_save_seq(kc, seq, OKV_NONE, buf, *n, n));
    return buf;
}

int main(int argc, char **argv) {
    int load = argc == 3 && strcmp(argv[1], "--load") == 0;
    if (argc != 2 && !load) {
        fprintf(stderr, "usage: exchange DIR | exchange --load DIR\n");
        return 2;
    }
    const char *dir = argv[argc - 1];
    uint64_t b = 0;
    okv_kv_seq_cache *kv = seq_state();
    okv_kv_cell_cache *kc = cell_state(&b);
    size_t sn = 0, cn = 0;
    uint8_t *s = seq_bytes(kv, &sn), *c = cell_bytes(kc, b, &cn);
    if (!load) {
        EXPECT(write_file(dir, "c-seq.snap", s, sn));
        EXPECT(write_file(dir, "c-cell.snap", c, cn));
    } else {
        /* Python's snapshots load here and save back as this state's bytes. */
        size_t pn = 0, qn = 0;
        uint8_t *ps = read_file(dir, "py-seq.snap", &pn), *pc = read_file(dir, "py-cell.snap", &qn);
        EXPECT(ps != NULL && pc != NULL);
        okv_config *cfg = config(OKV_DTYPE_F16, OKV_DTYPE_Q8_0);
        okv_kv_seq_cache *kv2 = NULL;
        EXPECT_OK(okv_kv_seq_cache_new(cfg, &kv2));
        EXPECT_OK(okv_config_free(cfg));
        EXPECT_OK(okv_kv_seq_cache_load_state(kv2, ps, pn));
        size_t n2 = 0;
        uint8_t *s2 = seq_bytes(kv2, &n2);
        EXPECT(n2 == sn && memcmp(s2, s, sn) == 0);
        cfg = config(OKV_DTYPE_BF16, OKV_DTYPE_BF16);
        okv_kv_cell_cache *kc2 = NULL;
        EXPECT_OK(okv_kv_cell_cache_new(cfg, 32, 4, &kc2));
        EXPECT_OK(okv_config_free(cfg));
        uint64_t got = 0;
        EXPECT_OK(okv_kv_cell_cache_load_seq(kc2, pc, qn, &got));
        size_t m2 = 0;
        uint8_t *c2 = cell_bytes(kc2, got, &m2);
        EXPECT(m2 == cn && memcmp(c2, c, cn) == 0);
        free(s2);
        free(c2);
        free(ps);
        free(pc);
        EXPECT_OK(okv_kv_cell_cache_free(kc2));
        EXPECT_OK(okv_kv_seq_cache_free(kv2));
    }
    free(s);
    free(c);
    EXPECT_OK(okv_kv_cell_cache_free(kc));
    EXPECT_OK(okv_kv_seq_cache_free(kv));
    return CHECK_SUMMARY(load ? "exchange --load" : "exchange");
}
