// Blocked (flash-style) prefill attention for AVX-512; see attention_simd.h.
//
// The per-(token, head) kernel computes one score at a time: a 128-element dot product ending in
// a horizontal sum, a scalar exp per key, and a value mix in double. For a long prompt that is
// most of attention's time. Here a work item is up to kMaxRows query rows that share one KV head
// (GQA heads of a few tokens); their scores against 32 keys at a time are one register tile of
// FMAs over keys stored transposed (dk-major, so a vector holds 16 keys of one dimension), the
// softmax is online per block of kKeyBlock keys (running max and sum, vectorized exp), and the
// value mix is a register tile of rows x 64 outputs. Float throughout except the softmax sums
// (double); the result differs from the reference by rounding only, so this runs for prompts, not
// for passes whose rows must equal one-token passes (ExactTokenRows keeps those on AttentionSimd).
//
// Keys are transposed once per call (per chunk of positions, to bound the scratch) and shared by
// every item; the output rows double as the running value sums, rescaled as the max moves.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/attention_simd.h"
#include "kernels/scratch_buffer.h"

namespace substrate {
namespace {

constexpr int kMaxRows = 12;     // query rows per item: 12 x 2 score vectors = 24 accumulators
constexpr int kKeyTile = 32;     // keys per score tile (two vectors)
constexpr int kKeyBlock = 128;   // keys per online-softmax step
constexpr int kMixRows = 6;      // rows per value-mix tile: 6 x 4 vectors = 24 accumulators
constexpr size_t kChunkBytes = 4 << 20;  // transposed keys per chunk of positions

inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 Load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 Load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 Load16(const uint16_t* p, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
inline float ToFloat(float x) { return x; }
inline float ToFloat(uint16_t h) { return _cvtsh_ss(h); }

// e^x for x <= 0 (scores minus their running max): 2^n * e^r with |r| <= ln2/2, a degree-6
// Taylor polynomial (relative error ~1e-7) and scalef for 2^n. Very negative x gives (nearly)
// zero; masked lanes are zeroed by the caller, not here.
inline __m512 Exp(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-100.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);  // ln2, high bits
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);        // ln2, the rest
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// Scores of R rows against 32 keys: s[r * kKeyBlock + j] = q_r . key_j * scale for the keys in
// kt[d * kt_stride + j], j < 32.
template <int R>
void ScoreTile(const float* const* q, int dk, float scale, const float* kt, int64_t kt_stride,
               float* s) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int d = 0; d < dk; ++d) {
    const __m512 k0 = _mm512_load_ps(kt + d * kt_stride);
    const __m512 k1 = _mm512_load_ps(kt + d * kt_stride + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 b = _mm512_set1_ps(q[r][d]);
      acc[r][0] = _mm512_fmadd_ps(b, k0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(b, k1, acc[r][1]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int r = 0; r < R; ++r) {
    _mm512_store_ps(s + r * kKeyBlock, _mm512_mul_ps(acc[r][0], sc));
    _mm512_store_ps(s + r * kKeyBlock + 16, _mm512_mul_ps(acc[r][1], sc));
  }
}

// o_r[d0 .. d0 + 16 * NV) += sum_j p[r * kKeyBlock + j] * v_j[d0 ..] over n keys, for R rows;
// the last vector of the tile under `last`.
template <int R, int NV, typename T>
void MixTile(const float* p, int n, const T* v, int64_t v_stride, float* const* o, int d0,
             __mmask16 last) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j)
      acc[r][j] = _mm512_maskz_loadu_ps(j == NV - 1 ? last : 0xFFFF, o[r] + d0 + 16 * j);
  for (int k = 0; k < n; ++k) {
    const T* vk = v + k * v_stride + d0;
    __m512 vv[NV];
    for (int j = 0; j < NV; ++j) vv[j] = j == NV - 1 ? Load16(vk + 16 * j, last) : Load16(vk + 16 * j);
    for (int r = 0; r < R; ++r) {
      const __m512 b = _mm512_set1_ps(p[r * kKeyBlock + k]);
      for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_fmadd_ps(b, vv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j)
      _mm512_mask_storeu_ps(o[r] + d0 + 16 * j, j == NV - 1 ? last : 0xFFFF, acc[r][j]);
}

template <int R, typename T>
void MixRows(const float* p, int n, const T* v, int64_t v_stride, float* const* o, int dv) {
  int d0 = 0;
  for (; d0 + 64 <= dv; d0 += 64) MixTile<R, 4>(p, n, v, v_stride, o, d0, 0xFFFF);
  const int rest = dv - d0;
  if (rest == 0) return;
  const int nv = (rest + 15) / 16;
  const auto last = static_cast<__mmask16>(rest % 16 == 0 ? 0xFFFF : (1u << (rest % 16)) - 1);
  switch (nv) {
    case 1: MixTile<R, 1>(p, n, v, v_stride, o, d0, last); break;
    case 2: MixTile<R, 2>(p, n, v, v_stride, o, d0, last); break;
    default: MixTile<R, 3>(p, n, v, v_stride, o, d0, last); break;
  }
}

template <typename T>
void Mix(int rows, const float* p, int n, const T* v, int64_t v_stride, float* const* o, int dv) {
  for (int r0 = 0; r0 < rows; r0 += kMixRows) {
    const float* pr = p + r0 * kKeyBlock;
    float* const* orow = o + r0;
    switch (std::min(kMixRows, rows - r0)) {
      case 1: MixRows<1>(pr, n, v, v_stride, orow, dv); break;
      case 2: MixRows<2>(pr, n, v, v_stride, orow, dv); break;
      case 3: MixRows<3>(pr, n, v, v_stride, orow, dv); break;
      case 4: MixRows<4>(pr, n, v, v_stride, orow, dv); break;
      case 5: MixRows<5>(pr, n, v, v_stride, orow, dv); break;
      default: MixRows<6>(pr, n, v, v_stride, orow, dv); break;
    }
  }
}

void Scores(int rows, const float* const* q, int dk, float scale, const float* kt,
            int64_t kt_stride, float* s) {
  switch (rows) {
#define SUBSTRATE_SCORE_CASE(R) \
  case R: ScoreTile<R>(q, dk, scale, kt, kt_stride, s); break;
    SUBSTRATE_SCORE_CASE(1) SUBSTRATE_SCORE_CASE(2) SUBSTRATE_SCORE_CASE(3)
    SUBSTRATE_SCORE_CASE(4) SUBSTRATE_SCORE_CASE(5) SUBSTRATE_SCORE_CASE(6)
    SUBSTRATE_SCORE_CASE(7) SUBSTRATE_SCORE_CASE(8) SUBSTRATE_SCORE_CASE(9)
    SUBSTRATE_SCORE_CASE(10) SUBSTRATE_SCORE_CASE(11)
    default: ScoreTile<12>(q, dk, scale, kt, kt_stride, s); break;
#undef SUBSTRATE_SCORE_CASE
  }
}

// Per query row, the online softmax's state across key blocks and chunks.
struct RowState {
  float max;     // running max of the row's scores (-inf before any valid key)
  bool nan;      // a NaN score: the row's output is NaN, as the reference's
  double sum;    // sum of e^(score - max) over the keys seen
};

// One work item: `rows` query rows (token t[r], head h[r], all of KV head hk) against the keys
// [c0, c1) of the current chunk, whose transposed copy is kt (dk rows of kt_stride floats,
// position c0 at column 0). Updates the rows' outputs (running value sums) and states.
template <typename T>
void RunItem(const AttentionShape& s, const float* q, int64_t pos0, const T* v, int64_t v_stride,
             int hk, const int64_t* t, const int* h, int rows, int64_t c0, int64_t c1,
             const float* kt, int64_t kt_stride, float* out, RowState* state, float* p) {
  const float* qrow[kMaxRows];
  float* orow[kMaxRows];
  RowState* st[kMaxRows];
  int64_t last[kMaxRows];  // the row's last visible position (causal)
  int64_t end = c0;
  for (int r = 0; r < rows; ++r) {
    qrow[r] = q + (t[r] * s.n_head + h[r]) * s.dk;
    orow[r] = out + (t[r] * s.n_head + h[r]) * s.dv;
    st[r] = &state[t[r] * s.n_head + h[r]];
    last[r] = pos0 + t[r];
    end = std::max(end, std::min(c1, last[r] + 1));
  }
  const T* vh = v + static_cast<int64_t>(hk) * s.dv;
  for (int64_t b0 = c0; b0 < end; b0 += kKeyBlock) {
    const int nb = static_cast<int>(std::min<int64_t>(kKeyBlock, end - b0));
    for (int j = 0; j < nb; j += kKeyTile)
      Scores(rows, qrow, s.dk, s.scale, kt + (b0 - c0) + j, kt_stride, p + j);
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
      if (nan) st[r]->nan = true;
      const float bmax = _mm512_reduce_max_ps(vmax);
      const float new_max = std::max(st[r]->max, bmax);
      if (n == 0 || new_max == -INFINITY || st[r]->nan) {
        std::memset(pr, 0, sizeof(float) * nb);  // nothing (finite) to mix from this block
        continue;
      }
      if (new_max > st[r]->max) {
        // Earlier keys' weights shrink by e^(old - new): rescale the row's sums.
        const float alpha = std::exp(st[r]->max - new_max);
        st[r]->sum *= alpha;
        const __m512 a = _mm512_set1_ps(alpha);
        int d = 0;
        for (; d + 16 <= s.dv; d += 16)
          _mm512_storeu_ps(orow[r] + d, _mm512_mul_ps(_mm512_loadu_ps(orow[r] + d), a));
        for (; d < s.dv; ++d) orow[r][d] *= alpha;
        st[r]->max = new_max;
      }
      const __m512 mx = _mm512_set1_ps(new_max);
      __m512 vsum = _mm512_setzero_ps();
      for (int j = 0; j < nb; j += 16) {
        const auto m = static_cast<__mmask16>(
            n - j >= 16 ? 0xFFFF : (n - j <= 0 ? 0 : (1u << (n - j)) - 1));
        const __m512 e = _mm512_maskz_mov_ps(m, Exp(_mm512_sub_ps(_mm512_load_ps(pr + j), mx)));
        _mm512_store_ps(pr + j, e);
        vsum = _mm512_add_ps(vsum, e);
      }
      st[r]->sum += _mm512_reduce_add_ps(vsum);
    }
    Mix(rows, p, nb, vh + b0 * v_stride, v_stride, orow, s.dv);
  }
}

// Keys [c0, c1) of every KV head, transposed: kt[(hk * dk + d) * stride + (p - c0)].
template <typename T>
void TransposeKeys(const AttentionShape& s, const T* k, int64_t k_stride, int64_t c0, int64_t c1,
                   float* kt, int64_t stride, ThreadPool& pool) {
  pool.ParallelFor(int64_t{s.n_head_kv} * s.dk, 16, [&](int64_t begin, int64_t end, int) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t hk = row / s.dk, d = row % s.dk;
      const T* src = k + hk * s.dk + d;
      float* dst = kt + row * stride;
      int64_t p = c0;
      for (; p < c1; ++p) dst[p - c0] = ToFloat(src[p * k_stride]);
      for (; p - c0 < stride; ++p) dst[p - c0] = 0.0f;  // padding keys: masked, but finite
    }
  });
}

