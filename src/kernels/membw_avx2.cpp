// The read loops of the bandwidth probe in AVX2 (see membw.cpp): 32-byte loads, four
// independent accumulators, optionally the decode kernels' software prefetch.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu_features.h"

namespace substrate::membw_detail {

uint64_t ReadSliceAvx2(const uint8_t* p, size_t bytes, const PrefetchDistances* ahead) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  size_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    if (ahead) {
      for (int k = 0; k < 128; k += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(p + i + k) + ahead->l1, _MM_HINT_T0);
        if (ahead->l2) _mm_prefetch(reinterpret_cast<const char*>(p + i + k) + ahead->l2, _MM_HINT_T1);
      }
    }
    a = _mm256_add_epi64(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_add_epi64(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    c = _mm256_add_epi64(c, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    d = _mm256_add_epi64(d, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  __m256i s4 = _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s4);
  uint64_t s = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; i < bytes; ++i) s += p[i];
  return s;
}

}  // namespace substrate::membw_detail
