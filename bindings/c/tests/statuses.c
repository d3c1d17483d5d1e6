/* The per-function statuses the header documents, one check per path that no
 * other C test reaches: each call gets its documented status, its message
 * names the problem, and the state it would change is unchanged. Also the
 * documented semantics around them: the GQA head mapping, a cell step's
 * max_step over all sequences, and what okv_cells_for_forks counts. */
#include <stdint.h>
#include <string.h>

#include "check.h"

enum { HD = 4 };

static void test_config_statuses(void) {
    okv_config *cfg = NULL;
    EXPECT_OK(okv_config_new(8, 2, &cfg));
    size_t depth = 99;
    EXPECT_STATUS(okv_config_depth(cfg, 0, &depth), OKV_ERR_INVALID_CONFIG); /* no layer configs yet */
    EXPECT(depth == 99);
    okv_layer_config flat = {OKV_POLICY_FLAT, 0, 1, HD};
    EXPECT_OK(okv_config_set_layers(cfg, &flat, 1));
    /* max_step above the capacity: refused by validate and every constructor. */
    EXPECT_OK(okv_config_set_max_step(cfg, 9));
    EXPECT_STATUS(okv_config_validate(cfg), OKV_ERR_INVALID_CONFIG);
    EXPECT(strstr(okv_last_error(), "max_step") != NULL);
    okv_kv_seq_cache *kv = (okv_kv_seq_cache *)(uintptr_t)0x1;
    EXPECT_STATUS(okv_kv_seq_cache_new(cfg, &kv), OKV_ERR_INVALID_CONFIG);
    EXPECT(kv == (okv_kv_seq_cache *)(uintptr_t)0x1);
    okv_cell_cache *cc = (okv_cell_cache *)(uintptr_t)0x1;
    EXPECT_STATUS(okv_cell_cache_new(cfg, 8, 2, &cc), OKV_ERR_INVALID_CONFIG);
    EXPECT_OK(okv_config_set_max_step(cfg, 8));
    EXPECT_STATUS(okv_cell_cache_new(cfg, 8, 0, &cc), OKV_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(okv_last_error(), "n_seq_max") != NULL);
    EXPECT(cc == (okv_cell_cache *)(uintptr_t)0x1);
    EXPECT_OK(okv_config_free(cfg));
}

/* max_step bounds a cell step's tokens of all sequences together. */
static void test_cell_step_max_step(void) {
    okv_layer_config flat = {OKV_POLICY_FLAT, 0, 1, HD};
    okv_config *cfg = check_config(8, 1, flat, 1);
    okv_cell_cache *cc = NULL;
    EXPECT_OK(okv_cell_cache_new(cfg, 8, 2, &cc));
    uint64_t ids[2];
    EXPECT_OK(okv_cell_cache_seq_new(cc, &ids[0]));
    EXPECT_OK(okv_cell_cache_seq_new(cc, &ids[1]));
    size_t pos[2] = {0, 0};
    EXPECT_STATUS(okv_cell_cache_begin_step(cc, ids, pos, 2), OKV_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(okv_last_error(), "max_step") != NULL);
    size_t free_cells = 0, next = 9;
    EXPECT_OK(okv_cell_cache_free_cells(cc, &free_cells));
    EXPECT(free_cells == 8);
    EXPECT_OK(okv_cell_cache_next_pos(cc, ids[1], &next));
    EXPECT(next == 0);
    okv_cell_plan plan;
    EXPECT_STATUS(okv_cell_cache_plan(cc, 0, &plan), OKV_ERR_STEP_PROTOCOL); /* no step opened */
    EXPECT_OK(okv_cell_cache_begin_step(cc, &ids[0], pos, 1));
    EXPECT_OK(okv_cell_cache_begin_step(cc, &ids[1], pos, 1));
    /* p1 below p0: refused, the sequence keeps its position. */
    EXPECT_STATUS(okv_cell_cache_seq_rm(cc, ids[0], 1, 0), OKV_ERR_INVALID_ARGUMENT);
    size_t len = 0;
    EXPECT_OK(okv_cell_cache_seq_len(cc, ids[0], &len));
    EXPECT(len == 1);
    EXPECT_OK(okv_cell_cache_free(cc));
    EXPECT_OK(okv_config_free(cfg));
}

/* Query head h reads KV head h / (n_q / n_kv): with one key per KV head the
 * output of query head h is exactly that head's value row. */
