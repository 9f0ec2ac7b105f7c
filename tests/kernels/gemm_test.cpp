// The AMX prefill GEMM against the scalar dot kernels on the same quantized activations (the
// integer block sums are exact on both sides, so only float rounding may differ), for every
// accelerated format, awkward row counts (not multiples of 16), token counts 1..70, one or two
// threads; and MatMul's dispatch (with and without residual tiers) against MatMulReference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/matmul.h"
#include "kernels/random_matrix.h"
#include "kernels/vec_dot.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace substrate {
namespace {

using kernel_test::RandomFloats;
using kernel_test::RandomMatrix;

const DType kGemmTypes[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ6_K};

// sum_k |w_rk| * (|x_tk| + amax_t / 100): bounds the magnitude of every term either side adds
// (the quantized activation is within amax/254 of x).
std::vector<double> Magnitudes(DType t, const std::vector<uint8_t>& w, int64_t rows, int64_t cols,
                               const std::vector<float>& x, int64_t n_tokens) {
  const size_t rb = *RowBytes(t, static_cast<uint64_t>(cols));
  std::vector<float> row(static_cast<size_t>(cols));
  std::vector<double> mag(static_cast<size_t>(rows * n_tokens));
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeRow(t, w.data() + r * rb, row.data(), cols);
    for (int64_t n = 0; n < n_tokens; ++n) {
      const float* xt = x.data() + n * cols;
      double amax = 0, s = 0;
      for (int64_t k = 0; k < cols; ++k) amax = std::max(amax, std::fabs(double{xt[k]}));
      for (int64_t k = 0; k < cols; ++k) s += std::fabs(double{row[k]}) * (std::fabs(xt[k]) + amax / 100);
      mag[n * rows + r] = s;
    }
  }
  return mag;
}

// Float rounding only: each side rounds once per sub-block step (n_sub steps) plus a few
// products, each step off by at most 2^-24 of the running magnitude; 4 ulps per step of slack.
// A wrong scale, nibble order or offset moves a result by a whole sub-block's term, about
// mag / n_sub, orders of magnitude above this.
double Bound(double mag, int64_t cols, DType t) {
  int64_t n_sub = cols / (t == DType::kQ6_K ? 16 : 32);
  return 4.0 * static_cast<double>(n_sub + 8) * std::ldexp(1.0, -24) * mag + 1e-30;
}

TEST(Gemm, EqualsScalarDotKernelsOnAwkwardShapes) {
  if (DetectedIsa() < Isa::kAmx) GTEST_SKIP() << "no usable AMX on this CPU/OS";
  std::mt19937 rng(11);
  ThreadPool pool2(2), pool1(1);
  for (DType t : kGemmTypes) {
    const bool k_format = t == DType::kQ4_K || t == DType::kQ6_K;
    for (int64_t cols : {k_format ? int64_t{256} : int64_t{96}, int64_t{768}}) {
      for (int64_t rows : {int64_t{1}, int64_t{17}, int64_t{75}}) {
        ASSERT_TRUE(GemmSupports(t, cols, 70, Isa::kAmx)) << DTypeName(t);
        ASSERT_FALSE(GemmSupports(t, cols, 1, Isa::kAmx)) << DTypeName(t);  // decode: dot kernels
        ASSERT_FALSE(GemmSupports(t, cols, 70, Isa::kAvx512)) << DTypeName(t);
        auto w = RandomMatrix(t, rows, cols, rng);
        const size_t rb = *RowBytes(t, static_cast<uint64_t>(cols));
        const DType at = GemmActType(t);
        ASSERT_EQ(at, scalar::Find(t)->act_type) << DTypeName(t);
        const size_t stride = ActRowBytes(at, cols);
        for (int64_t n_tokens : {1, 2, 15, 16, 17, 33, 70}) {
          auto x = RandomFloats(cols * n_tokens, rng);
          std::vector<uint8_t> act(stride * n_tokens);
          for (int64_t n = 0; n < n_tokens; ++n)
            scalar::FindQuantize(at)(x.data() + n * cols, act.data() + n * stride, cols);
          std::vector<float> want(rows * n_tokens), tmp(n_tokens);
          for (int64_t r = 0; r < rows; ++r) {
            scalar::Find(t)->dot(cols, w.data() + r * rb, act.data(), stride,
                                 static_cast<int>(n_tokens), tmp.data());
            for (int64_t n = 0; n < n_tokens; ++n) want[n * rows + r] = tmp[n];
          }
          auto mag = Magnitudes(t, w, rows, cols, x, n_tokens);
          for (ThreadPool* pool : {&pool1, &pool2}) {
            std::vector<float> got(want.size(), NAN);
            GemmQuantized(t, WeightLayout::kRows, w.data(), rb, rows, cols, act.data(), stride, n_tokens, got.data(),
                          *pool);
            int bad = 0;
            for (size_t i = 0; i < got.size() && bad < 3; ++i) {
              bool ok = std::fabs(double{got[i]} - want[i]) <= Bound(mag[i], cols, t);
              if (!ok) ++bad;
              EXPECT_TRUE(ok) << DTypeName(t) << " rows=" << rows << " cols=" << cols
                              << " tokens=" << n_tokens << " threads=" << pool->size()
                              << " r=" << i % rows << " t=" << i / rows << " got " << got[i]
                              << " want " << want[i] << " bound " << Bound(mag[i], cols, t);
            }
          }
        }
      }
    }
  }
}

