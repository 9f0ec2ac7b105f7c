// The SIMD elementwise ops against their scalar definitions (kernels/ops.h): SwiGlu's AVX-512
// body, with its polynomial exp, over awkward lengths (tails under a mask), both signs, large
// magnitudes and in place.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/ops.h"

namespace substrate {
namespace {

TEST(OpsSimd, SwiGluMatchesTheScalarDefinition) {
  if (DetectedIsa() < Isa::kAvx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  const Isa prev = SetIsaForTesting(Isa::kAvx512);
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.0f, 4.0f);
  for (int64_t n : {1, 15, 16, 17, 100, 1031}) {
    std::vector<float> gate(static_cast<size_t>(n)), up(static_cast<size_t>(n));
    for (float& x : gate) x = g(rng);
    for (float& x : up) x = g(rng);
    gate[0] = -90.0f;  // e^-|g| far below 1: the sigmoid's tails
    if (n > 1) gate[1] = 88.0f;
    if (n > 2) gate[2] = 0.0f;
    std::vector<float> out(static_cast<size_t>(n) + 1, 7.0f);  // one past n: must stay 7
    SwiGlu(gate.data(), up.data(), n, out.data());
    for (int64_t i = 0; i < n; ++i) {
      const double want =
          static_cast<double>(gate[i]) / (1.0 + std::exp(-static_cast<double>(gate[i]))) * up[i];
      EXPECT_NEAR(out[i], want, 2e-6 * std::abs(want) + 1e-30) << "n " << n << " i " << i;
    }
    EXPECT_EQ(out[n], 7.0f) << "a store past n";
    // In place (out aliases gate), as the forward pass calls it.
    std::vector<float> in_place = gate;
    SwiGlu(in_place.data(), up.data(), n, in_place.data());
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(in_place[i], out[i]);
  }
  SetIsaForTesting(prev);
}

}  // namespace
}  // namespace substrate
