// AttentionSimd (and Attention, which dispatches to it) against the scalar AttentionReference on
// random inputs: odd head sizes, GQA groups, a prefill batch on top of a cached history, a long
// history, and masked (-inf) keys; the blocked prefill kernel against the same reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

// Random q/K/V for a case, as F32 rows (strides padded) and the same values rounded to F16.
struct Inputs {
  std::vector<float> q, k, v;
  std::vector<uint16_t> k16, v16;
  int64_t ks, vs;
  KvRows Kv(DType type) const {
    return type == DType::kF32 ? KvRows{type, k.data(), ks, v.data(), vs}
                               : KvRows{type, k16.data(), ks, v16.data(), vs};
  }
};

Inputs MakeInputs(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0, 1);
  Inputs in;
  const int64_t n_pos = c.pos0 + c.n_tokens;
  in.ks = c.n_head_kv * c.dk + 3;
  in.vs = c.n_head_kv * c.dv + 5;
  in.q.resize(c.n_tokens * c.n_head * c.dk);
  in.k.resize(n_pos * in.ks);
  in.v.resize(n_pos * in.vs);
  for (auto* buf : {&in.q, &in.k, &in.v})
    for (auto& x : *buf) x = 2 * g(rng);
  for (float x : in.k) in.k16.push_back(Fp32ToFp16(x));
  for (float x : in.v) in.v16.push_back(Fp32ToFp16(x));
  return in;
}

// Cases for the blocked kernel: GQA groups of 1-16 heads (16 > its 12 rows per item), odd head
// sizes (masked vector tails), token counts that end mid-tile, a history long enough to cross its
// chunk of transposed keys (1,024 positions at 8 heads of 128) and several key blocks, and passes
// of a few tokens (keys transposed per item, groups split between items).
const Case kBlockedCases[] = {{32, 8, 128, 128, 40, 0}, {4, 2, 64, 64, 17, 3},
                              {8, 1, 20, 13, 16, 40},   {6, 6, 128, 128, 33, 0},
                              {2, 1, 47, 80, 19, 9},    {16, 1, 64, 64, 20, 5},
                              {8, 8, 128, 128, 21, 1100}, {32, 8, 128, 128, 1, 300},
                              {4, 2, 64, 64, 3, 140},   {16, 1, 64, 64, 2, 5},
                              {2, 1, 47, 80, 5, 9},     {8, 8, 128, 128, 1, 1100},
                              {2, 1, 40, 59, 7, 9},     {3, 1, 40, 59, 1, 30}};

TEST(AttentionBlocked, MatchesScalarReference) {
  if (DetectedIsa() < Isa::kAvx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  ThreadPool pool(2);
  for (const Case& c : kBlockedCases) {
    SCOPED_TRACE(::testing::Message() << c.n_head << "/" << c.n_head_kv << " heads, dk " << c.dk
                                      << ", dv " << c.dv << ", " << c.n_tokens << " tokens at "
                                      << c.pos0);
    const Inputs in = MakeInputs(c, 23);
    AttentionShape s{c.n_head, c.n_head_kv, c.dk, c.dv, 1.0f / std::sqrt(float(c.dk))};
    for (DType type : {DType::kF32, DType::kF16}) {
      SCOPED_TRACE(DTypeName(type));
      std::vector<float> want(c.n_tokens * c.n_head * c.dv), got(want.size(), NAN);
      AttentionReference(s, in.q.data(), c.n_tokens, c.pos0, in.Kv(type), want.data(), pool);
      AttentionBlockedAvx512(s, in.q.data(), c.n_tokens, c.pos0, in.Kv(type), got.data(), pool);
      // Float value sums and a polynomial exp against double sums and libm: measured 1-7e-6
      // relative (AttentionSimd: up to ~5e-6); the bound is the one AttentionSimd is held to.
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 2e-5f * (1 + std::fabs(want[i]))) << "element " << i;
    }
  }
}

TEST(AttentionBlocked, MaskedKeysAndNaNQueries) {
  if (DetectedIsa() < Isa::kAvx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  ThreadPool pool(2);
  const Case c{4, 2, 32, 32, 18, 2};
  Inputs in = MakeInputs(c, 5);
  // Key 0 of KV head 0 scores -inf for the queries of heads 0 and 1 (their first component made
  // positive, the key's -inf); token 3's head 1 query is NaN.
  in.k[0] = -INFINITY;
  for (int64_t t = 0; t < c.n_tokens; ++t)
    for (int h = 0; h < 2; ++h) {
      float* qh = &in.q[(t * c.n_head + h) * c.dk];
      qh[0] = std::fabs(qh[0]) + 0.1f;
    }
  for (int d = 0; d < c.dk; ++d) in.q[(3 * c.n_head + 1) * c.dk + d] = d == 0 ? NAN : 0.0f;
  AttentionShape s{c.n_head, c.n_head_kv, c.dk, c.dv, 0.25f};
  std::vector<float> want(c.n_tokens * c.n_head * c.dv), got(want.size(), 0.0f);
  AttentionReference(s, in.q.data(), c.n_tokens, c.pos0, in.Kv(DType::kF32), want.data(), pool);
  AttentionBlockedAvx512(s, in.q.data(), c.n_tokens, c.pos0, in.Kv(DType::kF32), got.data(), pool);
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) {
      ASSERT_TRUE(std::isnan(got[i])) << "element " << i;
    } else {
      ASSERT_NEAR(got[i], want[i], 2e-5f * (1 + std::fabs(want[i]))) << "element " << i;
    }
  }
  EXPECT_TRUE(std::isnan(got[(3 * c.n_head + 1) * c.dv]));
}

// A row's bits do not depend on the pass that computes it: a prompt's rows equal the rows of
// one-token passes at the same positions, and of the prompt split in two, through Attention (the
// dispatch) as through the kernel. Deferred verification, prompt lookup, batching and the prefix
// cache rely on it. Histories cross a chunk of shared transposed keys (1,024 positions here).
TEST(AttentionBlocked, RowsDoNotDependOnThePass) {
  if (DetectedIsa() < Isa::kAvx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  ThreadPool pool(2);
  for (const Case& c : {Case{8, 2, 64, 64, 24, 7}, Case{8, 8, 128, 128, 40, 1000}}) {
    const Inputs in = MakeInputs(c, 9);
    AttentionShape s{c.n_head, c.n_head_kv, c.dk, c.dv, 0.125f};
    const int64_t row = int64_t{c.n_head} * c.dv;
    for (DType type : {DType::kF32, DType::kF16}) {
      SCOPED_TRACE(DTypeName(type));
      const KvRows kv = in.Kv(type);
      std::vector<float> prompt(c.n_tokens * row), split(prompt.size()), one(row);
      Attention(s, in.q.data(), c.n_tokens, c.pos0, kv, prompt.data(), pool);
      const int64_t first = 5;
      Attention(s, in.q.data(), first, c.pos0, kv, split.data(), pool);
      Attention(s, in.q.data() + first * c.n_head * c.dk, c.n_tokens - first, c.pos0 + first, kv,
                split.data() + first * row, pool);
      EXPECT_EQ(0, std::memcmp(prompt.data(), split.data(), prompt.size() * sizeof(float)));
      for (int64_t t = 0; t < c.n_tokens; ++t) {
        AttentionBlockedAvx512(s, in.q.data() + t * c.n_head * c.dk, 1, c.pos0 + t, kv,
                               one.data(), pool);
        ASSERT_EQ(0, std::memcmp(prompt.data() + t * row, one.data(), row * sizeof(float)))
            << "token " << t;
      }
    }
  }
}

}  // namespace
}  // namespace substrate
