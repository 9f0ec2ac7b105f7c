// Blocked (flash-style) attention for AVX-512; see attention_simd.h.
//
// A work item is up to kMaxRows query rows that share one KV head (GQA heads of a few tokens).
// Against each block of kKeyBlock keys their scores are dot products over 16-element chunks (rows
// by keys of accumulators in registers, every key chunk loaded once for several rows) whose lanes
// are summed for 16 keys at once (Sums16: one tree of shuffles instead of a horizontal sum per
// key), in the one-token kernel's order of additions. The softmax is online per block
// (running max and sum, vectorized exp); the value mix is a register tile of rows x 32 outputs,
// summed in double. The result differs from the reference by rounding only.
//
// A row's arithmetic depends only on its query and the keys and values it sees: blocks sit at
// absolute positions (multiples of kKeyBlock), every row of an item runs the same sequence, and
// keys a row does not see add exact zeros. So a row is bit-identical whatever pass computes it
// (one token or a prompt, any item), which deferred verification, prompt lookup, batching and the
// prefix cache rely on.
// GCC 12's 512-bit reduce/convert intrinsics pass an "undefined" vector that its own
// -Wuninitialized then flags; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/attention_simd.h"
#include "kernels/exp_avx512.h"
#include "kernels/token_tile.h"

namespace substrate {
namespace {

constexpr int kMaxRows = 12;    // query rows per item
constexpr int kScoreRows = 4;   // rows sharing each loaded key chunk
constexpr int kKeyBlock = 128;  // keys per online-softmax step
constexpr int kMixRows = 6;     // rows per value-mix tile: 6 x 4 vectors of doubles

inline __m512 Load16(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
inline __m512 Load16(const uint16_t* p, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

// The lane sums of 16 vectors: out[j] = the sum of v[j]'s 16 lanes, each by the same tree (lanes
// i + 8, then i + 4, i + 2, i + 1 added pairwise), computed for all 16 at once by shuffles. The
// rounds leave the sums in the lane order kSlot, an involution, so reading v through it gives
// them in natural order.
inline __m512 Sums16(const __m512* v) {
  static constexpr int kSlot[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};
  __m512 a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i) {  // 256-bit halves: lanes 0-7 of slot i, 8-15 of slot i + 8
    const __m512 x = v[kSlot[i]], y = v[kSlot[i + 8]];
    a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xEE));
  }
  for (int i = 0; i < 4; ++i)  // 128-bit quarters
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[i], a[i + 4], 0x88),
                         _mm512_shuffle_f32x4(a[i], a[i + 4], 0xDD));
  for (int i = 0; i < 2; ++i)  // pairs within a quarter
    c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[i], b[i + 2], 0x44),
                         _mm512_shuffle_ps(b[i], b[i + 2], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xDD));
}

// lanes[r * 16 + j] = the 16 per-lane partial sums of q_r . key j for R rows and J keys (key j's
// elements at key[j]): 16-element chunk c goes to accumulator c % 2 and the two are added, as the
// one-token kernel's Dot does (attention_simd_avx512.cpp), and Sums16 adds lanes in the order of
// its _mm512_reduce_add_ps; the last chunk is masked (zeros add nothing). R x J x 2 accumulators in
// registers, each query chunk loaded once per J keys and each key chunk once per R rows.
template <int R, int J, typename T>
void DotLanes(const float* const* q, int dk, const T* const* key, __m512* lanes) {
  __m512 acc[R][J][2];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) acc[r][j][0] = acc[r][j][1] = _mm512_setzero_ps();
  const int n_chunks = (dk + 15) / 16;
  const auto tail = static_cast<__mmask16>(dk % 16 == 0 ? 0xFFFF : (1u << (dk % 16)) - 1);
  // Chunk c into accumulator `half` (a constant, so the accumulators stay in registers).
  auto chunk = [&](int c, int half) {
    const __mmask16 m = c == n_chunks - 1 ? tail : 0xFFFF;
    __m512 qc[R];
    for (int r = 0; r < R; ++r) qc[r] = _mm512_maskz_loadu_ps(m, q[r] + 16 * c);
    for (int j = 0; j < J; ++j) {
      const __m512 kc = Load16(key[j] + 16 * c, m);
      for (int r = 0; r < R; ++r) acc[r][j][half] = _mm512_fmadd_ps(qc[r], kc, acc[r][j][half]);
    }
  };
  int c = 0;
  for (; c + 2 <= n_chunks; c += 2) {
    chunk(c, 0);
    chunk(c + 1, 1);
  }
  if (c < n_chunks) chunk(c, 0);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) lanes[r * 16 + j] = _mm512_add_ps(acc[r][j][0], acc[r][j][1]);
}

