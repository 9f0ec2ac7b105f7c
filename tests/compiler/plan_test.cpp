// PlanBundle IR: each invariant refuses a plan that breaks it, naming the invariant and the op;
// the JSON reader refuses malformed documents with a message naming the problem.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "compiler/planner.h"
#include "test_util.h"

namespace substrate::compiler {
namespace {

// A plan with streamed skeletons, streamed residuals and three-tier ladders.
PlanBundle SmallPlan() {
  ModelProfile p = testing::SmallProfile();
  CompileRequest req;
  uint64_t all_min = p.overhead_bytes;
  for (const auto& op : p.ops) all_min += op.options.front().bytes;
  req.budget.max_ram_bytes = all_min - 15000;  // forces streaming of some skeletons
  req.budget.quality_loss_cap = 10;            // no upgrades: ladders stay 3 tiers deep
  req.escalation.max_concurrent_escalations = 2;
  auto plan = CompilePlan(p, req);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  return *plan;
}

void ExpectBroken(const PlanBundle& plan, const std::string& invariant, const std::string& op) {
  Status st = Validate(plan);
  ASSERT_FALSE(st.ok()) << "expected invariant " << invariant << " to fail";
  EXPECT_NE(st.message().find("invariant " + invariant), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("'" + op + "'"), std::string::npos) << st.message();
  // The loader refuses it the same way.
  auto loaded = PlanFromJson(PlanToJson(plan));
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find(invariant), std::string::npos);
}

TEST(PlanBundle, SmallPlanIsValidAndStreams) {
  PlanBundle plan = SmallPlan();
  ASSERT_TRUE(Validate(plan).ok());
  int streamed = 0, three = 0;
  for (const auto& t : plan.tensor_catalog) streamed += t.residency == Residency::kStreamed;
  for (const auto& ob : plan.op_bundles) three += ob.tiers.size() == 3;
  EXPECT_GT(streamed, 0);
  EXPECT_GT(three, 0);
  auto fp = ComputeFootprint(plan);
  ASSERT_TRUE(fp.ok());
  EXPECT_LE(fp->default_peak_bytes, plan.budget.max_ram_bytes);
  EXPECT_GT(fp->stream_window_bytes, 0u);
}

TEST(PlanBundle, UnknownReferenceIsRefused) {
  PlanBundle plan = SmallPlan();
  plan.op_bundles[1].tiers[0].requires_.push_back("nope.skeleton");
  ExpectBroken(plan, "references-resolve", plan.op_bundles[1].op_id);
}

TEST(PlanBundle, MissingRequiredTensorIsRefused) {
  PlanBundle plan = SmallPlan();
  plan.op_bundles[0].tiers.back().requires_.pop_back();
  ExpectBroken(plan, "references-resolve", plan.op_bundles[0].op_id);
}

TEST(PlanBundle, PrefetchAfterDeadlineIsRefused) {
  PlanBundle plan = SmallPlan();
  for (size_t i = 0; i + 1 < plan.op_bundles.size(); ++i) {
    for (auto& t : plan.op_bundles[i].tiers) {
      if (t.prefetch.empty()) continue;
      t.prefetch[0].start_during = plan.op_bundles[i + 1].op_id;  // later than the deadline
      ExpectBroken(plan, "prefetch-order", plan.op_bundles[i].op_id);
      return;
    }
  }
  FAIL() << "the small plan has no prefetch";
}

TEST(PlanBundle, DefaultPathOverBudgetIsRefused) {
  PlanBundle plan = SmallPlan();
  auto fp = ComputeFootprint(plan);
  plan.budget.max_ram_bytes = fp->default_peak_bytes - 1;
  plan.escalation_ram_pool_bytes = 0;
  Status st = Validate(plan);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("invariant default-path-fits"), std::string::npos) << st.message();
}

TEST(PlanBundle, RiskRisingWithTierIsRefused) {
  PlanBundle plan = SmallPlan();
  auto& ob = plan.op_bundles[2];
  ASSERT_GE(ob.tiers.size(), 2u);
  ob.tiers[1].estimated_quality_risk = ob.tiers[0].estimated_quality_risk * 2;
  ExpectBroken(plan, "risk-monotone", ob.op_id);
}

