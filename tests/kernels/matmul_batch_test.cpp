// MatMulBatch (kernels/matmul.h): every job of a random batch gets exactly the bits MatMul
// writes for it alone, at every ISA tier the CPU has and for 1, 2 and 3 threads. The batches
// mix weight types, interleaved Q8_0 (its own kernel on AVX-512, de-interleaved rows below and
// with residual tiers), residual tiers, row counts that are not multiples of the 16-row work
// items, 1..5 tokens, jobs sharing an activation pointer (one quantization) with the same or a
// different token count or width, a prefill-sized job (the GEMM on AMX) and an empty one. MatMul
// is itself the one-job batch, so both are also held to MatMulReference. Weights are quantized
// from normal values (kernel bit patterns are the dot-kernel tests' business).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/interleaved_q8_0.h"
#include "kernels/matmul.h"
#include "kernels/random_matrix.h"
#include "quant/quant.h"

namespace substrate {
namespace {

using kernel_test::RandomFloats;

// A weight with its bytes (skeleton, residuals) kept alive.
struct TestWeight {
  std::vector<uint8_t> skeleton, res[2];
  WeightView view;
};

// rows x cols of `type` quantized from normal values (sane bytes for every type).
std::vector<uint8_t> QuantizedMatrix(DType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  const size_t rb = *RowBytes(type, static_cast<uint64_t>(cols));
  std::vector<uint8_t> m(rb * static_cast<size_t>(rows));
  std::vector<float> v = RandomFloats(rows * cols, rng);
  for (int64_t r = 0; r < rows; ++r) QuantizeRow(type, v.data() + r * cols, m.data() + r * rb, cols);
  return m;
}

std::unique_ptr<TestWeight> MakeWeight(DType type, int64_t rows, int64_t cols, bool interleave,
                                       int n_res, std::mt19937& rng) {
  auto w = std::make_unique<TestWeight>();
  w->skeleton = QuantizedMatrix(type, rows, cols, rng);
  if (interleave) InterleaveQ8_0(w->skeleton.data(), rows, cols);
  w->view.type = type;
  w->view.layout = interleave ? WeightLayout::kQ8_0Interleaved : WeightLayout::kRows;
  w->view.data = w->skeleton.data();
  w->view.bytes = w->skeleton.size();
  w->view.rows = rows;
  w->view.cols = cols;
  w->view.n_residuals = n_res;
  const DType res_types[2] = {DType::kQ4_0, DType::kQ6_K};
  for (int k = 0; k < n_res; ++k) {
    w->res[k] = QuantizedMatrix(res_types[k], rows, cols, rng);
    w->view.residual_type[k] = res_types[k];
    w->view.residual[k] = w->res[k].data();
  }
  return w;
}

TEST(MatMulBatch, EveryJobEqualsItsOwnMatMulBitForBit) {
  std::mt19937 rng(20261129);
  const int64_t kMaxCols = 512, kMaxTokens = 12;
  // Activations: a few buffers that several jobs read (same pointer: one quantization).
  std::vector<std::vector<float>> xs;
  for (int i = 0; i < 3; ++i) xs.push_back(RandomFloats(kMaxCols * kMaxTokens, rng));

  const DType kRowTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16,  DType::kQ8_0,
                             DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,  DType::kQ4_K,
                             DType::kQ6_K, DType::kQ3_K, DType::kIQ4_XS};
  int checked = 0;
  for (int round = 0; round < 6; ++round) {
    std::vector<std::unique_ptr<TestWeight>> weights;
    std::vector<MatMulJob> jobs;
    const int n_jobs = 3 + static_cast<int>(rng() % 10);
    for (int j = 0; j < n_jobs; ++j) {
      const int64_t cols = rng() % 2 ? 256 : 512;
      const int kind = static_cast<int>(rng() % 4);  // 0, 1: rows; 2: interleaved; 3: resid.
      std::unique_ptr<TestWeight> w;
      if (kind == 2) {
        const int64_t rows = 16 * (1 + static_cast<int64_t>(rng() % 6));
        w = MakeWeight(DType::kQ8_0, rows, cols, true, static_cast<int>(rng() % 3), rng);
      } else {
        const DType t = kRowTypes[rng() % std::size(kRowTypes)];
        const int64_t rows = 1 + static_cast<int64_t>(rng() % 70);
        w = MakeWeight(t, rows, cols, false, kind == 3 ? 1 + static_cast<int>(rng() % 2) : 0,
                       rng);
      }
      const int64_t n_tokens = 1 + static_cast<int64_t>(rng() % 5);
      jobs.push_back({&w->view, xs[rng() % xs.size()].data(), n_tokens, nullptr});
      weights.push_back(std::move(w));
    }
    // A prefill-sized job (the GEMM where the CPU has AMX) and one without tokens.
    weights.push_back(MakeWeight(DType::kQ4_0, 40, 256, false, 0, rng));
    jobs.push_back({&weights.back()->view, xs[0].data(), kMaxTokens, nullptr});
    weights.push_back(MakeWeight(DType::kQ8_0, 32, 256, false, 0, rng));
    jobs.push_back({&weights.back()->view, xs[1].data(), 0, nullptr});
    std::shuffle(jobs.begin(), jobs.end(), rng);

    std::vector<size_t> offset(jobs.size() + 1, 0);
    for (size_t j = 0; j < jobs.size(); ++j)
      offset[j + 1] = offset[j] + static_cast<size_t>(jobs[j].w->rows * kMaxTokens);
    const float nan = std::numeric_limits<float>::quiet_NaN();

    // The reference, once per round, and how far each result may be from it: activations are
    // quantized to 8 bits per block (or kept as floats), each element within amax / 254 of x,
    // so a result moves at most sum_k |w_rk| * amax_t / 254; twice that is allowed. A wrong
    // row, token or activation set is off by the whole dot product, several times more.
    std::vector<float> ref(offset.back(), nan), tol(offset.back(), 0.0f);
    for (size_t j = 0; j < jobs.size(); ++j) {
      const WeightView& w = *jobs[j].w;
      MatMulReference(w, jobs[j].x, jobs[j].n_tokens, ref.data() + offset[j]);
      std::vector<float> row(static_cast<size_t>(w.cols));
      for (int64_t r = 0; r < w.rows; ++r) {
        DequantizeWeightRow(w, r, row.data());
        double l1 = 0;
        for (float v : row) l1 += std::fabs(v);
        for (int64_t t = 0; t < jobs[j].n_tokens; ++t) {
          double amax = 0;
          for (int64_t k = 0; k < w.cols; ++k)
            amax = std::max(amax, std::fabs(double{jobs[j].x[t * w.cols + k]}));
          tol[offset[j] + static_cast<size_t>(t * w.rows + r)] =
              static_cast<float>(2 * l1 * amax / 254 + 1e-6);
        }
      }
    }

    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
      if (isa > DetectedIsa()) continue;
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        const Isa prev = SetIsaForTesting(isa);
        std::vector<float> want(offset.back(), nan), got(offset.back(), nan);
        for (size_t j = 0; j < jobs.size(); ++j)
          MatMul(*jobs[j].w, jobs[j].x, jobs[j].n_tokens, want.data() + offset[j], pool);
        std::vector<MatMulJob> batch = jobs;
        for (size_t j = 0; j < batch.size(); ++j) batch[j].y = got.data() + offset[j];
        MatMulBatch(batch.data(), static_cast<int>(batch.size()), pool);
        SetIsaForTesting(prev);

        for (size_t j = 0; j < jobs.size(); ++j) {
          const WeightView& w = *jobs[j].w;
          const size_t n = static_cast<size_t>(w.rows * jobs[j].n_tokens);
          const float* g = got.data() + offset[j];
          const float* e = want.data() + offset[j];
          const float* rf = ref.data() + offset[j];
          SCOPED_TRACE(::testing::Message()
                       << IsaName(isa) << " threads=" << threads << " round=" << round
                       << " job=" << j << " type=" << DTypeName(w.type) << " layout="
                       << static_cast<int>(w.layout) << " residuals=" << w.n_residuals
                       << " rows=" << w.rows << " cols=" << w.cols
                       << " tokens=" << jobs[j].n_tokens);
          // Bits, including the untouched NaNs past the job's tokens.
          ASSERT_EQ(0, std::memcmp(g, e, static_cast<size_t>(w.rows * kMaxTokens) * 4));
          const float* tl = tol.data() + offset[j];
          int bad = 0;
          for (size_t i = 0; i < n; ++i) bad += !(std::fabs(g[i] - rf[i]) <= tl[i]);
          EXPECT_EQ(bad, 0) << "results off the reference";
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 100);
}

// Jobs that read one activation pointer with different token counts or widths must not share
// quantized rows: each gets its own set.
TEST(MatMulBatch, SamePointerDifferentShapesKeepTheirOwnActivations) {
  std::mt19937 rng(7);
  ThreadPool pool(2);
  auto x = RandomFloats(512 * 4, rng);
  auto a = MakeWeight(DType::kQ4_0, 24, 256, false, 0, rng);
  auto b = MakeWeight(DType::kQ4_0, 24, 512, false, 0, rng);
  auto c = MakeWeight(DType::kQ8_0, 32, 256, true, 0, rng);
  std::vector<MatMulJob> jobs = {{&a->view, x.data(), 1, nullptr},
                                 {&b->view, x.data(), 1, nullptr},
                                 {&a->view, x.data(), 3, nullptr},
                                 {&c->view, x.data(), 2, nullptr},
                                 {&c->view, x.data(), 4, nullptr}};
  std::vector<std::vector<float>> want(jobs.size()), got(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    const size_t n = static_cast<size_t>(jobs[j].w->rows * jobs[j].n_tokens);
    want[j].assign(n, 0.0f);
    got[j].assign(n, 0.0f);
    MatMul(*jobs[j].w, jobs[j].x, jobs[j].n_tokens, want[j].data(), pool);
    jobs[j].y = got[j].data();
  }
  MatMulBatch(jobs.data(), static_cast<int>(jobs.size()), pool);
  for (size_t j = 0; j < jobs.size(); ++j) EXPECT_EQ(want[j], got[j]) << "job " << j;
}

}  // namespace
}  // namespace substrate
