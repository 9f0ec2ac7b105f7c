// AVX-512VL + VNNI (+ BF16 where present) kernels: 256-bit vectors, dpbusd integer products
// and 32 registers, so 8 tokens per weight pass; see vec_dot_x86.inc. The hottest types (Q4_K,
// the bulk of Q4_K_M files, and Q8_0, Q4_0, Q6_K; Q3_K and Q2_K, which the 256-bit code left
// compute-bound) get 512-bit kernels here, one template over the token count serving decode
// (NT = 1) and prefill alike, so both give the same bits per row.
// GCC 12's 512-bit insert/extract intrinsics pass an "undefined" vector that its own
// -Wuninitialized then flags; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define SUBSTRATE_VNNI 1
#define SUBSTRATE_MAX_NT 8
#define SUBSTRATE_ISA_NS avx512
#include "kernels/vec_dot_x86.inc"

namespace substrate::avx512 {
namespace {

template <int NT>
void DotQ4_KWideT(int64_t n, const void* wv, const uint8_t* act, size_t stride, float* out) {
  auto* w = static_cast<const BlockQ4_K*>(wv);
  const __m256i m4 = _mm256_set1_epi8(0xF);
  // Lane patterns selecting scale 2j for the low 32 bytes of a chunk and 2j+1 for the high.
  __m512i pick[4];
  for (int j = 0; j < 4; ++j)
    pick[j] = _mm512_inserti64x4(_mm512_zextsi256_si512(_mm256_set1_epi16(static_cast<short>(2 * j))),
                                 _mm256_set1_epi16(static_cast<short>(2 * j + 1)), 1);
  // Port 5 (shuffles, inserts, broadcasts) bounds this kernel, so the per-block scalar work is
  // kept off it where possible: d and dmin convert together from one 32-bit load, the int32
  // sums stay 16 lanes wide (no fold), and the mins expand with one byte unpack.
  __m512 acc[NT];
  __m256 acc_min[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps(), acc_min[t] = _mm256_setzero_ps();
  const __m256i lane1 = _mm256_set1_epi32(1);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const BlockQ4_K& x = w[b];
    PrefetchWeights<NT>(&x, sizeof(x));
    uint64_t sc8, mn8;
    UnpackQ4KScales64(x.scales, &sc8, &mn8);
    __m512i sc16 = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(sc8))));
    __m128i mn = _mm_cvtsi64_si128(static_cast<long long>(mn8));
    // [m0,m0,m1,m1,...]: each min multiplies two 16-element bsums.
    __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn));
    __m512i q[4], s[4];
    for (int j = 0; j < 4; ++j) {
      __m256i raw = Load256(x.qs + 32 * j);
      __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      q[j] = _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1);  // elements 64j..64j+63
      s[j] = _mm512_permutexvar_epi16(pick[j], sc16);
    }
    uint32_t d_dmin;  // d and dmin, adjacent fp16 fields
    std::memcpy(&d_dmin, reinterpret_cast<const uint8_t*>(&x), 4);
    const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(d_dmin)));  // [d, dmin, 0, 0]
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_K& y = Act<BlockQ8_K>(act, stride, t)[b];
      __m512i sumi = _mm512_setzero_si512();
      for (int j = 0; j < 4; ++j) {
        __m512i p = _mm512_maddubs_epi16(q[j], _mm512_loadu_si512(y.qs + 64 * j));
        sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(p, s[j]));
      }
      __m256i pm = _mm256_madd_epi16(mins, Load256(y.bsums));
      __m128 ds = _mm_mul_ps(dd, _mm_set1_ps(y.d));  // [d * yd, dmin * yd, 0, 0]
      acc[t] = _mm512_fmadd_ps(_mm512_broadcastss_ps(ds), _mm512_cvtepi32_ps(sumi), acc[t]);
      acc_min[t] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(_mm256_castps128_ps256(ds), lane1),
                                   _mm256_cvtepi32_ps(pm), acc_min[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = _mm512_reduce_add_ps(acc[t]) - HsumPs(acc_min[t]);
}

SUBSTRATE_DEFINE_MULTI(DotQ4_KWide)

// ---------------------------------------------------------------- decode GEMV, 32-blocks

// Two 32-byte pieces (two blocks' quants or activations) as one zmm.
inline __m512i Load2x256(const void* lo, const void* hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(Load256(lo)), Load256(hi), 1);
}

// The fp16 scales d of blocks b..b+3 as floats. The four d fields (each block's first 2 bytes)
// are gathered from one or two 64-byte loads of the blocks themselves by a single word permute,
// instead of four scalar loads and three inserts. Reads only bytes of the 4 blocks:
// 4 * sizeof(W) >= 64 (or >= 128 for two).
template <typename W>
inline __m128 Halves4(const W* w) {
  constexpr int kStep = sizeof(W) / 2;  // words per block
  static_assert(sizeof(W) % 2 == 0 && 3 * kStep < 64 && 4 * sizeof(W) >= 64);
  const __m512i idx = _mm512_setr_epi32(kStep << 16, (3 * kStep) << 16 | (2 * kStep), 0, 0, 0, 0,
                                        0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  __m512i h;
  if constexpr (3 * kStep < 32) {
    h = _mm512_permutexvar_epi16(idx, _mm512_loadu_si512(w));
  } else {
    static_assert(4 * sizeof(W) >= 128);
    const char* c = reinterpret_cast<const char*>(w);
    h = _mm512_permutex2var_epi16(_mm512_loadu_si512(c), idx, _mm512_loadu_si512(c + 64));
  }
  return _mm_cvtph_ps(_mm512_castsi512_si128(h));
}

// Four blocks' scales (as floats, block b in lane 0) spread so that lanes 0-7 of the first
// result carry block b, lanes 8-15 block b+1, and the second result b+2, b+3.
inline void Spread4(__m128 d4, __m512* s01, __m512* s23) {
  const __m512 d = _mm512_castps128_ps512(d4);
  *s01 = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), d);
  *s23 = _mm512_permutexvar_ps(_mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3), d);
}

