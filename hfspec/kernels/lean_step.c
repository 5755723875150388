/* hfspec's native decoder step: every decoder layer of a lean decoder (hfspec/kernels/lean.py) over M new tokens
 * at consecutive cache slots, in one C call (hfspec/kernels/native_step.py builds the arguments and says why): a
 * 4-bit lean draft's (int4 codes, rows of W_q and W_k permuted so that HF's rotate-half pairs sit side by side) or the
 * lean target's (the target's own fp32 weights, unfused and unpermuted: each q and k head's values are put in the
 * draft's pair order after the product, as the eager step's column order does, so the cache holds the same layout).
 *
 * Per layer, as `_Block.step` computes it: RMSNorm, the QKV product (one fused matrix or three), the rotary (rot < d
 * rotates the first rot values of each head and keeps the rest), keys and values written into the preallocated cache
 * at slots start..start+M-1, each new token attending to every slot up to its own (grouped-query: query head i reads
 * KV head i / (nq / nkv)), the output product, the residual, RMSNorm, the gate/up product (one matrix or two),
 * act(gate) · up, the down product, the residual. Products run `hfspec_int4_rows` or `hfspec_rows_f32`
 * (rows_kernel.c, built into the same library); the rest is plain C that the compiler vectorises. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int hfspec_int4_rows(const float* x, const uint8_t* packed, const uint16_t* sz, const float* b, float* y, int64_t M,
                     int64_t N, int64_t Np, int64_t K, int64_t group, int threads);
int hfspec_rows_f32(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t N, int64_t K,
                    int threads);

enum { ACT_SILU = 0, ACT_GELU_TANH = 1, ACT_GELU = 2 };
enum { ROT_PAIRS = 0, ROT_HALVES = 1 };
enum { KIND_INT4 = 0, KIND_F32 = 1 };
/* Per layer, MATS matrices in this order, each (kind, n, k, group) in dims and (weight or packed codes,
 * scales_and_zeros or NULL, bias or NULL) in ptrs, n = 0 for an unused one (a fused QKV fills Q's place): */
enum { M_Q, M_K, M_V, M_O, M_GATE, M_UP, M_DOWN, MATS };
enum { PTRS_PER_LAYER = 3 * MATS + 2 }; /* ... then the input norm and the MLP norm */
enum { D_LAYERS, D_HIDDEN, D_NQ, D_NKV, D_HEAD, D_ROT, D_INTER, D_SLOTS, D_START, D_ACT, D_ROWS, D_ROTARY, D_HEADER = 16 };

static void rms_norm(const float* h, const float* w, float* x, int64_t M, int64_t H, float eps) {
  for (int64_t m = 0; m < M; m++) {
    const float* hm = h + m * H;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < H; j++) ss += hm[j] * hm[j];
    float r = 1.0f / sqrtf(ss / (float)H + eps);
    for (int64_t j = 0; j < H; j++) x[m * H + j] = hm[j] * r * w[j];
  }
}

static int64_t padded(int64_t n) { return (n + 63) / 64 * 64; }

/* dest [M, Σ n] = x times matrices first..first+count-1 side by side (each through `part` [M, n] when there are
 * several). Returns 0, or 3 when a kernel refused. */
static int products(const void* const* p, const int64_t* md, int first, int count, const float* x, float* dest,
                    float* part, int64_t M, int threads) {
  int64_t total = 0, off = 0;
  for (int j = first; j < first + count; j++) total += md[4 * j + 1];
  for (int j = first; j < first + count; j++) {
    const int64_t* d = md + 4 * j;
    const void* const* q = p + 3 * j;
    int64_t n = d[1];
    if (n == 0) continue;
    float* out = n == total ? dest : part;
    int rc = d[0] == KIND_INT4 ? hfspec_int4_rows(x, (const uint8_t*)q[0], (const uint16_t*)q[1], (const float*)q[2],
                                                  out, M, n, padded(n), d[2], d[3], threads)
                               : hfspec_rows_f32(x, (const float*)q[0], (const float*)q[2], out, M, n, d[2], threads);
    if (rc) return 3;
    if (out == part)
      for (int64_t m = 0; m < M; m++) memcpy(dest + m * total + off, part + m * n, sizeof(float) * n);
    off += n;
  }
  return 0;
}

static float activation(float g, int act) {
  if (act == ACT_SILU) return g / (1.0f + expf(-g));
  if (act == ACT_GELU_TANH) return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
  return 0.5f * g * (1.0f + erff(g * 0.7071067811865476f));
}

/* One query head's attention for row m: o [d] = softmax(q · keys[s] · scaling) · values[s] over the slots s < L
 * that `seen` marks (NULL: all of them). */
static void attend(const float* q, const float* keys, const float* values, float* o, float* scores, int64_t L,
                   int64_t d, float scaling, const uint8_t* seen) {
  float top = -INFINITY;
  for (int64_t s = 0; s < L; s++) {
    if (seen && !seen[s]) continue;
    const float* k = keys + s * d;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < d; j++) dot += q[j] * k[j];
    scores[s] = dot * scaling;
    top = scores[s] > top ? scores[s] : top;
  }
  float total = 0.0f;
  for (int64_t s = 0; s < L; s++) {
    scores[s] = (seen && !seen[s]) ? 0.0f : expf(scores[s] - top);
    total += scores[s];
  }
  memset(o, 0, sizeof(float) * d);
  for (int64_t s = 0; s < L; s++) {
    if (seen && !seen[s]) continue;
    const float* v = values + s * d;
    float w = scores[s] / total;
#pragma omp simd
    for (int64_t j = 0; j < d; j++) o[j] += w * v[j];
  }
}

