// Quantize -> dequantize on synthetic data: every format reproduces its input within the error
// its bit budget allows, handles all-zero and constant blocks, and never emits NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "format/dtype.h"
#include "quant/quant.h"

namespace substrate {
namespace {

double RelRms(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    e += (a[i] - b[i]) * static_cast<double>(a[i] - b[i]);
    s += a[i] * static_cast<double>(a[i]);
  }
  return std::sqrt(e / (s > 0 ? s : 1));
}

std::vector<float> RoundTrip(DType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(*RowBytes(t, x.size()));
  QuantizeRow(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
  std::vector<float> y(x.size());
  DequantizeRow(t, q.data(), y.data(), static_cast<int64_t>(y.size()));
  return y;
}

struct Bound {
  DType type;
  double max_rel_rms;  // generous: a Gaussian row at this bit width
};

TEST(RoundTrip, GaussianRowsWithinBitBudget) {
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.f, 0.02f);
  std::vector<float> x(4096);
  for (auto& v : x) v = g(rng);
  x[100] = 0.3f;  // an outlier, as real weights have
  const Bound bounds[] = {
      {DType::kF16, 1e-3},  {DType::kBF16, 5e-3}, {DType::kQ8_0, 0.01},
      {DType::kQ6_K, 0.03}, {DType::kQ5_0, 0.07}, {DType::kQ5_1, 0.07},
      {DType::kQ5_K, 0.05}, {DType::kQ4_0, 0.14}, {DType::kQ4_1, 0.14},
      {DType::kQ4_K, 0.1},  {DType::kIQ4_NL, 0.12}, {DType::kIQ4_XS, 0.12},
      {DType::kQ3_K, 0.22}, {DType::kQ2_K, 0.45},
  };
  for (const Bound& b : bounds) {
    auto y = RoundTrip(b.type, x);
    const double err = RelRms(x, y);
    EXPECT_LT(err, b.max_rel_rms) << DTypeName(b.type);
    for (float v : y) ASSERT_TRUE(std::isfinite(v)) << DTypeName(b.type);
    std::printf("  %-7s rel rms %.4f (bound %.3f)\n", DTypeName(b.type), err, b.max_rel_rms);
  }
}

TEST(RoundTrip, ZeroAndConstantBlocks) {
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                  DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K,
                  DType::kIQ4_NL, DType::kIQ4_XS}) {
    std::vector<float> zero(512, 0.f);
    for (float v : RoundTrip(t, zero)) ASSERT_EQ(v, 0.f) << DTypeName(t);
    std::vector<float> c(512, 0.5f);
    auto y = RoundTrip(t, c);
    EXPECT_LT(RelRms(c, y), 0.1) << DTypeName(t);
  }
}

TEST(RoundTrip, QuantizedValuesAreFixedPointsOfQ8_0) {
  // Dequantized Q8_0 data quantizes back to the same bytes (scale and levels are exact).
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> x(256);
  for (auto& v : x) v = g(rng);
  std::vector<uint8_t> q1(*RowBytes(DType::kQ8_0, 256)), q2(q1.size());
  QuantizeRow(DType::kQ8_0, x.data(), q1.data(), 256);
  std::vector<float> y(256);
  DequantizeRow(DType::kQ8_0, q1.data(), y.data(), 256);
  QuantizeRow(DType::kQ8_0, y.data(), q2.data(), 256);
  EXPECT_EQ(q1, q2);
}

TEST(RoundTrip, ImportanceWeightsAreAccepted) {
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> x(512), w(512, 1.f);
  for (auto& v : x) v = g(rng);
  for (DType t : {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ2_K,
                  DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kIQ4_NL,
                  DType::kIQ4_XS}) {
    std::vector<uint8_t> q(*RowBytes(t, 512));
    QuantizeRow(t, x.data(), q.data(), 512, w.data());
    std::vector<float> y(512);
    DequantizeRow(t, q.data(), y.data(), 512);
    const double err = RelRms(x, y);
    EXPECT_LT(err, t == DType::kQ2_K ? 0.45 : 0.25) << DTypeName(t);
    // Uniform importance must not do worse than a few percent over no importance at all.
    EXPECT_LT(err, 1.1 * RelRms(x, RoundTrip(t, x))) << DTypeName(t);
  }
}

}  // namespace
}  // namespace substrate

namespace substrate {
namespace {

TEST(RoundTrip, NonFiniteInputsDoNotCrash) {
  // Garbage in (a corrupt source tensor) must give garbage out, never a crash or a hang.
  std::vector<float> x(512, 0.25f);
  x[3] = NAN;
  x[40] = INFINITY;
  x[300] = -INFINITY;
  x[301] = 3e38f;
  for (DType t : {DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,
                  DType::kQ5_0, DType::kQ5_1, DType::kQ2_K, DType::kQ3_K, DType::kQ4_K,
                  DType::kQ5_K, DType::kQ6_K, DType::kIQ4_NL, DType::kIQ4_XS}) {
    std::vector<uint8_t> q(*RowBytes(t, x.size()));
    QuantizeRow(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
    std::vector<float> w(x.size(), 1.f);
    QuantizeRow(t, x.data(), q.data(), static_cast<int64_t>(x.size()), w.data());
    std::vector<float> y(x.size());
    DequantizeRow(t, q.data(), y.data(), static_cast<int64_t>(y.size()));
  }
}

}  // namespace
}  // namespace substrate
