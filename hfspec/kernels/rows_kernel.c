/* hfspec's few-row linear: y[m, n] = sum_k x[m, k] * w[n, k] (+ b[n]) for a few rows of x, reading each row of w
 * from memory once for all of them (hfspec/kernels/verify_linear.py builds it and says why). fp32 and bf16.
 *
 * A row of w is loaded 16 floats (32 bf16) at a time and multiplied into one accumulator per row of x (which stays
 * in L1), while the row PREFETCH_ROWS rows ahead is prefetched, so that memory reads overlap the arithmetic (without
 * it every extra row of x cost about a tenth of the one-row product on the 2-core AMX Xeon VM; with it a twentieth).
 * In fp32, from PAIR_ROWS to PAIR_MAX rows of x, two rows of w are taken at a time, so that each load of x feeds two
 * multiplies (on the 2-core AVX-512 EPYC a whole SmolLM2-135M pass over 16 positions cost 1.02 one-token MKL steps
 * against 1.22 without, 32 positions 1.66 against 2.01; pairs from 2 rows on, where memory sets the pace, were
 * slower: 2 rows 0.72 against 0.57). Rows of x are taken in near-equal chunks of at most F32_CHUNK / BF16_CHUNK (fp32: 16 as
 * 8 + 8; the pairs' accumulators must fit in registers) over blocks of BLOCK_N rows of w, which the next chunk finds
 * in L1 or L2. bf16 keeps one row of w at a time: pairs were slower there at every width up to 16. bf16
 * accumulates in fp32 (AVX512-BF16 dot products where the CPU has them) and rounds once to nearest even, as oneDNN
 * does. Threads split the rows of w evenly (OpenMP, the same runtime as torch's). */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#define PREFETCH_ROWS 2
#define BLOCK_N 8
#if defined(__AVX512F__)
#define F32_CHUNK 12
#define BF16_CHUNK 16
#define PAIR_ROWS 6
#define PAIR_MAX 12
#elif defined(__AVX2__) && defined(__FMA__)
/* AVX2 (8 floats a vector, 16 registers): pairs of weight rows up to PAIR_MAX rows of x (two accumulators per
 * row, two weight vectors and one of x), one weight row at a time for 7-12 rows (an accumulator per row, the
 * weight vector, x read from memory by the multiply-add), so that up to 12 rows read the weights once: as two chunks
 * (4 + 3) over each block of weights, 7 rows of x cost a lean SmolLM2-135M pass 0.59 of an HF step against 6 rows'
 * 0.43; in one chunk 0.45 (2-core EPYC Zen 2, benchmarks/results/epyc-avx2-2c-2026-12-07-verify-width-chunk12.md) */
#define F32_CHUNK 12
#define BF16_CHUNK 8
#define PAIR_ROWS 4
#define PAIR_MAX 6
#else
#error "hfspec's few-row kernel needs AVX-512 or AVX2 with FMA"
#endif

/* bf16 <-> fp32, round to nearest even (either instruction set's bf16 body) */
static inline uint16_t to_bf16(float f) {
  union { float f; uint32_t u; } v = {f};
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u); /* NaN stays NaN */
  return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

static inline float from_bf16(uint16_t h) {
  union { uint32_t u; float f; } v = {(uint32_t)h << 16};
  return v.f;
}

#if defined(__AVX512F__)
/* ------------------------------------------------------------------------------------------------ fp32 */
#define F32_BODY(M)                                                                                                \
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

/* Two rows of w at a time (n, n + 1): each load of a row of x feeds two accumulators, which halves the loads of x
 * per multiply; every output is summed in the same order as by F32_BODY, so the results are bit for bit the same. */
