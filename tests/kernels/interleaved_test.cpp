// The interleaved decode layouts (kernels/interleaved_q8_0.h, interleaved_q4_0.h,
// interleaved_q4_k.h, interleaved_q6_k.h; decode and prefill): the in-place rearrangement round-trips to the
// original bytes (every bit pattern of quants and packed scales), and MatMul over an
// interleaved view equals MatMul over the plain rows (same quantized activations, integer
// sums exact, so only float order differs) at every ISA tier the CPU has, for decode, short
// token runs and prefill (1-70 tokens: the 8-token register tiles and their remainders), with
// and without residual tiers; the reference and row lookups equal the plain ones exactly.
#include "kernels/interleaved.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/interleaved_q4_0.h"
#include "kernels/interleaved_q4_k.h"
#include "kernels/interleaved_q6_k.h"
#include "kernels/interleaved_q8_0.h"
#include "kernels/matmul.h"
#include "kernels/random_matrix.h"
#include "quant/quant.h"

namespace substrate {
namespace {

using kernel_test::RandomFloats;
using kernel_test::RandomMatrix;

struct Layout {
  DType type;
  WeightLayout layout;
  int64_t cols_step;  // columns must be a multiple of this
};

class Interleaved : public ::testing::TestWithParam<Layout> {};

TEST_P(Interleaved, ShapesThatQualify) {
  const Layout l = GetParam();
  std::vector<uint8_t> m(*RowBytes(l.type, 4 * l.cols_step) * 24);
  EXPECT_EQ(InterleaveForDecode(l.type, 16, 4 * l.cols_step, m.data(), nullptr), l.layout);
  // Rows not a multiple of 16, columns not a multiple of the step: left as rows.
  EXPECT_EQ(InterleaveForDecode(l.type, 24, 4 * l.cols_step, m.data(), nullptr), WeightLayout::kRows);
  if (l.cols_step > GetDTypeTraits(l.type).block_size) {
    EXPECT_EQ(InterleaveForDecode(l.type, 16, 3 * l.cols_step / 2, m.data(), nullptr),
              WeightLayout::kRows);
  }
  EXPECT_EQ(InterleaveForDecode(DType::kQ3_K, 16, 1024, m.data(), nullptr), WeightLayout::kRows);
}

TEST_P(Interleaved, RoundTripsToThePlainRows) {
  const Layout l = GetParam();
  std::mt19937 rng(3);
  ThreadPool pool(2);
  const int64_t rows = 48, cols = 3 * l.cols_step;
  const size_t rb = *RowBytes(l.type, cols);
  const auto plain = RandomMatrix(l.type, rows, cols, rng);
  // The rearrangement has a vector path on AVX-512 (an expert cache runs it on every read) and
  // the scalar one: each tier the CPU has, with and without threads.
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx})
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      if (isa > DetectedIsa()) continue;
      SCOPED_TRACE(IsaName(isa));
      const Isa prev = SetIsaForTesting(isa);
      auto m = plain;
      const WeightLayout got_layout = InterleaveForDecode(l.type, rows, cols, m.data(), p);
      SetIsaForTesting(prev);
      ASSERT_EQ(got_layout, l.layout);
      ASSERT_NE(m, plain);
      std::vector<uint8_t> got(kInterleavedRows * rb);
      for (int64_t g = 0; g < rows / kInterleavedRows; ++g) {
        DeinterleaveGroup(l.layout, m.data(), cols, g, got.data());
        EXPECT_EQ(0, std::memcmp(got.data(), plain.data() + g * kInterleavedRows * rb, got.size()))
            << "group " << g;
      }
      for (int64_t r = 0; r < rows; ++r) {
        DeinterleaveRow(l.layout, m.data(), cols, r, got.data());
        EXPECT_EQ(0, std::memcmp(got.data(), plain.data() + r * rb, rb)) << "row " << r;
      }
    }
}

// What a store packed in the CPU layout relies on: DecodeLayoutFor names the layout the
// rearrangement gives, pieces of whole 16-row groups rearranged one by one give the bytes of the
// whole matrix rearranged, DeinterleaveInPlace restores the rows, and the manifest's names
// round-trip.
TEST_P(Interleaved, RearrangedInPiecesAsWholeAndBackInPlace) {
  const Layout l = GetParam();
  std::mt19937 rng(5);
  const int64_t rows = 64, cols = 2 * l.cols_step;
  const size_t rb = *RowBytes(l.type, cols);
  const auto plain = RandomMatrix(l.type, rows, cols, rng);
  EXPECT_EQ(DecodeLayoutFor(l.type, rows, cols), l.layout);
  EXPECT_EQ(DecodeLayoutFor(l.type, rows + 8, cols), WeightLayout::kRows);
  auto whole = plain;
  ASSERT_EQ(InterleaveForDecode(l.type, rows, cols, whole.data(), nullptr), l.layout);
  auto pieces = plain;
  for (int64_t r0 : {0, 16, 48})  // pieces of 16, 32 and 16 rows
    InterleaveForDecode(l.type, r0 == 16 ? 32 : 16, cols, pieces.data() + r0 * rb, nullptr);
  EXPECT_EQ(pieces, whole);
  DeinterleaveInPlace(l.layout, l.type, rows, cols, pieces.data());
  EXPECT_EQ(pieces, plain);
  WeightLayout named = WeightLayout::kRows;
  ASSERT_TRUE(WeightLayoutFromName(WeightLayoutName(l.layout), &named));
  EXPECT_EQ(named, l.layout);
  EXPECT_FALSE(WeightLayoutFromName("q4_0", &named));
}

