/* The demo model of examples/runner/ (and python/offgraph_kv/demo_model.py)
 * in C: the counter-based splitmix64 weights, RMS norm, an order-preserving
 * f32 matmul (no FMA: build with -ffp-contract=off), head reshapes and the
 * greedy choice. Header-only (static functions) so the C and C++ runners
 * share one copy. */
#ifndef OFFGRAPH_KV_DEMO_MODEL_H
#define OFFGRAPH_KV_DEMO_MODEL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define DM_GOLDEN 0x9E3779B97F4A7C15ULL
enum { DM_TAG_EMB = 1, DM_TAG_WQ = 2, DM_TAG_WK = 3, DM_TAG_WV = 4, DM_TAG_WO = 5, DM_TAG_PROMPT = 6, DM_TAG_OUT = 7 };

typedef struct {
    size_t seqs, prefix, decode, chunk, layers, window, hidden, q_heads, kv_heads, head_dim, vocab;
    int64_t seed;
    size_t threads; /* 0: every core */
} dm_args;

/* The Rust runner's (and the Python demo's) defaults. */
static inline dm_args dm_default_args(void) {
    dm_args a = {16, 1024, 64, 256, 12, 256, 1024, 16, 4, 64, 1024, 0, 0};
    return a;
}

static inline int dm_is_flat(size_t layer) { return (layer + 1) % 6 == 0; }

static inline uint64_t dm_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline uint64_t dm_stream_key(int64_t seed, uint64_t tag, size_t layer) {
    uint64_t raw = (uint64_t)seed * 0x0100000001B3ULL + tag * 0x10001ULL + (uint64_t)layer * 0x101ULL;
    return dm_mix(raw);
}

static inline uint64_t dm_bits(uint64_t key, size_t i) { return dm_mix(key + ((uint64_t)i + 1) * DM_GOLDEN); }

/* uniform(key, n)[i]: float64 in [-1, 1). */
static inline double dm_uniform(uint64_t key, size_t i) {
    return (double)(dm_bits(key, i) >> 40) / (double)(1ULL << 24) * 2.0 - 1.0;
}

/* uniform / sqrt(rows) in float64, then cast. */
static inline float *dm_matrix(const dm_args *a, uint64_t tag, size_t layer, size_t rows, size_t cols) {
    float *m = (float *)malloc(rows * cols * sizeof(float));
    if (!m) return NULL;
    double s = sqrt((double)rows);
    uint64_t key = dm_stream_key(a->seed, tag, layer);
    for (size_t i = 0; i < rows * cols; i++) m[i] = (float)(dm_uniform(key, i) / s);
    return m;
}

typedef struct {
    float *emb, *out;
    float **wq, **wk, **wv, **wo;
    size_t layers;
} dm_weights;

static inline void dm_free_weights(dm_weights *w) {
    for (size_t i = 0; i < w->layers; i++) {
        if (w->wq) free(w->wq[i]);
        if (w->wk) free(w->wk[i]);
        if (w->wv) free(w->wv[i]);
        if (w->wo) free(w->wo[i]);
    }
    free(w->wq);
    free(w->wk);
    free(w->wv);
    free(w->wo);
    free(w->emb);
    free(w->out);
    memset(w, 0, sizeof *w);
}

/* 0 on success, -1 when out of memory. */
static inline int dm_make_weights(const dm_args *a, dm_weights *w) {
    size_t qd = a->q_heads * a->head_dim, kd = a->kv_heads * a->head_dim;
    memset(w, 0, sizeof *w);
    w->layers = a->layers;
    w->wq = (float **)calloc(a->layers, sizeof(float *));
    w->wk = (float **)calloc(a->layers, sizeof(float *));
    w->wv = (float **)calloc(a->layers, sizeof(float *));
    w->wo = (float **)calloc(a->layers, sizeof(float *));
    w->emb = (float *)malloc(a->vocab * a->hidden * sizeof(float));
    if (!w->wq || !w->wk || !w->wv || !w->wo || !w->emb) goto oom;
    for (size_t i = 0; i < a->vocab * a->hidden; i++)
        w->emb[i] = (float)dm_uniform(dm_stream_key(a->seed, DM_TAG_EMB, 0), i);
    for (size_t l = 0; l < a->layers; l++) {
        w->wq[l] = dm_matrix(a, DM_TAG_WQ, l, a->hidden, qd);
        w->wk[l] = dm_matrix(a, DM_TAG_WK, l, a->hidden, kd);
        w->wv[l] = dm_matrix(a, DM_TAG_WV, l, a->hidden, kd);
        w->wo[l] = dm_matrix(a, DM_TAG_WO, l, qd, a->hidden);
        if (!w->wq[l] || !w->wk[l] || !w->wv[l] || !w->wo[l]) goto oom;
    }
    w->out = dm_matrix(a, DM_TAG_OUT, 0, a->hidden, a->vocab);
    if (!w->out) goto oom;
    return 0;
oom:
    dm_free_weights(w);
    return -1;
}

