/* The demo's decode loop through the C API: the workload of
 * examples/runner/ with the same model, weights and tokens.
 *
 * A shared prompt prefix is prefilled once, in chunks, on one sequence of a
 * okv_kv_cell_cache; every other sequence forks it with okv_kv_cell_cache_seq_clone
 * (cells shared, no K/V copied); then all decode one token per step in
 * batched steps: okv_kv_cell_cache_begin_step, then per layer _update and
 * _attend into this program's buffer. It prints the generated tokens as
 * `generated: [[...], ...]` (the Rust runner's --dump JSON has the same list).
 *
 *   cc -std=c11 -O2 -ffp-contract=off -I bindings/c/include examples/c/runner.c \
 *      -L target/release -loffgraph_kv_c -lm -o runner-c
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offgraph_kv.h"
#include "demo_model.h"

#define CHECK(call)                                                                                  \
    do {                                                                                             \
        okv_status s_ = (call);                                                                      \
        if (s_ != OKV_OK) {                                                                          \
            fprintf(stderr, "runner-c: %s: %s: %s\n", #call, okv_status_name(s_), okv_last_error()); \
            goto done;                                                                               \
        }                                                                                            \
    } while (0)

typedef struct {
    const dm_args *a;
    const dm_weights *w;
    okv_kv_cell_cache *kc;
    okv_attend_options opts;
    /* Scratch of one step of up to max_t tokens. */
    float *x, *h, *tmp, *q, *k, *v, *o, *proj;
} runner;

/* One step through every layer: x [t, hidden] after the last layer. 0 on success. */
static int forward(runner *r, const size_t *tokens, const uint64_t *ids, const size_t *positions, size_t t) {
    const dm_args *a = r->a;
    const dm_weights *w = r->w;
    size_t hd = a->hidden, qd = a->q_heads * a->head_dim, kd = a->kv_heads * a->head_dim;
    int rc = -1;
    CHECK(okv_kv_cell_cache_begin_step(r->kc, ids, positions, t));
    for (size_t i = 0; i < t; i++) memcpy(r->x + i * hd, w->emb + tokens[i] * hd, hd * sizeof(float));
    for (size_t layer = 0; layer < a->layers; layer++) {
        dm_rms_norm(r->x, t, hd, r->h);
        dm_matmul(r->h, t, hd, w->wk[layer], kd, r->tmp);
        dm_heads(r->tmp, t, a->kv_heads, a->head_dim, r->k);
        dm_matmul(r->h, t, hd, w->wv[layer], kd, r->tmp);
        dm_heads(r->tmp, t, a->kv_heads, a->head_dim, r->v);
        dm_matmul(r->h, t, hd, w->wq[layer], qd, r->tmp);
        dm_heads(r->tmp, t, a->q_heads, a->head_dim, r->q);
        CHECK(okv_kv_cell_cache_update(r->kc, layer, r->k, t * kd, r->v, t * kd));
        CHECK(okv_kv_cell_cache_attend(r->kc, layer, r->q, t * qd, a->q_heads, r->o, t * qd, &r->opts));
        dm_unheads(r->o, t, a->q_heads, a->head_dim, r->tmp);
        dm_matmul(r->tmp, t, qd, w->wo[layer], hd, r->proj);
        for (size_t i = 0; i < t * hd; i++) r->x[i] += r->proj[i];
    }
    rc = 0;
done:
    return rc;
}

/* The cache the demo builds, sized for its worst case (build_cache in examples/runner/decode.rs). */
static okv_status build_cache(const dm_args *a, okv_kv_cell_cache **out) {
    size_t capacity = a->prefix + a->decode;
    size_t max_step = a->chunk > a->seqs ? a->chunk : a->seqs;
    if (max_step > capacity) max_step = capacity;
    okv_config *cfg = NULL;
    okv_layer_config *layers = (okv_layer_config *)calloc(a->layers, sizeof(okv_layer_config));
    okv_status s = layers ? OKV_OK : OKV_ERR_OUT_OF_CAPACITY;
    if (s != OKV_OK) return s;
    for (size_t i = 0; i < a->layers; i++) {
        layers[i].policy = dm_is_flat(i) ? OKV_POLICY_FLAT : OKV_POLICY_RING;
        layers[i].window = a->window;
        layers[i].n_kv_heads = a->kv_heads;
        layers[i].head_dim = a->head_dim;
    }
    size_t n_cells = 0;
    if ((s = okv_config_new(capacity, a->layers, &cfg)) == OKV_OK &&
        (s = okv_config_set_layers(cfg, layers, a->layers)) == OKV_OK &&
        (s = okv_config_set_initial_capacity(cfg, capacity < 64 ? capacity : 64)) == OKV_OK &&
        (s = okv_config_set_max_step(cfg, max_step)) == OKV_OK &&
        (s = okv_cells_for_forks(cfg, a->prefix, a->seqs, a->decode, &n_cells)) == OKV_OK)
        s = okv_kv_cell_cache_new(cfg, n_cells, a->seqs, out);
    okv_config_free(cfg);
    free(layers);
    return s;
}

static void print_list(const size_t *v, size_t n) {
    printf("[");
    for (size_t i = 0; i < n; i++) printf(i ? ", %zu" : "%zu", v[i]);
    printf("]");
}