// Scales of blocks b..b+3 (weight d times the activation's float d), spread as Spread4 does:
// one fp16 conversion per 4 blocks (and per weight pass, whatever the token count).
inline void Scales4(__m128 dh, const float* yd, __m512* s01, __m512* s23) {
  Spread4(_mm_mul_ps(dh, _mm_loadu_ps(yd)), s01, s23);
}

// Decode (NT = 1) keeps enough lines in flight to cover DRAM latency; prefill reuses each row.
template <int NT>
inline void PrefetchRow(const void* p, int bytes) {
  PrefetchWeights<NT == 1 ? 1 : 2>(p, bytes);
}

// The 512-bit kernels below are templates over NT, the tokens per weight pass: the weight
// unpacking is shared, and each token's float operations are exactly those of NT = 1, in the
// same order. So a row computed in a multi-token pass (prefill, verification, speculation) is
// bit-identical to the same row computed in one-token decode; tests/kernels/token_rows_test.

// Q8_0 x Q8_0: 4 blocks per step in two zmm with independent accumulators, one scale
// conversion per 4 blocks, weights prefetched ahead. Signed by signed through dpbusd: |q| times
// a with q's sign (there is no 512-bit psignb: negate a where q < 0 under a mask).
template <int NT>
void DotQ8_0WideT(int64_t n, const void* wv, const uint8_t* act, size_t stride, float* out) {
  auto* w = static_cast<const BlockQ8_0*>(wv);
  const int64_t nb = n / 32;
  __m512 acc0[NT], acc1[NT];
  for (int t = 0; t < NT; ++t) acc0[t] = _mm512_setzero_ps(), acc1[t] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    PrefetchRow<NT>(w + b, 4 * sizeof(BlockQ8_0));
    const __m128 dh = Halves4(w + b);
    const __m512i q01 = Load2x256(w[b].qs, w[b + 1].qs), q23 = Load2x256(w[b + 2].qs, w[b + 3].qs);
    const __m512i a01 = _mm512_abs_epi8(q01), a23 = _mm512_abs_epi8(q23);
    const __mmask64 n01 = _mm512_movepi8_mask(q01), n23 = _mm512_movepi8_mask(q23);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_0* y = Act<BlockQ8_0>(act, stride, t);
      const float* yd = reinterpret_cast<const float*>(y + nb);  // float scales (ActRowBytes)
      __m512 s01, s23;
      Scales4(dh, yd + b, &s01, &s23);
      __m512i y01 = Load2x256(y[b].qs, y[b + 1].qs), y23 = Load2x256(y[b + 2].qs, y[b + 3].qs);
      y01 = _mm512_mask_sub_epi8(y01, n01, _mm512_setzero_si512(), y01);
      y23 = _mm512_mask_sub_epi8(y23, n23, _mm512_setzero_si512(), y23);
      const __m512i p01 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), a01, y01);
      const __m512i p23 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), a23, y23);
      acc0[t] = _mm512_fmadd_ps(s01, _mm512_cvtepi32_ps(p01), acc0[t]);
      acc1[t] = _mm512_fmadd_ps(s23, _mm512_cvtepi32_ps(p23), acc1[t]);
    }
  }
  __m256 tail[NT];
  for (int t = 0; t < NT; ++t) tail[t] = _mm256_setzero_ps();
  for (; b < nb; ++b) {
    const __m256i q = Load256(w[b].qs), aq = _mm256_abs_epi8(q);
    const float dw = H(w[b].d);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_0* y = Act<BlockQ8_0>(act, stride, t);
      const float* yd = reinterpret_cast<const float*>(y + nb);
      const __m256i p = DotS8S8(aq, q, Load256(y[b].qs));
      tail[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * yd[b]), _mm256_cvtepi32_ps(p), tail[t]);
    }
  }
  for (int t = 0; t < NT; ++t)
    out[t] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[t], acc1[t])) + HsumPs(tail[t]);
}

// 32 bytes of nibble pairs as 64 values: [low nibbles of bytes 0-15 | their high nibbles | low
// nibbles of 16-31 | their high nibbles], the element order of Q4_0's and IQ4_XS's blocks.
inline __m512i SplitNibbles(__m256i t) {
  const __m512i dup = _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3);
  const __m512i shifts = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
  return _mm512_and_si512(
      _mm512_srlv_epi64(_mm512_permutexvar_epi64(dup, _mm512_castsi256_si512(t)), shifts),
      _mm512_set1_epi8(0x0F));
}

