/* Pool dtypes and snapshots through the C API: names and codes, rows written
 * as float32 / float16 / bfloat16 into pools of every dtype, pool views that
 * say their dtype and row bytes, okv_dequantize, nbytes, and snapshots of both
 * pool-owning caches (round trips per dtype, the size query, and every bad
 * input with its documented status, its message, no out-parameter written and
 * the state unchanged). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rows.h"

enum { HEADS = 2, HD = 32, QH = 4, CAP = 64, LAYERS = 2, N_DTYPES = 4 };


/* Bits of a float that is exact in the narrow type (normal or zero). */
static uint16_t f16_bits(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
    if ((b & 0x7fffffffu) == 0) return sign;
    uint32_t e = (b >> 23) & 0xffu;
    return (uint16_t)(sign | ((e - 127 + 15) << 10) | ((b & 0x7fffffu) >> 13));
}
static uint16_t bf16_bits(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    return (uint16_t)(b >> 16);
}

/* The rows of tokens [t0, t0 + n) as [HEADS, n, HD]. */
static void rows_f32(size_t t0, size_t n, float *k, float *v) { test_rows(HEADS, HD, t0, n, k, v); }

static okv_config *dtype_config(uint32_t kd, uint32_t vd, uint32_t policy, size_t window) {
    okv_layer_config l = {policy, window, HEADS, HD};
    okv_config *cfg = check_config(CAP, LAYERS, l, 4);
    EXPECT_OK(okv_config_set_dtypes(cfg, kd, vd));
    return cfg;
}

/* Writes tokens [t0, t0 + n) of every layer, as float32, float16 or bfloat16
 * rows by `how` (0, 1, 2). */
static void write_step(okv_kv_seq_cache *kv, size_t t0, size_t n, int how) {
    size_t pos = 0;
    EXPECT_OK(okv_kv_seq_cache_begin_step(kv, n, &pos));
    EXPECT(pos == t0);
    float k[HEADS * 4 * HD], v[HEADS * 4 * HD];
    uint16_t kb[HEADS * 4 * HD], vb[HEADS * 4 * HD];
    size_t m = HEADS * n * HD;
    rows_f32(t0, n, k, v);
    for (size_t i = 0; i < m; i++) {
        kb[i] = how == 1 ? f16_bits(k[i]) : bf16_bits(k[i]);
        vb[i] = how == 1 ? f16_bits(v[i]) : bf16_bits(v[i]);
    }
    for (size_t l = 0; l < LAYERS; l++) {
        if (how == 0) EXPECT_OK(okv_kv_seq_cache_update(kv, l, k, m, v, m));
        if (how == 1) EXPECT_OK(okv_kv_seq_cache_update_f16(kv, l, kb, m, vb, m));
        if (how == 2) EXPECT_OK(okv_kv_seq_cache_update_bf16(kv, l, kb, m, vb, m));
    }
}

/* A sequence cache of dtypes (kd, vd) holding `n` tokens, written in steps of
 * 3, 1 and 1 tokens through the three row types in turn. */
static okv_kv_seq_cache *filled(uint32_t kd, uint32_t vd, size_t n) {
    okv_config *cfg = dtype_config(kd, vd, OKV_POLICY_FLAT, 0);
    okv_kv_seq_cache *kv = NULL;
    EXPECT_OK(okv_kv_seq_cache_new(cfg, &kv));
    EXPECT_OK(okv_config_free(cfg));
    size_t t = 0;
    for (int i = 0; t < n; i++) {
        size_t step = i == 0 ? (n < 3 ? n : 3) : 1;
        write_step(kv, t, step, i % 3);
        t += step;
    }
    return kv;
}

static void test_names_and_codes(void) {
    const char *names[N_DTYPES] = {"float32", "float16", "bfloat16", "q8_0"};
    for (uint32_t d = 0; d < N_DTYPES; d++) {
        uint32_t got = 99;
        EXPECT_OK(okv_dtype_from_name(names[d], &got));
        EXPECT(got == d);
        EXPECT(strcmp(okv_dtype_name(d), names[d]) == 0);
    }
    EXPECT(OKV_DTYPE_F32 == 0 && OKV_DTYPE_F16 == 1 && OKV_DTYPE_BF16 == 2 && OKV_DTYPE_Q8_0 == 3);
    EXPECT(strcmp(okv_dtype_name(7), "unknown") == 0);
    uint32_t got = 99;
    EXPECT_STATUS(okv_dtype_from_name("int4", &got), OKV_ERR_INVALID_CONFIG);
    EXPECT(strstr(okv_last_error(), "int4") != NULL && strstr(okv_last_error(), "q8_0") != NULL);
    EXPECT(got == 99);
    EXPECT_STATUS(okv_dtype_from_name(NULL, &got), OKV_ERR_NULL_POINTER);
    EXPECT_STATUS(okv_dtype_from_name("float16", NULL), OKV_ERR_NULL_POINTER);
    size_t rb = 0;
    EXPECT_OK(okv_dtype_row_bytes(OKV_DTYPE_Q8_0, 128, &rb));
    EXPECT(rb == 136);
    EXPECT_OK(okv_dtype_row_bytes(OKV_DTYPE_BF16, 128, &rb));
    EXPECT(rb == 256);
    EXPECT_STATUS(okv_dtype_row_bytes(OKV_DTYPE_Q8_0, 48, &rb), OKV_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(okv_last_error(), "multiple of 32") != NULL);
    EXPECT_STATUS(okv_dtype_row_bytes(4, 32, &rb), OKV_ERR_INVALID_ARGUMENT);
    EXPECT(rb == 256);
}