#define F32_PAIRS(M)                                                                                               \
  for (; n0 + 2 <= n1; n0 += 2) {                                                                                  \
    const float* w0 = w + n0 * K;                                                                                  \
    const float* w1 = w0 + K;                                                                                      \
    __m512 a0[M], a1[M];                                                                                           \
    for (int m = 0; m < M; m++) a0[m] = a1[m] = _mm512_setzero_ps();                                               \
    int64_t k = 0;                                                                                                 \
    for (; k + 16 <= K; k += 16) {                                                                                 \
      _mm_prefetch((const char*)(w0 + PREFETCH_ROWS * K + k), _MM_HINT_T0);                                        \
      _mm_prefetch((const char*)(w1 + PREFETCH_ROWS * K + k), _MM_HINT_T0);                                        \
      __m512 v0 = _mm512_loadu_ps(w0 + k), v1 = _mm512_loadu_ps(w1 + k);                                           \
      for (int m = 0; m < M; m++) {                                                                                \
        __m512 xv = _mm512_loadu_ps(x + m * K + k);                                                                \
        a0[m] = _mm512_fmadd_ps(xv, v0, a0[m]);                                                                    \
        a1[m] = _mm512_fmadd_ps(xv, v1, a1[m]);                                                                    \
      }                                                                                                            \
    }                                                                                                              \
    if (k < K) {                                                                                                   \
      __mmask16 mask = (__mmask16)((1u << (K - k)) - 1u);                                                          \
      __m512 v0 = _mm512_maskz_loadu_ps(mask, w0 + k), v1 = _mm512_maskz_loadu_ps(mask, w1 + k);                   \
      for (int m = 0; m < M; m++) {                                                                                \
        __m512 xv = _mm512_maskz_loadu_ps(mask, x + m * K + k);                                                    \
        a0[m] = _mm512_fmadd_ps(xv, v0, a0[m]);                                                                    \
        a1[m] = _mm512_fmadd_ps(xv, v1, a1[m]);                                                                    \
      }                                                                                                            \
    }                                                                                                              \
    float b0 = b ? b[n0] : 0.0f, b1 = b ? b[n0 + 1] : 0.0f;                                                        \
    for (int m = 0; m < M; m++) {                                                                                  \
      y[m * N + n0] = _mm512_reduce_add_ps(a0[m]) + b0;                                                            \
      y[m * N + n0 + 1] = _mm512_reduce_add_ps(a1[m]) + b1;                                                        \
    }                                                                                                              \
  }

/* ------------------------------------------------------------------------------------------------ bf16 */
#ifdef __AVX512BF16__
/* 32 bf16 pairs a step: acc += x[2i] w[2i] + x[2i+1] w[2i+1] */
#define BF16_STEP 32
#define BF16_LOAD(p) ((__m512bh)_mm512_loadu_si512(p))
#define BF16_MASKED(mask, p) ((__m512bh)_mm512_maskz_loadu_epi16((__mmask32)(mask), p))
#define BF16_MASK(r) ((__mmask32)((1ull << (r)) - 1ull))
#define BF16_DOT(acc, xv, wv) _mm512_dpbf16_ps(acc, xv, wv)
typedef __m512bh bf16_vec;
#else
/* widened to fp32 (a bf16 is the top half of an fp32), 16 a step */
#define BF16_STEP 16
#define BF16_WIDEN(v) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16))
#define BF16_LOAD(p) BF16_WIDEN(_mm256_loadu_si256((const __m256i*)(p)))
#define BF16_MASKED(mask, p) BF16_WIDEN(_mm256_maskz_loadu_epi16((__mmask16)(mask), p))
#define BF16_MASK(r) ((__mmask16)((1u << (r)) - 1u))
#define BF16_DOT(acc, xv, wv) _mm512_fmadd_ps(xv, wv, acc)
typedef __m512 bf16_vec;
#endif

#define BF16_BODY(M)                                                                                               \
  for (int64_t n = n0; n < n1; n++) {                                                                              \
    const uint16_t* wn = w + n * K;                                                                                \
    __m512 acc[M];                                                                                                 \
    for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();                                                      \
    int64_t k = 0;                                                                                                 \
    for (; k + BF16_STEP <= K; k += BF16_STEP) {                                                                   \
      _mm_prefetch((const char*)(wn + PREFETCH_ROWS * K + k), _MM_HINT_T0);                                        \
      bf16_vec wv = BF16_LOAD(wn + k);                                                                             \
      for (int m = 0; m < M; m++) acc[m] = BF16_DOT(acc[m], BF16_LOAD(x + m * K + k), wv);                         \
    }                                                                                                              \
    if (k < K) {                                                                                                   \
      bf16_vec wv = BF16_MASKED(BF16_MASK(K - k), wn + k);                                                         \
      for (int m = 0; m < M; m++) acc[m] = BF16_DOT(acc[m], BF16_MASKED(BF16_MASK(K - k), x + m * K + k), wv);     \
    }                                                                                                              \
    float bn = b ? from_bf16(b[n]) : 0.0f;                                                                         \
    for (int m = 0; m < M; m++) y[m * N + n] = to_bf16(_mm512_reduce_add_ps(acc[m]) + bn);                         \
  }