static const char USAGE[] =
    "usage: runner-c [--seqs N] [--prefix N] [--decode N] [--chunk N] [--layers N]\n"
    "                [--window N] [--hidden N] [--q-heads N] [--kv-heads N]\n"
    "                [--head-dim N] [--vocab N] [--seed INT] [--threads N]\n"
    "The offgraph-kv demo's workload (same weights, prompt and tokens as examples/runner/) in C.\n";

int main(int argc, char **argv) {
    dm_args a = dm_default_args();
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(USAGE, stdout);
            return 0;
        }
        int got = i + 1 < argc ? dm_parse_flag(&a, argv[i], argv[i + 1]) : 0;
        if (got != 1) {
            fprintf(stderr, "%srunner-c: error: bad or unknown argument %s\n", USAGE, argv[i]);
            return 2;
        }
        i++;
    }
    if (a.q_heads % a.kv_heads != 0 || a.window > a.prefix + a.decode) {
        fprintf(stderr, "runner-c: error: --q-heads must be a multiple of --kv-heads, --window at most --prefix + --decode\n");
        return 2;
    }
    printf("offgraph-kv runner (C API): %zu sequences share a %zu-token prefix, then decode %zu tokens each\n", a.seqs,
           a.prefix, a.decode);

    int rc = 1;
    dm_weights w;
    runner r;
    memset(&r, 0, sizeof r);
    size_t *step = NULL, *gen = NULL, *tok = NULL, *pos = NULL;
    uint64_t *ids = NULL, *step_ids = NULL;
    float *scratch = NULL;
    if (dm_make_weights(&a, &w) != 0) {
        fprintf(stderr, "runner-c: out of memory\n");
        return 1;
    }
    size_t max_t = a.chunk > a.seqs ? a.chunk : a.seqs;
    size_t widest = a.hidden;
    if (a.q_heads * a.head_dim > widest) widest = a.q_heads * a.head_dim;
    r.a = &a;
    r.w = &w;
    r.opts.threads = a.threads;
    r.opts.backend = OKV_BACKEND_AUTO;
    r.x = (float *)malloc(max_t * a.hidden * sizeof(float));
    r.h = (float *)malloc(max_t * a.hidden * sizeof(float));
    r.proj = (float *)malloc(max_t * a.hidden * sizeof(float));
    r.tmp = (float *)malloc(max_t * widest * sizeof(float));
    r.q = (float *)malloc(max_t * a.q_heads * a.head_dim * sizeof(float));
    r.o = (float *)malloc(max_t * a.q_heads * a.head_dim * sizeof(float));
    r.k = (float *)malloc(max_t * a.kv_heads * a.head_dim * sizeof(float));
    r.v = (float *)malloc(max_t * a.kv_heads * a.head_dim * sizeof(float));
    step = (size_t *)malloc(a.seqs * sizeof(size_t));
    gen = (size_t *)malloc(a.seqs * a.decode * sizeof(size_t));
    tok = (size_t *)malloc(max_t * sizeof(size_t));
    pos = (size_t *)malloc(max_t * sizeof(size_t));
    ids = (uint64_t *)malloc(a.seqs * sizeof(uint64_t));
    step_ids = (uint64_t *)malloc(max_t * sizeof(uint64_t));
    scratch = (float *)malloc(a.seqs * (a.hidden + a.vocab) * sizeof(float));
    if (!r.x || !r.h || !r.proj || !r.tmp || !r.q || !r.o || !r.k || !r.v || !step || !gen || !tok || !pos || !ids ||
        !step_ids || !scratch) {
        fprintf(stderr, "runner-c: out of memory\n");
        goto done;
    }
    CHECK(build_cache(&a, &r.kc));

    /* Prefill the shared prefix once, in chunks, on one sequence. */
    CHECK(okv_kv_cell_cache_seq_new(r.kc, &ids[0]));
    for (size_t start = 0; start < a.prefix; start += a.chunk) {
        size_t stop = start + a.chunk < a.prefix ? start + a.chunk : a.prefix;
        for (size_t p = start; p < stop; p++) {
            tok[p - start] = dm_prompt_token(&a, p);
            pos[p - start] = p;
            step_ids[p - start] = ids[0];
        }
        if (forward(&r, tok, step_ids, pos, stop - start) != 0) goto done;
    }
    /* Fork: every other sequence shares the prefix's cells. */
    for (size_t s = 1; s < a.seqs; s++) CHECK(okv_kv_cell_cache_seq_clone(r.kc, ids[0], OKV_NONE, &ids[s]));
    for (size_t s = 0; s < a.seqs; s++) step[s] = dm_fork_token(&a, s);
    for (size_t m = 0; m < a.decode; m++) {
        for (size_t s = 0; s < a.seqs; s++) pos[s] = a.prefix + m;
        if (forward(&r, step, ids, pos, a.seqs) != 0) goto done;
        dm_next_tokens(&a, &w, r.x, a.seqs, scratch, step);
        for (size_t s = 0; s < a.seqs; s++) gen[s * a.decode + m] = step[s];
    }

    printf("generated: [");
    for (size_t s = 0; s < a.seqs; s++) {
        if (s) printf(", ");
        print_list(gen + s * a.decode, a.decode);
    }
    printf("]\n");
    rc = 0;
done:
    if (r.kc) okv_kv_cell_cache_free(r.kc);
    dm_free_weights(&w);
    free(r.x);
    free(r.h);
    free(r.proj);
    free(r.tmp);
    free(r.q);
    free(r.o);
    free(r.k);
    free(r.v);
    free(step);
    free(gen);
    free(tok);
    free(pos);
    free(ids);
    free(step_ids);
    free(scratch);
    return rc;
}
