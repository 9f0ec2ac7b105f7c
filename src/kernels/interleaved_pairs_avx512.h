// What the interleaved Q4_0 and Q8_0 products in AVX-512 VNNI share (interleaved_q4_0.h,
// interleaved_q8_0.h: 16 rows a group, blocks in pairs): the activation tile's blocks, the
// pairs' scales, the walk over the pairs and over the groups. Included by those two kernels'
// translation units only.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu_features.h"
#include "kernels/interleaved_q8_0.h"
#include "quant/blocks.h"

namespace substrate::avx512 {

// Block b of a P-token activation tile (interleaved_q8_0.h), seen from its first token of a
// register tile: p = tile + b * kActTileBytesPerToken * P + 4 * (that token's index in the
// tile).
template <int P>
struct TileBlock {
  const uint8_t* p;
  __m512i Word(int j, int t) const { return Broadcast(4 * (j * P + t)); }  // 4 quants
  __m512i Sum(int t) const { return Broadcast(4 * (8 * P + t)); }          // -128 * sum
  __m512 Scale(int t) const { return _mm512_castsi512_ps(Broadcast(4 * (9 * P + t))); }

 private:
  __m512i Broadcast(int offset) const {
    int32_t v;
    std::memcpy(&v, p + offset, 4);
    return _mm512_set1_epi32(v);
  }
};

// The fp16 scales of C pairs, 2C vectors of 16 rows (pair i's at p + i * pair_bytes + scales,
// one vector per block, kInterleavedScaleBytes apart), converted and times `factor`, each line
// requested ahead.
template <int C>
inline void PairScales(const char* p, int pair_bytes, int scales, const PrefetchDistances& ahead,
                       float factor, __m512* d) {
  for (int i = 0; i < C; ++i) {
    const char* s = p + i * pair_bytes + scales;
    _mm_prefetch(s + ahead.l1, _MM_HINT_T0);
    if (ahead.l2) _mm_prefetch(s + ahead.l2, _MM_HINT_T1);
    for (int h = 0; h < 2; ++h)
      d[2 * i + h] = _mm512_mul_ps(
          _mm512_cvtph_ps(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + h * kInterleavedScaleBytes))),
          _mm512_set1_ps(factor));
  }
}

// Adds word j of each of NT tokens times the R groups' weight vectors w to the chains.
template <int R, int NT, int P>
inline void DotWord(const __m512i (&w)[R], const TileBlock<P>& a, int j, __m512i (&chain)[R][NT]) {
  for (int t = 0; t < NT; ++t) {
    const __m512i word = a.Word(j, t);
    for (int r = 0; r < R; ++r) chain[r][t] = _mm512_dpbusd_epi32(chain[r][t], w[r], word);
  }
}

// The walk over C pairs of blocks (blocks b .. b + 2C - 1) of R groups against NT tokens, into
// acc, that the Q8_0 and Q4_0 kernels share. Per block the chains start from the tile's
// -128 * sum(a) (s) and zero (u); `Layout::Feed<R, NT, P, kSplit>(q, group_bytes, ahead, a, s,
// u)` adds the block's products (at q in group 0) to them, into u as well only when kSplit: few
// chains in flight (decode) need two per block to hide dpbusd's latency. Then one fp16 scale
// vector for the 16 rows (times Layout::kScaleFactor, a power of two) times the token's
// activation scale. Token t's float operations are the same for every R, NT, P and C.
template <class Layout>
struct PairsOf {
  template <int R, int NT, int P, int C>
  static void Run(const uint8_t* p, size_t group_bytes, int64_t b, const uint8_t* tile,
                  const PrefetchDistances& ahead, __m512* acc) {
    constexpr bool kSplit = R * NT < 8;
    const char* pc = reinterpret_cast<const char*>(p);
    __m512 d[R][2 * C];
    for (int r = 0; r < R; ++r)
      PairScales<C>(pc + r * group_bytes, Layout::kPairBytes, Layout::kScales, ahead,
                    Layout::kScaleFactor, d[r]);
    for (int i = 0; i < 2 * C; ++i) {  // block b + i: quants at pair i / 2, half i % 2
      const char* q = pc + (i / 2) * Layout::kPairBytes + (i % 2) * Layout::kQuantBytes;
      const TileBlock<P> a{tile + (b + i) * kActTileBytesPerToken * P};
      __m512i s[R][NT], u[R][NT];
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < NT; ++t) {
          s[r][t] = a.Sum(t);
          u[r][t] = _mm512_setzero_si512();
        }
      Layout::template Feed<R, NT, P, kSplit>(q, group_bytes, ahead, a, s, u);
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < NT; ++t) {
          const __m512i sum = kSplit ? _mm512_add_epi32(s[r][t], u[r][t]) : s[r][t];
          acc[r * NT + t] = _mm512_fmadd_ps(_mm512_mul_ps(d[r][i], a.Scale(t)),
                                            _mm512_cvtepi32_ps(sum), acc[r * NT + t]);
        }
    }
  }
};

