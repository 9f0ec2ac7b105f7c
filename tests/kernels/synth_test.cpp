// End to end: `substrate synth` writes a GGUF that our reader opens with the preset's shapes,
// the mix's types (and its fallbacks for rows that do not fit 256-blocks), and weights that
// decode to finite, non-constant values and multiply the same on every kernel tier.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/thread_pool.h"
#include "format/model_file.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "quant/quant.h"

namespace substrate {
namespace {

TEST(Synth, WritesLoadableModelWithPresetShapesAndMixTypes) {
  std::string out = ::testing::TempDir() + "synth_test_" + std::to_string(getpid()) + ".gguf";
  std::string cmd = std::string(SUBSTRATE_BINARY) +
                    " synth --preset test-tiny-moe --type Q4_K_M -t 2 -o " + out + " 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto file = ModelFile::Open(out);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const ModelFile& f = **file;
  EXPECT_EQ(f.metadata().GetString("general.architecture", ""), "qwen2moe");
  EXPECT_EQ(f.metadata().GetInt("qwen2moe.expert_count", 0), 4);
  EXPECT_EQ(f.metadata().GetInt("qwen2moe.expert_feed_forward_length", 0), 384);
  // 1 embedding + 2 layers x 17 tensors + output norm + output.
  EXPECT_EQ(f.tensors().size(), 1u + 2 * 17 + 2);
  const TensorInfo* gate = f.Find("blk.1.ffn_gate_exps.weight");
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->ne, (std::vector<uint64_t>{256, 384, 4}));
  EXPECT_EQ(gate->type, DType::kQ4_K);
  const TensorInfo* down = f.Find("blk.0.ffn_down_exps.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_NE(down->type, DType::kQ4_K) << "384-wide rows cannot hold 256-blocks: a fallback type";
  const TensorInfo* norm = f.Find("blk.0.attn_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->type, DType::kF32);

  // The weights decode to finite, varied values, and every tier multiplies them alike.
  std::vector<uint8_t> bytes(gate->bytes);
  ASSERT_TRUE(f.ReadTensor(*gate, bytes.data()).ok());
  WeightView w;
  w.type = gate->type;
  w.data = bytes.data();
  w.bytes = bytes.size();
  w.cols = 256;
  w.rows = 384 * 4;
  std::vector<float> row(256);
  DequantizeRow(w.type, bytes.data(), row.data(), 256);
  float lo = row[0], hi = row[0];
  for (float v : row) {
    ASSERT_TRUE(std::isfinite(v));
    lo = std::min(lo, v), hi = std::max(hi, v);
  }
  EXPECT_LT(lo, hi);
  std::vector<float> x(256 * 3), want(w.rows * 3), got(want.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.1f * static_cast<float>(i));
  MatMulReference(w, x.data(), 3, want.data());
  ThreadPool pool(2);
  MatMul(w, x.data(), 3, got.data(), pool);
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * double(got[i] - want[i]);
    den += double(want[i]) * want[i];
  }
  EXPECT_LT(std::sqrt(num / den), 2e-2);
  std::remove(out.c_str());
}

TEST(Synth, NextnLayersFollowTheMainOnes) {
  std::string out = ::testing::TempDir() + "synth_nextn_" + std::to_string(getpid()) + ".gguf";
  std::string cmd = std::string(SUBSTRATE_BINARY) +
                    " synth --preset test-tiny-moe --type Q8_0 --nextn 1 -t 2 -o " + out +
                    " 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto file = ModelFile::Open(out);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const ModelFile& f = **file;
  EXPECT_EQ(f.metadata().GetInt("qwen2moe.block_count", 0), 3);
  EXPECT_EQ(f.metadata().GetInt("qwen2moe.nextn_predict_layers", 0), 1);
  // The main layers' and the next-n layer's block tensors, and its four own.
  EXPECT_EQ(f.tensors().size(), 1u + 3 * 17 + 4 + 2);
  const TensorInfo* eh = f.Find("blk.2.nextn.eh_proj.weight");
  ASSERT_NE(eh, nullptr);
  EXPECT_EQ(eh->ne, (std::vector<uint64_t>{512, 256}));
  EXPECT_NE(f.Find("blk.2.ffn_gate_exps.weight"), nullptr);
  std::remove(out.c_str());
  std::string bin = SUBSTRATE_BINARY;
  EXPECT_NE(std::system((bin + " synth --preset test-tiny-moe --type Q8_0 --nextn 9 -o " + out +
                         " 2>/dev/null").c_str()), 0);
}

TEST(Synth, RejectsUnknownPresetAndType) {
  std::string bin = SUBSTRATE_BINARY;
  EXPECT_NE(std::system((bin + " synth --preset nope --type Q4_0 -o /dev/null 2>/dev/null").c_str()), 0);
  EXPECT_NE(std::system((bin + " synth --preset llama3-8b --type Q9_9 -o /dev/null 2>/dev/null").c_str()), 0);
}

}  // namespace
}  // namespace substrate
