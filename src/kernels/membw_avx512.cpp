// The read loops of the bandwidth probe in AVX-512 (see membw.cpp): 64-byte loads, four
// independent accumulators, optionally the decode kernels' software prefetch.
// GCC 12's 512-bit reduce/extract intrinsics pass an "undefined" vector that its own
// -Wuninitialized then flags; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu_features.h"

namespace substrate::membw_detail {

uint64_t ReadSliceAvx512(const uint8_t* p, size_t bytes, const PrefetchDistances* ahead) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  size_t i = 0;
  for (; i + 256 <= bytes; i += 256) {
    if (ahead) {
      for (int k = 0; k < 256; k += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(p + i + k) + ahead->l1, _MM_HINT_T0);
        if (ahead->l2) _mm_prefetch(reinterpret_cast<const char*>(p + i + k) + ahead->l2, _MM_HINT_T1);
      }
    }
    a = _mm512_add_epi64(a, _mm512_load_si512(p + i));
    b = _mm512_add_epi64(b, _mm512_load_si512(p + i + 64));
    c = _mm512_add_epi64(c, _mm512_load_si512(p + i + 128));
    d = _mm512_add_epi64(d, _mm512_load_si512(p + i + 192));
  }
  uint64_t s = static_cast<uint64_t>(
      _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d))));
  for (; i < bytes; ++i) s += p[i];
  return s;
}

}  // namespace substrate::membw_detail
