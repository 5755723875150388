/* hfspec's few-row fp32 linear: y[m, n] = sum_k x[m, k] * w[n, k] (+ b[n]) for 1 <= M <= 16 rows of x, reading
 * each row of w once for all M rows (hfspec/kernels/verify_linear.py builds it and says why).
 *
 * A row of w is loaded 16 floats at a time and multiplied into M accumulators, one per row of x (which stays in
 * L1); the row PREFETCH_ROWS rows ahead is prefetched as it goes, so that the memory reads overlap the arithmetic
 * (without it every extra row of x cost about a tenth of the one-row product on the 2-core AMX Xeon VM; with it a
 * twentieth). Threads split the rows of w evenly (OpenMP, the same runtime as torch's). */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#define PREFETCH_ROWS 2

#define ROWS_BODY(M)                                                                                               \
  for (int64_t n = n0; n < n1; n++) {                                                                              \
    const float* wn = w + n * K;                                                                                   \
    __m512 acc[M];                                                                                                 \
    for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();                                                      \
    int64_t k = 0;                                                                                                 \
    for (; k + 16 <= K; k += 16) {                                                                                 \
      _mm_prefetch((const char*)(wn + PREFETCH_ROWS * K + k), _MM_HINT_T0);                                        \
      __m512 wv = _mm512_loadu_ps(wn + k);                                                                         \
      for (int m = 0; m < M; m++) acc[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * K + k), wv, acc[m]);            \
    }                                                                                                              \
    if (k < K) {                                                                                                   \
      __mmask16 mask = (__mmask16)((1u << (K - k)) - 1u);                                                          \
      __m512 wv = _mm512_maskz_loadu_ps(mask, wn + k);                                                             \
      for (int m = 0; m < M; m++) acc[m] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, x + m * K + k), wv, acc[m]); \
    }                                                                                                              \
    float bn = b ? b[n] : 0.0f;                                                                                    \
    for (int m = 0; m < M; m++) y[m * N + n] = _mm512_reduce_add_ps(acc[m]) + bn;                                  \
  }

#define DEFINE_ROWS(M)                                                                                             \
  static void rows_##M(const float* x, const float* w, const float* b, float* y, int64_t N, int64_t K,            \
                       int64_t n0, int64_t n1) {                                                                   \
    ROWS_BODY(M)                                                                                                   \
  }

DEFINE_ROWS(1) DEFINE_ROWS(2) DEFINE_ROWS(3) DEFINE_ROWS(4) DEFINE_ROWS(5) DEFINE_ROWS(6) DEFINE_ROWS(7)
DEFINE_ROWS(8) DEFINE_ROWS(9) DEFINE_ROWS(10) DEFINE_ROWS(11) DEFINE_ROWS(12) DEFINE_ROWS(13) DEFINE_ROWS(14)
DEFINE_ROWS(15) DEFINE_ROWS(16)

typedef void (*rows_fn)(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
static const rows_fn ROWS[17] = {0,       rows_1,  rows_2,  rows_3,  rows_4,  rows_5,  rows_6,  rows_7, rows_8,
                                 rows_9,  rows_10, rows_11, rows_12, rows_13, rows_14, rows_15, rows_16};

/* x [M, K], w [N, K], b [N] or NULL, y [M, N], all contiguous fp32. Returns 0, or 1 for M outside 1..16. */
int hfspec_rows_linear(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t N, int64_t K,
                       int threads) {
  if (M < 1 || M > 16 || N < 1 || K < 1) return 1;
  rows_fn fn = ROWS[M];
  if (threads < 2 || N < 64) {
    fn(x, w, b, y, N, K, 0, N);
    return 0;
  }
#pragma omp parallel num_threads(threads)
  {
    int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    int64_t per = (N + nt - 1) / nt, n0 = t * per, n1 = n0 + per < N ? n0 + per : N;
    if (n0 < n1) fn(x, w, b, y, N, K, n0, n1);
  }
  return 0;
}