#else /* AVX2 + FMA: the same bodies on 8-float vectors; the last K % 8 terms summed in scalar after the
         * vector's reduction, the same way in F32_BODY and F32_PAIRS (bit for bit the same results) */
static inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#define F32_BODY(M)                                                                                                \
  for (int64_t n = n0; n < n1; n++) {                                                                              \
    const float* wn = w + n * K;                                                                                   \
    __m256 acc[M];                                                                                                 \
    for (int m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();                                                      \
    int64_t k = 0;                                                                                                 \
    for (; k + 8 <= K; k += 8) {                                                                                   \
      _mm_prefetch((const char*)(wn + PREFETCH_ROWS * K + k), _MM_HINT_T0);                                        \
      __m256 wv = _mm256_loadu_ps(wn + k);                                                                         \
      for (int m = 0; m < M; m++) acc[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * K + k), wv, acc[m]);            \
    }                                                                                                              \
    float bn = b ? b[n] : 0.0f;                                                                                    \
    for (int m = 0; m < M; m++) {                                                                                  \
      float s = hsum256(acc[m]);                                                                                   \
      for (int64_t j = k; j < K; j++) s += x[m * K + j] * wn[j];                                                   \
      y[m * N + n] = s + bn;                                                                                       \
    }                                                                                                              \
  }

#define F32_PAIRS(M)                                                                                               \
  for (; n0 + 2 <= n1; n0 += 2) {                                                                                  \
    const float* w0 = w + n0 * K;                                                                                  \
    const float* w1 = w0 + K;                                                                                      \
    __m256 a0[M], a1[M];                                                                                           \
    for (int m = 0; m < M; m++) a0[m] = a1[m] = _mm256_setzero_ps();                                               \
    int64_t k = 0;                                                                                                 \
    for (; k + 8 <= K; k += 8) {                                                                                   \
      _mm_prefetch((const char*)(w0 + PREFETCH_ROWS * K + k), _MM_HINT_T0);                                        \
      _mm_prefetch((const char*)(w1 + PREFETCH_ROWS * K + k), _MM_HINT_T0);                                        \
      __m256 v0 = _mm256_loadu_ps(w0 + k), v1 = _mm256_loadu_ps(w1 + k);                                           \
      for (int m = 0; m < M; m++) {                                                                                \
        __m256 xv = _mm256_loadu_ps(x + m * K + k);                                                                \
        a0[m] = _mm256_fmadd_ps(xv, v0, a0[m]);                                                                    \
        a1[m] = _mm256_fmadd_ps(xv, v1, a1[m]);                                                                    \
      }                                                                                                            \
    }                                                                                                              \
    float b0 = b ? b[n0] : 0.0f, b1 = b ? b[n0 + 1] : 0.0f;                                                        \
    for (int m = 0; m < M; m++) {                                                                                  \
      float s0 = hsum256(a0[m]), s1 = hsum256(a1[m]);                                                              \
      for (int64_t j = k; j < K; j++) {                                                                            \
        s0 += x[m * K + j] * w0[j];                                                                                \
        s1 += x[m * K + j] * w1[j];                                                                                \
      }                                                                                                            \
      y[m * N + n0] = s0 + b0;                                                                                     \
      y[m * N + n0 + 1] = s1 + b1;                                                                                 \
    }                                                                                                              \
  }

/* bf16 widened to fp32 (a bf16 is the top half of an fp32), 8 a step; accumulated in fp32, rounded once */
#define BF16_LOAD8(p) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(p))), 16))

