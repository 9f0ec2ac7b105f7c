// Activation statistics through the model's ObserveInput hook on the trained MoE: every dense
// product sees every token, the experts of a layer together see each token top_k times, the
// file round-trips exactly, and importance is normalized per slice.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <numeric>

#include "compiler/activation_stats.h"
#include "compiler/calibrate.h"

namespace substrate::compiler {
namespace {

const std::string kShared = std::string(SUBSTRATE_SHARED_DIR);

TEST(ActivationStats, CountsEveryProductInputOnTheTrainedMoe) {
  const std::string model = kShared + "/gguf/tiny-coder-moe-bf16.gguf", text = kShared + "/text/heldout.txt";
  if (!std::ifstream(model).good()) GTEST_SKIP() << "fixtures not found in " << kShared;
  auto runner = CalibrationRunner::Open(model, text, 64, 2);
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  auto stats = (*runner)->CollectActivationStats(0, 2);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->tokens, 128);
  for (int l = 0; l < 6; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    for (const char* dense : {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                              "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"}) {
      auto it = stats->tensors.find(b + dense);
      ASSERT_NE(it, stats->tensors.end()) << b + dense;
      EXPECT_EQ(it->second.slices, 1);
      EXPECT_EQ(it->second.rows[0], 128) << b + dense;
    }
    for (const char* experts : {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"}) {
      auto it = stats->tensors.find(b + experts);
      ASSERT_NE(it, stats->tensors.end()) << b + experts;
      EXPECT_EQ(it->second.slices, 32);
      const auto& rows = it->second.rows;
      EXPECT_EQ(std::accumulate(rows.begin(), rows.end(), int64_t{0}), 128 * 4) << b + experts;
    }
  }
  // Round trip through the file, exactly.
  const std::string path = ::testing::TempDir() + "/substrate_stats_test.gguf";
  ASSERT_TRUE(SaveActivationStats(*stats, path).ok());
  auto back = LoadActivationStats(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->tokens, stats->tokens);
  ASSERT_EQ(back->tensors.size(), stats->tensors.size());
  for (const auto& [name, s] : stats->tensors) {
    const ColumnStats& t = back->tensors.at(name);
    EXPECT_EQ(t.sum_sq, s.sum_sq) << name;
    EXPECT_EQ(t.rows, s.rows) << name;
    for (int k = 0; k < static_cast<int>(s.slices); ++k)
      EXPECT_EQ(back->ColumnImportance(name, s.slices > 1 ? k : -1, s.cols),
                stats->ColumnImportance(name, s.slices > 1 ? k : -1, s.cols));
  }
  // Importance: one value per column, mean 1 (before the floor), every value > 0.
  const auto imp = stats->ColumnImportance("blk.2.attn_q.weight", -1, 256);
  ASSERT_EQ(imp.size(), 256u);
  const double mean = std::accumulate(imp.begin(), imp.end(), 0.0) / 256;
  EXPECT_NEAR(mean, 1.0, 0.01);
  for (float v : imp) EXPECT_GT(v, 0.f);
  EXPECT_TRUE(stats->ColumnImportance("no.such.weight", -1, 256).empty());
  std::remove(path.c_str());
  EXPECT_FALSE(LoadActivationStats(model).ok()) << "a model file is not a statistics file";
}

}  // namespace
}  // namespace substrate::compiler
