// AMX int8 tile kernel of the prefill GEMM (see gemm_amx.h). One tile product per sub-block:
// C (16 weight rows x 16 tokens, int32) = A (16 rows x sub int8) . B (sub/4 x 16 tokens x 4).
// The integer products of a sub-block are exact; its scales (per weight row, per token) are
// then applied in float with AVX-512, accumulating 16 rows x 16 tokens in 16 zmm registers.
// Two sub-blocks are in flight at once (C0/A0/B0 and C1/A1/B1) so one tile product overlaps
// the other's store and scaling.
// GCC 12's 512-bit conversion intrinsics pass an "undefined" vector that its own
// -Wmaybe-uninitialized then flags; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/gemm_amx.h"

#include <immintrin.h>

#include <cstring>

#include "kernels/vec_dot.h"
#include "quant/blocks.h"

namespace substrate::amx {
namespace {

struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

template <bool kOffset>
void TileDotT(const TileArgs& a, float* out) {
  alignas(64) int32_t cbuf[2][16][16];
  __m512 acc[16];
  for (int m = 0; m < 16; ++m) acc[m] = _mm512_setzero_ps();
  const int64_t sub = a.sub;
  const int64_t b_step = sub * 16;  // bytes of activations per sub-block (16 tokens)
  for (int64_t j = 0; j < a.n_sub; j += 2) {
    const bool two = j + 1 < a.n_sub;
    _tile_loadd(2, a.wq + j * 16 * sub, sub);
    _tile_loadd(4, a.aq + j * b_step, 64);
    _tile_zero(0);
    _tile_dpbssd(0, 2, 4);
    if (two) {
      _tile_loadd(3, a.wq + (j + 1) * 16 * sub, sub);
      _tile_loadd(5, a.aq + (j + 1) * b_step, 64);
      _tile_zero(1);
      _tile_dpbssd(1, 3, 5);
    }
    _tile_stored(0, cbuf[0], 64);
    if (two) _tile_stored(1, cbuf[1], 64);
    for (int h = 0; h < (two ? 2 : 1); ++h) {
      const int64_t jj = j + h;
      const __m512 da = _mm512_loadu_ps(a.ad + (jj >> a.act_shift) * 16);
      const float* ws = a.ws + jj * 16;
      for (int m = 0; m < 16; ++m) {
        __m512 c = _mm512_cvtepi32_ps(_mm512_load_si512(cbuf[h][m]));
        acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(c, _mm512_set1_ps(ws[m])), da, acc[m]);
      }
      if constexpr (kOffset) {
        const __m512 s = _mm512_loadu_ps(a.asum + jj * 16);
        const float* wo = a.wo + jj * 16;
        for (int m = 0; m < 16; ++m) acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(wo[m]), s, acc[m]);
      }
    }
  }
  for (int m = 0; m < 16; ++m) _mm512_storeu_ps(out + 16 * m, acc[m]);
}

inline float H(uint16_t h) { return _cvtsh_ss(h); }

inline __m256i Load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Stores 32 values as two 16-value sub-blocks j, j+1 of row m (Q6_K's layout, sub = 16).
inline void Store2x16(int8_t* q, int64_t j, int m, __m256i v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + (j * 16 + m) * 16), _mm256_castsi256_si128(v));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + ((j + 1) * 16 + m) * 16),
                   _mm256_extracti128_si256(v, 1));
}

inline void Store32(int8_t* q, int64_t j, int m, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + (j * 16 + m) * 32), v);
}

