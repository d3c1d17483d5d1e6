/* fork after a threaded attend: the child (which holds none of the parent's
 * worker threads) runs a 2-thread attend equal to the 1-thread result instead
 * of waiting forever on workers that do not exist; the parent waits with a
 * deadline, so a regression fails instead of hanging. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

enum { HEADS = 2, HD = 64, T = 64, QH = 4, CAP = 256, N = QH * T * HD };
/* The child's exit codes. */
enum { SAME = 0, DIFFERENT = 3, FAILED = 4 };

static float unit(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
}

static okv_status attend(okv_kv_seq_cache *kv, const float *q, float *out, size_t threads) {
    okv_attend_options opts = {0.0f, threads, OKV_BACKEND_NATIVE};
    return okv_kv_seq_cache_attend(kv, 0, q, N, QH, out, N, &opts);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(void) {
    okv_layer_config l = {OKV_POLICY_FLAT, 0, HEADS, HD};
    okv_config *cfg = check_config(CAP, 1, l, T);
    okv_kv_seq_cache *kv = NULL;
    EXPECT_OK(okv_kv_seq_cache_new(cfg, &kv));
    float *k = (float *)malloc(HEADS * T * HD * sizeof(float));
    float *v = (float *)malloc(HEADS * T * HD * sizeof(float));
    float *q = (float *)malloc(N * sizeof(float));
    float *one = (float *)calloc(N, sizeof(float));
    float *two = (float *)calloc(N, sizeof(float));
    unsigned seed = 7;
    for (int i = 0; i < HEADS * T * HD; i++) k[i] = unit(&seed), v[i] = unit(&seed);
    for (int i = 0; i < N; i++) q[i] = unit(&seed);
    size_t pos = 0;
    EXPECT_OK(okv_kv_seq_cache_begin_step(kv, T, &pos));
    EXPECT_OK(okv_kv_seq_cache_update(kv, 0, k, HEADS * T * HD, v, HEADS * T * HD));
    EXPECT_OK(attend(kv, q, one, 1));
    /* Starts the worker pool in this process. */
    EXPECT_OK(attend(kv, q, two, 2));
    EXPECT(memcmp(one, two, N * sizeof(float)) == 0);

    fflush(NULL);
    pid_t pid = fork();
    EXPECT(pid >= 0);
    if (pid == 0) {
        memset(two, 0, N * sizeof(float));
        int code = attend(kv, q, two, 2) != OKV_OK                ? FAILED
                   : memcmp(one, two, N * sizeof(float)) == 0 ? SAME
                                                              : DIFFERENT;
        _exit(code);
    }
    if (pid > 0) {
        /* Generous: valgrind runs the child too, one thread at a time. */
        double limit = 120.0, t0 = now();
        int status = 0, done = 0;
        while (!done && now() - t0 < limit) {
            pid_t r = waitpid(pid, &status, WNOHANG);
            if (r == pid) {
                done = 1;
            } else if (r < 0) {
                break;
            } else {
                struct timespec tick = {0, 10 * 1000 * 1000};
                nanosleep(&tick, NULL);
            }
        }
        if (!done) {
            fprintf(stderr, "the forked child's 2-thread attend did not finish within %.0f s (killed)\n", limit);
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
        }
        EXPECT(done);
        EXPECT(done && WIFEXITED(status) && WEXITSTATUS(status) == SAME);
        if (done && WIFEXITED(status)) printf("child exited %d (0: equal to 1 thread)\n", WEXITSTATUS(status));
    }
    /* The parent's own pool still serves it. */
    memset(two, 0, N * sizeof(float));
    EXPECT_OK(attend(kv, q, two, 2));
    EXPECT(memcmp(one, two, N * sizeof(float)) == 0);

    EXPECT_OK(okv_kv_seq_cache_free(kv));
    EXPECT_OK(okv_config_free(cfg));
    free(k), free(v), free(q), free(one), free(two);
    return CHECK_SUMMARY("fork");
}
