// Unit tests of the model layer that need no fixtures: ops, routing, sampling, op ids.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "kernels/ops.h"
#include "kernels/routing.h"
#include "model/blocks.h"
#include "model/hparams.h"
#include "model/op_id.h"
#include "model/sampler.h"

namespace substrate {
namespace {

TEST(Ops, RmsNormAndSoftmax) {
  float x[4] = {1, 2, 3, 4}, w[4] = {1, 1, 2, 1}, y[4];
  RmsNorm(x, w, 0.0f, 4, 1, y);
  const float r = std::sqrt((1 + 4 + 9 + 16) / 4.0f);
  EXPECT_NEAR(y[2], 3 / r * 2, 1e-6);
  float s[3] = {0, std::log(2.0f), -INFINITY};
  Softmax(s, 3);
  EXPECT_NEAR(s[0], 1 / 3.0, 1e-6);
  EXPECT_NEAR(s[1], 2 / 3.0, 1e-6);
  EXPECT_EQ(s[2], 0.0f);
}

TEST(Ops, RopeStylesPairDifferentElements) {
  // Position 0 is the identity; at position 1 the first pair rotates by 1 radian.
  RopeParams p;
  p.n_rot = 4;
  int32_t pos[1] = {1};
  float a[4] = {1, 0, 0, 0};
  p.style = RopeStyle::kNormal;  // pairs (0,1), (2,3)
  Rope(a, 1, 1, 4, pos, p);
  EXPECT_NEAR(a[0], std::cos(1.0f), 1e-6);
  EXPECT_NEAR(a[1], std::sin(1.0f), 1e-6);
  float b[4] = {1, 0, 0, 0};
  p.style = RopeStyle::kNeox;  // pairs (0,2), (1,3)
  Rope(b, 1, 1, 4, pos, p);
  EXPECT_NEAR(b[0], std::cos(1.0f), 1e-6);
  EXPECT_NEAR(b[2], std::sin(1.0f), 1e-6);
  EXPECT_EQ(b[1], 0.0f);
}

TEST(Routing, SoftmaxTopKWithAndWithoutRenormalization) {
  ModelHParams hp;
  hp.n_expert = 4;
  hp.n_expert_used = 2;
  const float logits[4] = {0.0f, 2.0f, 1.0f, -1.0f};
  int32_t idx[2];
  float w[2];
  hp.expert_weights_norm = false;  // qwen2moe
  RouteRow(hp.routing(), logits, nullptr, idx, w);
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 2);
  const double z = 1 + std::exp(2.0) + std::exp(1.0) + std::exp(-1.0);
  EXPECT_NEAR(w[0], std::exp(2.0) / z, 1e-6);
  hp.expert_weights_norm = true;  // mixtral, qwen3moe
  RouteRow(hp.routing(), logits, nullptr, idx, w);
  EXPECT_NEAR(w[0] + w[1], 1.0, 1e-6);
}

TEST(Routing, DeepseekGroupsBiasAndScale) {
  ModelHParams hp;
  hp.n_expert = 4;
  hp.n_expert_used = 2;
  hp.gating = GatingFunc::kSigmoid;
  hp.n_expert_groups = 2;
  hp.n_group_used = 1;
  hp.expert_weights_norm = true;
  hp.expert_weights_scale = 2.5f;
  // Group 0 = experts {0,1}, group 1 = {2,3}. The bias makes group 1 win and expert 3 first,
  // but the weights come from the unbiased scores.
  const float logits[4] = {1.0f, 1.0f, 0.0f, -0.5f};
  const float bias[4] = {0.0f, 0.0f, 0.8f, 1.0f};
  int32_t idx[2];
  float w[2];
  RouteRow(hp.routing(), logits, bias, idx, w);
  EXPECT_EQ(idx[0], 3);
  EXPECT_EQ(idx[1], 2);
  const float s2 = Sigmoid(0.0f), s3 = Sigmoid(-0.5f);
  EXPECT_NEAR(w[0], 2.5f * s3 / (s2 + s3), 1e-5);
}

// Cache-aware routing: a cached expert within the bonus of the K-th choice takes its place;
// its weight stays the router's; a bonus of 0, or every expert cached, routes exactly.
TEST(Routing, CachedExpertsWinNearTiesOnly) {
  ModelHParams hp;
  hp.n_expert = 4;
  hp.n_expert_used = 2;
  hp.expert_weights_norm = false;
  const float logits[4] = {2.0f, 1.9f, 1.8f, -1.0f};  // softmax: 0.386, 0.349, 0.316, 0.019
  int32_t exact[2], idx[2];
  float we[2], w[2];
  RouteRow(hp.routing(), logits, nullptr, exact, we);
  ASSERT_EQ(exact[0], 0);
  ASSERT_EQ(exact[1], 1);
  RoutingParams p = hp.routing();
  const uint8_t cached[4] = {1, 0, 1, 1};
  p.cached = cached;
  p.cached_bonus = 0.05f;  // expert 2 (0.316 + 0.05) passes expert 1 (0.349); 3 stays out
  RouteRow(p, logits, nullptr, idx, w);
  EXPECT_EQ(idx[0], 0);
  EXPECT_EQ(idx[1], 2);
  EXPECT_EQ(w[0], we[0]);
  const double z = std::exp(2.0) + std::exp(1.9) + std::exp(1.8) + std::exp(-1.0);
  EXPECT_NEAR(w[1], std::exp(1.8) / z, 1e-6) << "the weight is the router's, not the bonus's";
  p.cached_bonus = 0.01f;  // too small to pass it
  RouteRow(p, logits, nullptr, idx, w);
  EXPECT_EQ(idx[1], 1);
  const uint8_t all[4] = {1, 1, 1, 1};
  p.cached = all;
  p.cached_bonus = 0.5f;
  RouteRow(p, logits, nullptr, idx, w);
  EXPECT_EQ(std::vector<int32_t>(idx, idx + 2), std::vector<int32_t>(exact, exact + 2));
  EXPECT_EQ(std::vector<float>(w, w + 2), std::vector<float>(we, we + 2));
}

TEST(Sampler, GreedyAndSeededSampling) {
  std::vector<float> logits = {0.1f, 3.0f, 2.9f, -1.0f};
  Sampler greedy(SamplingParams{});
  EXPECT_EQ(greedy.Sample(logits.data(), 4, {}), 1);
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 7;
  Sampler a(p), b(p);
  std::set<int32_t> seen;
  for (int i = 0; i < 200; ++i) {
    const int32_t x = a.Sample(logits.data(), 4, {});
    EXPECT_EQ(x, b.Sample(logits.data(), 4, {}));  // same seed, same draws
    seen.insert(x);
  }
  EXPECT_GE(seen.size(), 2u);
  p.top_k = 1;
  Sampler k1(p);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(k1.Sample(logits.data(), 4, {}), 1);
  // A strong repetition penalty moves greedy off a seen token.
  SamplingParams rp;
  rp.repeat_penalty = 2.0f;
  Sampler r(rp);
  EXPECT_EQ(r.Sample(logits.data(), 4, {1}), 2);
}

TEST(OpIds, StableNamesAndTopologicalList) {
  EXPECT_EQ(OpIdAttention(5), "block_5.attn");
  EXPECT_EQ(OpIdMoeExpert(5, 17), "block_5.moe.expert_17");
  EXPECT_EQ(OpIdMoeShared(2), "block_2.moe.shared");
  ModelHParams hp;
  hp.arch = "qwen2moe";
  hp.n_layer = 2;
  hp.n_expert = 3;
  hp.n_expert_used = 1;
  hp.n_leading_dense = 1;
  auto ops = ListOps(hp, [](const std::string& n) { return n != "output.weight"; });
  ASSERT_FALSE(ops.empty());
  EXPECT_EQ(ops.front().id, "token_embd");
  EXPECT_EQ(ops[1].id, "block_0.attn");
  EXPECT_EQ(ops[2].id, "block_0.ffn");
  EXPECT_EQ(ops[4].id, "block_1.moe.router");
  EXPECT_EQ(ops[5].id, "block_1.moe.expert_0");
  EXPECT_EQ(ops[5].tensors[0].slice, 0);
  EXPECT_EQ(ops.back().id, "output");
  EXPECT_EQ(ops.back().tensors.back().name, "token_embd.weight");  // tied
}

}  // namespace
}  // namespace substrate