static void test_gqa_mapping(void) {
    okv_layer_config l = {OKV_POLICY_FLAT, 0, 2, HD};
    okv_config *cfg = check_config(4, 1, l, 1);
    okv_kv_seq_cache *kv = NULL;
    EXPECT_OK(okv_kv_seq_cache_new(cfg, &kv));
    size_t pos = 0;
    EXPECT_OK(okv_kv_seq_cache_begin_step(kv, 1, &pos));
    float k[2 * HD] = {0}, v[2 * HD] = {1, 2, 3, 4, -1, -2, -3, -4};
    EXPECT_OK(okv_kv_seq_cache_update(kv, 0, k, 2 * HD, v, 2 * HD));
    float q[4 * HD] = {0}, out[4 * HD];
    EXPECT_OK(okv_kv_seq_cache_attend(kv, 0, q, 4 * HD, 4, out, 4 * HD, NULL));
    for (size_t h = 0; h < 4; h++) EXPECT(memcmp(out + h * HD, v + (h / 2) * HD, HD * sizeof(float)) == 0);
    /* 3 query heads over 2 KV heads: a GQA mismatch, out untouched. */
    float before[4 * HD];
    memcpy(before, out, sizeof out);
    EXPECT_STATUS(okv_kv_seq_cache_attend(kv, 0, q, 3 * HD, 3, out, 3 * HD, NULL), OKV_ERR_SHAPE);
    EXPECT(memcmp(before, out, sizeof out) == 0);
    EXPECT_OK(okv_kv_seq_cache_free(kv));
    EXPECT_OK(okv_config_free(cfg));
}

/* n_seqs counts every sequence that grows, the original included. */
static void test_cells_for_forks_counts(void) {
    okv_layer_config flat = {OKV_POLICY_FLAT, 0, 1, HD};
    okv_config *cfg = check_config(64, 1, flat, 1);
    size_t n = 0;
    EXPECT_OK(okv_cells_for_forks(cfg, 10, 1, 5, &n));
    EXPECT(n == 15); /* the original alone, growing by 5 */
    EXPECT_OK(okv_cells_for_forks(cfg, 10, 3, 5, &n));
    EXPECT(n == 25); /* the prefix once, then 3 sequences x 5 */
    /* 25 cells do serve the original plus two forks, each 5 more tokens. */
    okv_cell_cache *cc = NULL;
    EXPECT_OK(okv_cell_cache_new(cfg, n, 4, &cc));
    uint64_t s[3];
    EXPECT_OK(okv_cell_cache_seq_new(cc, &s[0]));
    for (size_t p = 0; p < 10; p++) EXPECT_OK(okv_cell_cache_begin_step(cc, &s[0], &p, 1));
    EXPECT_OK(okv_cell_cache_seq_clone(cc, s[0], OKV_NONE, &s[1]));
    EXPECT_OK(okv_cell_cache_seq_clone(cc, s[0], OKV_NONE, &s[2]));
    for (size_t p = 10; p < 15; p++)
        for (size_t i = 0; i < 3; i++) EXPECT_OK(okv_cell_cache_begin_step(cc, &s[i], &p, 1));
    size_t free_cells = 99;
    EXPECT_OK(okv_cell_cache_free_cells(cc, &free_cells));
    EXPECT(free_cells == 0);
    EXPECT_OK(okv_cell_cache_free(cc));
    EXPECT_OK(okv_config_free(cfg));
}

static void test_registry_statuses(void) {
    okv_handle_kind kind = OKV_HANDLE_CONFIG;
    void *h = (void *)(uintptr_t)0x1;
    EXPECT_STATUS(okv_registry_get("no such key, statuses.c", &kind, &h), OKV_ERR_NOT_FOUND);
    EXPECT(h == (void *)(uintptr_t)0x1);
    EXPECT_STATUS(okv_registry_get("\xff\xfe", &kind, &h), OKV_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(okv_last_error(), "UTF-8") != NULL);
    EXPECT_STATUS(okv_registry_erase("no such key, statuses.c"), OKV_ERR_NOT_FOUND);
}

int main(void) {
    test_config_statuses();
    test_cell_step_max_step();
    test_gqa_mapping();
    test_cells_for_forks_counts();
    test_registry_statuses();
    return CHECK_SUMMARY("statuses");
}
