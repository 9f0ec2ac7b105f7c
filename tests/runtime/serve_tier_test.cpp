// The served tier (ResidencyOptions::serve_tier, `--tier N` of run/perplexity/bench --store):
// tiny-coder-moe through the fixture's Q4_K + Q8_0 + F16 ladder, streamed under a cap, gives at
// tier 0 and at the top tier exactly the logits of the resident store source at that tier, and
// the two differ; a tier past the ladder is an error naming it and the ladder.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/residency_manager.h"
#include "runtime/plan_fixture.h"
#include "store/store_weight_source.h"

namespace substrate {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace substrate::testing;

std::vector<int32_t> Prompt() {
  std::ifstream in(std::string(SUBSTRATE_SHARED_DIR) + "/models/tiny-coder-moe/golden.json");
  if (!in) return {1, 2, 3, 4, 5, 6, 7, 8};
  return json::parse(in)["greedy"]["prompt"].get<std::vector<int32_t>>();
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(double{a[i]} - double{b[i]}));
  return d;
}

std::vector<float> StreamedLogits(int tier, ResidencyStats* stats) {
  ResidencyOptions o;
  o.reserve_bytes = 4ull << 20;
  o.serve_tier = tier;
  // A cap below the weights: some ops stream through slabs, experts through the cache.
  MemoryLedger ledger(StoreDataBytes(PackedTinyMoeStore()) * 3 / 5);
  auto m = ResidencyManager::Open(PackedTinyMoeStore(), &ledger, o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return {};
  Status err;
  auto logits = LogitsThrough(m->get(), (*m)->metadata(), &ledger, Prompt(), &err);
  EXPECT_TRUE(err.ok()) << err.ToString();
  *stats = (*m)->stats();
  EXPECT_LE(ledger.peak(), ledger.cap());
  return logits;
}

std::vector<float> ResidentLogits(int tier) {
  StoreOptions o;
  o.max_tier = tier;
  o.serve_tier = tier;
  MemoryLedger ledger;
  auto src = StoreWeightSource::Open(PackedTinyMoeStore(), &ledger, o);
  EXPECT_TRUE(src.ok()) << src.status().ToString();
  if (!src.ok()) return {};
  Status err;
  auto logits = LogitsThrough(src->get(), (*src)->metadata(), &ledger, Prompt(), &err);
  EXPECT_TRUE(err.ok()) << err.ToString();
  return logits;
}

TEST(ServeTier, EachTierIsTheResidentSourcesAndTheTiersDiffer) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture tiny-coder-moe-bf16.gguf";
  ResidencyStats s0, s2;
  const std::vector<float> low = StreamedLogits(0, &s0);
  const std::vector<float> top = StreamedLogits(2, &s2);
  ASSERT_FALSE(low.empty());
  ASSERT_FALSE(top.empty());
  EXPECT_EQ(s0.serve_tier, 0);
  EXPECT_EQ(s2.serve_tier, 2);
  EXPECT_GT(s0.n_ops_streamed + s0.n_ops_expert, 0);
  EXPECT_EQ(MaxAbsDiff(low, ResidentLogits(0)), 0.0) << "tier 0 streamed != tier 0 resident";
  EXPECT_EQ(MaxAbsDiff(top, ResidentLogits(2)), 0.0) << "top tier streamed != top tier resident";
  EXPECT_GT(MaxAbsDiff(low, top), 1e-3) << "the skeleton alone should not reproduce the top tier";
  // The default (no tier asked) is the top tier.
  ResidencyStats sd;
  EXPECT_EQ(MaxAbsDiff(StreamedLogits(-1, &sd), top), 0.0);
  EXPECT_EQ(sd.serve_tier, 2);
}

TEST(ServeTier, PastTheLadderIsAnErrorNamingItAndTheTiers) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture";
  ResidencyOptions o;
  o.reserve_bytes = 4ull << 20;
  o.serve_tier = 3;
  MemoryLedger ledger(StoreDataBytes(PackedTinyMoeStore()));
  auto m = ResidencyManager::Open(PackedTinyMoeStore(), &ledger, o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("tier 3"), std::string::npos) << m.status().ToString();
  EXPECT_NE(m.status().message().find("tiers 0..2 (Q4_K, + Q8_0, + F16)"), std::string::npos)
      << m.status().ToString();
  EXPECT_EQ(ledger.current(), 0u);
}

std::pair<int, std::string> Cli(const std::string& args) {
  const std::string out = StoreTestPath("tier_cli.txt");
  const int rc = std::system((std::string(SUBSTRATE_BINARY) + " " + args + " > " + out + " 2>&1").c_str());
  std::ifstream in(out);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::remove(out);
  return {rc, text};
}

TEST(ServeTier, CliFlag) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture";
  if (!fs::exists(SUBSTRATE_BINARY)) GTEST_SKIP() << "no substrate binary";
  const std::string store = " --store " + PackedTinyMoeStore() + " --max-ram " +
                            std::to_string(StoreDataBytes(PackedTinyMoeStore())) + " -c 64 ";
  auto [rc, text] = Cli("run" + store + "--tier 7 -p 'def f' -n 1");
  EXPECT_NE(rc, 0) << text;
  EXPECT_NE(text.find("tier 7"), std::string::npos) << text;
  EXPECT_NE(text.find("tiers 0..2"), std::string::npos) << text;
  auto [rc0, text0] = Cli("run" + store + "--tier 0 -p 'def f' -n 2 --json");
  ASSERT_EQ(rc0, 0) << text0;
  const size_t brace = text0.find('{');
  ASSERT_NE(brace, std::string::npos) << text0;
  EXPECT_EQ(json::parse(text0.substr(brace))["store"]["serve_tier"], 0) << text0;
  auto [rcp, textp] = Cli("perplexity" + store + "--tier 5 -f " + std::string(SUBSTRATE_SOURCE_DIR) +
                          "/README.md --chunks 1");
  EXPECT_NE(rcp, 0) << textp;
  EXPECT_NE(textp.find("tier 5"), std::string::npos) << textp;
  auto [rcn, textn] = Cli("run -m " + PackedTinyMoeStore() + "/model.gguf --tier 0 -p x -n 1");
  EXPECT_NE(rcn, 0) << textn;
  EXPECT_NE(textn.find("--tier needs --store"), std::string::npos) << textn;
}

}  // namespace
}  // namespace substrate
