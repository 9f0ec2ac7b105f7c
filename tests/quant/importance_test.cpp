// Importance-weighted quantization of the K-quants and IQ4 types: importance multiplies the
// error weights of the default search, so all-ones importance must give the plain quantizer's
// bytes exactly, and real importance must lower the importance-weighted error it targets.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "format/dtype.h"
#include "quant/quant.h"

namespace substrate {
namespace {

const DType kTypes[] = {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K,   DType::kQ5_K,
                        DType::kQ6_K, DType::kIQ4_NL, DType::kIQ4_XS};

std::vector<float> Row(std::mt19937& rng, int64_t n, int kind) {
  std::normal_distribution<float> g(0.f, 0.02f);
  std::student_t_distribution<float> heavy(3.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = kind == 0 ? g(rng) : kind == 1 ? 0.01f * heavy(rng) : std::fabs(g(rng)) + 0.001f;
  if (kind == 0) x[7] = 0.4f;  // an outlier
  return x;
}

std::vector<uint8_t> Quantize(DType t, const std::vector<float>& x, const float* imp) {
  std::vector<uint8_t> q(*RowBytes(t, x.size()));
  QuantizeRow(t, x.data(), q.data(), static_cast<int64_t>(x.size()), imp);
  return q;
}

double WeightedError(DType t, const std::vector<float>& x, const std::vector<uint8_t>& q,
                     const std::vector<float>& w) {
  std::vector<float> y(x.size());
  DequantizeRow(t, q.data(), y.data(), static_cast<int64_t>(y.size()));
  double e = 0;
  for (size_t i = 0; i < x.size(); ++i) e += w[i] * (x[i] - static_cast<double>(y[i])) * (x[i] - y[i]);
  return e;
}

TEST(Importance, UniformImportanceIsByteIdenticalToPlain) {
  std::mt19937 rng(3);
  const int64_t n = 1024;
  const std::vector<float> ones(n, 1.f);
  for (DType t : kTypes) {
    for (int kind = 0; kind < 3; ++kind) {
      for (int rep = 0; rep < 20; ++rep) {
        const std::vector<float> x = Row(rng, n, kind);
        ASSERT_EQ(Quantize(t, x, nullptr), Quantize(t, x, ones.data()))
            << DTypeName(t) << " kind " << kind << " row " << rep;
      }
    }
  }
}

TEST(Importance, LowersTheImportanceWeightedError) {
  // Activations with a few loud columns (as real models have): the weighted quantizer must
  // spend its precision there.
  std::mt19937 rng(5);
  const int64_t n = 2048;
  std::lognormal_distribution<float> loud(0.f, 1.5f);
  std::vector<float> imp(n);
  for (auto& v : imp) v = loud(rng);
  for (DType t : kTypes) {
    double plain = 0, weighted = 0;
    int differ = 0;
    for (int rep = 0; rep < 40; ++rep) {
      const std::vector<float> x = Row(rng, n, rep % 3);
      const auto q0 = Quantize(t, x, nullptr), q1 = Quantize(t, x, imp.data());
      differ += q0 != q1;
      plain += WeightedError(t, x, q0, imp);
      weighted += WeightedError(t, x, q1, imp);
    }
    EXPECT_GT(differ, 20) << DTypeName(t);
    EXPECT_LT(weighted, 0.97 * plain) << DTypeName(t);
    std::printf("  %-7s weighted error with importance / without: %.3f\n", DTypeName(t), weighted / plain);
  }
}

TEST(Importance, ZeroImportanceColumnsDoNotBreakTheSearch) {
  std::mt19937 rng(9);
  const int64_t n = 512;
  std::vector<float> imp(n, 1.f);
  for (int64_t i = 0; i < n; i += 3) imp[static_cast<size_t>(i)] = 0.f;
  for (int64_t i = 256; i < 512; ++i) imp[static_cast<size_t>(i)] = 0.f;  // a whole block dark
  for (DType t : kTypes) {
    const std::vector<float> x = Row(rng, n, 0);
    const auto q = Quantize(t, x, imp.data());
    std::vector<float> y(x.size());
    DequantizeRow(t, q.data(), y.data(), n);
    for (float v : y) ASSERT_TRUE(std::isfinite(v)) << DTypeName(t);
  }
}

}  // namespace
}  // namespace substrate