/* The shared prompt prefix: integers(stream_key(seed, PROMPT, 0), prefix, vocab). */
static inline size_t dm_prompt_token(const dm_args *a, size_t i) {
    return (size_t)(dm_bits(dm_stream_key(a->seed, DM_TAG_PROMPT, 0), i) % (uint64_t)a->vocab);
}

static inline size_t dm_fork_token(const dm_args *a, size_t fork) { return (fork * 7 + 1) % a->vocab; }

/* x / sqrt(mean(x * x) + 1e-6) per row of `width` (the mean summed in f64). */
static inline void dm_rms_norm(const float *x, size_t rows, size_t width, float *out) {
    for (size_t r = 0; r < rows; r++) {
        const float *row = x + r * width;
        double ss = 0.0;
        for (size_t i = 0; i < width; i++) {
            float sq = row[i] * row[i];
            ss += (double)sq;
        }
        float mean = (float)(ss / (double)width);
        float d = sqrtf(mean + 1e-6f);
        for (size_t i = 0; i < width; i++) out[r * width + i] = row[i] / d;
    }
}

/* out [t, n] = x [t, k] . w [k, n], each output accumulated over k in order. */
static inline void dm_matmul(const float *x, size_t t, size_t k, const float *w, size_t n, float *out) {
    memset(out, 0, t * n * sizeof(float));
    for (size_t r = 0; r < t; r++) {
        float *o = out + r * n;
        for (size_t kk = 0; kk < k; kk++) {
            float xv = x[r * k + kk];
            const float *wr = w + kk * n;
            for (size_t j = 0; j < n; j++) o[j] += xv * wr[j];
        }
    }
}

/* [t, n * d] -> [n, t, d]. */
static inline void dm_heads(const float *x, size_t t, size_t n, size_t d, float *out) {
    for (size_t ti = 0; ti < t; ti++)
        for (size_t h = 0; h < n; h++) memcpy(out + (h * t + ti) * d, x + (ti * n + h) * d, d * sizeof(float));
}

/* [n, t, d] -> [t, n * d]. */
static inline void dm_unheads(const float *x, size_t t, size_t n, size_t d, float *out) {
    for (size_t h = 0; h < n; h++)
        for (size_t ti = 0; ti < t; ti++) memcpy(out + (ti * n + h) * d, x + (h * t + ti) * d, d * sizeof(float));
}

/* Greedy: argmax(rms_norm(x) . out) per row, the first index on ties.
 * `scratch` holds t * (hidden + vocab) floats. */
static inline void dm_next_tokens(const dm_args *a, const dm_weights *w, const float *x, size_t t, float *scratch,
                                  size_t *tokens) {
    float *h = scratch, *logits = scratch + t * a->hidden;
    dm_rms_norm(x, t, a->hidden, h);
    dm_matmul(h, t, a->hidden, w->out, a->vocab, logits);
    for (size_t r = 0; r < t; r++) {
        const float *row = logits + r * a->vocab;
        size_t best = 0;
        for (size_t i = 1; i < a->vocab; i++)
            if (row[i] > row[best]) best = i;
        tokens[r] = best;
    }
}

/* Parses the runner flags shared by the C and C++ examples into `a`.
 * Returns 1 when `flag` is one of them (its value consumed), 0 when unknown,
 * -1 for a bad value. */
static inline int dm_parse_flag(dm_args *a, const char *flag, const char *value) {
    struct {
        const char *name;
        size_t *field;
    } flags[] = {
        {"--seqs", &a->seqs},       {"--prefix", &a->prefix},     {"--decode", &a->decode},
        {"--chunk", &a->chunk},     {"--layers", &a->layers},     {"--window", &a->window},
        {"--hidden", &a->hidden},   {"--q-heads", &a->q_heads},   {"--kv-heads", &a->kv_heads},
        {"--head-dim", &a->head_dim}, {"--vocab", &a->vocab},     {"--threads", &a->threads},
    };
    char *end = NULL;
    if (strcmp(flag, "--seed") == 0) {
        long long v = strtoll(value, &end, 10);
        if (!*value || *end) return -1;
        a->seed = (int64_t)v;
        return 1;
    }
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        if (strcmp(flag, flags[i].name) == 0) {
            unsigned long long v = strtoull(value, &end, 10);
            if (!*value || *end || v == 0 || value[0] == '-') return -1;
            *flags[i].field = (size_t)v;
            return 1;
        }
    }
    return 0;
}

#endif