TEST(PlanBundle, DeltaFallingWithTierIsRefused) {
  PlanBundle plan = SmallPlan();
  for (auto& ob : plan.op_bundles) {
    if (ob.tiers.size() < 3 || ob.tiers[2].peak_ram_delta_bytes == 0) continue;
    ob.tiers[1].peak_ram_delta_bytes = ob.tiers[2].peak_ram_delta_bytes + 1;
    ExpectBroken(plan, "delta-monotone", ob.op_id);
    return;
  }
  FAIL() << "no op with a streamed three-tier ladder";
}

TEST(PlanBundle, DeltaBelowStreamedResidualIsRefused) {
  PlanBundle plan = SmallPlan();
  for (auto& ob : plan.op_bundles) {
    if (ob.tiers.size() < 2 || ob.tiers[1].peak_ram_delta_bytes == 0) continue;
    for (auto& t : ob.tiers) t.peak_ram_delta_bytes = 0;
    ExpectBroken(plan, "delta-monotone", ob.op_id);
    return;
  }
  FAIL() << "no op with a streamed residual";
}

TEST(PlanBundle, PoolTooSmallForKEscalationsIsRefused) {
  PlanBundle plan = SmallPlan();
  plan.escalation_ram_pool_bytes = 1;
  Status st = Validate(plan);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("invariant pool-k-tier1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("largest"), std::string::npos) << st.message();
}

TEST(PlanBundle, PoolBeyondBudgetIsRefused) {
  PlanBundle plan = SmallPlan();
  plan.escalation_ram_pool_bytes = plan.budget.max_ram_bytes;
  Status st = Validate(plan);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("invariant pool-fits-budget"), std::string::npos) << st.message();
}