#define BF16_BODY(M)                                                                                               \
  for (int64_t n = n0; n < n1; n++) {                                                                              \
    const uint16_t* wn = w + n * K;                                                                                \
    __m256 acc[M];                                                                                                 \
    for (int m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();                                                      \
    int64_t k = 0;                                                                                                 \
    for (; k + 8 <= K; k += 8) {                                                                                   \
      _mm_prefetch((const char*)(wn + PREFETCH_ROWS * K + k), _MM_HINT_T0);                                        \
      __m256 wv = BF16_LOAD8(wn + k);                                                                              \
      for (int m = 0; m < M; m++) acc[m] = _mm256_fmadd_ps(BF16_LOAD8(x + m * K + k), wv, acc[m]);                 \
    }                                                                                                              \
    float bn = b ? from_bf16(b[n]) : 0.0f;                                                                         \
    for (int m = 0; m < M; m++) {                                                                                  \
      float s = hsum256(acc[m]);                                                                                   \
      for (int64_t j = k; j < K; j++) s += from_bf16(x[m * K + j]) * from_bf16(wn[j]);                             \
      y[m * N + n] = to_bf16(s + bn);                                                                              \
    }                                                                                                              \
  }
#endif

/* ------------------------------------------------------------------------------------------------ the drivers */
#define DEFINE_F32(M)                                                                                              \
  static void f32_##M(const float* x, const float* w, const float* b, float* y, int64_t N, int64_t K, int64_t n0,  \
                      int64_t n1) {                                                                                \
    if (M >= PAIR_ROWS && M <= PAIR_MAX) F32_PAIRS(M)                                                              \
    F32_BODY(M)                                                                                                    \
  }
#define DEFINE_BF16(M)                                                                                             \
  static void bf16_##M(const uint16_t* x, const uint16_t* w, const uint16_t* b, uint16_t* y, int64_t N, int64_t K, \
                       int64_t n0, int64_t n1) {                                                                   \
    BF16_BODY(M)                                                                                                   \
  }
#define DEFINE(M) DEFINE_F32(M) DEFINE_BF16(M)

DEFINE(1) DEFINE(2) DEFINE(3) DEFINE(4) DEFINE(5) DEFINE(6) DEFINE(7) DEFINE(8) DEFINE(9) DEFINE(10) DEFINE(11)
DEFINE(12) DEFINE_BF16(13) DEFINE_BF16(14) DEFINE_BF16(15) DEFINE_BF16(16)

typedef void (*f32_fn)(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
typedef void (*bf16_fn)(const uint16_t*, const uint16_t*, const uint16_t*, uint16_t*, int64_t, int64_t, int64_t,
                        int64_t);
static const f32_fn F32[12 + 1] = {0,     f32_1, f32_2, f32_3,  f32_4,  f32_5,
                                          f32_6, f32_7, f32_8, f32_9, f32_10, f32_11, f32_12};
static const bf16_fn BF16[16 + 1] = {0,       bf16_1,  bf16_2,  bf16_3,  bf16_4,  bf16_5,  bf16_6,
                                             bf16_7,  bf16_8,  bf16_9,  bf16_10, bf16_11, bf16_12, bf16_13,
                                             bf16_14, bf16_15, bf16_16};

/* The rows of w this thread takes, [*n0, *n1). */
static void share(int64_t N, int64_t* n0, int64_t* n1) {
  int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
  int64_t per = (N + nt - 1) / nt;
  *n0 = t * per < N ? t * per : N;
  *n1 = *n0 + per < N ? *n0 + per : N;
}

#define DRIVE(TABLE, CHUNK, x, w, b, y, M, N, K, n0, n1)                                                           \
  for (int64_t nb = n0; nb < n1; nb += BLOCK_N) {                                                                  \
    int64_t ne = nb + BLOCK_N < n1 ? nb + BLOCK_N : n1;                                                            \
    int64_t chunks = (M + CHUNK - 1) / CHUNK;                                                                      \
    for (int64_t c = 0, m0 = 0; c < chunks; c++) {                                                                 \
      int64_t rows = (M - m0) / (chunks - c);                                                                      \
      TABLE[rows](x + m0 * K, w, b, y + m0 * N, N, K, nb, ne);                                                     \
      m0 += rows;                                                                                                  \
    }                                                                                                              \
  }

/* NAME(x [M, K], w [N, K], b [N] or NULL, y [M, N], M, N, K, threads), all contiguous T (bf16 as uint16_t bit
 * patterns). Returns 0, or 1 for bad sizes. */
#define ENTRY(NAME, T, TABLE, CHUNK)                                                                               \
  int NAME(const T* x, const T* w, const T* b, T* y, int64_t M, int64_t N, int64_t K, int threads) {               \
    if (M < 1 || N < 1 || K < 1) return 1;                                                                         \
    if (threads < 2 || N < 64) {                                                                                   \
      DRIVE(TABLE, CHUNK, x, w, b, y, M, N, K, 0, N)                                                               \
      return 0;                                                                                                    \
    }                                                                                                              \
    _Pragma("omp parallel num_threads(threads)") {                                                                 \
      int64_t n0, n1;                                                                                              \
      share(N, &n0, &n1);                                                                                          \
      DRIVE(TABLE, CHUNK, x, w, b, y, M, N, K, n0, n1)                                                             \
    }                                                                                                              \
    return 0;                                                                                                      \
  }

ENTRY(hfspec_rows_f32, float, F32, F32_CHUNK)
ENTRY(hfspec_rows_bf16, uint16_t, BF16, BF16_CHUNK)

/* int4_M: one block of the int4 layout for M rows of x, over either instruction set's INT4_BODY (below) */
#define DEFINE_INT4(M)                                                                                             \
  static void int4_##M(const float* x, const float* xs, const uint8_t* packed, const uint32_t* sz, const float* b,  \
                       float* y, int64_t N, int64_t Np, int64_t K, int64_t G, int64_t group, int64_t t)            \
      INT4_BODY(M)
