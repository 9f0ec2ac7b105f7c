// AVX2 + FMA attention; see attention_simd.h.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention_simd.h"

namespace substrate {
namespace {

inline float Dot(const float* a, const float* b, int n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8)
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  s0 = _mm256_add_ps(s0, s1);
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  float sum = _mm_cvtss_f32(r);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// acc[0..n) += w * x[0..n), in double: x widened four at a time.
inline void AxpyDouble(double* acc, double w, const float* x, int n) {
  const __m256d wv = _mm256_set1_pd(w);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x8 = _mm256_loadu_ps(x + i);
    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x8));
    __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x8, 1));
    _mm256_storeu_pd(acc + i, _mm256_fmadd_pd(wv, lo, _mm256_loadu_pd(acc + i)));
    _mm256_storeu_pd(acc + i + 4, _mm256_fmadd_pd(wv, hi, _mm256_loadu_pd(acc + i + 4)));
  }
  for (; i < n; ++i) acc[i] += w * x[i];
}

}  // namespace

void AttentionAvx2(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
                   const float* k, int64_t k_stride, const float* v, int64_t v_stride, float* out,
                   ThreadPool& pool) {
  const int group = s.n_head / s.n_head_kv;
  const int64_t n_items = n_tokens * s.n_head;
  pool.ParallelFor(n_items, 1, [&](int64_t begin, int64_t end, int) {
    // Grown once per thread, reused by every later call.
    static thread_local std::vector<float> scores;
    static thread_local std::vector<double> acc;
    if (scores.size() < static_cast<size_t>(pos0 + n_tokens))
      scores.resize(static_cast<size_t>(pos0 + n_tokens));
    if (acc.size() < static_cast<size_t>(s.dv)) acc.resize(static_cast<size_t>(s.dv));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / s.n_head;
      const int h = static_cast<int>(item % s.n_head);
      const int hk = h / group;
      const float* qh = q + (t * s.n_head + h) * s.dk;
      const int64_t n_kv = pos0 + t + 1;
      float max = -INFINITY;
      for (int64_t p = 0; p < n_kv; ++p) {
        float d = Dot(qh, k + p * k_stride + static_cast<int64_t>(hk) * s.dk, s.dk) * s.scale;
        scores[p] = d;
        max = std::max(max, d);
      }
      float* o = out + (t * s.n_head + h) * s.dv;
      if (max == -INFINITY) {  // every score -inf: the reference's softmax gives zeros
        std::fill(o, o + s.dv, 0.0f);
        continue;
      }
      // The reference's softmax step by step (kernels/ops.cpp Softmax), then its double mix.
      double sum = 0;
      for (int64_t p = 0; p < n_kv; ++p) {
        scores[p] = std::exp(scores[p] - max);
        sum += scores[p];
      }
      const float inv = static_cast<float>(1.0 / sum);
      std::fill(acc.begin(), acc.begin() + s.dv, 0.0);
      for (int64_t p = 0; p < n_kv; ++p)
        AxpyDouble(acc.data(), static_cast<double>(scores[p] * inv),
                   v + p * v_stride + static_cast<int64_t>(hk) * s.dv, s.dv);
      for (int d = 0; d < s.dv; ++d) o[d] = static_cast<float>(acc[d]);
    }
  });
}

}  // namespace substrate
