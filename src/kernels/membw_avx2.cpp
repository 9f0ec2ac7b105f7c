// The read loops of the bandwidth probe in AVX2 (see membw.cpp): 32-byte loads, the slice read
// as `streams` parts side by side (an accumulator each, four lines summed before they meet it),
// optionally with the decode kernels' software prefetch.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu_features.h"

namespace substrate::membw_detail {

namespace {

// K streams, each with its own accumulator (see membw_avx512.cpp).
template <int K>
uint64_t ReadStreams(const uint8_t* p, size_t bytes, const PrefetchDistances* ahead) {
  __m256i acc[K];
  for (int k = 0; k < K; ++k) acc[k] = _mm256_setzero_si256();
  const size_t part = bytes / K / 128 * 128;
  for (size_t i = 0; i < part; i += 128) {
#pragma GCC unroll 4
    for (int k = 0; k < K; ++k) {
      const uint8_t* q = p + static_cast<size_t>(k) * part + i;
      if (ahead) {
        for (int l = 0; l < 128; l += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(q + l) + ahead->l1, _MM_HINT_T0);
          if (ahead->l2)
            _mm_prefetch(reinterpret_cast<const char*>(q + l) + ahead->l2, _MM_HINT_T1);
        }
      }
      auto load = [&](int at) {
        return _mm256_load_si256(reinterpret_cast<const __m256i*>(q + at));
      };
      acc[k] = _mm256_add_epi64(acc[k], _mm256_add_epi64(_mm256_add_epi64(load(0), load(32)),
                                                         _mm256_add_epi64(load(64), load(96))));
    }
  }
  __m256i sum = acc[0];
  for (int k = 1; k < K; ++k) sum = _mm256_add_epi64(sum, acc[k]);
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sum);
  uint64_t s = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (size_t i = part * K; i < bytes; ++i) s += p[i];
  return s;
}

}  // namespace

uint64_t ReadSliceAvx2(const uint8_t* p, size_t bytes, const PrefetchDistances* ahead,
                       int streams) {
  return streams >= 4 ? ReadStreams<4>(p, bytes, ahead) : ReadStreams<1>(p, bytes, ahead);
}

}  // namespace substrate::membw_detail