typedef void (*int4_fn)(const float*, const float*, const uint8_t*, const uint32_t*, const float*, float*, int64_t,
                        int64_t, int64_t, int64_t, int64_t, int64_t);

#if defined(__AVX512F__)
/* ------------------------------------------------------------------------------------------------ int4 */
/* hfspec_int4_rows: y [M, N] = x [M, K] W^T (+ b) for a 4-bit weight in torch's CPU int4 layout (what
 * aten._weight_int4pack_mm_for_cpu reads; hfspec/quant/packing.py): packed [Np/64, K, 32] bytes, byte j of a
 * column k of block t holding row 64t + j in its low nibble and row 64t + 32 + j in its high one, and
 * scales_and_zeros [K/group, Np, 2] bf16 (s, o): w = (code − 8) · s + o (hfspec/kernels/int4_rows.py says why the
 * draft's tree levels and steps take this instead of torch's kernel).
 *
 * Per block of 64 rows and per group, each column's 32 bytes become four vectors of 16 codes as fp32 (the low
 * nibbles by a table permute, the high ones shifted and converted), multiplied into one accumulator per row of x
 * and vector; at the group's end y += s · Σ x·code + (o − 8 s) · Σ x, so the scales cost nothing per weight.
 * Rows of x go in near-equal chunks of at most INT4_CHUNK (4 accumulators each must fit in registers); the
 * next chunk finds the block in L1 or L2. Threads split the blocks. */
#define INT4_CHUNK 6
#define INT4_BLOCK 64

