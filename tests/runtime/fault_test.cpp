// The runtime over a faulty disk (core/fault_env.h): tiny-coder-moe streamed from its store under
// a plan (attention and shared experts streamed, the rest resident) while the Env slows, cuts
// short or fails the reads, or fills up under the trace.
//  - Slow reads miss their deadlines: with the plan's fallback "stall" the ops wait (the trace's
//    op events say hit:false with the stall) and the output stays the golden continuation; with
//    "use_lower_tier" the admission serves them below the store's top tier (the trace's tier).
//  - Short reads are resumed: golden output.
//  - EIO in the middle of a read is an IOError naming the file; the process goes on, and once
//    the disk is healthy the same runtime reads again.
//  - A full disk under the trace stops the log, not the run, and is reported by FlushTrace.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/fault_env.h"
#include "model/op_id.h"
#include "runtime/plan_fixture.h"
#include "runtime/residency_manager.h"

namespace substrate {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace substrate::testing;
using Kind = FaultEnv::Kind;

struct Golden {
  std::vector<int32_t> prompt, continuation;
};

Golden LoadGolden() {
  std::ifstream in(std::string(SUBSTRATE_SHARED_DIR) + "/models/tiny-coder-moe/golden.json");
  if (!in) return {};
  const json g = json::parse(in);
  return {g["greedy"]["prompt"].get<std::vector<int32_t>>(),
          g["greedy"]["continuation"].get<std::vector<int32_t>>()};
}

// The trace's op events of ops whose id contains `part`.
std::vector<json> OpEvents(const std::string& trace, const std::string& part) {
  std::vector<json> out;
  std::ifstream in(trace);
  for (std::string line; std::getline(in, line);) {
    const json e = json::parse(line);
    if (e["ev"] == "op" && e["op"].get<std::string>().find(part) != std::string::npos)
      out.push_back(e);
  }
  return out;
}

// Per attention op window after the prompt's pass (the first n_layer events): tier, hit, stall.
struct Windows {
  std::vector<int> tier;
  int misses = 0;
  double mean_stall_us = 0;
};
Windows AttentionWindows(const std::string& trace) {
  Windows w;
  const std::vector<json> ev = OpEvents(trace, ".attn");
  constexpr size_t kPromptPass = 6;  // tiny-coder-moe's layers
  for (size_t i = kPromptPass; i < ev.size(); ++i) {
    w.tier.push_back(ev[i]["tier"].get<int>());
    w.misses += !ev[i]["hit"].get<bool>();
    w.mean_stall_us += ev[i]["stall_us"].get<double>();
  }
  if (!w.tier.empty()) w.mean_stall_us /= static_cast<double>(w.tier.size());
  return w;
}

class RuntimeFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture tiny-coder-moe-bf16.gguf";
    golden_ = LoadGolden();
    if (golden_.prompt.empty()) GTEST_SKIP() << "no golden.json";
  }
  // A plan streaming attention and shared experts, whose late reads take `fallback`.
  std::string Plan(compiler::FallbackStrategy fallback) {
    auto p = WriteTinyMoePlan(
        [](OpKind k) { return k == OpKind::kAttention || k == OpKind::kMoeShared; },
        [](const std::string&) { return std::nullopt; }, "fault_plan.json", nullptr, fallback);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? *p : "";
  }
  std::unique_ptr<ResidencyManager> Open(const std::string& plan, const std::string& trace = "") {
    ResidencyOptions o;
    o.reserve_bytes = 4ull << 20;
    o.prefetch_depth = 2;
    o.plan_path = plan;
    o.trace_path = trace;
    o.env = &env_;
    auto m = ResidencyManager::Open(PackedTinyMoeStore(), &ledger_, o);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(*m) : nullptr;
  }
  std::vector<int32_t> Greedy(ResidencyManager& m, size_t n, Status* err) {
    return GreedyThrough(&m, m.metadata(), &ledger_, golden_.prompt, n, err);
  }
  std::vector<int32_t> Want(size_t n) const {
    return {golden_.continuation.begin(), golden_.continuation.begin() + n};
  }
  // Six tokens under `plan` with the env's faults as they are (the golden ones when `golden`);
  // the attention ops' windows from the trace.
  Windows RunTraced(const std::string& plan, bool golden, ResidencyStats* stats = nullptr);

  Golden golden_;
  FaultEnv env_;
  MemoryLedger ledger_{StoreDataBytes(PackedTinyMoeStore())};
};

Windows RuntimeFaultTest::RunTraced(const std::string& plan, bool golden, ResidencyStats* stats) {
  const std::string trace = StoreTestPath("fault_trace.jsonl");
  auto m = Open(plan, trace);
  if (!m) return {};
  Status err;
  const auto got = Greedy(*m, 6, &err);
  EXPECT_TRUE(err.ok()) << err.ToString();
  EXPECT_EQ(got.size(), 6u);
  if (golden) {
    EXPECT_EQ(got, Want(6));
  }
  if (stats) *stats = m->stats();
  EXPECT_TRUE(m->FlushTrace().ok());
  m.reset();
  Windows w = AttentionWindows(trace);
  fs::remove(trace);
  return w;
}

