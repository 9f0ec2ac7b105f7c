// A plan's prefetch start_during drives when the runtime issues an op's read: tiny-coder-moe with
// its attention and shared-expert ops streamed, once under a plan that leaves every read to the
// depth rule and once under one that moves block_4.attn's read earlier (issued when
// block_1.moe.shared begins) and block_3.attn's later (when block_2.moe.shared, the op right
// before it, begins). The trace's read events (issue_us, during) show each move against the named
// op's begin, and both runs give the golden greedy continuation.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "model/op_id.h"
#include "runtime/residency_manager.h"
#include "runtime/plan_fixture.h"

namespace substrate {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace substrate::testing;

// Routers, embedding and output resident; attention and shared experts streamed, evicted after
// themselves; `start` gives some of them a prefetch starting during the named op.
Expected<std::string> WritePlan(const std::map<std::string, std::string>& start,
                                const std::string& name) {
  return WriteTinyMoePlan(
      [](OpKind k) { return k == OpKind::kAttention || k == OpKind::kMoeShared; },
      [&](const std::string& op) -> std::optional<std::string> {
        auto it = start.find(op);
        if (it == start.end()) return std::nullopt;
        return it->second;
      },
      name);
}

struct Window {
  int64_t start_us = 0, end_us = 0;
};
struct Issue {
  int64_t issue_us = 0;
  std::string during;
};
struct Trace {
  std::map<std::string, std::vector<Window>> ops;    // per op, its windows in order
  std::map<std::string, std::vector<Issue>> issues;  // per op, its read requests in order
};

Trace Load(const std::string& path) {
  Trace t;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const json e = json::parse(line);
    const std::string op = e.at("op").get<std::string>();
    if (e.at("ev") == "op") {
      t.ops[op].push_back({e.at("start_us").get<int64_t>(), e.at("end_us").get<int64_t>()});
    } else {
      // One event per tier's span: the spans of one request share its issue time.
      auto& v = t.issues[op];
      const int64_t at = e.at("issue_us").get<int64_t>();
      if (v.empty() || v.back().issue_us != at) v.push_back({at, e.at("during").get<std::string>()});
    }
  }
  return t;
}

// Runs the golden greedy continuation under `plan`, returns the trace.
Trace RunUnder(const std::string& plan, ResidencyStats* stats) {
  const std::string golden = std::string(SUBSTRATE_SHARED_DIR) + "/models/tiny-coder-moe/golden.json";
  std::ifstream gin(golden);
  EXPECT_TRUE(gin) << "no " << golden;
  if (!gin) return {};
  const json g = json::parse(gin);
  const auto prompt = g["greedy"]["prompt"].get<std::vector<int32_t>>();
  const auto want = g["greedy"]["continuation"].get<std::vector<int32_t>>();
  ResidencyOptions o;
  o.reserve_bytes = 4ull << 20;
  o.prefetch_depth = 2;
  o.plan_path = plan;
  o.trace_path = StoreTestPath("prefetch_plan.jsonl");
  MemoryLedger ledger(StoreDataBytes(PackedTinyMoeStore()));
  auto m = ResidencyManager::Open(PackedTinyMoeStore(), &ledger, o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return {};
  Status err;
  EXPECT_EQ(GreedyThrough(m->get(), (*m)->metadata(), &ledger, prompt, want.size(), &err), want);
  EXPECT_TRUE(err.ok()) << err.ToString();
  EXPECT_LE(ledger.peak(), ledger.cap());
  *stats = (*m)->stats();
  EXPECT_TRUE((*m)->FlushTrace().ok());
  m->reset();
  Trace t = Load(o.trace_path);
  fs::remove(o.trace_path);
  return t;
}

TEST(PrefetchPlan, StartDuringMovesReadsEarlierAndLater) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture tiny-coder-moe-bf16.gguf";
  const std::string early = "block_4.attn", early_at = "block_1.moe.shared";
  const std::string late = "block_3.attn", late_at = "block_2.moe.shared";
  auto base_plan = WritePlan({}, "plan_depth.json");
  auto moved_plan = WritePlan({{early, early_at}, {late, late_at}}, "plan_moved.json");
  ASSERT_TRUE(base_plan.ok()) << base_plan.status().ToString();
  ASSERT_TRUE(moved_plan.ok()) << moved_plan.status().ToString();
  ResidencyStats bs, ms;
  const Trace base = RunUnder(*base_plan, &bs);
  const Trace moved = RunUnder(*moved_plan, &ms);
  fs::remove(*base_plan);
  fs::remove(*moved_plan);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(bs.n_ops_streamed, 12);
  EXPECT_EQ(bs.n_slabs, 3);        // the depth rule: prefetch_depth + 1
  EXPECT_EQ(ms.slabs_wanted, 4);   // block_4.attn's early window adds one
  EXPECT_EQ(ms.n_slabs, 4);

  // Every forward pass runs each op once; the k-th op window pairs with the k-th read (the
  // trailing reads of the token after the last are not consumed).
  for (const auto* t : {&base, &moved}) {
    for (const std::string& op : {early, late, early_at, late_at})
      ASSERT_FALSE(t->ops.at(op).empty()) << op;
    ASSERT_GE(t->issues.at(early).size(), t->ops.at(early).size());
    ASSERT_GE(t->issues.at(late).size(), t->ops.at(late).size());
  }
  const size_t passes = moved.ops.at(early_at).size();
  ASSERT_GT(passes, 1u);
  for (size_t k = 0; k < passes; ++k) {
    SCOPED_TRACE("forward pass " + std::to_string(k));
    // Earlier: issued inside block_1.moe.shared's window, where the depth rule waited until after it.
    const Window e_at = moved.ops.at(early_at)[k];
    const Issue e = moved.issues.at(early)[k];
    EXPECT_EQ(e.during, early_at);
    EXPECT_GE(e.issue_us, e_at.start_us);
    EXPECT_LE(e.issue_us, e_at.end_us);
    const Issue eb = base.issues.at(early)[k];
    EXPECT_NE(eb.during, early_at);
    EXPECT_GT(eb.issue_us, base.ops.at(early_at)[k].end_us);
    // Later: issued when block_2.moe.shared begins, where the depth rule issued it before.
    const Window l_at = moved.ops.at(late_at)[k];
    const Issue l = moved.issues.at(late)[k];
    EXPECT_EQ(l.during, late_at);
    EXPECT_GE(l.issue_us, l_at.start_us);
    const Issue lb = base.issues.at(late)[k];
    EXPECT_NE(lb.during, late_at);
    EXPECT_LT(lb.issue_us, base.ops.at(late_at)[k].start_us);
  }
}

