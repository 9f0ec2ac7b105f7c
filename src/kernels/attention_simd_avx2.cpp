// AVX2 + FMA attention; see attention_simd.h.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/attention_simd.h"
#include "kernels/scratch_buffer.h"

namespace substrate {
namespace {

#include "kernels/attention_x86.inc"


template <typename T>
float Dot(const float* a, const T* b, int n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), Load8(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), Load8(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), Load8(b + i), s0);
  s0 = _mm256_add_ps(s0, s1);
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  float sum = _mm_cvtss_f32(r);
  for (; i < n; ++i) sum += a[i] * ToFloat(b[i]);
  return sum;
}

// acc[0..n) += w * x[0..n), in double: x widened four at a time.
template <typename T>
inline void AxpyDouble(double* acc, double w, const T* x, int n) {
  const __m256d wv = _mm256_set1_pd(w);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x8 = Load8(x + i);
    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x8));
    __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x8, 1));
    _mm256_storeu_pd(acc + i, _mm256_fmadd_pd(wv, lo, _mm256_loadu_pd(acc + i)));
    _mm256_storeu_pd(acc + i + 4, _mm256_fmadd_pd(wv, hi, _mm256_loadu_pd(acc + i + 4)));
  }
  for (; i < n; ++i) acc[i] += w * ToFloat(x[i]);
}

}  // namespace

void AttentionAvx2(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
                   const KvRows& kv, float* out, ThreadPool& pool) {
  const int64_t v_stride = kv.v_stride;
  AttentionKv(s, q, n_tokens, pos0, kv, out, pool,
              [&](const float* w, int64_t n_kv, const auto* vh, float* o) {
                static thread_local ScratchBuffer acc_buf;  // the reference's double mix
                auto* acc = reinterpret_cast<double*>(
                    acc_buf.Reserve(static_cast<size_t>(s.dv) * sizeof(double)));
                std::fill(acc, acc + s.dv, 0.0);
                for (int64_t p = 0; p < n_kv; ++p)
                  AxpyDouble(acc, static_cast<double>(w[p]), vh + p * v_stride, s.dv);
                for (int d = 0; d < s.dv; ++d) o[d] = static_cast<float>(acc[d]);
              });
}

}  // namespace substrate