// Q4_0 x Q8_0. Nibbles (0..15) meet the activations unsigned-by-signed in dpbusd; the -8
// offset comes back as 8 * sum(a), itself one dpbusd, which is cheaper than the sign trick.
// Blocks b, b+1 unpack to [b lo 16 | b hi 16 | b+1 lo | b+1 hi], the activation order.
template <int NT>
void DotQ4_0WideT(int64_t n, const void* wv, const uint8_t* act, size_t stride, float* out) {
  auto* w = static_cast<const BlockQ4_0*>(wv);
  const int64_t nb = n / 32;
  const __m512i eight = _mm512_set1_epi8(8);
  auto unpack = [&](const BlockQ4_0* x) {
    return SplitNibbles(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[0].qs))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[1].qs)), 1));
  };
  auto dot = [&](__m512i q, __m512i a) {
    __m512i c = _mm512_dpbusd_epi32(_mm512_setzero_si512(), eight, a);
    return _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, a), c);
  };
  __m512 acc0[NT], acc1[NT];
  for (int t = 0; t < NT; ++t) acc0[t] = _mm512_setzero_ps(), acc1[t] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    PrefetchRow<NT>(w + b, 4 * sizeof(BlockQ4_0));
    const __m128 dh = Halves4(w + b);
    const __m512i q01 = unpack(w + b), q23 = unpack(w + b + 2);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_0* y = Act<BlockQ8_0>(act, stride, t);
      const float* yd = reinterpret_cast<const float*>(y + nb);
      __m512 s01, s23;
      Scales4(dh, yd + b, &s01, &s23);
      const __m512i p01 = dot(q01, Load2x256(y[b].qs, y[b + 1].qs));
      const __m512i p23 = dot(q23, Load2x256(y[b + 2].qs, y[b + 3].qs));
      acc0[t] = _mm512_fmadd_ps(s01, _mm512_cvtepi32_ps(p01), acc0[t]);
      acc1[t] = _mm512_fmadd_ps(s23, _mm512_cvtepi32_ps(p23), acc1[t]);
    }
  }
  __m256 tail[NT];
  for (int t = 0; t < NT; ++t) tail[t] = _mm256_setzero_ps();
  for (; b < nb; ++b) {
    const __m256i q = _mm256_sub_epi8(Nibbles32(w[b].qs), _mm256_set1_epi8(8));
    const __m256i aq = _mm256_abs_epi8(q);
    const float dw = H(w[b].d);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_0* y = Act<BlockQ8_0>(act, stride, t);
      const float* yd = reinterpret_cast<const float*>(y + nb);
      const __m256i p = DotS8S8(aq, q, Load256(y[b].qs));
      tail[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * yd[b]), _mm256_cvtepi32_ps(p), tail[t]);
    }
  }
  for (int t = 0; t < NT; ++t)
    out[t] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[t], acc1[t])) + HsumPs(tail[t]);
}

// ---------------------------------------------------------------- the other 32-element formats

// Q5_0, IQ4_NL (Q8_0 activations), Q4_1 and Q5_1 (Q8_1), four blocks a step as the kernels
// above: the 256-bit kernels spent ~15 instructions on each block and token, so decode ran at
// ~22 GB/s on two cores where Q4_0's wide kernel streams at the memory's rate.

// Blocks x and y's 4-bit quants as 64 unsigned bytes in the activations' order (SplitNibbles),
// plus 16 where the block's qh bit is set (Q5_0, Q5_1: bit j is element j's fifth bit).
template <typename W>
inline __m512i LegacyQuants(const W& x, const W& y) {
  __m512i q = SplitNibbles(_mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.qs))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(y.qs)), 1));
  if constexpr (requires { x.qh; }) {
    uint32_t hx, hy;
    std::memcpy(&hx, x.qh, 4);
    std::memcpy(&hy, y.qh, 4);
    const auto high = static_cast<__mmask64>(static_cast<uint64_t>(hy) << 32 | hx);
    q = _mm512_mask_add_epi8(q, high, q, _mm512_set1_epi8(16));
  }
  return q;
}

// The fp16 field at byte kOffset of blocks w[0..3] as floats: by Halves4's permute where its
// loads stay within the four blocks, else four scalar loads.
template <int kOffset, typename W>
inline __m128 Field4(const W* w) {
  constexpr size_t kStep = sizeof(W) / 2, kBytes = 4 * sizeof(W);
  if constexpr (sizeof(W) % 2 == 0 &&
                ((3 * kStep < 32 && kBytes >= 64 + kOffset) || kBytes >= 128 + kOffset)) {
    return Halves4(reinterpret_cast<const W*>(reinterpret_cast<const char*>(w) + kOffset));
  } else {
    auto at = [&](int i) {
      uint16_t h;
      std::memcpy(&h, reinterpret_cast<const char*>(w + i) + kOffset, 2);
      return static_cast<short>(h);
    };
    return _mm_cvtph_ps(_mm_setr_epi16(at(0), at(1), at(2), at(3), 0, 0, 0, 0));
  }
}

