/* The K/V rows the dtype and snapshot tests write (exchange.py writes the
 * same): multiples of 1/8 and 1/16 in [-1, 1), exact in float16 and bfloat16. */
#ifndef OKV_TEST_ROWS_H
#define OKV_TEST_ROWS_H
#include <stddef.h>

static inline float kval(size_t h, size_t t, size_t d) { return (float)((int)((h * 7 + t * 3 + d) % 16) - 8) * 0.125f; }
static inline float vval(size_t h, size_t t, size_t d) { return (float)((int)((h * 5 + t + d * 3) % 16) - 8) * 0.0625f; }

/* Tokens [t0, t0 + n) as [heads, n, hd] rows into k and v. */
static inline void test_rows(size_t heads, size_t hd, size_t t0, size_t n, float *k, float *v) {
    for (size_t h = 0; h < heads; h++)
        for (size_t t = 0; t < n; t++)
            for (size_t d = 0; d < hd; d++) {
                k[(h * n + t) * hd + d] = kval(h, t0 + t, d);
                v[(h * n + t) * hd + d] = vval(h, t0 + t, d);
            }
}

#endif
