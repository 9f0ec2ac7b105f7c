#include "kernels/attention.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "kernels/attention_simd.h"
#include "kernels/cpu_features.h"
#include "kernels/ops.h"
#include "kernels/profile.h"
#include "quant/quant.h"

namespace substrate {

namespace {

inline float ToFloat(float x) { return x; }
inline float ToFloat(uint16_t h) { return Fp16ToFp32(h); }

template <typename T>
void ReferenceHeads(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
                    const T* k, int64_t k_stride, const T* v, int64_t v_stride, float* out,
                    ThreadPool& pool) {
  const int group = s.n_head / s.n_head_kv;
  const int64_t n_items = n_tokens * s.n_head;
  pool.ParallelFor(n_items, 1, [&](int64_t begin, int64_t end, int) {
    std::vector<float> scores(static_cast<size_t>(pos0 + n_tokens));
    std::vector<double> acc(static_cast<size_t>(s.dv));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / s.n_head;
      const int h = static_cast<int>(item % s.n_head);
      const int hk = h / group;
      const float* qh = q + (t * s.n_head + h) * s.dk;
      const int64_t n_kv = pos0 + t + 1;
      for (int64_t p = 0; p < n_kv; ++p) {
        const T* kp = k + p * k_stride + static_cast<int64_t>(hk) * s.dk;
        float dot = 0;
        for (int d = 0; d < s.dk; ++d) dot += qh[d] * ToFloat(kp[d]);
        scores[p] = dot * s.scale;
      }
      Softmax(scores.data(), n_kv);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t p = 0; p < n_kv; ++p) {
        const T* vp = v + p * v_stride + static_cast<int64_t>(hk) * s.dv;
        const double w = scores[p];
        for (int d = 0; d < s.dv; ++d) acc[d] += w * ToFloat(vp[d]);
      }
      float* o = out + (t * s.n_head + h) * s.dv;
      for (int d = 0; d < s.dv; ++d) o[d] = static_cast<float>(acc[d]);
    }
  });
}

// The blocked kernel serves every pass where the CPU has AVX-512 (one arithmetic for prompts and
// single tokens, so a row's bits never depend on the pass); AttentionSimd serves AVX2.
bool UseBlocked(const AttentionShape& s, const KvRows& kv) {
  return ActiveIsa() >= Isa::kAvx512 && s.n_head_kv > 0 && s.n_head % s.n_head_kv == 0 &&
         s.dv <= kBlockedMaxDv && (kv.type == DType::kF32 || kv.type == DType::kF16);
}

}  // namespace

void AttentionReference(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
                        const KvRows& kv, float* out, ThreadPool& pool) {
  WithKvElements(kv, [&](const auto* k, const auto* v) {
    ReferenceHeads(s, q, n_tokens, pos0, k, kv.k_stride, v, kv.v_stride, out, pool);
  });
}

void Attention(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
               const KvRows& kv, float* out, ThreadPool& pool) {
  const bool profile = KernelProfilingEnabled();
  auto t0 = profile ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  if (UseBlocked(s, kv)) {
    AttentionBlockedAvx512(s, q, n_tokens, pos0, kv, out, pool);
  } else if (!AttentionSimd(s, q, n_tokens, pos0, kv, out, pool)) {
    AttentionReference(s, q, n_tokens, pos0, kv, out, pool);
  }
  if (profile) {
    // K/V bytes touched: every token reads its causal history of K and V rows, whose KV heads
    // the query heads of a group share (the bench's KV bytes a token count the same).
    const uint64_t rows = static_cast<uint64_t>(n_tokens * pos0 + n_tokens * (n_tokens + 1) / 2);
    const uint64_t bytes = rows * static_cast<uint64_t>(s.n_head_kv) * (s.dk + s.dv) *
                           (kv.type == DType::kF16 ? 2 : 4);
    AddKernelProfile(kProfileAttention,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                     bytes);
  }
}

}  // namespace substrate