TEST(Gemm, BoundRejectsOneWrongSubBlock) {
  // The comparison above must be able to fail: drop one sub-block's contribution from a Q4_0
  // product (what a mis-indexed scale would do) and check the bound flags it.
  std::mt19937 rng(5);
  const int64_t cols = 768;
  auto w = RandomMatrix(DType::kQ4_0, 1, cols, rng);
  auto x = RandomFloats(cols, rng);
  std::vector<uint8_t> act(ActRowBytes(DType::kQ8_0, cols));
  scalar::FindQuantize(DType::kQ8_0)(x.data(), act.data(), cols);
  float full, partial;
  scalar::Find(DType::kQ4_0)->dot(cols, w.data(), act.data(), act.size(), 1, &full);
  auto w2 = w;
  std::memset(w2.data() + 5 * sizeof(BlockQ4_0) + 2, 0x88, kQK4_0 / 2);  // block 5 -> zeros
  scalar::Find(DType::kQ4_0)->dot(cols, w2.data(), act.data(), act.size(), 1, &partial);
  auto mag = Magnitudes(DType::kQ4_0, w, 1, cols, x, 1);
  EXPECT_GT(std::fabs(double{full} - partial), 10 * Bound(mag[0], cols, DType::kQ4_0));
}

TEST(Gemm, MatMulDispatchWithAndWithoutResiduals) {
  if (DetectedIsa() < Isa::kAmx) GTEST_SKIP() << "no usable AMX on this CPU/OS";
  std::mt19937 rng(7);
  ThreadPool pool(2);
  const int64_t rows = 45, cols = 512, n_tokens = 40;  // past every format's min_tokens
  for (DType t : kGemmTypes) {
    auto skel = RandomMatrix(t, rows, cols, rng);
    auto resid = RandomMatrix(DType::kQ8_0, rows, cols, rng);
    for (int n_res : {0, 1}) {
      WeightView w;
      w.type = t;
      w.data = skel.data();
      w.bytes = skel.size();
      w.rows = rows;
      w.cols = cols;
      w.n_residuals = n_res;
      w.residual_type[0] = DType::kQ8_0;
      w.residual[0] = resid.data();
      auto x = RandomFloats(cols * n_tokens, rng);
      std::vector<float> ref(rows * n_tokens), amx(ref.size(), NAN), vnni(ref.size(), NAN);
      MatMulReference(w, x.data(), n_tokens, ref.data());
      Isa prev = SetIsaForTesting(Isa::kAmx);
      MatMul(w, x.data(), n_tokens, amx.data(), pool);
      SetIsaForTesting(Isa::kAvx512);
      MatMul(w, x.data(), n_tokens, vnni.data(), pool);
      SetIsaForTesting(prev);
      double num = 0, den = 0, diff = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        num += (amx[i] - ref[i]) * double{amx[i] - ref[i]};
        den += ref[i] * double{ref[i]};
        diff = std::max(diff, std::fabs(double{amx[i]} - vnni[i]));
      }
      // 8-bit activations against float ones: the dot kernels' own budget (vec_dot_test).
      EXPECT_LT(std::sqrt(num / den), 2.5e-2) << DTypeName(t) << " residuals=" << n_res;
      // Same activations as the dot kernels: equal but for float order.
      EXPECT_LT(diff, 1e-4 * std::sqrt(den / ref.size())) << DTypeName(t) << " residuals=" << n_res;
    }
  }
}

}  // namespace
}  // namespace substrate
