// Every SIMD dot kernel against the scalar reference kernel, on random blocks (every bit
// pattern of quants and scales) of awkward lengths and token counts; activation quantizers
// bit-exact; MatMul (all tiers, residuals, threads) against the dequantizing MatMulReference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "kernels/vec_dot.h"
#include "quant/quant.h"

namespace substrate {
namespace {

const DType kAllTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16,   DType::kQ8_0,
                           DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,   DType::kQ5_1,
                           DType::kQ2_K, DType::kQ3_K, DType::kQ4_K,   DType::kQ5_K,
                           DType::kQ6_K, DType::kIQ4_NL, DType::kIQ4_XS};

// Byte offsets of the fp16 scale fields of one block, which must hold sane numbers.
std::vector<int> HalfFields(DType t) {
  switch (t) {
    case DType::kQ4_1: case DType::kQ5_1: case DType::kQ4_K: case DType::kQ5_K: return {0, 2};
    case DType::kQ2_K: return {80, 82};
    case DType::kQ3_K: return {108};
    case DType::kQ6_K: return {208};
    default: return {0};
  }
}

std::vector<uint8_t> RandomRow(DType t, int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), ud(0.002f, 0.02f);
  const DTypeTraits& tr = GetDTypeTraits(t);
  std::vector<uint8_t> row(*RowBytes(t, static_cast<uint64_t>(n)));
  if (t == DType::kF32) {
    for (int64_t i = 0; i < n; ++i) {
      float f = u(rng);
      std::memcpy(row.data() + 4 * i, &f, 4);
    }
  } else if (t == DType::kF16 || t == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h = t == DType::kF16 ? Fp32ToFp16(u(rng)) : Fp32ToBf16(u(rng));
      std::memcpy(row.data() + 2 * i, &h, 2);
    }
  } else {
    for (auto& b : row) b = static_cast<uint8_t>(rng());
    for (size_t blk = 0; blk < row.size() / tr.block_bytes; ++blk)
      for (int off : HalfFields(t)) {
        uint16_t h = Fp32ToFp16(ud(rng));
        std::memcpy(row.data() + blk * tr.block_bytes + off, &h, 2);
      }
  }
  return row;
}

std::vector<float> RandomFloats(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = g(rng);
  return v;
}

std::vector<Isa> SimdTiers() {
  std::vector<Isa> tiers;
  if (DetectedIsa() >= Isa::kAvx2) tiers.push_back(Isa::kAvx2);
  if (DetectedIsa() >= Isa::kAvx512) tiers.push_back(Isa::kAvx512);
  return tiers;
}

TEST(VecDot, EveryTypeHasScalarAndSimdKernels) {
  for (DType t : kAllTypes) {
    ASSERT_NE(scalar::Find(t), nullptr) << DTypeName(t);
    for (Isa isa : SimdTiers()) EXPECT_NE(FindDotKernel(t, isa), scalar::Find(t)) << DTypeName(t);
  }
}

TEST(VecDot, SimdActivationQuantizersAreBitExact) {
  std::mt19937 rng(7);
  const DType acts[] = {DType::kQ8_0, DType::kQ8_1, DType::kQ8_K, DType::kF16, DType::kBF16};
  for (Isa isa : SimdTiers()) {
    for (DType at : acts) {
      for (int64_t n : {256, 768, 4096}) {
        auto x = RandomFloats(n, rng);
        x[3] = 0;  // zeros and a zero block exercise the d == 0 path
        for (int i = 32; i < 64; ++i) x[i] = 0;
        std::vector<uint8_t> a(ActRowBytes(at, n)), b(a.size());
        scalar::FindQuantize(at)(x.data(), a.data(), n);
        FindQuantizeAct(at, isa)(x.data(), b.data(), n);
        EXPECT_EQ(a, b) << DTypeName(at) << " " << IsaName(isa) << " n=" << n;
      }
    }
  }
}