// DotLanes for R rows over 16 keys, J keys at a time (R x J x 2 <= 16 accumulators).
template <int R, typename T>
void DotLanes16(const float* const* q, int dk, const T* const* key, __m512* lanes) {
  constexpr int J = R == 1 ? 8 : R == 2 ? 4 : 2;
  for (int j0 = 0; j0 < 16; j0 += J) DotLanes<R, J>(q, dk, key + j0, lanes + j0);
}

// Requests the cache lines holding `bytes` bytes from p (each once, whatever p's alignment) into
// the cache level kHint names.
template <int kHint>
inline void PrefetchBytes(const void* p, int bytes) {
  const auto first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  const auto last = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes) - 1;
  for (uintptr_t line = first; line <= last; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(line), static_cast<_mm_hint>(kHint));
}

// Keys requested this far ahead of the ones being scored. A head's rows of the cache lie a whole
// position's row apart (all KV heads' elements), 2-8 KiB, so the hardware's stream prefetchers,
// which follow sequential lines within a page, fetch none of them ahead: without requests each
// key waited for memory (decode at a long history read 6-12 GB/s of a 30-60 GB/s machine).
constexpr int kKeysAhead = 32;

// Requests keys [0, n) from k (dk elements each, k_stride apart) into L1.
template <typename T>
void RequestKeys(const T* k, int64_t k_stride, int dk, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    PrefetchBytes<_MM_HINT_T0>(k + j * k_stride, dk * static_cast<int>(sizeof(T)));
}

// Scores of `rows` rows against n keys (key j's dk elements at k + j * k_stride):
// s[r * kKeyBlock + j] = q_r . key_j * scale, for j up to n rounded up to 16 (zeros past n).
// Beside each 16 keys it requests the keys kKeysAhead further (those of the `avail` from k that
// exist; RequestKeys made the first ones') into L1 and the same keys' values (dv elements at
// v + j * v_stride, which the mix reads next) into L2.
template <typename T>
void Scores(int rows, const float* const* q, int dk, float scale, const T* k, int64_t k_stride,
            int n, int64_t avail, const T* v, int64_t v_stride, int dv, float* s) {
  __m512 lanes[kMaxRows * 16];
  const __m512 sc = _mm512_set1_ps(scale);
  const int v_bytes = dv * static_cast<int>(sizeof(T));
  for (int j0 = 0; j0 < n; j0 += 16) {
    const int nk = std::min(16, n - j0);
    if (j0 + kKeysAhead < avail)
      RequestKeys(k + (j0 + kKeysAhead) * k_stride, k_stride, dk,
                  std::min<int64_t>(16, avail - j0 - kKeysAhead));
    for (int j = j0; j < j0 + nk; ++j) PrefetchBytes<_MM_HINT_T1>(v + j * v_stride, v_bytes);
    const T* key[16];
    for (int j = 0; j < 16; ++j) key[j] = k + (j0 + std::min(j, nk - 1)) * k_stride;
    for (int r0 = 0; r0 < rows; r0 += kScoreRows) {
      __m512* out = lanes + r0 * 16;
      WithTile<kScoreRows>(std::min(kScoreRows, rows - r0),
                           [&](auto nr) { DotLanes16<nr.value>(q + r0, dk, key, out); });
    }
    for (int r = 0; r < rows; ++r) {
      for (int j = nk; j < 16; ++j) lanes[r * 16 + j] = _mm512_setzero_ps();  // keys past n
      _mm512_store_ps(s + r * kKeyBlock + j0, _mm512_mul_ps(Sums16(lanes + r * 16), sc));
    }
  }
}

// 8 value elements as doubles (fp16 ones converted), the first lanes under m.
inline __m512d Load8d(const float* p, __mmask8 m) {
  return _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, p));
}
inline __m512d Load8d(const uint16_t* p, __mmask8 m) {
  return _mm512_cvtps_pd(_mm256_cvtph_ps(_mm_maskz_loadu_epi16(m, p)));
}

