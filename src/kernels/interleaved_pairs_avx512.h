// What the interleaved Q4_0 and Q8_0 products in AVX-512 VNNI share (interleaved_q4_0.h,
// interleaved_q8_0.h: 16 rows a group, blocks in pairs): the broadcast activation word, the
// pairs' scales, and the walk over one group's pairs. Included by those two kernels' translation
// units only.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu_features.h"
#include "kernels/interleaved_q8_0.h"
#include "quant/blocks.h"

namespace substrate::avx512 {

inline __m512i Word(const int8_t* p) {  // 4 activation quants, broadcast to 16 lanes
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The fp16 scales of C pairs, 2C vectors of 16 rows (pair i's at p + i * pair_bytes + scales,
// one vector per block, kInterleavedScaleBytes apart), converted, each line requested ahead.
template <int C>
inline void PairScales(const char* p, int pair_bytes, int scales, const PrefetchDistances& ahead,
                       __m512* d) {
  for (int i = 0; i < C; ++i) {
    const char* s = p + i * pair_bytes + scales;
    _mm_prefetch(s + ahead.l1, _MM_HINT_T0);
    if (ahead.l2) _mm_prefetch(s + ahead.l2, _MM_HINT_T1);
    for (int h = 0; h < 2; ++h)
      d[2 * i + h] = _mm512_cvtph_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + h * kInterleavedScaleBytes)));
  }
}

// One group (16 rows) against NT tokens, into out[t][0..15]. `Pairs::Run<NT, C>(p, b, y, yd,
// sums, ahead, acc)` adds the C pairs at p (blocks b .. b + 2C - 1) to acc. Few tokens go in
// chunks of four pairs, whose requests the kernel spreads beside its loads (decode of one Q8_0
// matrix on Zen 5, two threads: 70-72 GB/s; pair by pair with the requests in one burst, 49-55;
// chunks of two pairs 54-58, of eight 67); several tokens compute long enough per pair to need
// neither the chunks nor the distance, and their registers go to the token tile.
template <int NT, class Pairs>
void GroupDot(const uint8_t* group, int64_t nb, int pair_bytes, const BlockQ8_0* const* y,
              const float* const* yd, const int32_t* const* sums, float* const* out) {
  // Decode reads every weight once per token: keep enough lines in flight to cover DRAM latency,
  // past page edges (DecodePrefetch: the distances this core wants).
  const PrefetchDistances ahead = PrefetchFor(NT, 2048);
  constexpr int kChunk = NT <= 2 ? 4 : 1;
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 2 * kChunk <= nb; b += 2 * kChunk)
    Pairs::template Run<NT, kChunk>(group + (b / 2) * pair_bytes, b, y, yd, sums, ahead, acc);
  for (; b < nb; b += 2)
    Pairs::template Run<NT, 1>(group + (b / 2) * pair_bytes, b, y, yd, sums, ahead, acc);
  for (int t = 0; t < NT; ++t) _mm512_storeu_ps(out[t], acc[t]);
}

}  // namespace substrate::avx512