void UnpackRow(WeightFormat f, const uint8_t* row, int64_t cols, int m, int8_t* q, float* s,
               float* o) {
  const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(3);
  switch (f) {
    case WeightFormat::kQ8_0: {
      auto* x = reinterpret_cast<const BlockQ8_0*>(row);
      for (int64_t b = 0; b < cols / kQK8_0; ++b) {
        s[b * 16 + m] = H(x[b].d);
        Store32(q, b, m, Load256(x[b].qs));
      }
      break;
    }
    case WeightFormat::kQ4_0: {
      auto* x = reinterpret_cast<const BlockQ4_0*>(row);
      for (int64_t b = 0; b < cols / kQK4_0; ++b) {
        s[b * 16 + m] = H(x[b].d);
        __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].qs));
        __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), m4);
        Store32(q, b, m, _mm256_sub_epi8(v, _mm256_set1_epi8(8)));
      }
      break;
    }
    case WeightFormat::kQ4_K: {  // sub-block 2i: low nibbles of bytes 32i.., 2i+1: high
      auto* x = reinterpret_cast<const BlockQ4_K*>(row);
      for (int64_t b = 0; b < cols / kQK_K; ++b) {
        uint8_t sc[8], mn[8];
        scalar::UnpackQ4KScales(x[b].scales, sc, mn);
        float d = H(x[b].d), dmin = H(x[b].dmin);
        for (int j = 0; j < 8; ++j) {
          s[(8 * b + j) * 16 + m] = d * sc[j];
          o[(8 * b + j) * 16 + m] = -dmin * mn[j];
        }
        for (int i = 0; i < 4; ++i) {
          __m256i v = Load256(x[b].qs + 32 * i);
          Store32(q, 8 * b + 2 * i, m, _mm256_and_si256(v, m4));
          Store32(q, 8 * b + 2 * i + 1, m, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
        }
      }
      break;
    }
    case WeightFormat::kQ6_K: {  // value = d * scales[j] * (6-bit q - 32), sub-blocks of 16
      auto* x = reinterpret_cast<const BlockQ6_K*>(row);
      const __m256i k32 = _mm256_set1_epi8(32);
      for (int64_t b = 0; b < cols / kQK_K; ++b) {
        float d = H(x[b].d);
        for (int j = 0; j < 16; ++j) s[(16 * b + j) * 16 + m] = d * x[b].scales[j];
        for (int h = 0; h < 2; ++h) {
          __m256i ql0 = Load256(x[b].ql + 64 * h), ql1 = Load256(x[b].ql + 64 * h + 32);
          __m256i qh = Load256(x[b].qh + 32 * h);
          __m256i lo[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                           _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
          for (int k = 0; k < 4; ++k) {
            __m256i top = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m3), 4);
            __m256i v = _mm256_sub_epi8(_mm256_or_si256(lo[k], top), k32);
            Store2x16(q, 16 * b + 8 * h + 2 * k, m, v);
          }
        }
      }
      break;
    }
  }
}

}  // namespace

void UnpackTile(WeightFormat f, const uint8_t* w, size_t row_bytes, int n_rows, int64_t cols,
                int8_t* q, float* s, float* o) {
  const int sub = f == WeightFormat::kQ6_K ? 16 : 32;
  const int64_t n_sub = cols / sub;
  for (int m = 0; m < 16; ++m) {
    if (m < n_rows) {
      UnpackRow(f, w + static_cast<size_t>(m) * row_bytes, cols, m, q, s, o);
      continue;
    }
    for (int64_t j = 0; j < n_sub; ++j) {  // rows past the end: zeros, never written out
      std::memset(q + (j * 16 + m) * sub, 0, static_cast<size_t>(sub));
      s[j * 16 + m] = 0;
      if (o) o[j * 16 + m] = 0;
    }
  }
}

void ConfigureTiles(int sub) {
  TileConfig c{};
  c.palette = 1;
  for (int i = 0; i < 2; ++i) c.rows[i] = 16, c.colsb[i] = 64;                  // C
  for (int i = 2; i < 4; ++i) c.rows[i] = 16, c.colsb[i] = static_cast<uint16_t>(sub);  // A
  for (int i = 4; i < 6; ++i) c.rows[i] = static_cast<uint8_t>(sub / 4), c.colsb[i] = 64;  // B
  // GCC 12 does not see ldtilecfg read the whole struct and drops the stores to rows/colsb
  // (then the first tile load faults): make the writes visible first.
  __asm__ volatile("" : : "r"(&c) : "memory");
  _tile_loadconfig(&c);
}

void ReleaseTiles() { _tile_release(); }

void TileDot(const TileArgs& a, float* out) {
  if (a.wo) {
    TileDotT<true>(a, out);
  } else {
    TileDotT<false>(a, out);
  }
}

}  // namespace substrate::amx