#define INT4_BODY(M)                                                                                               \
  {                                                                                                                \
    float ybuf[M][64] __attribute__((aligned(64)));                                                                \
    for (int m = 0; m < M; m++)                                                                                    \
      for (int r = 0; r < 4; r++) _mm512_store_ps(ybuf[m] + 16 * r, _mm512_setzero_ps());                          \
    const uint8_t* bt = packed + t * K * 32;                                                                       \
    const __m512 codes = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);                      \
    const __m512i top = _mm512_set1_epi32((int)0xFFFF0000u);                                                       \
    for (int64_t g = 0; g < G; g++) {                                                                              \
      __m512 acc[M][4];                                                                                            \
      for (int m = 0; m < M; m++)                                                                                  \
        for (int r = 0; r < 4; r++) acc[m][r] = _mm512_setzero_ps();                                               \
      for (int64_t k = g * group; k < (g + 1) * group; k++) {                                                      \
        const uint8_t* b = bt + k * 32;                                                                            \
        _mm_prefetch((const char*)(b + 32 * 8), _MM_HINT_T0);                                                      \
        __m512i i0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)b));                                     \
        __m512i i1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(b + 16)));                              \
        __m512 q0 = _mm512_permutexvar_ps(i0, codes); /* the permute reads the low 4 bits of each index */         \
        __m512 q1 = _mm512_permutexvar_ps(i1, codes);                                                              \
        __m512 q2 = _mm512_cvtepi32_ps(_mm512_srli_epi32(i0, 4));                                                  \
        __m512 q3 = _mm512_cvtepi32_ps(_mm512_srli_epi32(i1, 4));                                                  \
        for (int m = 0; m < M; m++) {                                                                              \
          __m512 xb = _mm512_set1_ps(x[m * K + k]);                                                                \
          acc[m][0] = _mm512_fmadd_ps(xb, q0, acc[m][0]);                                                          \
          acc[m][1] = _mm512_fmadd_ps(xb, q1, acc[m][1]);                                                          \
          acc[m][2] = _mm512_fmadd_ps(xb, q2, acc[m][2]);                                                          \
          acc[m][3] = _mm512_fmadd_ps(xb, q3, acc[m][3]);                                                          \
        }                                                                                                          \
      }                                                                                                            \
      const uint32_t* words = sz + g * Np + t * 64; /* (s, o) bf16 pairs: s in the low half */                    \
      for (int r = 0; r < 4; r++) {                                                                                \
        __m512i wd = _mm512_loadu_si512(words + 16 * r);                                                           \
        __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(wd, 16));                                                 \
        __m512 o = _mm512_fnmadd_ps(_mm512_set1_ps(8.0f), s, _mm512_castsi512_ps(_mm512_and_si512(wd, top)));      \
        for (int m = 0; m < M; m++) {                                                                              \
          __m512 yv = _mm512_fmadd_ps(s, acc[m][r], _mm512_load_ps(ybuf[m] + 16 * r));                             \
          _mm512_store_ps(ybuf[m] + 16 * r, _mm512_fmadd_ps(o, _mm512_set1_ps(xs[m * G + g]), yv));                \
        }                                                                                                          \
      }                                                                                                            \
    }                                                                                                              \
    int64_t n0 = t * 64, valid = N - n0 < 64 ? N - n0 : 64;                                                        \
    for (int m = 0; m < M; m++)                                                                                    \
      for (int64_t j = 0; j < valid; j++) y[m * N + n0 + j] = ybuf[m][j] + (b ? b[n0 + j] : 0.0f);                 \
  }

DEFINE_INT4(1) DEFINE_INT4(2) DEFINE_INT4(3) DEFINE_INT4(4) DEFINE_INT4(5) DEFINE_INT4(6)
static const int4_fn INT4[INT4_CHUNK + 1] = {0, int4_1, int4_2, int4_3, int4_4, int4_5, int4_6};

#else
/* AVX2: torch's int4 layout has blocks of 32 rows: packed [Np/32, K, 16] bytes, byte j of a column k of block t
 * holding row 32t + j in its low nibble and row 32t + 16 + j in its high one. Per block and group, each column's 16
 * bytes become four vectors of 8 codes as fp32 (masked and shifted, then converted); the rest as above. Chunks of
 * at most 2 rows of x: their 8 accumulators, the 4 code vectors and x fit in AVX2's 16 registers. */
#define INT4_CHUNK 2
#define INT4_BLOCK 32

