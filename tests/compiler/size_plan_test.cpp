// File-size plans on hand-made per-tensor profiles: the predicted size never exceeds the
// target and lands within 0.1 % below it when the tensors allow, the result is the greedy's
// best loss, a target below the smallest file is an error naming that minimum, and the JSON
// round-trips.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>

#include "compiler/size_plan.h"
#include "quant/quantize_model.h"

namespace substrate::compiler {
namespace {

// Tensors of a small transformer-like model (256 wide, six layers) with losses falling as bits
// grow, scaled per tensor.
ModelProfile TinyProfile(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.2, 5.0);
  ModelProfile p;
  p.model_id = "tiny";
  p.file = {32, 5000, 40000, 7000000};
  OpProfile op;  // Normalize wants an op
  op.id = "output";
  op.options.push_back({DType::kQ8_0, 100, 0.0});
  p.ops.push_back(op);
  const DType types[] = {DType::kQ2_K, DType::kQ3_K, DType::kIQ4_XS, DType::kQ4_K,
                         DType::kQ5_K, DType::kQ6_K, DType::kQ8_0};
  const double bpw[] = {2.625, 3.4375, 4.25, 4.5, 5.5, 6.5625, 8.5};
  auto add = [&](const std::string& name, std::vector<uint64_t> ne) {
    TensorProfile t;
    t.name = name;
    std::tie(t.kind, t.layer) = TensorKindAndLayer(name);
    t.ne = ne;
    const double scale = u(rng);
    for (size_t k = 0; k < 7; ++k)
      t.options.push_back({types[k], 0, scale * 1e-3 * std::pow(2.0, -2.0 * bpw[k]) * 64, 0});
    p.tensors.push_back(t);
  };
  add("token_embd.weight", {256, 8192});
  for (int l = 0; l < 6; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    add(b + "attn_q.weight", {256, 256});
    add(b + "attn_k.weight", {256, 64});
    add(b + "attn_v.weight", {256, 64});
    add(b + "attn_output.weight", {256, 256});
    add(b + "ffn_gate.weight", {256, 768});
    add(b + "ffn_up.weight", {256, 768});
    add(b + "ffn_down.weight", {768, 256});
  }
  EXPECT_TRUE(p.Normalize().ok());
  return p;
}

TEST(SizePlan, LandsWithinATenthOfAPercentBelowTheTarget) {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    const ModelProfile p = TinyProfile(seed);
    auto lo = PlanFileSize(p, 1ull << 40);
    ASSERT_TRUE(lo.ok()) << lo.status().ToString();
    const uint64_t min = lo->min_file_bytes, max = lo->max_file_bytes;
    EXPECT_EQ(lo->predicted_file_bytes, max);
    for (int i = 0; i <= 20; ++i) {
      const uint64_t target = min + (max - min) * i / 20;
      auto plan = PlanFileSize(p, target);
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      EXPECT_LE(plan->predicted_file_bytes, target);
      // In the lower half of the range (up to ~5.5 bits per weight here) within 0.1 %. Higher,
      // where most tensors reach their most precise types, the room left can be smaller than
      // any step and filling it cost more than 1 % of the loss: the better plan stays short.
      if (i > 0 && i <= 10) {
        EXPECT_GE(plan->predicted_file_bytes, target - target / 1000) << "seed " << seed << " i " << i;
      }
      // The prediction is recomputed from the chosen types and the summary.
      FilePrediction again = PredictFile(p, plan->tensor_types, plan->summary);
      EXPECT_EQ(again.file_bytes, plan->predicted_file_bytes);
      EXPECT_NEAR(again.kld, plan->predicted_kld, 1e-12);
      EXPECT_EQ(again.unmatched, 0);
    }
  }
}

TEST(SizePlan, MoreBytesNeverPredictMoreLoss) {
  const ModelProfile p = TinyProfile(7);
  auto base = PlanFileSize(p, 1ull << 40);
  ASSERT_TRUE(base.ok());
  double last = 1e9;
  for (uint64_t t = base->min_file_bytes; t <= base->max_file_bytes; t += (base->max_file_bytes - base->min_file_bytes) / 50) {
    auto plan = PlanFileSize(p, t);
    ASSERT_TRUE(plan.ok());
    EXPECT_LE(plan->predicted_kld, last * 1.01 + 1e-15);  // landing near the target may cost 1 %
    last = plan->predicted_kld;
  }
}

TEST(SizePlan, TargetBelowTheSmallestFileNamesTheMinimum) {
  const ModelProfile p = TinyProfile(1);
  auto ok = PlanFileSize(p, 1ull << 40);
  ASSERT_TRUE(ok.ok());
  auto plan = PlanFileSize(p, ok->min_file_bytes - 1);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find(std::to_string(ok->min_file_bytes)), std::string::npos)
      << plan.status().message();
  EXPECT_TRUE(PlanFileSize(p, ok->min_file_bytes).ok());
}

TEST(SizePlan, ProfileWithoutTensorsOrLayoutIsAnError) {
  ModelProfile p = TinyProfile(1);
  p.file.alignment = 0;
  EXPECT_FALSE(PlanFileSize(p, 1ull << 30).ok());
  p = TinyProfile(1);
  p.tensors.clear();
  auto r = PlanFileSize(p, 1ull << 30);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("per-tensor"), std::string::npos);
}

TEST(SizePlan, JsonRoundTripsAndProfileKeepsTensors) {
  const ModelProfile p = TinyProfile(3);
  auto again = ProfileFromJson(ProfileToJson(p));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_EQ(again->tensors.size(), p.tensors.size());
  EXPECT_EQ(again->file.header_bytes, p.file.header_bytes);
  auto plan = PlanFileSize(*again, 4000000);
  ASSERT_TRUE(plan.ok());
  auto plan0 = PlanFileSize(p, 4000000);
  ASSERT_TRUE(plan0.ok());
  EXPECT_EQ(plan->tensor_types, plan0->tensor_types);
  auto back = FilePlanFromJson(FilePlanToJson(*plan));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->tensor_types, plan->tensor_types);
  EXPECT_EQ(back->summary, plan->summary);
  EXPECT_EQ(back->predicted_file_bytes, plan->predicted_file_bytes);
  EXPECT_FALSE(FilePlanFromJson("{\"schema\": \"substrate.file_plan\"}").ok());
}

TEST(SizePlan, MixLinesGroupLayerRuns) {
  std::vector<std::pair<std::string, DType>> mix = {
      {"token_embd.weight", DType::kQ6_K},   {"blk.0.attn_q.weight", DType::kQ4_K},
      {"blk.1.attn_q.weight", DType::kQ4_K}, {"blk.2.attn_q.weight", DType::kQ5_K},
      {"blk.3.attn_q.weight", DType::kQ4_K}};
  auto lines = MixLines(mix);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("Q6_K"), std::string::npos);
  EXPECT_NE(lines[1].find("Q4_K 0-1, Q5_K 2, Q4_K 3"), std::string::npos) << lines[1];
}

}  // namespace
}  // namespace substrate::compiler
