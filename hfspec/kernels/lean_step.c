/* hfspec's native draft step: every decoder layer of a 4-bit lean draft (hfspec/kernels/lean.py) over M new tokens
 * at consecutive cache slots, in one C call (hfspec/kernels/native_step.py builds the arguments and says why).
 *
 * Per layer, as `_Block.step` computes it: RMSNorm, the fused QKV product, the rotary of adjacent pairs (the rows of
 * W_q and W_k were permuted so that HF's rotate-half pairs sit side by side; rot < d rotates the first rot values of
 * each head and keeps the rest), keys and values written into the preallocated cache at slots start..start+M-1, each
 * new token attending to every slot up to its own (grouped-query: query head i reads KV head i / (nq / nkv)), the
 * output product, the residual, RMSNorm, the fused gate/up product, act(gate) · up, the down product, the residual.
 * The four products run `hfspec_int4_rows` (rows_kernel.c, built into the same library); the rest is plain C that
 * the compiler vectorises. Compiled with the verify kernel's flags. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int hfspec_int4_rows(const float* x, const uint8_t* packed, const uint16_t* sz, const float* b, float* y, int64_t M,
                     int64_t N, int64_t Np, int64_t K, int64_t group, int threads);

enum { ACT_SILU = 0, ACT_GELU_TANH = 1, ACT_GELU = 2 };
enum { PTRS_PER_LAYER = 14 }; /* qkv, o, gate_up, down: (packed, scales_and_zeros, bias); input norm; MLP norm */
enum { D_LAYERS, D_HIDDEN, D_NQ, D_NKV, D_HEAD, D_ROT, D_INTER, D_SLOTS, D_START, D_ACT, D_ROWS, D_HEADER = 16 };

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

static int product(const void* const* p, const float* x, float* y, int64_t M, int64_t N, int64_t K, int64_t group,
                   int threads) {
  return hfspec_int4_rows(x, (const uint8_t*)p[0], (const uint16_t*)p[1], (const float*)p[2], y, M, N, padded(N), K,
                          group, threads);
}

static float activation(float g, int act) {
  if (act == ACT_SILU) return g / (1.0f + expf(-g));
  if (act == ACT_GELU_TANH) return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
  return 0.5f * g * (1.0f + erff(g * 0.7071067811865476f));
}

/* One query head's attention for row m: o [d] = softmax(q · keys[0..L) · scaling) · values[0..L). */
static void attend(const float* q, const float* keys, const float* values, float* o, float* scores, int64_t L,
                   int64_t d, float scaling) {
  float top = -INFINITY;
  for (int64_t s = 0; s < L; s++) {
    const float* k = keys + s * d;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < d; j++) dot += q[j] * k[j];
    scores[s] = dot * scaling;
    top = scores[s] > top ? scores[s] : top;
  }
  float total = 0.0f;
  for (int64_t s = 0; s < L; s++) {
    scores[s] = expf(scores[s] - top);
    total += scores[s];
  }
  memset(o, 0, sizeof(float) * d);
  for (int64_t s = 0; s < L; s++) {
    const float* v = values + s * d;
    float w = scores[s] / total;
#pragma omp simd
    for (int64_t j = 0; j < d; j++) o[j] += w * v[j];
  }
}

/* hfspec_lean_layers(h [M, hidden] fp32, in place: the embedded tokens in, the last layer's output out;
 * dims: D_HEADER values (above) then per layer the group sizes of qkv, o, gate_up, down; ptrs: PTRS_PER_LAYER per
 * layer; rope [M, rot/2, 2] (cos, sin) at the M positions; keys, values: per layer [nkv, slots, d] fp32, contiguous;
 * eps, scaling; threads). Returns 0, 1 for bad sizes, 2 out of memory, 3 a product refused. */
int hfspec_lean_layers(float* h, const int64_t* dims, const void* const* ptrs, const float* rope, float* const* keys,
                       float* const* values, float eps, float scaling, int threads) {
  int64_t layers = dims[D_LAYERS], H = dims[D_HIDDEN], nq = dims[D_NQ], nkv = dims[D_NKV], d = dims[D_HEAD];
  int64_t rot = dims[D_ROT], inter = dims[D_INTER], S = dims[D_SLOTS], start = dims[D_START], M = dims[D_ROWS];
  int act = (int)dims[D_ACT];
  if (layers < 1 || H < 1 || nq < 1 || nkv < 1 || nq % nkv || d < 2 || rot < 0 || rot > d || rot % 2 || inter < 1 ||
      M < 1 || start < 0 || start + M > S || act < ACT_SILU || act > ACT_GELU)
    return 1;
  int64_t nqkv = (nq + 2 * nkv) * d, wide = nqkv > 2 * inter ? nqkv : 2 * inter;
  int64_t widest_in = H > nq * d ? H : nq * d;
  widest_in = widest_in > inter ? widest_in : inter;
  float* x = (float*)malloc(sizeof(float) * M * widest_in);
  float* y = (float*)malloc(sizeof(float) * M * wide);
  float* o = (float*)malloc(sizeof(float) * M * (nq * d > H ? nq * d : H));
  float* scores = (float*)malloc(sizeof(float) * (start + M));
  int status = (x && y && o && scores) ? 0 : 2;
  for (int64_t l = 0; l < layers && !status; l++) {
    const void* const* p = ptrs + l * PTRS_PER_LAYER;
    const int64_t* group = dims + D_HEADER + 4 * l;
    float *kc = keys[l], *vc = values[l];
    rms_norm(h, (const float*)p[12], x, M, H, eps);
    if (product(p, x, y, M, nqkv, H, group[0], threads)) { status = 3; break; }
    for (int64_t m = 0; m < M; m++) {
      float* row = y + m * nqkv;
      const float* f = rope + m * rot;  /* rot / 2 (cos, sin) pairs */
      for (int64_t head = 0; head < nq + nkv; head++) {
        float* v = row + head * d;
        for (int64_t i = 0; i < rot / 2; i++) {
          float a = v[2 * i], b = v[2 * i + 1], c = f[2 * i], s = f[2 * i + 1];
          v[2 * i] = a * c - b * s;
          v[2 * i + 1] = a * s + b * c;
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
        attend(y + m * nqkv + qh * d, kc + kh * S * d, vc + kh * S * d, o + m * nq * d + qh * d, scores, start + m + 1,
               d, scaling);
      }
    if (product(p + 3, o, x, M, H, nq * d, group[1], threads)) { status = 3; break; }
    for (int64_t j = 0; j < M * H; j++) h[j] += x[j];
    rms_norm(h, (const float*)p[13], x, M, H, eps);
    if (product(p + 6, x, y, M, 2 * inter, H, group[2], threads)) { status = 3; break; }
    for (int64_t m = 0; m < M; m++)
      for (int64_t j = 0; j < inter; j++)
        x[m * inter + j] = activation(y[m * 2 * inter + j], act) * y[m * 2 * inter + inter + j];
    if (product(p + 9, x, o, M, H, inter, group[3], threads)) { status = 3; break; }
    for (int64_t j = 0; j < M * H; j++) h[j] += o[j];
  }
  free(x);
  free(y);
  free(o);
  free(scores);
  return status;
}