// Signed formats against Q8_0: `quants(x, y)` gives blocks x, y as 64 bytes and `dot(q, a)` their
// exact int32 products with 64 activations (lanes 0-7 block x, 8-15 block y). Blocks past the
// last multiple of four run one at a time: the block twice, its copy's lanes scaled by zero.
template <int NT, typename W, typename Quants, typename Dot>
void DotSigned32WideT(int64_t n, const W* w, const uint8_t* act, size_t stride, float* out,
                      Quants quants, Dot dot) {
  const int64_t nb = n / 32;
  __m512 acc0[NT], acc1[NT];
  for (int t = 0; t < NT; ++t) acc0[t] = _mm512_setzero_ps(), acc1[t] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    PrefetchRow<NT>(w + b, 4 * sizeof(W));
    const __m128 dh = Field4<0>(w + b);
    const __m512i q01 = quants(w[b], w[b + 1]), q23 = quants(w[b + 2], w[b + 3]);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_0* y = Act<BlockQ8_0>(act, stride, t);
      const float* yd = reinterpret_cast<const float*>(y + nb);  // float scales (ActRowBytes)
      __m512 s01, s23;
      Scales4(dh, yd + b, &s01, &s23);
      const __m512i p01 = dot(q01, Load2x256(y[b].qs, y[b + 1].qs));
      const __m512i p23 = dot(q23, Load2x256(y[b + 2].qs, y[b + 3].qs));
      acc0[t] = _mm512_fmadd_ps(s01, _mm512_cvtepi32_ps(p01), acc0[t]);
      acc1[t] = _mm512_fmadd_ps(s23, _mm512_cvtepi32_ps(p23), acc1[t]);
    }
  }
  for (; b < nb; ++b) {
    const __m512i q = quants(w[b], w[b]);
    const float dw = H(w[b].d);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_0* y = Act<BlockQ8_0>(act, stride, t);
      const float* yd = reinterpret_cast<const float*>(y + nb);
      const __m512 s = _mm512_maskz_mov_ps(0x00FF, _mm512_set1_ps(dw * yd[b]));
      acc0[t] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(dot(q, Load2x256(y[b].qs, y[b].qs))), acc0[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[t], acc1[t]));
}

template <int NT>
void DotQ5_0WideT(int64_t n, const void* wv, const uint8_t* act, size_t stride, float* out) {
  // Quants 0..31 stand for q - 16: 16 * sum(a) comes off, one dpbusd.
  const __m512i sixteen = _mm512_set1_epi8(16);
  DotSigned32WideT<NT>(
      n, static_cast<const BlockQ5_0*>(wv), act, stride, out, LegacyQuants<BlockQ5_0>,
      [&](__m512i q, __m512i a) {
        const __m512i c = _mm512_dpbusd_epi32(_mm512_setzero_si512(), sixteen, a);
        return _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, a), c);
      });
}

template <int NT>
void DotIQ4_NLWideT(int64_t n, const void* wv, const uint8_t* act, size_t stride, float* out) {
  const __m512i table = _mm512_broadcast_i32x4(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues)));
  // Signed values: |q| times a with q's sign, as Q8_0's kernel.
  DotSigned32WideT<NT>(
      n, static_cast<const BlockIQ4_NL*>(wv), act, stride, out,
      [&](const BlockIQ4_NL& x, const BlockIQ4_NL& y) {
        return _mm512_shuffle_epi8(table, LegacyQuants(x, y));
      },
      [](__m512i q, __m512i a) {
        a = _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(q), _mm512_setzero_si512(), a);
        return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(q), a);
      });
}

// Unsigned formats with a min (Q4_1, Q5_1) against Q8_1: d * dy * sum(q * a) + m * s_y, the
// mins four blocks at a time in one more chain per token.
template <int NT, typename W>
void DotUnsigned32WideT(int64_t n, const void* wv, const uint8_t* act, size_t stride,
                        float* out) {
  auto* w = static_cast<const W*>(wv);
  const int64_t nb = n / 32;
  constexpr int kD = 0, kM = 2;  // byte offsets of d and m (BlockQ8_1: d and s)
  __m512 acc0[NT], acc1[NT];
  __m128 mins[NT];
  for (int t = 0; t < NT; ++t)
    acc0[t] = _mm512_setzero_ps(), acc1[t] = _mm512_setzero_ps(), mins[t] = _mm_setzero_ps();
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    PrefetchRow<NT>(w + b, 4 * sizeof(W));
    const __m128 dw = Field4<kD>(w + b), mw = Field4<kM>(w + b);
    const __m512i q01 = LegacyQuants(w[b], w[b + 1]), q23 = LegacyQuants(w[b + 2], w[b + 3]);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_1* y = Act<BlockQ8_1>(act, stride, t) + b;
      __m512 s01, s23;
      Spread4(_mm_mul_ps(dw, Field4<kD>(y)), &s01, &s23);
      const __m512i p01 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q01, Load2x256(y[0].qs, y[1].qs));
      const __m512i p23 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q23, Load2x256(y[2].qs, y[3].qs));
      acc0[t] = _mm512_fmadd_ps(s01, _mm512_cvtepi32_ps(p01), acc0[t]);
      acc1[t] = _mm512_fmadd_ps(s23, _mm512_cvtepi32_ps(p23), acc1[t]);
      mins[t] = _mm_fmadd_ps(mw, Field4<kM>(y), mins[t]);
    }
  }
  for (; b < nb; ++b) {
    const __m512i q = LegacyQuants(w[b], w[b]);
    const float dw = H(w[b].d), mw = H(w[b].m);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_1& y = Act<BlockQ8_1>(act, stride, t)[b];
      const __m512 s = _mm512_maskz_mov_ps(0x00FF, _mm512_set1_ps(dw * H(y.d)));
      const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, Load2x256(y.qs, y.qs));
      acc0[t] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), acc0[t]);
      mins[t] = _mm_fmadd_ps(_mm_set_ss(mw), _mm_set_ss(H(y.s)), mins[t]);  // lane 0 only
    }
  }
  for (int t = 0; t < NT; ++t) {
    __m128 m = _mm_add_ps(mins[t], _mm_movehl_ps(mins[t], mins[t]));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    out[t] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[t], acc1[t])) + _mm_cvtss_f32(m);
  }
}