static void test_config_dtypes(void) {
    okv_layer_config l = {OKV_POLICY_FLAT, 0, HEADS, HD};
    okv_config *cfg = check_config(CAP, LAYERS, l, 4);
    uint32_t kd = 99, vd = 99;
    EXPECT_OK(okv_config_dtypes(cfg, &kd, &vd));
    EXPECT(kd == OKV_DTYPE_F32 && vd == OKV_DTYPE_F32);
    EXPECT_OK(okv_config_set_dtypes(cfg, OKV_DTYPE_F16, OKV_DTYPE_Q8_0));
    /* Unknown dtypes: refused by value, the config keeps its dtypes. */
    EXPECT_STATUS(okv_config_set_dtypes(cfg, 9, OKV_DTYPE_F32), OKV_ERR_INVALID_CONFIG);
    EXPECT(strstr(okv_last_error(), "k_dtype") != NULL && strstr(okv_last_error(), "9") != NULL);
    EXPECT_STATUS(okv_config_set_dtypes(cfg, OKV_DTYPE_F32, 0xffffffffu), OKV_ERR_INVALID_CONFIG);
    EXPECT(strstr(okv_last_error(), "v_dtype") != NULL);
    EXPECT_OK(okv_config_dtypes(cfg, &kd, &vd));
    EXPECT(kd == OKV_DTYPE_F16 && vd == OKV_DTYPE_Q8_0);
    EXPECT_STATUS(okv_config_dtypes(cfg, NULL, &vd), OKV_ERR_NULL_POINTER);
    EXPECT_OK(okv_config_validate(cfg));
    /* q8_0 with a head_dim that is not a multiple of 32: the config fails
     * validation by name, and no cache is built from it. */
    okv_layer_config odd = {OKV_POLICY_FLAT, 0, HEADS, 48};
    EXPECT_OK(okv_config_set_layers(cfg, &odd, 1));
    EXPECT_STATUS(okv_config_validate(cfg), OKV_ERR_INVALID_CONFIG);
    EXPECT(strstr(okv_last_error(), "q8_0") != NULL && strstr(okv_last_error(), "multiple of 32") != NULL);
    okv_kv_seq_cache *kv = (okv_kv_seq_cache *)(uintptr_t)0x1;
    EXPECT_STATUS(okv_kv_seq_cache_new(cfg, &kv), OKV_ERR_INVALID_CONFIG);
    EXPECT(kv == (okv_kv_seq_cache *)(uintptr_t)0x1);
    okv_kv_cell_cache *kc = (okv_kv_cell_cache *)(uintptr_t)0x1;
    EXPECT_STATUS(okv_kv_cell_cache_new(cfg, 16, 2, &kc), OKV_ERR_INVALID_CONFIG);
    EXPECT(kc == (okv_kv_cell_cache *)(uintptr_t)0x1);
    EXPECT_OK(okv_config_free(cfg));
}

/* Every (K dtype, V dtype) pair: pools say their dtype and row bytes, rows
 * written in any input type read back as their rounding, nbytes counts the
 * stored bytes, and attention over the pools matches float32's. */