TEST_F(RuntimeFaultTest, LateReadsStallUnderTheStallFallbackAndTheOutputStaysGolden) {
  const std::string plan = Plan(compiler::FallbackStrategy::kStall);
  const Windows clean = RunTraced(plan, /*golden=*/true);
  env_.Add({Kind::kSlowRead, ".attn.t", 0, -1, 20, 0});  // every attention read: +20 ms
  ResidencyStats st;
  const Windows slow = RunTraced(plan, /*golden=*/true, &st);
  fs::remove(plan);
  ASSERT_FALSE(slow.tier.empty());
  EXPECT_GT(env_.injected(Kind::kSlowRead), 20);
  EXPECT_EQ(st.demoted, 0u);
  // Waited for: every window at the store's top tier, most of them late, each by about the
  // delay of its reads (20 ms per tier's span, partly hidden by the read-ahead).
  for (int tier : slow.tier) EXPECT_EQ(tier, 2);
  EXPECT_GT(slow.misses, static_cast<int>(slow.tier.size()) / 2);
  EXPECT_GT(slow.mean_stall_us, clean.mean_stall_us + 15000)
      << "clean " << clean.mean_stall_us << " us, slow " << slow.mean_stall_us << " us";
}

TEST_F(RuntimeFaultTest, LateReadsGoToALowerTierUnderThatFallback) {
  const std::string plan = Plan(compiler::FallbackStrategy::kUseLowerTier);
  // Every attention read is slow (+50 ms). Whether a healthy disk keeps up with this tiny model
  // depends on the host, so the contrast is with the stall fallback under the same fault (the
  // test above: every window waits at the top tier), not with a clean run.
  env_.Add({Kind::kSlowRead, ".attn.t", 0, -1, 50, 0});
  ResidencyStats st;
  const Windows slow = RunTraced(plan, /*golden=*/false, &st);
  fs::remove(plan);
  ASSERT_EQ(slow.tier.size(), 36u);  // 6 layers x 6 tokens after the prompt
  EXPECT_GT(st.demoted, 0u);
  // Reads issued during the prompt's pass, before any op was timed, have no prediction and wait
  // at the plan's tier. From the second token on the admission sees the slow reads coming and
  // serves the attention ops at the skeleton instead of waiting for them.
  const std::vector<int> later(slow.tier.begin() + 6, slow.tier.end());
  const double at_tier0 = static_cast<double>(std::count(later.begin(), later.end(), 0)) /
                          static_cast<double>(later.size());
  EXPECT_GE(at_tier0, 0.8) << "of windows at tier 0 after the first token";
}

TEST_F(RuntimeFaultTest, ShortReadsAreResumed) {
  const std::string plan = Plan(compiler::FallbackStrategy::kStall);
  env_.Add({Kind::kShortRead, "", 0, -1, 0, 4096});  // a page per read call, every file
  auto m = Open(plan);                               // resident ops load through short reads too
  ASSERT_TRUE(m);
  Status err;
  EXPECT_EQ(Greedy(*m, 6, &err), Want(6));
  EXPECT_TRUE(err.ok()) << err.ToString();
  EXPECT_GT(env_.injected(Kind::kShortRead), 100);
  fs::remove(plan);
}

TEST_F(RuntimeFaultTest, EioMidReadIsAnErrorNamingTheFileAndTheRuntimeRecovers) {
  const std::string plan = Plan(compiler::FallbackStrategy::kStall);
  auto m = Open(plan);
  ASSERT_TRUE(m);
  // From now on a read of block_3's attention returns 8 KiB, then EIO.
  env_.Add({Kind::kReadError, "block_3.attn.t", 0, -1, 0, 8192});
  Status err;
  Greedy(*m, 4, &err);
  EXPECT_EQ(err.code(), StatusCode::kIOError) << err.ToString();
  EXPECT_NE(err.message().find("block_3.attn.t"), std::string::npos) << err.ToString();
  EXPECT_NE(err.message().find("Input/output error"), std::string::npos) << err.ToString();
  // The disk heals: the same runtime serves the golden continuation again.
  env_.Clear();
  Status again;
  EXPECT_EQ(Greedy(*m, 6, &again), Want(6));
  EXPECT_TRUE(again.ok()) << again.ToString();
  fs::remove(plan);
}

TEST_F(RuntimeFaultTest, AFullDiskUnderTheTraceStopsTheLogNotTheRun) {
  const std::string plan = Plan(compiler::FallbackStrategy::kStall);
  const std::string trace = StoreTestPath("fault_full.jsonl");
  env_.Add({Kind::kNoSpace, "fault_full.jsonl", 0, -1, 0, 3000});
  auto m = Open(plan, trace);
  ASSERT_TRUE(m);
  Status err;
  EXPECT_EQ(Greedy(*m, 6, &err), Want(6));
  EXPECT_TRUE(err.ok()) << err.ToString();
  Status flushed = m->FlushTrace();
  EXPECT_EQ(flushed.code(), StatusCode::kIOError) << flushed.ToString();
  EXPECT_NE(flushed.message().find("No space left on device"), std::string::npos)
      << flushed.ToString();
  EXPECT_NE(flushed.message().find("fault_full.jsonl"), std::string::npos) << flushed.ToString();
  m.reset();
  EXPECT_LE(fs::file_size(trace), 3000u);
  fs::remove(trace);
  fs::remove(plan);
}

}  // namespace
}  // namespace substrate
