// AttentionSimd against the scalar Attention on random inputs: odd head sizes, GQA groups, a
// prefill batch on top of a cached history.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_simd.h"
#include "kernels/cpu_features.h"

namespace substrate {
namespace {

TEST(AttentionSimd, MatchesScalarAttention) {
  if (DetectedIsa() < Isa::kAvx2) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0, 1);
  ThreadPool pool(2);
  struct Case { int n_head, n_head_kv, dk, dv; int64_t n_tokens, pos0; };
  for (Case c : {Case{4, 2, 64, 64, 5, 3}, Case{8, 1, 20, 13, 1, 40}, Case{6, 6, 128, 128, 33, 0}}) {
    AttentionShape s{c.n_head, c.n_head_kv, c.dk, c.dv, 1.0f / std::sqrt(float(c.dk))};
    const int64_t n_pos = c.pos0 + c.n_tokens;
    const int64_t ks = c.n_head_kv * c.dk + 3, vs = c.n_head_kv * c.dv + 5;  // padded rows
    std::vector<float> q(c.n_tokens * c.n_head * c.dk), k(n_pos * ks), v(n_pos * vs);
    for (auto* buf : {&q, &k, &v})
      for (auto& x : *buf) x = 2 * g(rng);
    std::vector<float> want(c.n_tokens * c.n_head * c.dv), got(want.size(), NAN);
    Attention(s, q.data(), c.n_tokens, c.pos0, k.data(), ks, v.data(), vs, want.data(), pool);
    ASSERT_TRUE(AttentionSimd(s, q.data(), c.n_tokens, c.pos0, k.data(), ks, v.data(), vs,
                              got.data(), pool));
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-4f * (1 + std::fabs(want[i]))) << "element " << i;
  }
}

}  // namespace
}  // namespace substrate
