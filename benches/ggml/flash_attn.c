// ggml's CPU flash attention (ggml_flash_attn_ext) on the decode shapes of
// benches/decode_floor.rs, against the same streaming-read floor, in one run.
//
// T = 1, 8 KV heads, 32 query heads, head_dim 128, contexts 2048 and 8192,
// 1 and 2 threads (a persistent ggml threadpool), cold (a 96 MiB read before
// every call) and warm; each round times ggml and the floor back to back, the
// order alternating; medians. Built against a ggml built from source by
// benches/bench_decode_ggml.py (nothing of ggml is kept in this repository).
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml.h"
#include "ggml-cpu.h"

#define N_KV 8
#define N_Q 32
#define HD 128

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n) {
    qsort(x, n, sizeof(double), cmp);
    return x[n / 2];
}

// The floor: K and V bytes read side by side with AVX loads into 8
// accumulators, prefetching 32 KiB ahead into L2 (benches/common/mod.rs).
static float stream2(const char *k, const char *v, size_t n) {
    __m256 a[8];
    for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
    size_t o = 0;
    for (; o + 128 <= n; o += 128) {
        for (int l = 0; l < 2; l++) {
            _mm_prefetch(k + o + (32 << 10) + 64 * l, _MM_HINT_T1);
            _mm_prefetch(v + o + (32 << 10) + 64 * l, _MM_HINT_T1);
        }
        for (int l = 0; l < 4; l++) {
            a[l] = _mm256_add_ps(a[l], _mm256_loadu_ps((const float *)(k + o + 32 * l)));
            a[4 + l] = _mm256_add_ps(a[4 + l], _mm256_loadu_ps((const float *)(v + o + 32 * l)));
        }
    }
    __m256 s = a[0];
    for (int i = 1; i < 8; i++) s = _mm256_add_ps(s, a[i]);
    float lanes[8];
    _mm256_storeu_ps(lanes, s);
    float t = 0;
    for (int i = 0; i < 8; i++) t += lanes[i];
    return t;
}

// A helper thread started once that reads the second half of the floor.
struct helper {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const char *k, *v;
    size_t n;
    int state;  // 0 idle, 1 work posted, 2 done
    float out;
};

static void *helper_main(void *arg) {
    struct helper *h = arg;
    for (;;) {
        pthread_mutex_lock(&h->mu);
        while (h->state != 1) pthread_cond_wait(&h->cv, &h->mu);
        pthread_mutex_unlock(&h->mu);
        float r = stream2(h->k, h->v, h->n);
        pthread_mutex_lock(&h->mu);
        h->out = r;
        h->state = 2;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
    }
    return NULL;
}

static float floor_read(struct helper *h, const char *k, const char *v, size_t n, int threads) {
    if (threads == 1) return stream2(k, v, n);
    size_t half = (n / 2) & ~(size_t)255;
    pthread_mutex_lock(&h->mu);
    h->k = k + half;
    h->v = v + half;
    h->n = n - half;
    h->state = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    float a = stream2(k, v, half);
    pthread_mutex_lock(&h->mu);
    while (h->state != 2) pthread_cond_wait(&h->cv, &h->mu);
    h->state = 0;
    float b = h->out;
    pthread_mutex_unlock(&h->mu);
    return a + b;
}

static float flush(const float *buf, size_t n) {
    float acc[32] = {0};
    for (size_t i = 0; i + 32 <= n; i += 32)
        for (int j = 0; j < 32; j++) acc[j] += buf[i + j];
    float s = 0;
    for (int j = 0; j < 32; j++) s += acc[j];
    return s;
}

