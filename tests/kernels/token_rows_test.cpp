// A token's row of a multi-token MatMul (prefill, verification, speculation) has exactly the
// bits the one-token MatMul (decode) gives it: for every weight type, the interleaved layouts and
// residual tiers, 2..70 tokens (every remainder of the kernels' token tiles), at every ISA tier
// the CPU has, under ExactTokenRows (which keeps the AMX GEMM out). Deferred verification and
// prompt-lookup speculation promise the tokens plain decoding shows; a 1e-7 difference in one
// row can move the Q8_K quantization of the next layer's activations and the logits with it.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/interleaved.h"
#include "kernels/matmul.h"
#include "kernels/random_matrix.h"
#include "quant/quant.h"

namespace substrate {
namespace {

using kernel_test::RandomFloats;

const DType kTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0,   DType::kQ4_0,
                        DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kIQ4_NL, DType::kQ2_K,
                        DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K,   DType::kIQ4_XS};

std::vector<uint8_t> Quantized(DType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  const size_t rb = *RowBytes(type, static_cast<uint64_t>(cols));
  std::vector<uint8_t> m(rb * static_cast<size_t>(rows));
  std::vector<float> v = RandomFloats(rows * cols, rng);
  for (int64_t r = 0; r < rows; ++r)
    QuantizeRow(type, v.data() + r * cols, m.data() + r * rb, cols);
  return m;
}

struct Case {
  const char* what;
  DType type;
  int64_t rows, cols;
  bool interleave;
  int n_res;
};

// Runs one case at the active tier; returns the number of rows compared.
int CheckCase(const Case& c, std::mt19937& rng, ThreadPool& pool) {
  std::vector<uint8_t> skel = Quantized(c.type, c.rows, c.cols, rng), res[2];
  WeightView w;
  w.type = c.type;
  w.layout = c.interleave ? InterleaveForDecode(c.type, c.rows, c.cols, skel.data(), nullptr)
                          : WeightLayout::kRows;
  EXPECT_EQ(c.interleave, w.layout != WeightLayout::kRows) << c.what;
  w.data = skel.data();
  w.bytes = skel.size();
  w.rows = c.rows;
  w.cols = c.cols;
  w.n_residuals = c.n_res;
  const DType res_types[2] = {DType::kQ4_0, DType::kQ6_K};
  for (int k = 0; k < c.n_res; ++k) {
    res[k] = Quantized(res_types[k], c.rows, c.cols, rng);
    w.residual_type[k] = res_types[k];
    w.residual[k] = res[k].data();
  }
  const int64_t kTokens[] = {2, 3, 5, 8, 9, 12, 17, 33, 70};
  const int64_t max_t = 70;
  // Activations with a wide dynamic range per row, as real hidden states have.
  std::vector<float> x = RandomFloats(max_t * c.cols, rng);
  for (int64_t i = 0; i < max_t * c.cols; i += 37) x[static_cast<size_t>(i)] *= 20.0f;
  std::vector<float> one(static_cast<size_t>(max_t * c.rows)), many(one.size());
  ExactTokenRows exact;
  for (int64_t t = 0; t < max_t; ++t)
    MatMul(w, x.data() + t * c.cols, 1, one.data() + t * c.rows, pool);
  int rows = 0;
  for (int64_t nt : kTokens) {
    MatMul(w, x.data(), nt, many.data(), pool);
    for (int64_t t = 0; t < nt; ++t) {
      const float* a = many.data() + t * c.rows;
      const float* b = one.data() + t * c.rows;
      if (std::memcmp(a, b, static_cast<size_t>(c.rows) * sizeof(float)) != 0) {
        int64_t r = 0;
        while (a[r] == b[r] || (a[r] != a[r] && b[r] != b[r])) ++r;
        ADD_FAILURE() << c.what << " " << DTypeName(c.type) << " at " << IsaName(ActiveIsa())
                      << ": " << nt << "-token pass, token " << t << " row " << r << " = " << a[r]
                      << ", one-token pass " << b[r] << " (diff " << a[r] - b[r] << ")";
        return rows;
      }
      rows += static_cast<int>(c.rows);
    }
  }
  return rows;
}

TEST(TokenRows, MultiTokenRowsEqualOneTokenRowsBitForBit) {
  std::mt19937 rng(20261130);
  ThreadPool pool(2);
  std::vector<Case> cases;
  for (DType t : kTypes) {
    const bool k_format = GetDTypeTraits(t).block_size == 256;
    // 32-element formats: 13 blocks (not a multiple of the 4-block 512-bit steps) and 16.
    if (!k_format) cases.push_back({"plain", t, 37, 13 * 32, false, 0});
    cases.push_back({"plain", t, 21, 512, false, 0});
    if (k_format) cases.push_back({"plain", t, 19, 768, false, 0});
    // Float formats: a rest past the kernels' steps that every chain takes (445: 29 past the
    // 32-wide steps, 13 past the 16-wide ones), where prefill tiles rows and tokens.
    // And 2,093: three of the prefill tiles' column blocks, carried from one to the next.
    if (GetDTypeTraits(t).block_size == 1) {
      cases.push_back({"plain, a rest", t, 11, 445, false, 0});
      cases.push_back({"plain, column blocks", t, 9, 2093, false, 0});
    }
  }
  cases.push_back({"interleaved", DType::kQ8_0, 48, 512, true, 0});
  cases.push_back({"interleaved+residual", DType::kQ8_0, 32, 256, true, 1});
  cases.push_back({"interleaved", DType::kQ4_0, 48, 512, true, 0});
  cases.push_back({"interleaved+residual", DType::kQ4_0, 32, 256, true, 1});
  cases.push_back({"interleaved", DType::kQ4_K, 48, 768, true, 0});
  cases.push_back({"interleaved+residual", DType::kQ4_K, 32, 512, true, 1});
  cases.push_back({"interleaved", DType::kQ6_K, 48, 768, true, 0});
  cases.push_back({"interleaved+residual", DType::kQ6_K, 32, 512, true, 1});
  cases.push_back({"residuals", DType::kQ4_K, 23, 512, false, 2});
  const Isa saved = ActiveIsa();
  for (int tier = 0; tier <= static_cast<int>(DetectedIsa()); ++tier) {
    SetIsaForTesting(static_cast<Isa>(tier));
    int rows = 0;
    for (const Case& c : cases) rows += CheckCase(c, rng, pool);
    std::printf("  %-7s %d rows of multi-token passes equal their one-token rows\n",
                IsaName(static_cast<Isa>(tier)), rows);
  }
  SetIsaForTesting(saved);
}

}  // namespace
}  // namespace substrate
