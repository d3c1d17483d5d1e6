/* Handles across threads: a call on a handle another thread is inside is
 * refused with OKV_ERR_BUSY (never raced), a free racing a call is refused or
 * makes the late call BAD_HANDLE, and the registry takes calls from any thread. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

enum { HEADS = 2, HD = 64, T = 64, QH = 8, CAP = 4096 };

typedef struct {
    okv_kv_seq_cache *kv;
    float *q, *out;
    atomic_int stop, calls, unexpected;
    /* Yield between calls, so a racing free can find the handle idle even where
     * threads are serialized (valgrind runs one thread at a time). */
    int yield_between;
} worker_state;

/* Attends over and over until told to stop: most of its time is inside a call. */
static void *worker(void *arg) {
    worker_state *w = (worker_state *)arg;
    okv_attend_options opts = {0.0f, 1, OKV_BACKEND_NATIVE};
    while (!atomic_load(&w->stop)) {
        okv_status s = okv_kv_seq_cache_attend(w->kv, 0, w->q, QH * T * HD, QH, w->out, QH * T * HD, &opts);
        if (s == OKV_ERR_BAD_HANDLE) break; /* freed under us: refused, not read */
        if (s != OKV_OK && s != OKV_ERR_BUSY) atomic_fetch_add(&w->unexpected, 1);
        atomic_fetch_add(&w->calls, 1);
        if (w->yield_between) sched_yield();
    }
    return NULL;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static okv_kv_seq_cache *filled_cache(okv_config **cfg_out) {
    okv_layer_config l = {OKV_POLICY_FLAT, 0, HEADS, HD};
    okv_config *cfg = check_config(CAP, 1, l, T);
    okv_kv_seq_cache *kv = NULL;
    EXPECT_OK(okv_kv_seq_cache_new(cfg, &kv));
    float *k = (float *)calloc(HEADS * T * HD, sizeof(float));
    size_t pos = 0;
    for (int s = 0; s < 16; s++) {
        EXPECT_OK(okv_kv_seq_cache_begin_step(kv, T, &pos));
        EXPECT_OK(okv_kv_seq_cache_update(kv, 0, k, HEADS * T * HD, k, HEADS * T * HD));
    }
    free(k);
    *cfg_out = cfg;
    return kv;
}

/* A worker's state over a filled cache; the caller starts the thread. */
static void worker_setup(worker_state *w, okv_config **cfg, int yield_between) {
    memset(w, 0, sizeof *w);
    w->kv = filled_cache(cfg);
    w->q = (float *)calloc(QH * T * HD, sizeof(float));
    w->out = (float *)calloc(QH * T * HD, sizeof(float));
    w->yield_between = yield_between;
}

static void test_busy(void) {
    okv_config *cfg = NULL;
    worker_state w;
    worker_setup(&w, &cfg, 0);
    size_t len = 0, before = 0;
    EXPECT_OK(okv_kv_seq_cache_length(w.kv, &before));
    EXPECT(before == 16 * T);
    pthread_t th;
    pthread_create(&th, NULL, worker, &w);
    /* Read the handle until a call lands while the worker is inside one;
     * every answer must be the length or BUSY (nothing in between). */
    int busy = 0, other = 0;
    double t0 = now();
    while (!busy && now() - t0 < 60.0) {
        size_t got = 12345;
        okv_status s = okv_kv_seq_cache_length(w.kv, &got);
        if (s == OKV_ERR_BUSY) {
            busy = 1;
            EXPECT(got == 12345);
            EXPECT(strstr(okv_last_error(), "another thread") != NULL);
        } else if (s != OKV_OK || got != before) {
            other++;
        }
        sched_yield(); /* let the worker run where threads are serialized */
    }
    EXPECT(busy);
    EXPECT(other == 0);
    atomic_store(&w.stop, 1);
    pthread_join(th, NULL);
    EXPECT(atomic_load(&w.unexpected) == 0);
    EXPECT(atomic_load(&w.calls) > 0);
    EXPECT_OK(okv_kv_seq_cache_length(w.kv, &len));
    EXPECT(len == before);
    EXPECT_OK(okv_kv_seq_cache_free(w.kv));
    EXPECT_OK(okv_config_free(cfg));
    free(w.q);
    free(w.out);
}

static void test_free_racing_a_call(void) {
    okv_config *cfg = NULL;
    worker_state w;
    worker_setup(&w, &cfg, 1);
    pthread_t th;
    pthread_create(&th, NULL, worker, &w);
    while (atomic_load(&w.calls) == 0) sched_yield();
    /* Free while the worker is (most likely) inside a call: refused as BUSY;
     * once it succeeds the worker's next call is BAD_HANDLE and it exits. */
    int busy = 0;
    okv_status s;
    double t0 = now();
    while ((s = okv_kv_seq_cache_free(w.kv)) == OKV_ERR_BUSY && now() - t0 < 60.0) {
        busy++;
        sched_yield(); /* the worker must run to leave its call */
    }
    EXPECT(s == OKV_OK);
    atomic_store(&w.stop, 1); /* only matters if the free never went through */
    pthread_join(th, NULL);
    if (s != OKV_OK) EXPECT_OK(okv_kv_seq_cache_free(w.kv));
    EXPECT(atomic_load(&w.unexpected) == 0);
    printf("free racing attend: %d refusals as busy before it went through\n", busy);
    EXPECT_OK(okv_config_free(cfg));
    free(w.q);
    free(w.out);
}

static void *registry_worker(void *arg) {
    long id = (long)(intptr_t)arg;
    okv_config *cfg = NULL;
    okv_config_new(8, 1, &cfg);
    for (int i = 0; i < 200; i++) {
        char key[64];
        size_t n = 0;
        if (okv_registry_unique_key("threads-", key, sizeof key, &n) != OKV_OK) return (void *)1;
        if (okv_registry_install(key, cfg) != OKV_OK) return (void *)2;
        okv_handle_kind kind;
        void *h = NULL;
        if (okv_registry_get(key, &kind, &h) != OKV_OK || h != (void *)cfg) return (void *)3;
        if (okv_registry_erase(key) != OKV_OK) return (void *)4;
    }
    (void)id;
    okv_config_free(cfg);
    return NULL;
}

static void test_registry_from_threads(void) {
    pthread_t th[4];
    for (long i = 0; i < 4; i++) pthread_create(&th[i], NULL, registry_worker, (void *)(intptr_t)i);
    for (int i = 0; i < 4; i++) {
        void *r = NULL;
        pthread_join(th[i], &r);
        EXPECT(r == NULL);
    }
}

int main(void) {
    test_busy();
    test_free_racing_a_call();
    test_registry_from_threads();
    return CHECK_SUMMARY("threads");
}
