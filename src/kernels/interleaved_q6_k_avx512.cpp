// The interleaved Q6_K product (interleaved_q6_k.h) in AVX-512 VNNI, decode and prefill.
// GCC 12's 512-bit reduce/extract intrinsics pass an "undefined" vector that its own
// -Wuninitialized then flags; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstring>

#include "kernels/cpu_features.h"
#include "kernels/interleaved_q6_k.h"
#include "kernels/interleaved_k_frame.h"
#include "quant/blocks.h"

namespace substrate::avx512 {
namespace {

constexpr int kBlockBytes = kQ6KInterleaved_BlockBytes;
constexpr int kQh = kQ6KInterleaved_QlBytes;
constexpr int kScales = kQh + kQ6KInterleaved_QhBytes;
constexpr int kD = kScales + kQ6KInterleaved_ScaleBytes;

inline __m512i Word(const void* p) {  // 4 bytes, broadcast to 16 lanes
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Scales 2m and 2m + 1 of the 16 rows as the two (signed) words of each lane.
inline __m512i ScalePair(const uint8_t* blk, int m) {
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kScales + 32 * m)));
}

// The 6-bit quants of 4 elements of the 16 rows: element 32k + 4w.. of the block's half whose
// low nibbles are in ql word `ql` and high bits in qh word `qh` (the Q6_K packing: k = 0, 1 take
// the low nibbles of ql's two 32-byte halves and qh bits 0-1, 2-3; k = 2, 3 their high nibbles
// and bits 4-5, 6-7).
template <int k>
inline __m512i Quants(const uint8_t* ql, const uint8_t* qh) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  const __m512i l = _mm512_loadu_si512(ql), h = _mm512_loadu_si512(qh);
  const __m512i low = k < 2 ? _mm512_and_si512(l, m4) : _mm512_and_si512(_mm512_srli_epi16(l, 4), m4);
  __m512i high;
  if constexpr (k == 0) high = _mm512_slli_epi16(h, 4);
  if constexpr (k == 1) high = _mm512_slli_epi16(h, 2);
  if constexpr (k == 2) high = h;
  if constexpr (k == 3) high = _mm512_srli_epi16(h, 2);
  return _mm512_or_si512(low, _mm512_and_si512(high, m30));
}

// Per 16-element sub-block: 4 weight vectors (16 rows x 4 quants, 0..63), per token a dpbusd
// chain and one fma by the rows' d * scale. Per block the -32 offset: the activation's 16-element
// sums times the scales (8 dpwssd), then one fma by the token's scale. Token t's float operations
// are the same for every NT.
template <int NT, int k>
inline void SubBlocks(const uint8_t* blk, int n, __m512 d, const BlockQ8_K* const* y, int64_t b,
                      const PrefetchDistances& ahead, __m512* acc) {
  const __m512i pair = ScalePair(blk, 4 * n + k);
  for (int lh = 0; lh < 2; ++lh) {
    // 16 steps per block, 4 lines each (GroupDot says how far ahead).
    const char* step = reinterpret_cast<const char*>(blk) + 256 * (8 * n + 2 * k + lh);
    for (int o = 0; o < 256; o += 64) {
      _mm_prefetch(step + ahead.l1 + o, _MM_HINT_T0);
      if (ahead.l2) _mm_prefetch(step + ahead.l2 + o, _MM_HINT_T1);
    }
    const __m512i sc = lh ? _mm512_srai_epi32(pair, 16) : _mm512_srai_epi32(_mm512_slli_epi32(pair, 16), 16);
    const __m512 fsc = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
    __m512i q[4];
    for (int i = 0; i < 4; ++i) {
      const int w = 4 * lh + i;
      q[i] = Quants<k>(blk + 64 * (16 * n + 8 * (k & 1) + w), blk + kQh + 64 * (8 * n + w));
    }
    for (int t = 0; t < NT; ++t) {
      const int8_t* a = y[t][b].qs + 128 * n + 32 * k + 16 * lh;
      __m512i c = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[0], Word(a));
      c = _mm512_dpbusd_epi32(c, q[1], Word(a + 4));
      c = _mm512_dpbusd_epi32(c, q[2], Word(a + 8));
      c = _mm512_dpbusd_epi32(c, q[3], Word(a + 12));
      acc[t] = _mm512_fmadd_ps(fsc, _mm512_cvtepi32_ps(c), acc[t]);
    }
  }
}

template <int NT>
void GroupDot(const uint8_t* group, int64_t nb, const BlockQ8_K* const* y, float* const* out) {
  // Decode reads every weight once per token: keep enough lines in flight to cover DRAM latency
  // (DecodePrefetch: the distances this core wants); a tile of tokens computes long enough per
  // block to request the block after next. SubBlocks requests a few lines per step, not a
  // block's worth in one burst, which would wait for the core's line fill buffers.
  const PrefetchDistances ahead = PrefetchFor(NT, 2 * kBlockBytes);
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = group + b * kBlockBytes;
    // A block's scales and d, at its end, are read first: one token alone would meet them before
    // the stream above requested them (a stall per block, 6-12 % of decode bandwidth), so they
    // are requested two blocks ahead.
    if constexpr (NT == 1)
      for (int o = kScales; o < kBlockBytes; o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(blk) + 2 * kBlockBytes + o, _MM_HINT_T0);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kD)));
    __m512 part[NT];
    for (int t = 0; t < NT; ++t) part[t] = _mm512_setzero_ps();
    for (int n = 0; n < 2; ++n) {
      SubBlocks<NT, 0>(blk, n, d, y, b, ahead, part);
      SubBlocks<NT, 1>(blk, n, d, y, b, ahead, part);
      SubBlocks<NT, 2>(blk, n, d, y, b, ahead, part);
      SubBlocks<NT, 3>(blk, n, d, y, b, ahead, part);
    }
    __m512i pairs[8];
    for (int m = 0; m < 8; ++m) pairs[m] = ScalePair(blk, m);
    const __m512 d32 = _mm512_mul_ps(d, _mm512_set1_ps(32.0f));
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_K& yb = y[t][b];
      __m512i off = _mm512_setzero_si512();
      for (int m = 0; m < 8; ++m) off = _mm512_dpwssd_epi32(off, pairs[m], Word(yb.bsums + 2 * m));
      part[t] = _mm512_fnmadd_ps(d32, _mm512_cvtepi32_ps(off), part[t]);
      acc[t] = _mm512_fmadd_ps(part[t], _mm512_set1_ps(yb.d), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) _mm512_storeu_ps(out[t], acc[t]);
}

}  // namespace

void GemvQ6_KInterleaved(const uint8_t* data, int64_t cols, int64_t g0, int64_t g1,
                         const uint8_t* act, size_t act_stride, int nt, float* y,
                         int64_t y_stride) {
  k_frame::Gemv<BlockQ6_K>(data, cols, g0, g1, act, act_stride, nt, y, y_stride,
                           [](auto tile, auto&&... args) { GroupDot<decltype(tile)::value>(args...); });
}

}  // namespace substrate::avx512