TEST(PlanJson, MalformedDocumentsAreRefusedClearly) {
  const std::string good = PlanToJson(SmallPlan());
  ASSERT_TRUE(PlanFromJson(good).ok());
  auto refuse = [](const std::string& text, const std::string& needle) {
    auto r = PlanFromJson(text);
    ASSERT_FALSE(r.ok()) << "accepted: " << text.substr(0, 80);
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  refuse("", "not valid JSON");
  refuse("{\"schema\":", "not valid JSON");
  refuse(good.substr(0, good.size() / 2), "not valid JSON");
  refuse("[1,2,3]", "not a JSON object");
  using nlohmann::json;
  auto edit = [&](auto fn) {
    json j = json::parse(good);
    fn(j);
    return j.dump();
  };
  refuse(edit([](json& j) { j["schema"] = "other"; }), "schema is 'other'");
  refuse(edit([](json& j) { j["version"] = 99; }), "schema version 99");
  refuse(edit([](json& j) { j.erase("tensor_catalog"); }), "missing field 'tensor_catalog'");
  refuse(edit([](json& j) { j["budget"]["max_ram_bytes"] = "lots"; }), "budget.max_ram_bytes: expected an unsigned integer");
  refuse(edit([](json& j) { j["budget"]["max_ram_bytes"] = -5; }), "budget.max_ram_bytes");
  refuse(edit([](json& j) { j["op_bundles"][1]["tiers"][0]["requires"] = 7; }), "op_bundles[1].tiers[0].requires: expected an array");
  refuse(edit([](json& j) { j["tensor_catalog"][0]["residency"] = "floating"; }), "neither resident nor streamed");
  refuse(edit([](json& j) { j["op_bundles"][0]["tiers"][0]["fallback"] = "pray"; }), "unknown fallback 'pray'");
  refuse(edit([](json& j) { j["op_bundles"] = json::array(); }), "no op bundles");
  refuse(edit([](json& j) { j["op_bundles"][1]["op_id"] = j["op_bundles"][0]["op_id"]; }), "appears twice");
  refuse(edit([](json& j) { j["escalation_policy"]["max_concurrent_escalations"] = -1; }), "max_concurrent_escalations");
  refuse(edit([](json& j) { j["op_bundles"][0]["tiers"][0]["estimated_quality_risk"] = "high"; }), "expected a number");
}

TEST(PlanJson, SaveAndLoadRoundTrip) {
  PlanBundle plan = SmallPlan();
  std::string path = ::testing::TempDir() + "/plan_roundtrip.json";
  ASSERT_TRUE(SavePlan(plan, path).ok());
  auto back = LoadPlan(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(PlanToJson(*back), PlanToJson(plan));
  auto missing = LoadPlan(path + ".absent");
  EXPECT_FALSE(missing.ok());
}

TEST(Profile, JsonRoundTripAndErrors) {
  ModelProfile p = testing::SmallProfile();
  auto back = ProfileFromJson(ProfileToJson(p));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(ProfileToJson(*back), ProfileToJson(p));
  auto bad = ProfileFromJson("{\"schema\":\"substrate.profile\",\"version\":1}");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model_id"), std::string::npos);
}

TEST(Profile, BytesComeFromRowBytes) {
  SynthMoeOptions o;
  o.layers = 2;
  o.experts = 4;
  o.top_k = 2;
  auto p = SynthesizeMoeProfile(o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const OpProfile* e = p->Find("block_1.moe.expert_3");
  ASSERT_NE(e, nullptr);
  EXPECT_DOUBLE_EQ(e->activation_prob, 0.5);
  // Q4_K: 144 bytes per 256 elements; three 2048x1536 matrices.
  for (const auto& opt : e->options)
    if (opt.type == DType::kQ4_K) {
      EXPECT_EQ(opt.bytes, 3ull * 2048 * 1536 / 256 * 144);
    }
}

TEST(PlanJson, TensorTypesForQuantize) {
  SynthMoeOptions o;
  o.layers = 2, o.experts = 4, o.top_k = 2, o.d_model = 256, o.expert_ffn = 256, o.vocab = 512;
  auto p = SynthesizeMoeProfile(o);
  ASSERT_TRUE(p.ok());
  CompileRequest req;
  req.budget.max_ram_bytes = 64ull << 20;
  req.budget.quality_loss_cap = 0.05;
  auto plan = CompilePlan(*p, req);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto types = PlanTensorTypes(*plan);
  ASSERT_TRUE(types.ok());
  EXPECT_EQ(DTypeName(types->at("blk.1.attn_q.weight")), plan->Bundle("block_1.attn")->tiers[0].precision);
  auto j = nlohmann::json::parse(PlanToJson(*plan));
  EXPECT_EQ(j["tensor_types"]["blk.1.attn_q.weight"], plan->Bundle("block_1.attn")->tiers[0].precision);
  EXPECT_TRUE(j["tensor_types"].contains("blk.0.ffn_gate_exps.weight"));
}

TEST(Compiler, SeedDemoCompiles) {
  SynthMoeOptions o;  // 27 layers, 64 experts, top-8
  auto p = SynthesizeMoeProfile(o);
  ASSERT_TRUE(p.ok());
  p->hardware = {2e10, 3e9, "test"};
  EXPECT_EQ(p->ops.size(), 27u * 67 + 1);
  CompileRequest req;
  req.budget.max_ram_bytes = 36ull << 30;
  req.budget.quality_loss_cap = 0.05;
  req.budget.target_tokens_per_second = 4;
  req.escalation.max_concurrent_escalations = 6;
  auto plan = CompilePlan(*p, req);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_LE(plan->predicted.quality_loss, 0.05);
  EXPECT_GE(plan->predicted.tokens_per_second, 4);
  // Under 2 GB the skeleton cannot stay resident: it streams, and the request fails on speed.
  req.budget.max_ram_bytes = 2ull << 30;
  auto report = CheckFeasibility(*p, req);
  ASSERT_TRUE(report.ok());
  EXPECT_FALSE(report->feasible);
  EXPECT_FALSE(report->relax_options.empty());
}

}  // namespace
}  // namespace substrate::compiler