template <int NT>
void DotQ4_1WideT(int64_t n, const void* w, const uint8_t* act, size_t stride, float* out) {
  DotUnsigned32WideT<NT, BlockQ4_1>(n, w, act, stride, out);
}
template <int NT>
void DotQ5_1WideT(int64_t n, const void* w, const uint8_t* act, size_t stride, float* out) {
  DotUnsigned32WideT<NT, BlockQ5_1>(n, w, act, stride, out);
}

// A zmm whose low 256-bit lane repeats the 32-bit value lo and whose high lane repeats hi
// (per-lane shift counts).
inline __m512i LanePair32(int lo, int hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(lo)), _mm256_set1_epi32(hi),
                            1);
}

// For the K formats' 16 int16 scales of 16-value groups: pick[g] lets int16 lane j of the zmm
// holding values 64g..64g+63 (after maddubs, two values a lane) take scale 4g + j / 8.
inline void GroupScalePicks(__m512i (&pick)[4]) {
  for (int g = 0; g < 4; ++g) {
    alignas(64) int16_t idx[32];
    for (int j = 0; j < 32; ++j) idx[j] = static_cast<int16_t>(4 * g + j / 8);
    pick[g] = _mm512_load_si512(idx);
  }
}

// A Q8_K block's 256 activations against four zmm of unsigned quants (zmm g: values
// 64g..64g+63), each 16-value group weighted by its int16 scale in s: the exact int32 sums,
// folded to 8 lanes (the K formats' kernels below).
inline __m256i ScaledGroupSums(const __m512i (&q)[4], const __m512i (&s)[4], const int8_t* y) {
  __m512i sumi = _mm512_setzero_si512();
  for (int g = 0; g < 4; ++g)
    sumi =
        _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q[g], _mm512_loadu_si512(y + 64 * g)), s[g]);
  return _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64(sumi, 1));
}

// The same for quants stored as value + 2^offset_bits (Q6_K: 32, Q3_K: 4): the offset times
// each group's scaled activation sum (the bsums) taken off, so the sums stay exact.
inline __m256i OffsetGroupSums(const __m512i (&q)[4], const __m512i (&s)[4], __m256i sc16,
                               const BlockQ8_K& y, int offset_bits) {
  const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(sc16, Load256(y.bsums)), offset_bits);
  return _mm256_sub_epi32(ScaledGroupSums(q, s, y.qs), offset);
}

// Q6_K x Q8_K. Each half block (128 values) is one zmm of low nibbles (values 0-63 of the half)
// and one of high nibbles (64-127), their two top bits taken from the same 32 qh bytes at
// per-256-bit-lane shifts; each 128-bit chunk then holds one 16-value group, so the int16
// scales apply per chunk. The -32 offset comes back through the bsums.
template <int NT>
void DotQ6_KWideT(int64_t n, const void* wv, const uint8_t* act, size_t stride, float* out) {
  auto* w = static_cast<const BlockQ6_K*>(wv);
  const __m512i m4 = _mm512_set1_epi8(0xF), m3 = _mm512_set1_epi8(3);
  const __m512i shift_lo = LanePair32(0, 2), shift_hi = LanePair32(4, 6);
  __m512i pick[4];  // g = 2h + 0 for the low nibbles of half h, 2h + 1 for the high
  GroupScalePicks(pick);
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const BlockQ6_K& x = w[b];
    PrefetchRow<NT>(&x, sizeof(x));
    const __m256i sc16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales)));
    const __m512i sc = _mm512_castsi256_si512(sc16);
    __m512i q[4], s[4];  // [2h]: low nibbles of half h, [2h + 1]: high; s: their scales
    for (int h = 0; h < 2; ++h) {
      __m512i a = _mm512_loadu_si512(x.ql + 64 * h);
      __m512i qh = _mm512_broadcast_i64x4(Load256(x.qh + 32 * h));
      __m512i top_lo = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi32(qh, shift_lo), m3), 4);
      __m512i top_hi = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi32(qh, shift_hi), m3), 4);
      q[2 * h] = _mm512_or_si512(_mm512_and_si512(a, m4), top_lo);
      q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(a, 4), m4), top_hi);
      s[2 * h] = _mm512_permutexvar_epi16(pick[2 * h], sc);
      s[2 * h + 1] = _mm512_permutexvar_epi16(pick[2 * h + 1], sc);
    }
    const float dw = H(x.d);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_K& yb = Act<BlockQ8_K>(act, stride, t)[b];
      const __m256i sums = OffsetGroupSums(q, s, sc16, yb, 5);
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * yb.d), _mm256_cvtepi32_ps(sums), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = HsumPs(acc[t]);
}