static void test_round_trips(void) {
    const size_t row_bytes[N_DTYPES] = {HD * 4, HD * 2, HD * 2, HD / 32 * 34};
    const size_t n = 6;
    okv_kv_seq_cache *ref = filled(OKV_DTYPE_F32, OKV_DTYPE_F32, n);
    size_t ref_bytes = 0;
    EXPECT_OK(okv_kv_seq_cache_nbytes(ref, &ref_bytes));
    float q[QH * HD], out_ref[QH * HD], out[QH * HD];
    for (size_t i = 0; i < QH * HD; i++) q[i] = (float)((int)(i % 11) - 5) * 0.1f;
    okv_attend_options opts = {0.0f, 1, OKV_BACKEND_NATIVE};
    EXPECT_OK(okv_kv_seq_cache_attend(ref, 0, q, QH * HD, QH, out_ref, QH * HD, &opts));
    for (uint32_t kd = 0; kd < N_DTYPES; kd++)
        for (uint32_t vd = 0; vd < N_DTYPES; vd++) {
            okv_kv_seq_cache *kv = filled(kd, vd, n);
            okv_pool_view pv;
            EXPECT_OK(okv_kv_seq_cache_pool(kv, 1, &pv));
            EXPECT(pv.k_dtype == kd && pv.v_dtype == vd);
            EXPECT(pv.k_row_bytes == row_bytes[kd] && pv.v_row_bytes == row_bytes[vd]);
            EXPECT(pv.n_kv_heads == HEADS && pv.head_dim == HD && pv.slots >= n);
            /* nbytes: the rows written (n, flat layers) in the stored
             * dtypes, all layers. */
            size_t nb = 0;
            EXPECT_OK(okv_kv_seq_cache_nbytes(kv, &nb));
            EXPECT(nb == LAYERS * HEADS * n * (row_bytes[kd] + row_bytes[vd]));
            EXPECT(kd != OKV_DTYPE_F32 || vd != OKV_DTYPE_F32 || nb == ref_bytes);
            /* Read the rows back: float16/bfloat16 exact (the values are
             * representable), q8_0 within half a quantization step. */
            size_t vals = HEADS * pv.slots * HD;
            float *kf = (float *)malloc(vals * sizeof(float)), *vf = (float *)malloc(vals * sizeof(float));
            EXPECT_OK(okv_dequantize(kd, (const uint8_t *)pv.k, HEADS * pv.slots * pv.k_row_bytes, kf, vals));
            EXPECT_OK(okv_dequantize(vd, (const uint8_t *)pv.v, HEADS * pv.slots * pv.v_row_bytes, vf, vals));
            double kerr = 0, verr = 0;
            for (size_t h = 0; h < HEADS; h++)
                for (size_t t = 0; t < n; t++)
                    for (size_t d = 0; d < HD; d++) {
                        size_t i = (h * pv.slots + t) * HD + d;
                        kerr = fmax(kerr, fabs(kf[i] - kval(h, t, d)));
                        verr = fmax(verr, fabs(vf[i] - vval(h, t, d)));
                    }
            /* q8_0: max|x| <= 1, so a step is at most 1/127. */
            EXPECT(kerr <= (kd == OKV_DTYPE_Q8_0 ? 0.5 / 127 + 1e-6 : 0.0));
            EXPECT(verr <= (vd == OKV_DTYPE_Q8_0 ? 0.5 / 127 + 1e-6 : 0.0));
            free(kf);
            free(vf);
            EXPECT_OK(okv_kv_seq_cache_attend(kv, 0, q, QH * HD, QH, out, QH * HD, &opts));
            double aerr = 0;
            for (size_t i = 0; i < QH * HD; i++) aerr = fmax(aerr, fabs(out[i] - out_ref[i]));
            EXPECT(aerr <= (kd == OKV_DTYPE_Q8_0 || vd == OKV_DTYPE_Q8_0 ? 0.02 : 1e-5));
            EXPECT_OK(okv_kv_seq_cache_free(kv));
        }
    EXPECT_OK(okv_kv_seq_cache_free(ref));
}

/* Bad rows for the float16/bfloat16 updates: each refused with its status,
 * nothing written (the pool's bytes compared), the step still open. */