// o_r[d0 .. d0 + 8 * NV) += sum_k p[r * kKeyBlock + k] * v_k[d0 ..] over n keys, for R rows, in
// double (as the one-token kernel: float value sums moved near-tied routing of the tiny MoE
// fixtures); the last vector of the tile under `last`. The weights come as doubles already, so
// each is one broadcast load (converting them here cost two operations per row, key and tile).
template <int R, int NV, typename T>
void MixTile(const double* p, int n, const T* v, int64_t v_stride, double* const* o, int d0,
             __mmask8 last) {
  // Every loop over the tile unrolled whole: GCC scalarizes acc into registers only if none of
  // its indices is a variable (with the first and last loops rolled it kept acc on the stack
  // and stored all 24 vectors on every key, which halved the mix's speed).
  __m512d acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j)
      acc[r][j] = _mm512_maskz_loadu_pd(j == NV - 1 ? last : 0xFF, o[r] + d0 + 8 * j);
  for (int k = 0; k < n; ++k) {
    const T* vk = v + k * v_stride + d0;
    __m512d vv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) vv[j] = Load8d(vk + 8 * j, j == NV - 1 ? last : 0xFF);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512d b = _mm512_set1_pd(p[r * kKeyBlock + k]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_fmadd_pd(b, vv[j], acc[r][j]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j)
      _mm512_mask_storeu_pd(o[r] + d0 + 8 * j, j == NV - 1 ? last : 0xFF, acc[r][j]);
}

template <int R, typename T>
void MixRows(const double* p, int n, const T* v, int64_t v_stride, double* const* o, int dv) {
  int d0 = 0;
  for (; d0 + 32 <= dv; d0 += 32) MixTile<R, 4>(p, n, v, v_stride, o, d0, 0xFF);
  const int rest = dv - d0;
  if (rest == 0) return;
  const auto last = static_cast<__mmask8>(rest % 8 == 0 ? 0xFF : (1u << (rest % 8)) - 1);
  WithTile<4>((rest + 7) / 8,
              [&](auto nv) { MixTile<R, nv.value>(p, n, v, v_stride, o, d0, last); });
}

template <typename T>
void Mix(int rows, const double* p, int n, const T* v, int64_t v_stride, double* const* o, int dv) {
  for (int r0 = 0; r0 < rows; r0 += kMixRows) {
    const double* pr = p + r0 * kKeyBlock;
    double* const* orow = o + r0;
    WithTile<kMixRows>(std::min(kMixRows, rows - r0),
                       [&](auto nr) { MixRows<nr.value>(pr, n, v, v_stride, orow, dv); });
  }
}

// Per query row, the online softmax's state across key blocks.
struct RowState {
  float max;   // running max of the row's scores (-inf before any valid key)
  bool nan;    // a NaN score: the row's output is NaN, as the reference's
  double sum;  // sum of e^(score - max) over the keys seen
};