// Q3_K x Q8_K, laid out as Q6_K's kernel: zmm g (0-3) holds values 64g..64g+63, the 2-bit
// quants of one 32-byte load at per-256-bit-lane shifts (0 and 2, then 4 and 6) and the third
// bit from the 32 hmask bytes, bit 2g (low lane) or 2g + 1 (high lane) moved to bit 2, so values
// 0..7 (one bit select joins the two); each 128-bit chunk is one 16-value group with its int16
// scale, and the -4 offset comes back through the bsums. The 256-bit kernel it replaces spent
// most of a block unpacking scales one byte at a time and decoded Q3_K_M files at a quarter of
// the memory's speed.
template <int NT>
void DotQ3_KWideT(int64_t n, const void* wv, const uint8_t* act, size_t stride, float* out) {
  auto* w = static_cast<const BlockQ3_K*>(wv);
  const __m512i m7 = _mm512_set1_epi8(7), m3 = _mm512_set1_epi8(3);
  // Shifts of whole 32-bit words (one uop, where 16-bit ones take two on some cores): a byte's
  // bits 0-1 after a right shift, and its bit 2 after a left shift by 1 or 2, are its own.
  const __m512i shift_lo = LanePair32(0, 2), shift_hi = LanePair32(4, 6);
  // hmask bit 2g + lane to bit 2: left by 2 and 1 for g = 0, right by 2g - 2 and 2g - 1 after.
  const __m512i hup = LanePair32(2, 1);
  const __m512i hdown[4] = {{}, LanePair32(0, 1), LanePair32(2, 3), LanePair32(4, 5)};
  __m512i pick[4];
  GroupScalePicks(pick);
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const BlockQ3_K& x = w[b];
    PrefetchRow<NT>(&x, sizeof(x));
    const __m256i sc16 = _mm256_cvtepi8_epi16(Q3KScales(x.scales));
    const __m512i sc = _mm512_castsi256_si512(sc16);
    const __m512i hm = _mm512_broadcast_i64x4(Load256(x.hmask));
    __m512i q[4], s[4];
    for (int h = 0; h < 2; ++h) {
      const __m512i a = _mm512_broadcast_i64x4(Load256(x.qs + 32 * h));
      for (int k = 0; k < 2; ++k) {
        const int g = 2 * h + k;
        const __m512i lo = _mm512_srlv_epi32(a, k ? shift_hi : shift_lo);
        const __m512i hb = g == 0 ? _mm512_sllv_epi32(hm, hup) : _mm512_srlv_epi32(hm, hdown[g]);
        // (lo & 3) | (hb & ~3), then & 7: bits 0-1 from the quants, bit 2 from the mask.
        q[g] = _mm512_and_si512(_mm512_ternarylogic_epi32(m3, lo, hb, 0xCA), m7);
        s[g] = _mm512_permutexvar_epi16(pick[g], sc);
      }
    }
    const float dw = H(x.d);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_K& yb = Act<BlockQ8_K>(act, stride, t)[b];
      const __m256i sums = OffsetGroupSums(q, s, sc16, yb, 2);
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * yb.d), _mm256_cvtepi32_ps(sums), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = HsumPs(acc[t]);
}

// Q2_K x Q8_K: Q3_K's kernel without the third bit; each 16-value group's 4-bit scale from the
// low nibble of its byte, its min (the high nibble) meeting the bsums.
template <int NT>
void DotQ2_KWideT(int64_t n, const void* wv, const uint8_t* act, size_t stride, float* out) {
  auto* w = static_cast<const BlockQ2_K*>(wv);
  const __m512i m3 = _mm512_set1_epi8(3);
  const __m128i m4 = _mm_set1_epi8(0xF);
  const __m512i shift_lo = LanePair32(0, 2), shift_hi = LanePair32(4, 6);  // as Q3_K's
  __m512i pick[4];
  GroupScalePicks(pick);
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const BlockQ2_K& x = w[b];
    PrefetchRow<NT>(&x, sizeof(x));
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales));
    const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(sc8, m4)));
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4));
    __m512i q[4], s[4];
    for (int h = 0; h < 2; ++h) {
      const __m512i a = _mm512_broadcast_i64x4(Load256(x.qs + 32 * h));
      q[2 * h] = _mm512_and_si512(_mm512_srlv_epi32(a, shift_lo), m3);
      q[2 * h + 1] = _mm512_and_si512(_mm512_srlv_epi32(a, shift_hi), m3);
    }
    for (int g = 0; g < 4; ++g) s[g] = _mm512_permutexvar_epi16(pick[g], sc);
    const float dw = H(x.d), dmin = H(x.dmin);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_K& yb = Act<BlockQ8_K>(act, stride, t)[b];
      const __m256i s8 = ScaledGroupSums(q, s, yb.qs);
      __m256i pm = _mm256_madd_epi16(mins16, Load256(yb.bsums));
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * yb.d), _mm256_cvtepi32_ps(s8), acc[t]);
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(-dmin * yb.d), _mm256_cvtepi32_ps(pm), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = HsumPs(acc[t]);
}

