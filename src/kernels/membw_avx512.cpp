// The read loops of the bandwidth probe in AVX-512 (see membw.cpp): 64-byte loads, the slice read
// as `streams` parts side by side (an accumulator each, four lines summed before they meet it),
// optionally with the decode kernels' software prefetch.
// GCC 12's 512-bit reduce/extract intrinsics pass an "undefined" vector that its own
// -Wuninitialized then flags; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu_features.h"

namespace substrate::membw_detail {

namespace {

// K streams, each with its own accumulator and its four lines summed before they meet it: the
// streams' loads issue back to back (a loop over the streams at run time, sharing accumulators,
// read 20-30 % slower on a Zen 5).
template <int K>
uint64_t ReadStreams(const uint8_t* p, size_t bytes, const PrefetchDistances* ahead) {
  __m512i acc[K];
  for (int k = 0; k < K; ++k) acc[k] = _mm512_setzero_si512();
  const size_t part = bytes / K / 256 * 256;
  for (size_t i = 0; i < part; i += 256) {
#pragma GCC unroll 4
    for (int k = 0; k < K; ++k) {
      const uint8_t* q = p + static_cast<size_t>(k) * part + i;
      if (ahead) {
        for (int l = 0; l < 256; l += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(q + l) + ahead->l1, _MM_HINT_T0);
          if (ahead->l2)
            _mm_prefetch(reinterpret_cast<const char*>(q + l) + ahead->l2, _MM_HINT_T1);
        }
      }
      acc[k] = _mm512_add_epi64(
          acc[k], _mm512_add_epi64(
                      _mm512_add_epi64(_mm512_load_si512(q), _mm512_load_si512(q + 64)),
                      _mm512_add_epi64(_mm512_load_si512(q + 128), _mm512_load_si512(q + 192))));
    }
  }
  __m512i sum = acc[0];
  for (int k = 1; k < K; ++k) sum = _mm512_add_epi64(sum, acc[k]);
  uint64_t s = static_cast<uint64_t>(_mm512_reduce_add_epi64(sum));
  for (size_t i = part * K; i < bytes; ++i) s += p[i];
  return s;
}

}  // namespace

uint64_t ReadSliceAvx512(const uint8_t* p, size_t bytes, const PrefetchDistances* ahead,
                         int streams) {
  return streams >= 4 ? ReadStreams<4>(p, bytes, ahead) : ReadStreams<1>(p, bytes, ahead);
}

}  // namespace substrate::membw_detail