static void fill(float *x, size_t n, unsigned seed) {
    unsigned s = seed * 2654435761u;
    if (!s) s = 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        x[i] = (float)(s >> 8) / (float)(1u << 24) - 0.5f;
    }
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 41;
    int quick = getenv("ATTN_BENCH_QUICK") != NULL;
    const int ctxs[2] = {2048, 8192};
    const enum ggml_type types[4] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0};
    const char *names[4] = {"float32", "float16", "bfloat16", "q8_0"};
    size_t nflush = (size_t)24 << 20;
    float *fbuf = malloc(nflush * sizeof(float));
    for (size_t i = 0; i < nflush; i++) fbuf[i] = 1.0f;
    struct helper h = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0};
    pthread_t ht;
    pthread_create(&ht, NULL, helper_main, &h);
    volatile float sink = 0;
    printf("| ctx | threads | cache | dtype | ggml ms | floor ms | ggml / floor |\n|---|---|---|---|---|---|---|\n");
    double *tk = malloc(sizeof(double) * (rounds + 1)), *tf = malloc(sizeof(double) * (rounds + 1));
    for (int ci = 0; ci < (quick ? 1 : 2); ci++) {
        int ctx = ctxs[ci];
        size_t nvals = (size_t)N_KV * ctx * HD;
        float *kf = malloc(nvals * sizeof(float)), *vf = malloc(nvals * sizeof(float));
        float *qf = malloc((size_t)N_Q * HD * sizeof(float));
        fill(kf, nvals, 1);
        fill(vf, nvals, 2);
        fill(qf, N_Q * HD, 3);
        for (int threads = 1; threads <= 2; threads++) {
            struct ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
            struct ggml_threadpool *tp = ggml_threadpool_new(&tpp);
            for (int warm = 0; warm <= 1; warm++) {
                for (int ti = 0; ti < 4; ti++) {
                    enum ggml_type ty = types[ti];
                    size_t kbytes = ggml_row_size(ty, HD) * ctx * N_KV;
                    struct ggml_init_params ip = {2 * kbytes + ((size_t)64 << 20), NULL, false};
                    struct ggml_context *g = ggml_init(ip);
                    struct ggml_tensor *q = ggml_new_tensor_4d(g, GGML_TYPE_F32, HD, 1, N_Q, 1);
                    struct ggml_tensor *k = ggml_new_tensor_4d(g, ty, HD, ctx, N_KV, 1);
                    struct ggml_tensor *v = ggml_new_tensor_4d(g, ty, HD, ctx, N_KV, 1);
                    memcpy(q->data, qf, (size_t)N_Q * HD * sizeof(float));
                    ggml_quantize_chunk(ty, kf, k->data, 0, (int64_t)ctx * N_KV, HD, NULL);
                    ggml_quantize_chunk(ty, vf, v->data, 0, (int64_t)ctx * N_KV, HD, NULL);
                    struct ggml_tensor *o = ggml_flash_attn_ext(g, q, k, v, NULL, 0.08838834764831845f, 0.0f, 0.0f);
                    struct ggml_cgraph *gf = ggml_new_graph(g);
                    ggml_build_forward_expand(gf, o);
                    struct ggml_cplan plan = ggml_graph_plan(gf, threads, tp);
                    void *work = plan.work_size ? malloc(plan.work_size) : NULL;
                    plan.work_data = work;
                    for (int r = 0; r < rounds + 1; r++) {
                        for (int oi = 0; oi < 2; oi++) {
                            int which = (oi + r) % 2;
                            if (!warm) sink += flush(fbuf, nflush);
                            else if (which == 0) ggml_graph_compute(gf, &plan);
                            else sink += floor_read(&h, k->data, v->data, kbytes, threads);
                            double t0 = now_ms();
                            if (which == 0) ggml_graph_compute(gf, &plan);
                            else sink += floor_read(&h, k->data, v->data, kbytes, threads);
                            double dt = now_ms() - t0;
                            if (r > 0) (which == 0 ? tk : tf)[r - 1] = dt;
                        }
                    }
                    double km = median(tk, rounds), fm = median(tf, rounds);
                    printf("| %d | %d | %s | %s | %.3f | %.3f | %.2f |\n", ctx, threads, warm ? "warm" : "cold",
                           names[ti], km, fm, km / fm);
                    fflush(stdout);
                    free(work);
                    ggml_free(g);
                }
            }
            ggml_threadpool_free(tp);
        }
        free(kf);
        free(vf);
        free(qf);
    }
    return sink == 12345.0f;
}