// IQ4_XS x Q8_K. zmm z holds values 64z..64z+63 (sub-blocks 2z and 2z + 1): the 32 bytes of
// their indices unpacked as Q4_0's nibbles are, looked up in the non-linear table (one byte
// shuffle), and multiplied through dpbusd as Q8_0's kernel does (|v| by the activation carrying
// v's sign); int32 lanes 0-7 belong to sub-block 2z, 8-15 to 2z + 1, so the 6-bit scales
// (IQ4XSScales) apply by one lane multiply and the block's sum stays an exact integer, as in the
// 256-bit kernel.
template <int NT>
void DotIQ4_XSWideT(int64_t n, const void* wv, const uint8_t* act, size_t stride, float* out) {
  auto* w = static_cast<const BlockIQ4_XS*>(wv);
  const __m512i table =
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues)));
  __m512i pick[4];  // lanes 0-7 take sub-block 2z's scale, 8-15 take 2z + 1's
  for (int z = 0; z < 4; ++z) pick[z] = LanePair32(2 * z, 2 * z + 1);
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const BlockIQ4_XS& x = w[b];
    PrefetchRow<NT>(&x, sizeof(x));
    const uint64_t ls = IQ4XSScales(x);
    const __m512i sc = _mm512_castsi256_si512(
        _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(ls))),
                         _mm256_set1_epi32(32)));
    __m512i av[4], s[4];
    __mmask64 neg[4];
    for (int z = 0; z < 4; ++z) {
      const __m512i v = _mm512_shuffle_epi8(table, SplitNibbles(Load256(x.qs + 32 * z)));
      av[z] = _mm512_abs_epi8(v);
      neg[z] = _mm512_movepi8_mask(v);
      s[z] = _mm512_permutexvar_epi32(pick[z], sc);
    }
    const float dw = H(x.d);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_K& yb = Act<BlockQ8_K>(act, stride, t)[b];
      __m512i sumi = _mm512_setzero_si512();
      for (int z = 0; z < 4; ++z) {
        __m512i y = _mm512_loadu_si512(yb.qs + 64 * z);
        y = _mm512_mask_sub_epi8(y, neg[z], _mm512_setzero_si512(), y);
        sumi = _mm512_add_epi32(
            sumi, _mm512_mullo_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), av[z], y), s[z]));
      }
      const __m256i s8 =
          _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64(sumi, 1));
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * yb.d), _mm256_cvtepi32_ps(s8), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = HsumPs(acc[t]);
}

// 16 float weights from p (F32, or F16/BF16 widened exactly), the lanes outside m zero.
template <typename T, bool kBf16>
inline __m512 LoadFloats16(const T* p, __mmask16 m) {
  if constexpr (sizeof(T) == 4) {
    return _mm512_maskz_loadu_ps(m, p);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return kBf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                 : _mm512_cvtph_ps(h);
  }
}

// Float weights (F32, or F16/BF16 widened exactly) against float activations, 16 at a time:
// the 256-bit version's two chains per token, each twice as wide (decode needs more than two
// 8-wide FMAs per FMA latency to keep up with memory).
template <int NT, typename T, bool kBf16 = false>
void DotFloatWideT(int64_t n, const T* w, const uint8_t* act, size_t stride, float* out) {
  auto load = [&](int64_t i, __mmask16 m) { return LoadFloats16<T, kBf16>(w + i, m); };
  constexpr int kStepBytes = 32 * static_cast<int>(sizeof(T));
  __m512 acc[NT][2];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    PrefetchWeights<NT>(w + i, kStepBytes);
    const __m512 w0 = load(i, 0xFFFF), w1 = load(i + 16, 0xFFFF);
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const float* a = Act<float>(act, stride, t) + i;
      acc[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(a), acc[t][0]);
      acc[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(a + 16), acc[t][1]);
    }
  }
  // The rest (under 32): a chunk of up to 16 into each chain, the lanes past n zero. The chain
  // is a constant and every loop over tokens unrolled whole: a variable index into acc kept it on
  // the stack for 5-8 tokens (GCC scalarizes an array only under constant indices).
  auto rest = [&](auto h) {
    const int64_t left = n - i;
    const auto m = static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1);
    const __m512 wc = load(i, m);
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t)
      acc[t][h] = _mm512_fmadd_ps(wc, _mm512_maskz_loadu_ps(m, Act<float>(act, stride, t) + i),
                                  acc[t][h]);
    i += 16;
  };
  if (i < n) rest(std::integral_constant<int, 0>());
  if (i < n) rest(std::integral_constant<int, 1>());
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) out[t] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]));
}

// R rows x NT tokens of DotFloatWideT at once (prefill), over columns [c0, c1): each loaded
// weight chunk serves NT tokens and each activation chunk R rows. The chains run one after the
// other (the even 16-element chunks, then the odd ones) so that only R x NT accumulators are
// live, and carry over in `state` ([chain][row][token]) from one column block to the next
// (stored and reloaded: exact); each (row, token) adds its chunks in DotFloatWideT's order, so
// each result has its bits. c0 is a multiple of 32; the block with c1 = n also takes the rest
// past the last 32 and writes the results.
template <int R, int NT, typename T, bool kBf16>
void DotFloatTileWide(int64_t n, int64_t c0, int64_t c1, const T* w, size_t row_bytes,
                      const uint8_t* act, size_t stride, __m512* state, float* out,
                      int64_t out_stride) {
  auto load = [&](int r, int64_t i, __mmask16 m) {
    const T* row = reinterpret_cast<const T*>(reinterpret_cast<const char*>(w) + r * row_bytes);
    return LoadFloats16<T, kBf16>(row + i, m);
  };
  const int64_t full = n / 32 * 32, k0 = c0 / 32, k1 = std::min(c1, full) / 32;
  const bool last = c1 == n;
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    __m512* st = state + h * R * NT;
    __m512 acc[R][NT];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) acc[r][t] = c0 == 0 ? _mm512_setzero_ps() : st[r * NT + t];
    auto chunk = [&](int64_t i, __mmask16 m) {
      __m512 wr[R];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) wr[r] = load(r, i, m);
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) {
        __m512 a = _mm512_maskz_loadu_ps(m, Act<float>(act, stride, t) + i);
        // One load for the R rows: folded into each FMA, it was R loads, and loads bound.
        asm("" : "+v"(a));
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wr[r], a, acc[r][t]);
      }
    };
    for (int64_t k = k0; k < k1; ++k) chunk(32 * k + 16 * h, 0xFFFF);
    // The rest (under 32), as DotFloatWideT takes it: its first 16 to the even chain.
    const int64_t left = n - full - 16 * h;
    if (last && left > 0) chunk(full + 16 * h, left >= 16 ? 0xFFFF : (1u << left) - 1);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) {
        if (last && h == 1) {
          out[t * out_stride + r] =
              _mm512_reduce_add_ps(_mm512_add_ps(state[r * NT + t], acc[r][t]));
        } else {
          st[r * NT + t] = acc[r][t];
        }
      }
  }
}