static void test_bad_rows(void) {
    okv_kv_seq_cache *kv = filled(OKV_DTYPE_F16, OKV_DTYPE_F16, 3);
    size_t pos = 0;
    EXPECT_OK(okv_kv_seq_cache_begin_step(kv, 1, &pos));
    okv_pool_view pv;
    EXPECT_OK(okv_kv_seq_cache_pool(kv, 0, &pv));
    size_t pool_bytes = HEADS * pv.slots * pv.k_row_bytes;
    uint8_t *before = (uint8_t *)malloc(2 * pool_bytes);
    memcpy(before, pv.k, pool_bytes);
    memcpy(before + pool_bytes, pv.v, pool_bytes);
    uint16_t kb[HEADS * HD] = {0}, vb[HEADS * HD] = {0};
    EXPECT_STATUS(okv_kv_seq_cache_update_f16(kv, 0, kb, HEADS * HD - 1, vb, HEADS * HD), OKV_ERR_SHAPE);
    EXPECT(strstr(okv_last_error(), "expected 64 values") != NULL);
    EXPECT_STATUS(okv_kv_seq_cache_update_bf16(kv, 0, kb, HEADS * HD, vb, 2 * HEADS * HD), OKV_ERR_SHAPE);
    EXPECT_STATUS(okv_kv_seq_cache_update_f16(kv, 0, NULL, HEADS * HD, vb, HEADS * HD), OKV_ERR_NULL_POINTER);
    EXPECT_STATUS(okv_kv_seq_cache_update_bf16(kv, LAYERS, kb, HEADS * HD, vb, HEADS * HD), OKV_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(okv_kv_seq_cache_update_f16(kv, 0, (const uint16_t *)pv.k, HEADS * HD, vb, HEADS * HD),
                  OKV_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(okv_last_error(), "overlaps") != NULL);
    EXPECT_STATUS(okv_kv_seq_cache_update_f16(NULL, 0, kb, HEADS * HD, vb, HEADS * HD), OKV_ERR_NULL_POINTER);
    okv_pool_view after;
    EXPECT_OK(okv_kv_seq_cache_pool(kv, 0, &after));
    EXPECT(after.k == pv.k && memcmp(before, after.k, pool_bytes) == 0 &&
           memcmp(before + pool_bytes, after.v, pool_bytes) == 0);
    free(before);
    size_t len = 0;
    EXPECT_OK(okv_kv_seq_cache_length(kv, &len));
    EXPECT(len == 4);
    EXPECT_OK(okv_kv_seq_cache_update_f16(kv, 0, kb, HEADS * HD, vb, HEADS * HD));
    EXPECT_OK(okv_kv_seq_cache_free(kv));
    /* No open step: the step protocol, not the rows. */
    okv_config *cfg = dtype_config(OKV_DTYPE_BF16, OKV_DTYPE_BF16, OKV_POLICY_FLAT, 0);
    EXPECT_OK(okv_kv_seq_cache_new(cfg, &kv));
    EXPECT_STATUS(okv_kv_seq_cache_update_bf16(kv, 0, kb, HEADS * HD, vb, HEADS * HD), OKV_ERR_STEP_PROTOCOL);
    okv_kv_cell_cache *kc = NULL;
    EXPECT_OK(okv_kv_cell_cache_new(cfg, 16, 2, &kc));
    uint64_t s = 0;
    EXPECT_OK(okv_kv_cell_cache_seq_new(kc, &s));
    size_t p0 = 0;
    EXPECT_OK(okv_kv_cell_cache_begin_step(kc, &s, &p0, 1));
    EXPECT_STATUS(okv_kv_cell_cache_update_f16(kc, 0, kb, HEADS * HD + 1, vb, HEADS * HD), OKV_ERR_SHAPE);
    EXPECT_OK(okv_kv_cell_cache_update_f16(kc, 0, kb, HEADS * HD, vb, HEADS * HD));
    EXPECT_OK(okv_kv_cell_cache_update_bf16(kc, 1, kb, HEADS * HD, vb, HEADS * HD));
    EXPECT_OK(okv_kv_cell_cache_free(kc));
    EXPECT_OK(okv_kv_seq_cache_free(kv));
    EXPECT_OK(okv_config_free(cfg));
}

static void test_dequantize_refusals(void) {
    uint8_t src[34 * 2] = {0};
    float dst[64];
    for (size_t i = 0; i < 64; i++) dst[i] = 7.0f;
    EXPECT_STATUS(okv_dequantize(4, src, sizeof src, dst, 64), OKV_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(okv_dequantize(OKV_DTYPE_Q8_0, src, sizeof src, dst, 48), OKV_ERR_SHAPE);
    EXPECT(strstr(okv_last_error(), "34") != NULL || strstr(okv_last_error(), "68") != NULL);
    EXPECT_STATUS(okv_dequantize(OKV_DTYPE_Q8_0, src, sizeof src - 1, dst, 64), OKV_ERR_SHAPE);
    EXPECT_STATUS(okv_dequantize(OKV_DTYPE_F16, src, sizeof src, dst, 64), OKV_ERR_SHAPE);
    EXPECT_STATUS(okv_dequantize(OKV_DTYPE_Q8_0, NULL, sizeof src, dst, 64), OKV_ERR_NULL_POINTER);
    EXPECT_STATUS(okv_dequantize(OKV_DTYPE_F32, (const uint8_t *)dst, 16, dst + 2, 4), OKV_ERR_INVALID_ARGUMENT);
    int untouched = 1;
    for (size_t i = 0; i < 64; i++) untouched &= dst[i] == 7.0f;
    EXPECT(untouched);
    EXPECT_OK(okv_dequantize(OKV_DTYPE_Q8_0, src, sizeof src, dst, 64));
    EXPECT(dst[0] == 0.0f && dst[63] == 0.0f);
}

/* A snapshot's bytes into a fresh malloc'd buffer, by the size query. */
static uint8_t *save_seq_state(okv_kv_seq_cache *kv, size_t start, size_t upto, size_t *len) {
    *len = 0;
    EXPECT_STATUS(okv_kv_seq_cache_save_state(kv, start, upto, NULL, 0, len), OKV_ERR_BUFFER_TOO_SMALL);
    uint8_t *buf = (uint8_t *)malloc(*len);
    EXPECT_OK(okv_kv_seq_cache_save_state(kv, start, upto, buf, *len, len));
    return buf;
}

/* The state a refused load must not change: length and the whole snapshot. */
static int same_state(okv_kv_seq_cache *kv, size_t len, const uint8_t *snap, size_t snap_len) {
    size_t l = 0, n = 0;
    if (okv_kv_seq_cache_length(kv, &l) != OKV_OK || l != len) return 0;
    uint8_t *now = save_seq_state(kv, OKV_NONE, OKV_NONE, &n);
    int same = n == snap_len && memcmp(now, snap, n) == 0;
    free(now);
    return same;
}

static void test_seq_snapshots(void) {
    for (uint32_t d = 0; d < N_DTYPES; d++) {
        okv_kv_seq_cache *kv = filled(d, d, 6);
        size_t len = 0;
        uint8_t *snap = save_seq_state(kv, OKV_NONE, OKV_NONE, &len);
        EXPECT(len > 8 && memcmp(snap, "OKVSNAP", 8) == 0);
        /* Too small by one byte: the size again, the buffer untouched. */
        uint8_t *small = (uint8_t *)malloc(len);
        memset(small, 0xab, len);
        size_t need = 0;
        EXPECT_STATUS(okv_kv_seq_cache_save_state(kv, OKV_NONE, OKV_NONE, small, len - 1, &need),
                      OKV_ERR_BUFFER_TOO_SMALL);
        EXPECT(need == len && small[0] == 0xab && small[len - 2] == 0xab);
        EXPECT(strstr(okv_last_error(), "bytes") != NULL);
        free(small);
        /* Restore into a fresh cache: the same length, the same bytes saved
         * again, the same attention at the next step. */
        okv_config *cfg = dtype_config(d, d, OKV_POLICY_FLAT, 0);
        okv_kv_seq_cache *back = NULL;
        EXPECT_OK(okv_kv_seq_cache_new(cfg, &back));
        EXPECT_OK(okv_kv_seq_cache_load_state(back, snap, len));
        EXPECT(same_state(back, 6, snap, len));
        write_step(kv, 6, 1, 0);
        write_step(back, 6, 1, 0);
        float q[QH * HD], a[QH * HD], b[QH * HD];
        for (size_t i = 0; i < QH * HD; i++) q[i] = (float)((int)(i % 7) - 3) * 0.2f;
        okv_attend_options opts = {0.0f, 1, OKV_BACKEND_NATIVE};
        EXPECT_OK(okv_kv_seq_cache_attend(kv, 1, q, QH * HD, QH, a, QH * HD, &opts));
        EXPECT_OK(okv_kv_seq_cache_attend(back, 1, q, QH * HD, QH, b, QH * HD, &opts));
        EXPECT(memcmp(a, b, sizeof a) == 0);
        /* A range [4, 7) continues a cache of length 4 (a prefix chunk). */
        size_t head_len = 0, tail_len = 0;
        uint8_t *head = save_seq_state(kv, 0, 4, &head_len);
        uint8_t *tail = save_seq_state(kv, 4, OKV_NONE, &tail_len);
        okv_kv_seq_cache *chained = NULL;
        EXPECT_OK(okv_kv_seq_cache_new(cfg, &chained));
        const uint8_t *parts[2] = {head, tail};
        size_t lens[2] = {head_len, tail_len};
        EXPECT_OK(okv_kv_seq_cache_load_states(chained, parts, lens, 2));
        size_t whole_len = 0, got_len = 0;
        uint8_t *whole = save_seq_state(kv, OKV_NONE, OKV_NONE, &whole_len);
        EXPECT(same_state(chained, 7, whole, whole_len));
        /* Bad snapshots: each OKV_ERR_SNAPSHOT, the empty cache still empty. */
        okv_kv_seq_cache *empty = NULL;
        EXPECT_OK(okv_kv_seq_cache_new(cfg, &empty));
        uint8_t *empty_snap = save_seq_state(empty, OKV_NONE, OKV_NONE, &got_len);
        size_t empty_len = got_len;
        EXPECT_STATUS(okv_kv_seq_cache_load_state(empty, snap, len - 1), OKV_ERR_SNAPSHOT);
        EXPECT(strstr(okv_last_error(), "okv_kv_seq_cache_load_state") != NULL);
        uint8_t *damaged = (uint8_t *)malloc(len);
        memcpy(damaged, snap, len);
        damaged[len / 2] ^= 0x40;
        EXPECT_STATUS(okv_kv_seq_cache_load_state(empty, damaged, len), OKV_ERR_SNAPSHOT);
        damaged[len / 2] ^= 0x40;
        damaged[8] = 0xff; /* a newer format version */
        EXPECT_STATUS(okv_kv_seq_cache_load_state(empty, damaged, len), OKV_ERR_SNAPSHOT);
        free(damaged);
        EXPECT_STATUS(okv_kv_seq_cache_load_state(empty, (const uint8_t *)"not a snapshot", 14), OKV_ERR_SNAPSHOT);
        EXPECT_STATUS(okv_kv_seq_cache_load_state(empty, tail, tail_len), OKV_ERR_SNAPSHOT);
        EXPECT_STATUS(okv_kv_seq_cache_load_states(empty, parts, lens, 0), OKV_ERR_SNAPSHOT);
        EXPECT_STATUS(okv_kv_seq_cache_load_state(empty, NULL, 10), OKV_ERR_NULL_POINTER);
        EXPECT(same_state(empty, 0, empty_snap, empty_len));
        /* Foreign: another dtype's snapshot. */
        okv_config *other = dtype_config((d + 1) % N_DTYPES, d, OKV_POLICY_FLAT, 0);
        okv_kv_seq_cache *foreign = NULL;
        EXPECT_OK(okv_kv_seq_cache_new(other, &foreign));
        EXPECT_STATUS(okv_kv_seq_cache_load_state(foreign, snap, len), OKV_ERR_SNAPSHOT);
        size_t fl = 9;
        EXPECT_OK(okv_kv_seq_cache_length(foreign, &fl));
        EXPECT(fl == 0);
        /* A loaded cache refuses a second load (it does not start at 7). */
        EXPECT_STATUS(okv_kv_seq_cache_load_state(back, snap, len), OKV_ERR_SNAPSHOT);
        uint8_t *back_snap = save_seq_state(back, OKV_NONE, OKV_NONE, &got_len);
        EXPECT(got_len == whole_len && memcmp(back_snap, whole, got_len) == 0);
        /* Saves out of range, or into the pools: refused, out_len untouched. */
        size_t sentinel = 12345;
        uint8_t one[1];
        EXPECT_STATUS(okv_kv_seq_cache_save_state(kv, OKV_NONE, 8, one, 1, &sentinel), OKV_ERR_INVALID_ARGUMENT);
        EXPECT_STATUS(okv_kv_seq_cache_save_state(kv, 5, 3, one, 1, &sentinel), OKV_ERR_INVALID_ARGUMENT);
        okv_pool_view pv;
        EXPECT_OK(okv_kv_seq_cache_pool(kv, 0, &pv));
        EXPECT_STATUS(okv_kv_seq_cache_save_state(kv, OKV_NONE, OKV_NONE, (uint8_t *)pv.k, 1 << 20, &sentinel),
                      OKV_ERR_INVALID_ARGUMENT);
        EXPECT_STATUS(okv_kv_seq_cache_load_state(kv, (const uint8_t *)pv.k, 64), OKV_ERR_INVALID_ARGUMENT);
        EXPECT(sentinel == 12345);
        EXPECT_STATUS(okv_kv_seq_cache_save_state(kv, OKV_NONE, OKV_NONE, one, 1, NULL), OKV_ERR_NULL_POINTER);
        EXPECT_STATUS(okv_kv_seq_cache_save_state(kv, OKV_NONE, OKV_NONE, NULL, 1 << 20, &sentinel),
                      OKV_ERR_NULL_POINTER);
        EXPECT(sentinel == 12345);
        free(back_snap);
        free(empty_snap);
        free(whole);
        free(head);
        free(tail);
        free(snap);
        EXPECT_OK(okv_kv_seq_cache_free(foreign));
        EXPECT_OK(okv_kv_seq_cache_free(empty));
        EXPECT_OK(okv_kv_seq_cache_free(chained));
        EXPECT_OK(okv_kv_seq_cache_free(back));
        EXPECT_OK(okv_kv_seq_cache_free(kv));
        EXPECT_OK(okv_config_free(other));
        EXPECT_OK(okv_config_free(cfg));
    }
}

/* A ring layer that overwrote the tail a whole state needs refuses the save;
 * the range of what it still holds is allowed. */
static void test_ring_save_refusal(void) {
    okv_config *cfg = dtype_config(OKV_DTYPE_F16, OKV_DTYPE_F16, OKV_POLICY_RING, 4);
    okv_kv_seq_cache *kv = NULL;
    EXPECT_OK(okv_kv_seq_cache_new(cfg, &kv));
    for (size_t t = 0; t < 12; t++) write_step(kv, t, 1, 1);
    size_t sentinel = 777;
    uint8_t buf[16];
    EXPECT_STATUS(okv_kv_seq_cache_save_state(kv, OKV_NONE, 5, buf, sizeof buf, &sentinel), OKV_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(okv_last_error(), "ring layer") != NULL);
    EXPECT(sentinel == 777);
    size_t len = 0;
    uint8_t *snap = save_seq_state(kv, OKV_NONE, OKV_NONE, &len);
    okv_kv_seq_cache *back = NULL;
    EXPECT_OK(okv_kv_seq_cache_new(cfg, &back));
    EXPECT_OK(okv_kv_seq_cache_load_state(back, snap, len));
    size_t l = 0;
    EXPECT_OK(okv_kv_seq_cache_length(back, &l));
    EXPECT(l == 12);
    free(snap);
    EXPECT_OK(okv_kv_seq_cache_free(back));
    EXPECT_OK(okv_kv_seq_cache_free(kv));
    EXPECT_OK(okv_config_free(cfg));
}

/* A cell cache of dtype d with two sequences sharing a 5-token prefix, then
 * 2 tokens each. */
static okv_kv_cell_cache *cells_filled(uint32_t d, uint64_t ids[2]) {
    okv_config *cfg = dtype_config(d, d, OKV_POLICY_FLAT, 0);
    okv_kv_cell_cache *kc = NULL;
    EXPECT_OK(okv_kv_cell_cache_new(cfg, 32, 4, &kc));
    EXPECT_OK(okv_config_free(cfg));
    EXPECT_OK(okv_kv_cell_cache_seq_new(kc, &ids[0]));
    float k[HEADS * 4 * HD], v[HEADS * 4 * HD];
    for (size_t t0 = 0; t0 < 5;) {
        size_t n = t0 == 0 ? 3 : 2, pos[4];
        uint64_t sid[4];
        for (size_t i = 0; i < n; i++) sid[i] = ids[0], pos[i] = t0 + i;
        EXPECT_OK(okv_kv_cell_cache_begin_step(kc, sid, pos, n));
        rows_f32(t0, n, k, v);
        for (size_t l = 0; l < LAYERS; l++)
            EXPECT_OK(okv_kv_cell_cache_update(kc, l, k, HEADS * n * HD, v, HEADS * n * HD));
        t0 += n;
    }
    EXPECT_OK(okv_kv_cell_cache_seq_clone(kc, ids[0], OKV_NONE, &ids[1]));
    for (size_t t = 5; t < 7; t++) {
        size_t pos[2] = {t, t};
        EXPECT_OK(okv_kv_cell_cache_begin_step(kc, ids, pos, 2));
        rows_f32(t + 10 * (t - 4), 2, k, v);
        for (size_t l = 0; l < LAYERS; l++)
            EXPECT_OK(okv_kv_cell_cache_update(kc, l, k, HEADS * 2 * HD, v, HEADS * 2 * HD));
    }
    return kc;
}

static uint8_t *save_cell_seq(okv_kv_cell_cache *kc, uint64_t seq, size_t upto, size_t *len) {
    *len = 0;
    EXPECT_STATUS(okv_kv_cell_cache_save_seq(kc, seq, upto, NULL, 0, len), OKV_ERR_BUFFER_TOO_SMALL);
    uint8_t *buf = (uint8_t *)malloc(*len);
    EXPECT_OK(okv_kv_cell_cache_save_seq(kc, seq, upto, buf, *len, len));
    return buf;
}

static void test_cell_snapshots(void) {
    for (uint32_t d = 0; d < N_DTYPES; d++) {
        uint64_t ids[2], other_ids[2];
        okv_kv_cell_cache *kc = cells_filled(d, ids);
        okv_kv_cell_cache *dst = cells_filled(d, other_ids);
        size_t len = 0;
        uint8_t *snap = save_cell_seq(kc, ids[1], OKV_NONE, &len);
        size_t free_before = 0, free_after = 0;
        EXPECT_OK(okv_kv_cell_cache_free_cells(dst, &free_before));
        uint64_t got = 0;
        EXPECT_OK(okv_kv_cell_cache_load_seq(dst, snap, len, &got));
        EXPECT(got != other_ids[0] && got != other_ids[1]);
        size_t n = 0, next = 0;
        EXPECT_OK(okv_kv_cell_cache_seq_len(dst, got, &n));
        EXPECT_OK(okv_kv_cell_cache_next_pos(dst, got, &next));
        EXPECT(n == 7 && next == 7);
        EXPECT_OK(okv_kv_cell_cache_free_cells(dst, &free_after));
        EXPECT(free_after == free_before - 7);
        /* Saved again from its new home: the same bytes. */
        size_t len2 = 0;
        uint8_t *again = save_cell_seq(dst, got, OKV_NONE, &len2);
        EXPECT(len2 == len && memcmp(again, snap, len) == 0);
        free(again);
        /* Up to a position: a shorter snapshot. */
        size_t len3 = 0;
        uint8_t *part = save_cell_seq(kc, ids[0], 3, &len3);
        EXPECT(len3 < len);
        free(part);
        /* Bad inputs: each refused, *out_seq unwritten, no cell taken. */
        uint64_t sentinel = 4242;
        EXPECT_STATUS(okv_kv_cell_cache_load_seq(dst, snap, len - 3, &sentinel), OKV_ERR_SNAPSHOT);
        uint8_t *damaged = (uint8_t *)malloc(len);
        memcpy(damaged, snap, len);
        damaged[len - 40] ^= 1;
        EXPECT_STATUS(okv_kv_cell_cache_load_seq(dst, damaged, len, &sentinel), OKV_ERR_SNAPSHOT);
        free(damaged);
        okv_kv_seq_cache *seq = filled(d, d, 3);
        size_t seq_len = 0;
        uint8_t *seq_snap = save_seq_state(seq, OKV_NONE, OKV_NONE, &seq_len);
        EXPECT_STATUS(okv_kv_cell_cache_load_seq(dst, seq_snap, seq_len, &sentinel), OKV_ERR_SNAPSHOT);
        okv_kv_seq_cache *seq2 = NULL;
        okv_config *cfg = dtype_config(d, d, OKV_POLICY_FLAT, 0);
        EXPECT_OK(okv_kv_seq_cache_new(cfg, &seq2));
        EXPECT_STATUS(okv_kv_seq_cache_load_state(seq2, snap, len), OKV_ERR_SNAPSHOT);
        EXPECT_OK(okv_config_free(cfg));
        EXPECT_OK(okv_kv_seq_cache_free(seq2));
        free(seq_snap);
        EXPECT_OK(okv_kv_seq_cache_free(seq));
        EXPECT_STATUS(okv_kv_cell_cache_load_seq(dst, snap, len, NULL), OKV_ERR_NULL_POINTER);
        EXPECT(sentinel == 4242);
        size_t free_now = 0;
        EXPECT_OK(okv_kv_cell_cache_free_cells(dst, &free_now));
        EXPECT(free_now == free_after);
        size_t sl = 99;
        EXPECT_STATUS(okv_kv_cell_cache_save_seq(kc, 987654, OKV_NONE, NULL, 0, &sl), OKV_ERR_UNKNOWN_SEQUENCE);
        EXPECT(sl == 99);
        /* More positions than the cache has cells: intact data a larger
         * cache of the layout holds, so no room here (not damage). Fewer
         * free cells than positions: no room now. */
        okv_config *small_cfg = dtype_config(d, d, OKV_POLICY_FLAT, 0);
        okv_kv_cell_cache *tiny = NULL;
        EXPECT_OK(okv_kv_cell_cache_new(small_cfg, 4, 2, &tiny));
        EXPECT_STATUS(okv_kv_cell_cache_load_seq(tiny, snap, len, &sentinel), OKV_ERR_OUT_OF_CAPACITY);
        EXPECT_OK(okv_kv_cell_cache_free(tiny));
        EXPECT_OK(okv_kv_cell_cache_new(small_cfg, 8, 2, &tiny));
        uint64_t busy = 0;
        EXPECT_OK(okv_kv_cell_cache_seq_new(tiny, &busy));
        uint64_t three[3] = {busy, busy, busy};
        size_t at[3] = {0, 1, 2};
        EXPECT_OK(okv_kv_cell_cache_begin_step(tiny, three, at, 3));
        EXPECT_STATUS(okv_kv_cell_cache_load_seq(tiny, snap, len, &sentinel), OKV_ERR_OUT_OF_CAPACITY);
        EXPECT(strstr(okv_last_error(), "free") != NULL);
        EXPECT(sentinel == 4242);
        EXPECT_OK(okv_kv_cell_cache_free_cells(tiny, &free_now));
        EXPECT(free_now == 5);
        EXPECT_OK(okv_kv_cell_cache_free(tiny));
        EXPECT_OK(okv_config_free(small_cfg));
        free(snap);
        EXPECT_OK(okv_kv_cell_cache_free(dst));
        EXPECT_OK(okv_kv_cell_cache_free(kc));
    }
}

static uint8_t *save_cell_chunk(okv_kv_cell_cache *kc, uint64_t seq, size_t a, size_t b, size_t *len) {
    *len = 0;
    EXPECT_STATUS(okv_kv_cell_cache_save_seq_chunk(kc, seq, a, b, NULL, 0, len), OKV_ERR_BUFFER_TOO_SMALL);
    uint8_t *buf = (uint8_t *)malloc(*len);
    EXPECT_OK(okv_kv_cell_cache_save_seq_chunk(kc, seq, a, b, buf, *len, len));
    return buf;
}

/* Chunk snapshots: [0, 3) and [3, 7) restore the sequence the whole-prefix
 * snapshot does (the same bytes saved back); every refusal takes no cell. */
static void test_cell_chunks(void) {
    for (uint32_t d = 0; d < N_DTYPES; d++) {
        uint64_t ids[2], other_ids[2];
        okv_kv_cell_cache *kc = cells_filled(d, ids);
        okv_kv_cell_cache *dst = cells_filled(d, other_ids);
        size_t l0 = 0, l1 = 0, whole_len = 0;
        uint8_t *c0 = save_cell_chunk(kc, ids[1], 0, 3, &l0);
        uint8_t *c1 = save_cell_chunk(kc, ids[1], 3, 7, &l1);
        uint8_t *whole = save_cell_seq(kc, ids[1], OKV_NONE, &whole_len);
        size_t free_before = 0, free_now = 0;
        EXPECT_OK(okv_kv_cell_cache_free_cells(dst, &free_before));
        uint64_t sentinel = 4242;
        const uint8_t *wrong[2] = {c1, c0};
        size_t wrong_lens[2] = {l1, l0};
        EXPECT_STATUS(okv_kv_cell_cache_load_seq_chunks(dst, wrong, wrong_lens, 2, &sentinel), OKV_ERR_SNAPSHOT);
        EXPECT(strstr(okv_last_error(), "part 0") != NULL);
        const uint8_t *parts[2] = {c0, c1};
        size_t lens[2] = {l0, l1 - 1};
        EXPECT_STATUS(okv_kv_cell_cache_load_seq_chunks(dst, parts, lens, 2, &sentinel), OKV_ERR_SNAPSHOT);
        EXPECT_STATUS(okv_kv_cell_cache_load_seq_chunks(dst, NULL, NULL, 0, &sentinel), OKV_ERR_INVALID_ARGUMENT);
        EXPECT_STATUS(okv_kv_cell_cache_load_seq_chunks(dst, NULL, lens, 2, &sentinel), OKV_ERR_NULL_POINTER);
        lens[1] = l1;
        EXPECT_STATUS(okv_kv_cell_cache_load_seq_chunks(dst, parts, lens, 2, NULL), OKV_ERR_NULL_POINTER);
        EXPECT(sentinel == 4242);
        EXPECT_OK(okv_kv_cell_cache_free_cells(dst, &free_now));
        EXPECT(free_now == free_before);
        uint64_t got = 0;
        EXPECT_OK(okv_kv_cell_cache_load_seq_chunks(dst, parts, lens, 2, &got));
        size_t again_len = 0, next = 0;
        EXPECT_OK(okv_kv_cell_cache_next_pos(dst, got, &next));
        EXPECT(next == 7);
        uint8_t *again = save_cell_seq(dst, got, OKV_NONE, &again_len);
        EXPECT(again_len == whole_len && memcmp(again, whole, whole_len) == 0);
        size_t sl = 99;
        EXPECT_STATUS(okv_kv_cell_cache_save_seq_chunk(kc, ids[1], 3, 3, NULL, 0, &sl), OKV_ERR_INVALID_ARGUMENT);
        EXPECT_STATUS(okv_kv_cell_cache_save_seq_chunk(kc, ids[1], 3, 9, NULL, 0, &sl), OKV_ERR_INVALID_ARGUMENT);
        EXPECT_STATUS(okv_kv_cell_cache_save_seq_chunk(kc, 987654, 0, 3, NULL, 0, &sl), OKV_ERR_UNKNOWN_SEQUENCE);
        EXPECT(sl == 99);
        free(again);
        free(whole);
        free(c1);
        free(c0);
        EXPECT_OK(okv_kv_cell_cache_free(dst));
        EXPECT_OK(okv_kv_cell_cache_free(kc));
    }
}

int main(void) {
    test_names_and_codes();
    test_config_dtypes();
    test_round_trips();
    test_bad_rows();
    test_dequantize_refusals();
    test_seq_snapshots();
    test_ring_save_refusal();
    test_cell_snapshots();
    test_cell_chunks();
    return CHECK_SUMMARY("dtypes");
}