// When the budget holds fewer slabs than the plan's windows, early reads may hold every slab as
// an op begins whose read was not issued (here block_0.moe.shared, due when the resident router
// before it begins, after block_3/4.attn took the slabs at token start): the read with the latest
// deadline yields its slab, so nothing is read outside the slabs and the cap holds.
TEST(PrefetchPlan, EarlyReadsYieldTheirSlabWhenTheBudgetHoldsFewer) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture tiny-coder-moe-bf16.gguf";
  auto plan = WritePlan({{"block_0.moe.shared", "block_0.moe.router"},
                         {"block_3.attn", ""},
                         {"block_4.attn", ""}},
                        "plan_tight.json");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ResidencyOptions o;
  o.reserve_bytes = 4ull << 20;
  o.prefetch_depth = 2;
  o.plan_path = *plan;
  ResidencyStats roomy;
  {
    MemoryLedger ledger(1ull << 32);
    auto m = ResidencyManager::Open(PackedTinyMoeStore(), &ledger, o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    roomy = (*m)->stats();
  }
  ASSERT_GT(roomy.slabs_wanted, 3);
  ASSERT_GT(roomy.slab_bytes, 2 * roomy.expert_slot_bytes);
  // Room for depth + 1 slabs, the minimum expert slots and half a slab more: not for the plan's.
  const uint64_t cap = roomy.resident_bytes + 3 * roomy.slab_bytes + o.reserve_bytes +
                       5 * roomy.expert_slot_bytes + roomy.slab_bytes / 2;
  const std::string golden = std::string(SUBSTRATE_SHARED_DIR) + "/models/tiny-coder-moe/golden.json";
  std::ifstream gin(golden);
  ASSERT_TRUE(gin) << "no " << golden;
  const json g = json::parse(gin);
  const auto prompt = g["greedy"]["prompt"].get<std::vector<int32_t>>();
  const auto want = g["greedy"]["continuation"].get<std::vector<int32_t>>();
  MemoryLedger ledger(cap);
  auto m = ResidencyManager::Open(PackedTinyMoeStore(), &ledger, o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->stats().n_slabs, 3);
  Status err;
  EXPECT_EQ(GreedyThrough(m->get(), (*m)->metadata(), &ledger, prompt, 8, &err),
            std::vector<int32_t>(want.begin(), want.begin() + 8));
  EXPECT_TRUE(err.ok()) << err.ToString();
  EXPECT_EQ((*m)->stats().demand_loads, 0u) << (*m)->StatsJson();
  EXPECT_LE(ledger.peak(), cap);
  m->reset();
  fs::remove(*plan);
}

}  // namespace
}  // namespace substrate