TEST(VecDot, SimdEqualsScalarOnRandomBlocks) {
  if (SimdTiers().empty()) GTEST_SKIP() << "no AVX2 on this CPU: nothing to compare";
  std::mt19937 rng(42);
  for (DType t : kAllTypes) {
    const DotKernel* ref = scalar::Find(t);
    int64_t bs = GetDTypeTraits(t).block_size;
    // Awkward lengths: one block, odd counts, and for the float types non-multiples of 8/16
    // (50 and 63: a rest past 16 after the 32-wide steps, which both chains take).
    std::vector<int64_t> lengths = bs == 1 ? std::vector<int64_t>{1, 7, 33, 50, 63, 100, 257, 1000}
                                           : std::vector<int64_t>{bs, 3 * bs, 17 * bs};
    if (bs == 32)  // every remainder of the 4-block decode kernels
      for (int64_t k : {2, 6, 35, 128}) lengths.push_back(k * bs);
    for (int64_t n : lengths) {
      const int kTokens = 11;
      auto w = RandomRow(t, n, rng);
      size_t stride = ActRowBytes(ref->act_type, n);
      std::vector<uint8_t> act(stride * kTokens);
      for (int tok = 0; tok < kTokens; ++tok) {
        auto x = RandomFloats(n, rng);
        scalar::FindQuantize(ref->act_type)(x.data(), act.data() + tok * stride, n);
      }
      std::vector<float> want(kTokens);
      ref->dot(n, w.data(), act.data(), stride, kTokens, want.data());
      double ms = 0;
      for (float v : want) ms += static_cast<double>(v) * v;
      double tol = 2e-5 * std::sqrt(ms / kTokens) + 1e-6;
      for (Isa isa : SimdTiers()) {
        const DotKernel* k = FindDotKernel(t, isa);
        ASSERT_EQ(k->act_type, ref->act_type);
        for (int nt : {1, 2, 3, 4, 5, 8, 11}) {
          std::vector<float> got(nt);
          k->dot(n, w.data(), act.data(), stride, nt, got.data());
          for (int tok = 0; tok < nt; ++tok)
            ASSERT_NEAR(got[tok], want[tok], tol)
                << DTypeName(t) << " " << IsaName(isa) << " n=" << n << " nt=" << nt
                << " token " << tok;
        }
      }
    }
  }
}

// A weight quantized from random floats with the reference quantizer, rows x cols.
std::vector<uint8_t> QuantizedMatrix(DType t, int64_t rows, int64_t cols, std::mt19937& rng,
                                     float scale) {
  size_t rb = *RowBytes(t, static_cast<uint64_t>(cols));
  std::vector<uint8_t> m(rb * rows);
  for (int64_t r = 0; r < rows; ++r) {
    auto f = RandomFloats(cols, rng);
    for (auto& v : f) v *= scale;
    QuantizeRow(t, f.data(), m.data() + r * rb, cols);
  }
  return m;
}

double RelError(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * static_cast<double>(got[i] - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Error budget of the activation rounding each weight type pairs with.
double Tolerance(DType t) {
  switch (scalar::Find(t)->act_type) {
    case DType::kF32: return 1e-5;
    case DType::kF16: return 2e-3;
    case DType::kBF16: return 1e-2;
    default: return 2.5e-2;  // 8-bit activations
  }
}

TEST(MatMul, MatchesReferenceOnEveryTierWithResidualsAndThreads) {
  std::mt19937 rng(3);
  ThreadPool pool(2);
  const int64_t rows = 37, cols = 768;
  for (DType t : kAllTypes) {
    if (!CanQuantize(t) || !CanDequantize(t)) {
      ADD_FAILURE() << "quant has no reference for " << DTypeName(t);
      continue;
    }
    auto skel = QuantizedMatrix(t, rows, cols, rng, 1.0f);
    auto resid = QuantizedMatrix(DType::kQ8_0, rows, cols, rng, 0.05f);
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
      for (int64_t n_tokens : {1, 5, 70}) {
        auto x = RandomFloats(cols * n_tokens, rng);
        std::vector<float> want(rows * n_tokens), got(want.size());
        MatMulReference(w, x.data(), n_tokens, want.data());
        for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
          if (isa > DetectedIsa()) continue;
          Isa prev = SetIsaForTesting(isa);
          std::fill(got.begin(), got.end(), NAN);
          MatMul(w, x.data(), n_tokens, got.data(), pool);
          SetIsaForTesting(prev);
          // The Q8_0 residual (5% of the weight) brings 8-bit activation rounding with it.
          double tol = n_res ? std::max(Tolerance(t), 2e-3) : Tolerance(t);
          EXPECT_LT(RelError(got, want), tol)
              << DTypeName(t) << " " << IsaName(isa) << " residuals=" << n_res
              << " tokens=" << n_tokens;
        }
      }
    }
  }
}

TEST(MatMul, UnsupportedTypeFallsBackToReference) {
  // A view whose column count does not divide into K blocks cannot use a fast kernel; the
  // scalar reference path must still produce the same numbers as MatMulReference.
  std::mt19937 rng(5);
  ThreadPool pool(2);
  const int64_t rows = 9, cols = 40;
  std::vector<uint8_t> m(rows * cols * 4);
  auto f = RandomFloats(rows * cols, rng);
  std::memcpy(m.data(), f.data(), m.size());
  WeightView w;
  w.type = DType::kF32;
  w.data = m.data();
  w.bytes = m.size();
  w.rows = rows;
  w.cols = cols;
  auto x = RandomFloats(cols * 3, rng);
  std::vector<float> want(rows * 3), got(rows * 3);
  MatMulReference(w, x.data(), 3, want.data());
  MatMul(w, x.data(), 3, got.data(), pool);
  EXPECT_LT(RelError(got, want), 1e-5);
}

}  // namespace
}  // namespace substrate