// One work item: `rows` query rows (token t[r], head h[r], all of KV head hk; kh and vh point at
// that head's elements of position 0). Writes the rows' outputs.
template <typename T>
void RunItem(const AttentionShape& s, const float* q, int64_t pos0, const T* kh, int64_t k_stride,
             const T* vh, int64_t v_stride, const int64_t* t, const int* h, int rows, float* out) {
  alignas(64) float p[kMaxRows * kKeyBlock];          // a block's scores per row
  alignas(64) double pd[kMaxRows * kKeyBlock];        // their weights, as the mix reads them
  alignas(64) double sums[kMaxRows * kBlockedMaxDv];  // the rows' running value sums
  const float* qrow[kMaxRows];
  double* orow[kMaxRows];
  RowState st[kMaxRows];
  int64_t last[kMaxRows];  // the row's last visible position (causal)
  int64_t end = 0;
  for (int r = 0; r < rows; ++r) {
    qrow[r] = q + (t[r] * s.n_head + h[r]) * s.dk;
    orow[r] = sums + r * s.dv;
    st[r] = RowState{-INFINITY, false, 0.0};
    std::fill(orow[r], orow[r] + s.dv, 0.0);
    last[r] = pos0 + t[r];
    end = std::max(end, last[r] + 1);
  }
  RequestKeys(kh, k_stride, s.dk, std::min<int64_t>(kKeysAhead, end));
  for (int64_t b0 = 0; b0 < end; b0 += kKeyBlock) {
    const int nb = static_cast<int>(std::min<int64_t>(kKeyBlock, end - b0));
    Scores(rows, qrow, s.dk, s.scale, kh + b0 * k_stride, k_stride, nb, end - b0,
           vh + b0 * v_stride, v_stride, s.dv, p);
    for (int r = 0; r < rows; ++r) {
      float* pr = p + r * kKeyBlock;
      // Keys of this block the row sees: [b0, b0 + n).
      const int n = static_cast<int>(std::clamp<int64_t>(last[r] + 1 - b0, 0, nb));
      __m512 vmax = _mm512_set1_ps(-INFINITY);
      __mmask16 nan = 0;
      for (int j = 0; j < n; j += 16) {
        const auto m = static_cast<__mmask16>(n - j >= 16 ? 0xFFFF : (1u << (n - j)) - 1);
        const __m512 x = _mm512_load_ps(pr + j);
        nan |= _mm512_mask_cmp_ps_mask(m, x, x, _CMP_UNORD_Q);
        vmax = _mm512_mask_max_ps(vmax, m, vmax, x);
      }
      if (nan) st[r].nan = true;
      const float bmax = _mm512_reduce_max_ps(vmax);
      const float new_max = std::max(st[r].max, bmax);
      double* pdr = pd + r * kKeyBlock;
      if (n == 0 || new_max == -INFINITY || st[r].nan) {
        std::memset(pdr, 0, sizeof(double) * nb);  // nothing (finite) to mix from this block
        continue;
      }
      if (new_max > st[r].max) {
        // Earlier keys' weights shrink by e^(old - new): rescale the row's sums.
        const float alpha = std::exp(st[r].max - new_max);
        st[r].sum *= alpha;
        for (int d = 0; d < s.dv; ++d) orow[r][d] *= alpha;
        st[r].max = new_max;
      }
      const __m512 mx = _mm512_set1_ps(new_max);
      __m512 vsum = _mm512_setzero_ps();
      for (int j = 0; j < nb; j += 16) {
        const auto m =
            static_cast<__mmask16>(n - j >= 16 ? 0xFFFF : (n - j <= 0 ? 0 : (1u << (n - j)) - 1));
        const __m512 e = _mm512_maskz_mov_ps(
            m, avx512::ExpNonPositive(_mm512_sub_ps(_mm512_load_ps(pr + j), mx)));
        _mm512_store_pd(pdr + j, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        _mm512_store_pd(pdr + j + 8, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
        vsum = _mm512_add_ps(vsum, e);
      }
      st[r].sum += _mm512_reduce_add_ps(vsum);
    }
    Mix(rows, pd, nb, vh + b0 * v_stride, v_stride, orow, s.dv);
  }
  // Normalize: o = (sum_p e^(s_p - max) v_p) / (sum_p e^(s_p - max)).
  for (int r = 0; r < rows; ++r) {
    float* o = out + (t[r] * s.n_head + h[r]) * s.dv;
    if (st[r].nan) {
      std::fill(o, o + s.dv, NAN);
    } else if (st[r].max == -INFINITY) {
      std::fill(o, o + s.dv, 0.0f);  // every score -inf: the reference's softmax gives zeros
    } else {
      const double inv = 1.0 / st[r].sum;
      for (int d = 0; d < s.dv; ++d) o[d] = static_cast<float>(orow[r][d] * inv);
    }
  }
}

template <typename T>
void Blocked(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0, const T* k,
             int64_t k_stride, const T* v, int64_t v_stride, float* out, ThreadPool& pool) {
  const int group = s.n_head / s.n_head_kv;
  // Rows of an item: up to kMaxRows heads of one KV group, times as many tokens as fit; groups
  // split further where that keeps every thread busy (a pass of a few tokens).
  int heads = std::min(group, kMaxRows);
  while (heads > 1 &&
         int64_t{s.n_head_kv} * ((group + heads - 1) / heads) * n_tokens < 2 * pool.size())
    heads = (heads + 1) / 2;
  const int head_chunks = (group + heads - 1) / heads;
  const int64_t tokens = std::max(1, kMaxRows / heads);
  const int64_t token_tiles = (n_tokens + tokens - 1) / tokens;
  const int64_t n_items = token_tiles * s.n_head_kv * head_chunks;

  pool.ParallelFor(n_items, 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t item = begin; item < end; ++item) {
      // The last token tiles see the most keys: they go first, so the threads' dynamic chunks
      // shrink as the work does.
      const int64_t tile = token_tiles - 1 - item / (int64_t{s.n_head_kv} * head_chunks);
      const int64_t rest = item % (int64_t{s.n_head_kv} * head_chunks);
      const int hk = static_cast<int>(rest / head_chunks);
      const int h0 = static_cast<int>(rest % head_chunks) * heads;
      const int nh = std::min(heads, group - h0);
      int64_t t[kMaxRows];
      int h[kMaxRows];
      int rows = 0;
      for (int64_t tt = tile * tokens; tt < std::min(n_tokens, (tile + 1) * tokens); ++tt)
        for (int g = 0; g < nh; ++g, ++rows) {
          t[rows] = tt;
          h[rows] = hk * group + h0 + g;
        }
      RunItem(s, q, pos0, k + int64_t{hk} * s.dk, k_stride, v + int64_t{hk} * s.dv, v_stride, t, h,
              rows, out);
    }
  });
}

}  // namespace

void AttentionBlockedAvx512(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
                            const KvRows& kv, float* out, ThreadPool& pool) {
  WithKvElements(kv, [&](const auto* k, const auto* v) {
    Blocked(s, q, n_tokens, pos0, k, kv.k_stride, v, kv.v_stride, out, pool);
  });
}

}  // namespace substrate
