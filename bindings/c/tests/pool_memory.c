/* Pool memory through the C ABI: a reserved pool keeps its view pointer
 * across growth (a view taken at the first step reads rows written later),
 * nbytes counts the rows and reserved_bytes the address space, clear and
 * trim give pages back with no live row changed, and the forced fallback
 * (OFFGRAPH_KV_POOLS=grow, set before the caches are built) runs the same
 * checks where they hold. Run as `pool_memory` and `pool_memory grow`. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "check.h"

enum { HEADS = 2, DIM = 8, DEPTH = 4096 };

static void fill(float *x, size_t n, float seed) {
    for (size_t i = 0; i < n; i++) x[i] = seed + (float)(i % 97) * 0.25f;
}

static void sequence_cache(int grow) {
    okv_layer_config layer = {OKV_POLICY_FLAT, 0, HEADS, DIM};
    okv_config *cfg = check_config(DEPTH, 1, layer, 8);
    EXPECT_OK(okv_config_set_initial_capacity(cfg, 4));
    okv_kv_seq_cache *kv = NULL;
    EXPECT_OK(okv_kv_seq_cache_new(cfg, &kv));
    float k[HEADS * DIM], v[HEADS * DIM];
    size_t pos = 0;
    EXPECT_OK(okv_kv_seq_cache_begin_step(kv, 1, &pos));
    fill(k, HEADS * DIM, 1.0f);
    fill(v, HEADS * DIM, -1.0f);
    EXPECT_OK(okv_kv_seq_cache_update(kv, 0, k, HEADS * DIM, v, HEADS * DIM));
    okv_pool_view first;
    EXPECT_OK(okv_kv_seq_cache_pool(kv, 0, &first));
    EXPECT(first.slots == (grow ? 4u : (size_t)DEPTH));
    for (size_t t = 1; t < 3000; t++) {
        EXPECT_OK(okv_kv_seq_cache_begin_step(kv, 1, &pos));
        fill(k, HEADS * DIM, (float)t);
        EXPECT_OK(okv_kv_seq_cache_update(kv, 0, k, HEADS * DIM, v, HEADS * DIM));
    }
    okv_pool_view now;
    EXPECT_OK(okv_kv_seq_cache_pool(kv, 0, &now));
    size_t nbytes = 0, reserved = 0;
    EXPECT_OK(okv_kv_seq_cache_nbytes(kv, &nbytes));
    EXPECT_OK(okv_kv_seq_cache_reserved_bytes(kv, &reserved));
    EXPECT(nbytes == 3000u * HEADS * DIM * 4 * 2);
    if (grow) {
        EXPECT(now.k != first.k); /* copied to a wider stride */
        EXPECT(reserved == 4096u * HEADS * DIM * 4 * 2);
    } else {
        /* The same address, and the first view reads head 1's row 2999. */
        EXPECT(now.k == first.k && now.v == first.v);
        EXPECT(memcmp((const float *)first.k + (DEPTH + 2999) * DIM, k + DIM, DIM * sizeof(float)) == 0);
        EXPECT(reserved == (size_t)DEPTH * HEADS * DIM * 4 * 2);
    }
    EXPECT_OK(okv_kv_seq_cache_clear(kv));
    EXPECT_OK(okv_kv_seq_cache_nbytes(kv, &nbytes));
    EXPECT(nbytes == 0);
    /* Refused calls write nothing to the out-parameter. */
    size_t untouched = 77;
    EXPECT_STATUS(okv_kv_seq_cache_reserved_bytes(NULL, &untouched), OKV_ERR_NULL_POINTER);
    EXPECT_STATUS(okv_kv_seq_cache_reserved_bytes(kv, NULL), OKV_ERR_NULL_POINTER);
    EXPECT(untouched == 77);
    EXPECT_OK(okv_kv_seq_cache_free(kv));
    EXPECT_STATUS(okv_kv_seq_cache_reserved_bytes(kv, &untouched), OKV_ERR_BAD_HANDLE);
    EXPECT(untouched == 77);
    EXPECT_OK(okv_config_free(cfg));
}

static void cell_cache(void) {
    okv_layer_config layer = {OKV_POLICY_FLAT, 0, HEADS, DIM};
    okv_config *cfg = check_config(DEPTH, 1, layer, 64);
    okv_kv_cell_cache *kc = NULL;
    EXPECT_OK(okv_kv_cell_cache_new(cfg, 1024, 8, &kc));
    uint64_t seqs[4];
    float k[HEADS * 64 * DIM], v[HEADS * 64 * DIM];
    uint64_t ids[64];
    size_t pos[64];
    for (int s = 0; s < 4; s++) EXPECT_OK(okv_kv_cell_cache_seq_new(kc, &seqs[s]));
    for (int chunk = 0; chunk < 2; chunk++) {
        for (int s = 0; s < 4; s++) {
            for (int i = 0; i < 64; i++) {
                ids[i] = seqs[s];
                pos[i] = (size_t)(chunk * 64 + i);
            }
            EXPECT_OK(okv_kv_cell_cache_begin_step(kc, ids, pos, 64));
            fill(k, HEADS * 64 * DIM, (float)(s * 10 + chunk));
            fill(v, HEADS * 64 * DIM, (float)(-s));
            EXPECT_OK(okv_kv_cell_cache_update(kc, 0, k, HEADS * 64 * DIM, v, HEADS * 64 * DIM));
        }
    }
    okv_pool_view view;
    EXPECT_OK(okv_kv_cell_cache_pool(kc, 0, &view));
    /* Sequence 1's second chunk went to cells 320..383 (lowest free first). */
    float survivor[DIM];
    memcpy(survivor, (const float *)view.k + 320 * DIM, sizeof survivor);
    size_t high = 0, after = 0;
    EXPECT_OK(okv_kv_cell_cache_nbytes(kc, &high));
    EXPECT(high == 512u * HEADS * DIM * 4 * 2);
    EXPECT_OK(okv_kv_cell_cache_seq_free(kc, seqs[2]));
    EXPECT_OK(okv_kv_cell_cache_seq_free(kc, seqs[3]));
    EXPECT_OK(okv_kv_cell_cache_trim(kc));
    EXPECT_OK(okv_kv_cell_cache_nbytes(kc, &after));
    EXPECT(after == 384u * HEADS * DIM * 4 * 2); /* up to sequence 1's last cell */
    okv_pool_view again;
    EXPECT_OK(okv_kv_cell_cache_pool(kc, 0, &again));
    EXPECT(memcmp((const float *)again.k + 320 * DIM, survivor, sizeof survivor) == 0);
    size_t reserved = 0;
    EXPECT_OK(okv_kv_cell_cache_reserved_bytes(kc, &reserved));
    EXPECT(reserved >= high);
    EXPECT_OK(okv_kv_cell_cache_clear(kc));
    EXPECT_OK(okv_kv_cell_cache_nbytes(kc, &after));
    EXPECT(after == 0);
    EXPECT_STATUS(okv_kv_cell_cache_trim(NULL), OKV_ERR_NULL_POINTER);
    EXPECT_OK(okv_kv_cell_cache_free(kc));
    EXPECT_STATUS(okv_kv_cell_cache_trim(kc), OKV_ERR_BAD_HANDLE);
    EXPECT_OK(okv_config_free(cfg));
}

int main(int argc, char **argv) {
    int grow = argc > 1 && strcmp(argv[1], "grow") == 0;
    if (grow) setenv("OFFGRAPH_KV_POOLS", "grow", 1);
    sequence_cache(grow);
    cell_cache();
    return CHECK_SUMMARY(grow ? "pool_memory (grow)" : "pool_memory");
}