template <typename T>
void Blocked(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0, const T* k,
             int64_t k_stride, const T* v, int64_t v_stride, float* out, ThreadPool& pool) {
  const int group = s.n_head / s.n_head_kv;
  // Rows of an item: up to kMaxRows heads of one KV group, times as many tokens as fit.
  const int heads = std::min(group, kMaxRows);
  const int head_chunks = (group + heads - 1) / heads;
  const int64_t tokens = std::max(1, kMaxRows / heads);
  const int64_t token_tiles = (n_tokens + tokens - 1) / tokens;
  const int64_t n_items = token_tiles * s.n_head_kv * head_chunks;

  // The calling thread owns the shared scratch: the transposed keys and the row states.
  static thread_local ScratchBuffer kt_buf, state_buf;
  const int64_t n_kv = pos0 + n_tokens;
  const int64_t bytes_per_pos = int64_t{s.n_head_kv} * s.dk * static_cast<int64_t>(sizeof(float));
  const int64_t chunk = std::min<int64_t>(
      (n_kv + kKeyBlock - 1) / kKeyBlock * kKeyBlock,
      std::max<int64_t>(kKeyBlock, static_cast<int64_t>(kChunkBytes) / bytes_per_pos / kKeyBlock *
                                       kKeyBlock));
  auto* kt = reinterpret_cast<float*>(kt_buf.Reserve(static_cast<size_t>(chunk * bytes_per_pos)));
  auto* state = reinterpret_cast<RowState*>(
      state_buf.Reserve(static_cast<size_t>(n_tokens * s.n_head) * sizeof(RowState)));
  for (int64_t i = 0; i < n_tokens * s.n_head; ++i) state[i] = RowState{-INFINITY, false, 0.0};
  std::fill(out, out + n_tokens * s.n_head * s.dv, 0.0f);

  for (int64_t c0 = 0; c0 < n_kv; c0 += chunk) {
    const int64_t c1 = std::min(n_kv, c0 + chunk);
    TransposeKeys(s, k, k_stride, c0, c1, kt, chunk, pool);
    pool.ParallelFor(n_items, 1, [&](int64_t begin, int64_t end, int) {
      static thread_local ScratchBuffer p_buf;
      auto* p = reinterpret_cast<float*>(p_buf.Reserve(sizeof(float) * kMaxRows * kKeyBlock));
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
        if (pos0 + t[rows - 1] < c0) continue;  // its rows see none of this chunk
        RunItem(s, q, pos0, v, v_stride, hk, t, h, rows, c0, c1,
                kt + int64_t{hk} * s.dk * chunk, chunk, out, state, p);
      }
    });
  }

  // Normalize: o = (sum_p e^(s_p - max) v_p) / (sum_p e^(s_p - max)).
  pool.ParallelFor(n_tokens * s.n_head, 64, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      float* o = out + i * s.dv;
      const RowState& st = state[i];
      if (st.nan) {
        std::fill(o, o + s.dv, NAN);
      } else if (st.max == -INFINITY) {
        std::fill(o, o + s.dv, 0.0f);  // every score -inf: the reference's softmax gives zeros
      } else {
        const float inv = static_cast<float>(1.0 / st.sum);
        for (int d = 0; d < s.dv; ++d) o[d] *= inv;
      }
    }
  });
}

}  // namespace

void AttentionBlockedAvx512(const AttentionShape& s, const float* q, int64_t n_tokens,
                            int64_t pos0, const KvRows& kv, float* out, ThreadPool& pool) {
  if (kv.type == DType::kF16) {
    Blocked(s, q, n_tokens, pos0, static_cast<const uint16_t*>(kv.k), kv.k_stride,
            static_cast<const uint16_t*>(kv.v), kv.v_stride, out, pool);
  } else {
    Blocked(s, q, n_tokens, pos0, static_cast<const float*>(kv.k), kv.k_stride,
            static_cast<const float*>(kv.v), kv.v_stride, out, pool);
  }
}

}  // namespace substrate
