// AttentionSimd (and Attention, which dispatches to it) against the scalar AttentionReference on
// random inputs: odd head sizes, GQA groups, a prefill batch on top of a cached history, a long
// history, and masked (-inf) keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_simd.h"
#include "kernels/cpu_features.h"
#include "quant/quant.h"

namespace substrate {
namespace {

struct Case {
  int n_head, n_head_kv, dk, dv;
  int64_t n_tokens, pos0;
};

// Runs the test body once per SIMD tier this CPU has (AttentionSimd picks by the active tier).
std::vector<Isa> SimdTiers() {
  std::vector<Isa> tiers;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512})
    if (DetectedIsa() >= isa) tiers.push_back(isa);
  return tiers;
}

class ScopedIsa {
 public:
  explicit ScopedIsa(Isa isa) : prev_(SetIsaForTesting(isa)) {}
  ~ScopedIsa() { SetIsaForTesting(prev_); }

 private:
  Isa prev_;
};

TEST(AttentionSimd, MatchesScalarReference) {
  if (DetectedIsa() < Isa::kAvx2) GTEST_SKIP() << "no AVX2 on this CPU";
  for (Isa isa : SimdTiers()) {
  SCOPED_TRACE(IsaName(isa));
  ScopedIsa scoped(isa);
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0, 1);
  ThreadPool pool(2);
  for (Case c : {Case{4, 2, 64, 64, 5, 3}, Case{8, 1, 20, 13, 1, 40}, Case{6, 6, 128, 128, 33, 0},
                 Case{4, 4, 128, 128, 2, 700}, Case{2, 1, 47, 80, 3, 9}}) {
    AttentionShape s{c.n_head, c.n_head_kv, c.dk, c.dv, 1.0f / std::sqrt(float(c.dk))};
    const int64_t n_pos = c.pos0 + c.n_tokens;
    const int64_t ks = c.n_head_kv * c.dk + 3, vs = c.n_head_kv * c.dv + 5;  // padded rows
    std::vector<float> q(c.n_tokens * c.n_head * c.dk), k(n_pos * ks), v(n_pos * vs);
    for (auto* buf : {&q, &k, &v})
      for (auto& x : *buf) x = 2 * g(rng);
    // The same history as F16 rows: both sides read the rounded values.
    std::vector<uint16_t> k16(k.size()), v16(v.size());
    for (size_t i = 0; i < k.size(); ++i) k16[i] = Fp32ToFp16(k[i]);
    for (size_t i = 0; i < v.size(); ++i) v16[i] = Fp32ToFp16(v[i]);
    std::vector<float> want32;
    for (DType type : {DType::kF32, DType::kF16}) {
      SCOPED_TRACE(DTypeName(type));
      const KvRows kv = type == DType::kF32 ? KvRows{type, k.data(), ks, v.data(), vs}
                                            : KvRows{type, k16.data(), ks, v16.data(), vs};
      std::vector<float> want(c.n_tokens * c.n_head * c.dv);
      AttentionReference(s, q.data(), c.n_tokens, c.pos0, kv, want.data(), pool);
      for (bool dispatch : {false, true}) {
        std::vector<float> got(want.size(), NAN);
        if (dispatch) {
          Attention(s, q.data(), c.n_tokens, c.pos0, kv, got.data(), pool);
        } else {
          ASSERT_TRUE(AttentionSimd(s, q.data(), c.n_tokens, c.pos0, kv, got.data(), pool));
        }
        // Only the q.k summation order differs from the reference (measured up to ~5e-6
        // relative on these scores of magnitude ~10), so a bound 5x tighter than float mixing
        // of the values would need.
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 2e-5f * (1 + std::fabs(want[i])))
              << "element " << i << (dispatch ? " (Attention)" : " (AttentionSimd)");
      }
      if (type == DType::kF32) {
        want32 = want;
      } else {
        // F16 rows round keys and values to 11 bits: outputs stay within a few 1e-3 of F32's
        // (scores of magnitude ~10 move by ~10 * 2^-11 before the softmax).
        double worst = 0;
        for (size_t i = 0; i < want.size(); ++i)
          worst = std::max(worst, std::fabs(double{want[i]} - want32[i]) / (1 + std::fabs(want32[i])));
        EXPECT_LT(worst, 0.05);
        EXPECT_GT(worst, 0.0);  // the F16 path really read rounded rows
      }
    }
  }
  }
}

TEST(AttentionSimd, MaskedKeysGiveZeroWeight) {
  if (DetectedIsa() < Isa::kAvx2) GTEST_SKIP() << "no AVX2 on this CPU";
  for (Isa isa : SimdTiers()) {
  SCOPED_TRACE(IsaName(isa));
  ScopedIsa scoped(isa);
  ThreadPool pool(1);
  // One head, dk = dv = 8, two positions; key 0 is -inf-scored through an infinite component.
  AttentionShape s{1, 1, 8, 8, 1.0f};
  std::vector<float> q(8, 1.0f), k(16, 0.0f), v(16);
  k[0] = -INFINITY;
  for (int i = 0; i < 16; ++i) v[i] = static_cast<float>(i);
  std::vector<float> want(8), got(8, NAN);
  const KvRows kv{DType::kF32, k.data(), 8, v.data(), 8};
  AttentionReference(s, q.data(), 1, 1, kv, want.data(), pool);
  ASSERT_TRUE(AttentionSimd(s, q.data(), 1, 1, kv, got.data(), pool));
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(want[i], v[8 + i]);
    EXPECT_EQ(got[i], want[i]);
  }
  }
}

}  // namespace
}  // namespace substrate