// Tiles of 4 rows x 4 tokens (16 accumulators, 4 weight and 1 activation registers), walked as
// FloatRowsByTiles walks them.
template <typename T, bool kBf16 = false>
void DotFloatRowsWide(int64_t n, const void* wv, size_t row_bytes, int n_rows, const void* actv,
                      size_t stride, int nt, float* out, int64_t out_stride) {
  FloatRowsByTiles<4, 4, 32, __m512, T>(
      n, wv, row_bytes, n_rows, actv, stride, nt, out, out_stride,
      [&](auto r, auto t, int64_t c0, int64_t c1, const T* w, const uint8_t* a, __m512* st,
          float* o) {
        DotFloatTileWide<r.value, t.value, T, kBf16>(n, c0, c1, w, row_bytes, a, stride, st, o,
                                                     out_stride);
      });
}

template <int NT>
void DotF32WideT(int64_t n, const void* w, const uint8_t* act, size_t stride, float* out) {
  DotFloatWideT<NT>(n, static_cast<const float*>(w), act, stride, out);
}
template <int NT>
void DotF16WideT(int64_t n, const void* w, const uint8_t* act, size_t stride, float* out) {
  DotFloatWideT<NT>(n, static_cast<const uint16_t*>(w), act, stride, out);
}
template <int NT>
void DotBF16WideT(int64_t n, const void* w, const uint8_t* act, size_t stride, float* out) {
  DotFloatWideT<NT, uint16_t, true>(n, static_cast<const uint16_t*>(w), act, stride, out);
}

SUBSTRATE_DEFINE_MULTI(DotQ5_0Wide)
SUBSTRATE_DEFINE_MULTI(DotIQ4_NLWide)
SUBSTRATE_DEFINE_MULTI(DotQ4_1Wide)
SUBSTRATE_DEFINE_MULTI(DotQ5_1Wide)
SUBSTRATE_DEFINE_MULTI(DotF32Wide)
SUBSTRATE_DEFINE_MULTI(DotF16Wide)
SUBSTRATE_DEFINE_MULTI(DotBF16Wide)
SUBSTRATE_DEFINE_MULTI(DotQ8_0Wide)
SUBSTRATE_DEFINE_MULTI(DotQ4_0Wide)
SUBSTRATE_DEFINE_MULTI(DotQ6_KWide)
SUBSTRATE_DEFINE_MULTI(DotQ3_KWide)
SUBSTRATE_DEFINE_MULTI(DotQ2_KWide)
SUBSTRATE_DEFINE_MULTI(DotIQ4_XSWide)

}  // namespace

const DotKernel* FindWide(DType type) {
  static const DotKernel kQ4_K{DType::kQ8_K, DotQ4_KWide, kMaxNT};
  static const DotKernel kQ8_0{DType::kQ8_0, DotQ8_0Wide, kMaxNT};
  static const DotKernel kQ4_0{DType::kQ8_0, DotQ4_0Wide, kMaxNT};
  static const DotKernel kQ6_K{DType::kQ8_K, DotQ6_KWide, kMaxNT};
  static const DotKernel kQ3_K{DType::kQ8_K, DotQ3_KWide, kMaxNT};
  static const DotKernel kQ2_K{DType::kQ8_K, DotQ2_KWide, kMaxNT};
  static const DotKernel kIQ4_XS{DType::kQ8_K, DotIQ4_XSWide, kMaxNT};
  static const DotKernel kQ5_0{DType::kQ8_0, DotQ5_0Wide, kMaxNT};
  static const DotKernel kIQ4_NL{DType::kQ8_0, DotIQ4_NLWide, kMaxNT};
  static const DotKernel kQ4_1{DType::kQ8_1, DotQ4_1Wide, kMaxNT};
  static const DotKernel kQ5_1{DType::kQ8_1, DotQ5_1Wide, kMaxNT};
  static const DotKernel kF32{DType::kF32, DotF32Wide, kMaxNT, DotFloatRowsWide<float>};
  static const DotKernel kF16{DType::kF32, DotF16Wide, kMaxNT, DotFloatRowsWide<uint16_t>};
  static const DotKernel kBF16{DType::kF32, DotBF16Wide, kMaxNT, DotFloatRowsWide<uint16_t, true>};
  switch (type) {
    case DType::kQ5_0: return &kQ5_0;
    case DType::kIQ4_NL: return &kIQ4_NL;
    case DType::kQ4_1: return &kQ4_1;
    case DType::kQ5_1: return &kQ5_1;
    case DType::kF32: return &kF32;
    case DType::kF16: return &kF16;
    case DType::kBF16: return &kBF16;
    case DType::kQ4_K: return &kQ4_K;
    case DType::kQ8_0: return &kQ8_0;
    case DType::kQ4_0: return &kQ4_0;
    case DType::kQ6_K: return &kQ6_K;
    case DType::kQ3_K: return &kQ3_K;
    case DType::kQ2_K: return &kQ2_K;
    case DType::kIQ4_XS: return &kIQ4_XS;
    default: return nullptr;
  }
}

}  // namespace substrate::avx512