// R consecutive groups (16 rows each, group_bytes apart) against NT tokens of a P-token tile
// (tile: already at the first of them), into out[t * y_stride + 16 * r + i].
// `Pairs::Run<R, NT, P, C>(p, group_bytes, b, tile, ahead, acc)` adds the C pairs at p (blocks
// b .. b + 2C - 1 of each group) to acc[r * NT + t]. Few tokens go in chunks of four pairs,
// whose requests the kernel spreads beside its loads (decode of one Q8_0 matrix on Zen 5, two
// threads: 70-72 GB/s; pair by pair with the requests in one burst, 49-55; chunks of two pairs
// 54-58, of eight 67); several tokens compute long enough per pair to need neither the chunks
// nor the distance, and their registers go to the tile.
template <int R, int NT, int P, class Pairs>
void GroupDot(const uint8_t* group, size_t group_bytes, int64_t nb, int pair_bytes,
              const uint8_t* tile, float* out, int64_t y_stride) {
  // Decode reads every weight once per token: keep enough lines in flight to cover DRAM latency,
  // past page edges (DecodePrefetch: the distances this core wants).
  const PrefetchDistances ahead = PrefetchFor(NT, 2048);
  constexpr int kChunk = NT <= 2 && R == 1 ? 4 : 1;
  __m512 acc[R * NT];
  for (int i = 0; i < R * NT; ++i) acc[i] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 2 * kChunk <= nb; b += 2 * kChunk)
    Pairs::template Run<R, NT, P, kChunk>(group + (b / 2) * pair_bytes, group_bytes, b, tile, ahead,
                                          acc);
  for (; b < nb; b += 2)
    Pairs::template Run<R, NT, P, 1>(group + (b / 2) * pair_bytes, group_bytes, b, tile, ahead,
                                     acc);
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t)
      _mm512_storeu_ps(out + t * y_stride + r * kInterleavedRows, acc[r * NT + t]);
}

// Groups [g0, g1) against the P tokens of a tile (P a compile-time count). 3, 4 and 8 tokens go
// two groups at a time in register tiles of up to four tokens, so that each broadcast activation
// word meets two weight vectors: 2 groups x 4 tokens ran 15 % more dpbusd per second than
// 1 x 8 on Zen 5 (a kernel benchmark with everything in L1, 5.4 against 4.7 G/s of the core's
// 7.2). One or two tokens (decode) go group by group, and so do 5 to 7, for which two groups
// would want more registers than there are and a 4 + rest split reads the weights twice.
template <int P, class Pairs>
void TileDot(const uint8_t* data, size_t group_bytes, int64_t nb, int pair_bytes, int64_t g0,
             int64_t g1, const uint8_t* tile, float* y, int64_t y_stride) {
  auto at = [&](int64_t g) { return data + static_cast<size_t>(g) * group_bytes; };
  if constexpr (P == 3 || P == 4 || P == 8) {
    constexpr int kTile = P == 8 ? 4 : P;
    auto groups = [&]<int R>(int64_t g) {
      for (int t0 = 0; t0 < P; t0 += kTile)
        GroupDot<R, kTile, P, Pairs>(at(g), group_bytes, nb, pair_bytes, tile + 4 * t0,
                                     y + t0 * y_stride + g * kInterleavedRows, y_stride);
    };
    int64_t g = g0;
    for (; g + 2 <= g1; g += 2) groups.template operator()<2>(g);
    if (g < g1) groups.template operator()<1>(g);
  } else {
    for (int64_t g = g0; g < g1; ++g)
      GroupDot<1, P, P, Pairs>(at(g), group_bytes, nb, pair_bytes, tile, y + g * kInterleavedRows,
                               y_stride);
  }
}

}  // namespace substrate::avx512