TEST_P(Interleaved, MatMulEqualsPlainRowsAtEveryTier) {
  const Layout l = GetParam();
  std::mt19937 rng(11);
  ThreadPool pool(2);
  // 5 steps: Q4_0's decode reads whole chunks of 4 pairs and then a pair on its own.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{48, 5 * l.cols_step}, {32, 1024}, {80, 4096}}) {
    const auto plain = RandomMatrix(l.type, rows, cols, rng);
    auto inter = plain;
    ASSERT_EQ(InterleaveForDecode(l.type, rows, cols, inter.data(), nullptr), l.layout);
    const auto resid = RandomMatrix(DType::kQ4_0, rows, cols, rng);
    for (int n_res : {0, 1}) {
      WeightView pv;
      pv.type = l.type;
      pv.data = plain.data();
      pv.bytes = plain.size();
      pv.rows = rows;
      pv.cols = cols;
      pv.n_residuals = n_res;
      pv.residual_type[0] = DType::kQ4_0;
      pv.residual[0] = resid.data();
      WeightView iv = pv;
      iv.layout = l.layout;
      iv.data = inter.data();

      std::vector<float> prow(cols), irow(cols);
      for (int64_t r = 0; r < rows; ++r) {
        DequantizeWeightRow(pv, r, prow.data());
        DequantizeWeightRow(iv, r, irow.data());
        ASSERT_EQ(prow, irow) << "row " << r;
      }
      for (int64_t n_tokens : {1, 2, 3, 4, 5, 8, 9, 13, 24, 70}) {
        auto x = RandomFloats(cols * n_tokens, rng);
        std::vector<float> pref(rows * n_tokens), iref(pref.size());
        MatMulReference(pv, x.data(), n_tokens, pref.data());
        MatMulReference(iv, x.data(), n_tokens, iref.data());
        ASSERT_EQ(pref, iref);
        double rms = 0;
        for (float v : pref) rms += double{v} * v;
        rms = std::sqrt(rms / pref.size());
        for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
          if (isa > DetectedIsa()) continue;
          Isa prev = SetIsaForTesting(isa);
          std::vector<float> want(pref.size(), NAN), got(pref.size(), NAN);
          MatMul(pv, x.data(), n_tokens, want.data(), pool);
          MatMul(iv, x.data(), n_tokens, got.data(), pool);
          SetIsaForTesting(prev);
          double diff = 0;
          for (size_t i = 0; i < got.size(); ++i)
            diff = std::max(diff, std::fabs(double{got[i]} - want[i]));
          // A wrong quant, scale or sign moves a result by a block's term, ~rms / 6 here.
          EXPECT_LT(diff, 1e-5 * rms) << IsaName(isa) << " rows=" << rows << " cols=" << cols
                                      << " tokens=" << n_tokens << " residuals=" << n_res;
        }
      }
    }
  }
}

// The decode prefetch distances (cpu_features.h: each vendor's, or SUBSTRATE_PREFETCH) only move
// requests: every setting gives the same bits, none requested too (0) or far past the matrix.
TEST_P(Interleaved, DecodeIsTheSameAtEveryPrefetchDistance) {
  const Layout l = GetParam();
  if (!InterleavedKernelFor(l.layout, DetectedIsa()))
    GTEST_SKIP() << "no kernel for this layout at this CPU's tier";
  std::mt19937 rng(5);
  ThreadPool pool(2);
  const int64_t rows = 64, cols = 4 * l.cols_step;
  auto m = RandomMatrix(l.type, rows, cols, rng);
  ASSERT_EQ(InterleaveForDecode(l.type, rows, cols, m.data(), nullptr), l.layout);
  WeightView v;
  v.type = l.type;
  v.layout = l.layout;
  v.data = m.data();
  v.bytes = m.size();
  v.rows = rows;
  v.cols = cols;
  const auto x = RandomFloats(cols, rng);
  const PrefetchDistances before = DecodePrefetch();
  std::vector<float> first;
  for (PrefetchDistances d : {PrefetchDistances{2048, 8192}, PrefetchDistances{6144, 0},
                              PrefetchDistances{0, 0}, PrefetchDistances{1 << 20, 1 << 22}}) {
    SetDecodePrefetchForTesting(d);
    std::vector<float> y(rows, NAN);
    MatMul(v, x.data(), 1, y.data(), pool);
    if (first.empty()) first = y;
    EXPECT_EQ(y, first) << "l1=" << d.l1 << " l2=" << d.l2;
  }
  SetDecodePrefetchForTesting(before);
}

INSTANTIATE_TEST_SUITE_P(Layouts, Interleaved,
                         ::testing::Values(Layout{DType::kQ8_0, WeightLayout::kQ8_0Interleaved, 64},
                                           Layout{DType::kQ4_0, WeightLayout::kQ4_0Interleaved, 64},
                                           Layout{DType::kQ4_K, WeightLayout::kQ4_KInterleaved, 256},
                                           Layout{DType::kQ5_K, WeightLayout::kQ5_KInterleaved, 256},
                                           Layout{DType::kQ6_K, WeightLayout::kQ6_KInterleaved, 256}),
                         [](const auto& info) { return std::string(DTypeName(info.param.type)); });

}  // namespace
}  // namespace substrate