/* hfspec_lean_layers(h [M, hidden] fp32, in place: the embedded tokens in, the last layer's output out;
 * dims: D_HEADER values (above) then per layer MATS × (kind, n, k, group); ptrs: PTRS_PER_LAYER per layer;
 * rope [M, rot/2, 2] (cos, sin) at the M positions; keys, values: per layer [nkv, slots, d] fp32, contiguous;
 * seen: NULL (row m attends to slots 0..start+m: consecutive positions) or [M, start + M] bytes, row m attending to
 * the slots it marks (a token tree's level: each node sees the context and its ancestors); eps, scaling; threads).
 * Returns 0, 1 for bad sizes, 2 out of memory, 3 a product refused. */
int hfspec_lean_layers(float* h, const int64_t* dims, const void* const* ptrs, const float* rope, float* const* keys,
                       float* const* values, const uint8_t* seen, float eps, float scaling, int threads) {
  int64_t layers = dims[D_LAYERS], H = dims[D_HIDDEN], nq = dims[D_NQ], nkv = dims[D_NKV], d = dims[D_HEAD];
  int64_t rot = dims[D_ROT], inter = dims[D_INTER], S = dims[D_SLOTS], start = dims[D_START], M = dims[D_ROWS];
  int act = (int)dims[D_ACT], halves = dims[D_ROTARY] == ROT_HALVES;
  if (layers < 1 || H < 1 || nq < 1 || nkv < 1 || nq % nkv || d < 2 || rot < 0 || rot > d || rot % 2 || inter < 1 ||
      M < 1 || start < 0 || start + M > S || act < ACT_SILU || act > ACT_GELU)
    return 1;
  int64_t nqkv = (nq + 2 * nkv) * d, wide = nqkv > 2 * inter ? nqkv : 2 * inter;
  int64_t widest = H > nq * d ? H : nq * d;
  widest = widest > inter ? widest : inter;
  float* x = (float*)malloc(sizeof(float) * M * widest);
  float* y = (float*)malloc(sizeof(float) * M * wide);
  float* part = (float*)malloc(sizeof(float) * M * wide);
  float* o = (float*)malloc(sizeof(float) * M * widest);
  float* scores = (float*)malloc(sizeof(float) * (start + M));
  int status = (x && y && part && o && scores) ? 0 : 2;
  for (int64_t l = 0; l < layers && !status; l++) {
    const void* const* p = ptrs + l * PTRS_PER_LAYER;
    const int64_t* md = dims + D_HEADER + 4 * MATS * l;
    float *kc = keys[l], *vc = values[l];
    if (md[4 * M_Q + 1] + md[4 * M_K + 1] + md[4 * M_V + 1] != nqkv || md[4 * M_GATE + 1] + md[4 * M_UP + 1] != 2 * inter) {
      status = 1;
      break;
    }
    rms_norm(h, (const float*)p[3 * MATS], x, M, H, eps);
    if ((status = products(p, md, M_Q, 3, x, y, part, M, threads))) break;
    for (int64_t m = 0; m < M; m++) {
      float* row = y + m * nqkv;
      const float* f = rope + m * rot; /* rot / 2 (cos, sin) pairs */
      for (int64_t head = 0; head < nq + nkv; head++) {
        float* v = row + head * d;
        if (halves) { /* the target's own rows: HF's pairs (i, i + rot/2) put side by side, as the eager step's
                         column order does (`pair_columns`), so that both write the cache alike */
          memcpy(part, v, sizeof(float) * rot);
          for (int64_t i = 0; i < rot / 2; i++) {
            v[2 * i] = part[i];
            v[2 * i + 1] = part[i + rot / 2];
          }
        }
        for (int64_t i = 0; i < rot / 2; i++) {
          float a = v[2 * i], b = v[2 * i + 1], c = f[2 * i], s = f[2 * i + 1];
          v[2 * i] = a * c - b * s;
          v[2 * i + 1] = b * c + a * s;
        }
      }
      for (int64_t kh = 0; kh < nkv; kh++) {
        memcpy(kc + (kh * S + start + m) * d, row + (nq + kh) * d, sizeof(float) * d);
        memcpy(vc + (kh * S + start + m) * d, row + (nq + nkv + kh) * d, sizeof(float) * d);
      }
    }
    for (int64_t m = 0; m < M; m++)
      for (int64_t qh = 0; qh < nq; qh++) {
        int64_t kh = qh / (nq / nkv);
        attend(y + m * nqkv + qh * d, kc + kh * S * d, vc + kh * S * d, o + m * nq * d + qh * d, scores,
               seen ? start + M : start + m + 1, d, scaling, seen ? seen + m * (start + M) : NULL);
      }
    if ((status = products(p, md, M_O, 1, o, x, part, M, threads))) break;
    for (int64_t j = 0; j < M * H; j++) h[j] += x[j];
    rms_norm(h, (const float*)p[3 * MATS + 1], x, M, H, eps);
    if ((status = products(p, md, M_GATE, 2, x, y, part, M, threads))) break;
    for (int64_t m = 0; m < M; m++)
      for (int64_t j = 0; j < inter; j++)
        x[m * inter + j] = activation(y[m * 2 * inter + j], act) * y[m * 2 * inter + inter + j];
    if ((status = products(p, md, M_DOWN, 1, x, o, part, M, threads))) break;
    for (int64_t j = 0; j < M * H; j++) h[j] += o[j];
  }
  free(x);
  free(y);
  free(part);
  free(o);
  free(scores);
  return status;
}
