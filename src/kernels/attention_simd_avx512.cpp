// AVX-512 attention; see attention_simd.h. Same arithmetic as the AVX2 version and the scalar
// reference (float q.k, float exp, double softmax sum, float-normalized weights, double value
// sums), with the value mix in register tiles: 64 output elements (8 zmm of doubles) stay in
// registers across every position instead of a load and store of the double row per position.
// GCC 12's 512-bit reduce/convert intrinsics pass an "undefined" vector that its own
// -Wuninitialized then flags; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/attention_simd.h"
#include "kernels/scratch_buffer.h"

namespace substrate {
namespace {

#include "kernels/attention_x86.inc"

// 16 key elements as floats (fp16 ones converted), all or the first `m` of them.
inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 Load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 Load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 Load16(const uint16_t* p, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

template <typename T>
float Dot(const float* a, const T* b, int n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), Load16(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), Load16(b + i + 16), s1);
  }
  if (i < n) {  // the rest, up to 31 elements, under masks
    __mmask16 m0 = static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1);
    s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m0, a + i), Load16(b + i, m0), s0);
    if (n - i > 16) {
      __mmask16 m1 = static_cast<__mmask16>((1u << (n - i - 16)) - 1);
      s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m1, a + i + 16), Load16(b + i + 16, m1), s1);
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

// out[d0..d0+8*kVec) = sum_p w[p] * v_p[d0..], accumulated in double, kVec zmm of 8 doubles.
template <int kVec, typename T>
inline void MixTile(const float* w, int64_t n_kv, const T* v, int64_t v_stride, int d0,
                    float* out) {
  __m512d acc[kVec];
  for (int j = 0; j < kVec; ++j) acc[j] = _mm512_setzero_pd();
  for (int64_t p = 0; p < n_kv; ++p) {
    const __m512d wp = _mm512_set1_pd(static_cast<double>(w[p]));
    const T* vp = v + p * v_stride + d0;
    for (int j = 0; j < kVec; ++j)
      acc[j] = _mm512_fmadd_pd(wp, _mm512_cvtps_pd(Load8(vp + 8 * j)), acc[j]);
  }
  for (int j = 0; j < kVec; ++j) _mm256_storeu_ps(out + d0 + 8 * j, _mm512_cvtpd_ps(acc[j]));
}

}  // namespace

void AttentionAvx512(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
                     const KvRows& kv, float* out, ThreadPool& pool) {
  const int64_t v_stride = kv.v_stride;
  AttentionKv(s, q, n_tokens, pos0, kv, out, pool,
              [&](const float* w, int64_t n_kv, const auto* vh, float* o) {
                int d0 = 0;
                for (; d0 + 64 <= s.dv; d0 += 64) MixTile<8>(w, n_kv, vh, v_stride, d0, o);
                for (; d0 + 8 <= s.dv; d0 += 8) MixTile<1>(w, n_kv, vh, v_stride, d0, o);
                for (; d0 < s.dv; ++d0) {
                  double acc = 0;
                  for (int64_t p = 0; p < n_kv; ++p)
                    acc += static_cast<double>(w[p]) * ToFloat(vh[p * v_stride + d0]);
                  o[d0] = static_cast<float>(acc);
                }
              });
}

}  // namespace substrate