#define INT4_BODY(M)                                                                                               \
  {                                                                                                                \
    float ybuf[M][32] __attribute__((aligned(32)));                                                                \
    for (int m = 0; m < M; m++)                                                                                    \
      for (int r = 0; r < 4; r++) _mm256_store_ps(ybuf[m] + 8 * r, _mm256_setzero_ps());                           \
    const uint8_t* bt = packed + t * K * 16;                                                                       \
    const __m256i low = _mm256_set1_epi32(0x0F);                                                                   \
    const __m256i top = _mm256_set1_epi32((int)0xFFFF0000u);                                                       \
    for (int64_t g = 0; g < G; g++) {                                                                              \
      __m256 acc[M][4];                                                                                            \
      for (int m = 0; m < M; m++)                                                                                  \
        for (int r = 0; r < 4; r++) acc[m][r] = _mm256_setzero_ps();                                               \
      for (int64_t k = g * group; k < (g + 1) * group; k++) {                                                      \
        const uint8_t* b = bt + k * 16;                                                                            \
        _mm_prefetch((const char*)(b + 16 * 8), _MM_HINT_T0);                                                      \
        __m256i i0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)b));                                     \
        __m256i i1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(b + 8)));                               \
        __m256 q0 = _mm256_cvtepi32_ps(_mm256_and_si256(i0, low));                                                 \
        __m256 q1 = _mm256_cvtepi32_ps(_mm256_and_si256(i1, low));                                                 \
        __m256 q2 = _mm256_cvtepi32_ps(_mm256_srli_epi32(i0, 4));                                                  \
        __m256 q3 = _mm256_cvtepi32_ps(_mm256_srli_epi32(i1, 4));                                                  \
        for (int m = 0; m < M; m++) {                                                                              \
          __m256 xb = _mm256_set1_ps(x[m * K + k]);                                                                \
          acc[m][0] = _mm256_fmadd_ps(xb, q0, acc[m][0]);                                                          \
          acc[m][1] = _mm256_fmadd_ps(xb, q1, acc[m][1]);                                                          \
          acc[m][2] = _mm256_fmadd_ps(xb, q2, acc[m][2]);                                                          \
          acc[m][3] = _mm256_fmadd_ps(xb, q3, acc[m][3]);                                                          \
        }                                                                                                          \
      }                                                                                                            \
      const uint32_t* words = sz + g * Np + t * 32; /* (s, o) bf16 pairs: s in the low half */                    \
      for (int r = 0; r < 4; r++) {                                                                                \
        __m256i wd = _mm256_loadu_si256((const __m256i*)(words + 8 * r));                                          \
        __m256 s = _mm256_castsi256_ps(_mm256_slli_epi32(wd, 16));                                                 \
        __m256 o = _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), s, _mm256_castsi256_ps(_mm256_and_si256(wd, top)));      \
        for (int m = 0; m < M; m++) {                                                                              \
          __m256 yv = _mm256_fmadd_ps(s, acc[m][r], _mm256_load_ps(ybuf[m] + 8 * r));                              \
          _mm256_store_ps(ybuf[m] + 8 * r, _mm256_fmadd_ps(o, _mm256_set1_ps(xs[m * G + g]), yv));                 \
        }                                                                                                          \
      }                                                                                                            \
    }                                                                                                              \
    int64_t n0 = t * 32, valid = N - n0 < 32 ? N - n0 : 32;                                                        \
    for (int m = 0; m < M; m++)                                                                                    \
      for (int64_t j = 0; j < valid; j++) y[m * N + n0 + j] = ybuf[m][j] + (b ? b[n0 + j] : 0.0f);                 \
  }

DEFINE_INT4(1) DEFINE_INT4(2)
static const int4_fn INT4[INT4_CHUNK + 1] = {0, int4_1, int4_2};
#endif

/* Rows per block of the int4 layout this library reads (torch's on the CPU it was built for: 64 with AVX-512, 32
 * with AVX2); hfspec/kernels/int4_rows.py uses the kernel only where torch's layout here is the same. */
int hfspec_int4_block(void) { return INT4_BLOCK; }

/* hfspec_int4_rows(x [M, K] fp32, packed, scales_and_zeros (bf16 bit patterns), b [N] fp32 or NULL, y [M, N] fp32,
 * M, N, Np (N padded to 64), K, group, threads), all contiguous. Returns 0, 1 for bad sizes, 2 out of memory. */
int hfspec_int4_rows(const float* x, const uint8_t* packed, const uint16_t* sz, const float* b, float* y, int64_t M,
                     int64_t N, int64_t Np, int64_t K, int64_t group, int threads) {
  if (M < 1 || N < 1 || K < 1 || group < 1 || K % group || Np % 64 || N > Np) return 1;
  int64_t G = K / group, T = Np / INT4_BLOCK, chunks = (M + INT4_CHUNK - 1) / INT4_CHUNK;
  float* xs = (float*)malloc(sizeof(float) * M * G); /* Σ x over each group, per row */
  if (!xs) return 2;
  for (int64_t m = 0; m < M; m++)
    for (int64_t g = 0; g < G; g++) {
      float s = 0.0f;
      for (int64_t k = g * group; k < (g + 1) * group; k++) s += x[m * K + k];
      xs[m * G + g] = s;
    }
  if (threads < 2 || T < 2) threads = 1;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t t = 0; t < T; t++)
    for (int64_t c = 0, m0 = 0; c < chunks; c++) {
      int64_t rows = (M - m0) / (chunks - c);
      INT4[rows](x + m0 * K, xs + m0 * G, packed, (const uint32_t*)sz, b, y + m0 * N, N, Np, K, G, group, t);
      m0 += rows;
    }
  free(xs);
  return 0;
}
