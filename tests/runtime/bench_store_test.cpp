// `substrate bench --store`: the weights a token computes over are the store's at the served tier
// (skeleton + residuals, routed experts' share, one embedding row) — checked against the manifest —
// with the same memory-bandwidth ratio fields as a resident bench, and the disk read rate over
// decode next to an O_DIRECT read probe of one store file from the same run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "runtime/plan_fixture.h"
#include "store/store_fixture.h"

namespace substrate {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace substrate::testing;

// The bench's rule, from the manifest: per tensor the bytes of tiers 0..tier; the embedding one
// row; expert tensors the routed share (4 of 32 in tiny-coder-moe).
uint64_t PerTokenFromManifest(const std::string& dir, int tier) {
  std::ifstream in(dir + "/manifest.json");
  const json m = json::parse(in);
  std::map<std::string, uint64_t> bytes;
  for (const json& e : m["entries"])
    if (e["tier"].get<int>() <= tier)
      bytes[e["tensor"].get<std::string>()] += e["bytes"].get<uint64_t>();
  uint64_t total = 0;
  for (const json& t : m["tensors"]) {
    const std::string name = t["name"];
    const uint64_t b = bytes[name];
    if (name == "token_embd.weight")
      total += b / t["shape"][1].get<uint64_t>();
    else if (name.find("_exps.") != std::string::npos)
      total += static_cast<uint64_t>(static_cast<double>(b) * 4.0 / 32.0);
    else
      total += b;
  }
  return total;
}

// Under 3/5 of the store's bytes (with room for the runtime) unless `budget` says otherwise.
json Bench(const std::string& extra, uint64_t budget = 0) {
  if (budget == 0) budget = StoreDataBytes(PackedTinyMoeStore()) * 3 / 5 + (24 << 20);
  const std::string out = StoreTestPath("bench_store.json");
  const std::string cmd = std::string(SUBSTRATE_BINARY) + " bench --store " + PackedTinyMoeStore() +
                          " --max-ram " + std::to_string(budget) +
                          " -p 0 -n 3 -r 1 -t 2 --json --bw-bytes 16M --probe-bytes 4M " + extra +
                          " > " + out + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(out);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::remove(out);
  EXPECT_EQ(rc, 0) << cmd << "\n" << text;
  if (rc != 0) return json();
  return json::parse(text.substr(text.find('{')));
}

TEST(BenchStore, WeightBandwidthAndDiskProbe) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture tiny-coder-moe-bf16.gguf";
  if (!fs::exists(SUBSTRATE_BINARY)) GTEST_SKIP() << "no substrate binary";
  const json top = Bench("");
  const json low = Bench("--tier 0");
  ASSERT_TRUE(top.is_object() && low.is_object());
  EXPECT_EQ(top["store"]["serve_tier"], 2);
  EXPECT_EQ(low["store"]["serve_tier"], 0);
  EXPECT_EQ(top["weight_bytes_per_token"].get<uint64_t>(),
            PerTokenFromManifest(PackedTinyMoeStore(), 2));
  EXPECT_EQ(low["weight_bytes_per_token"].get<uint64_t>(),
            PerTokenFromManifest(PackedTinyMoeStore(), 0));
  EXPECT_GT(top["model_bytes"].get<uint64_t>(), low["model_bytes"].get<uint64_t>());
  for (const json* j : {&top, &low}) {
    const json& b = *j;
    // The resident bench's fields, from the same code: achieved = tokens/s x weights per token.
    // Bytes a token reads: the weights and its KV cache rows (a few at -n 3).
    const double tps = b["tg"]["tokens_per_s"];
    const double per_token =
        b["weight_bytes_per_token"].get<double>() + b["kv_bytes_per_token"].get<double>();
    EXPECT_GT(b["kv_bytes_per_token"].get<double>(), 0);
    const double limit = b["mem_bw"]["bytes_per_s"];
    EXPECT_GT(tps, 0);
    EXPECT_NEAR(b["tg_bytes_per_s"].get<double>(), tps * per_token, 1e-6 * tps * per_token);
    EXPECT_NEAR(b["bw_ratio"].get<double>(), tps * per_token / limit, 1e-9);
    EXPECT_GT(b["bw_ratio"].get<double>(), 0);
    // The existing disk fields stay; the probe read a data file with the runtime's reader.
    EXPECT_TRUE(b.contains("disk_bytes_per_token")) << b.dump();
    EXPECT_TRUE(b.contains("disk_read_bytes_per_s")) << b.dump();
    const json& p = b["disk_probe"];
    ASSERT_TRUE(p.is_object()) << b.dump();
    EXPECT_NE(p["file"].get<std::string>().find(".bin"), std::string::npos);
    EXPECT_GT(p["bytes"].get<uint64_t>(), 0u);
    EXPECT_LE(p["bytes"].get<uint64_t>(), 4u << 20);
    EXPECT_GT(p["bytes_per_s"].get<double>(), 0);
    const double rate = b["disk_read_bytes_per_s"];
    if (rate > 0) {
      EXPECT_NEAR(b["disk_ratio"].get<double>(), rate / p["bytes_per_s"].get<double>(), 1e-9);
    }
    EXPECT_LE(b["ledger"]["peak_bytes"].get<uint64_t>(), b["ledger"]["cap_bytes"].get<uint64_t>());
  }
}

// A budget that leaves the routed experts streaming: the disk as their misses meet it (whole
// experts in no order, the runtime's readers at once), and the decode's disk bound from it.
TEST(BenchStore, ExpertReadProbeWhereExpertsStream) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture tiny-coder-moe-bf16.gguf";
  if (!fs::exists(SUBSTRATE_BINARY)) GTEST_SKIP() << "no substrate binary";
  const json b = Bench("--tier 0", StoreDataBytes(PackedTinyMoeStore()) * 3 / 20 + (24 << 20));
  ASSERT_TRUE(b.is_object());
  ASSERT_LT(b["store"]["expert_slots"].get<int>(), b["store"]["ops_expert"].get<int>()) << b.dump();
  const json& ep = b["expert_read_probe"];
  ASSERT_TRUE(ep.is_object()) << b.dump();
  EXPECT_EQ(ep["readers"].get<int>(), 4);
  EXPECT_GT(ep["bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(ep["bytes_per_s"].get<double>(), 0);
  const double per_token = b["disk_bytes_per_token"];
  ASSERT_GT(per_token, 0) << b.dump();
  EXPECT_NEAR(b["disk_bound_tokens_per_s"].get<double>(),
              ep["bytes_per_s"].get<double>() / per_token, 1e-9);
  EXPECT_NEAR(b["expert_disk_ratio"].get<double>(),
              b["disk_read_bytes_per_s"].get<double>() / ep["bytes_per_s"].get<double>(), 1e-9);
}

// -d: decode after an untimed prefill, reading that many more KV rows a token. With -n 3 a token
// reads (depth + 2) positions on average, so depth 16 reads 9 times the rows of depth 0.
TEST(BenchDepth, KvRowsCountedAndCombinationsRefused) {
  const std::string model = std::string(SUBSTRATE_SHARED_DIR) + "/gguf/tiny-coder-moe-bf16.gguf";
  if (!fs::exists(model) || !fs::exists(SUBSTRATE_BINARY)) GTEST_SKIP() << "no fixture or binary";
  auto bench = [&](const std::string& extra, int* rc) {
    const std::string out = StoreTestPath("bench_depth.json");
    const std::string cmd = std::string(SUBSTRATE_BINARY) + " bench -m " + model +
                            " -p 4 -n 3 -r 2 -t 2 --json --bw-bytes 16M " + extra + " > " + out +
                            " 2>&1";
    *rc = std::system(cmd.c_str());
    std::ifstream in(out);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    fs::remove(out);
    return text;
  };
  int rc = 0;
  const std::string flat = bench("", &rc);
  ASSERT_EQ(rc, 0) << flat;
  const std::string deep = bench("-d 16", &rc);
  ASSERT_EQ(rc, 0) << deep;
  const json a = json::parse(flat.substr(flat.find('{')));
  const json b = json::parse(deep.substr(deep.find('{')));
  EXPECT_EQ(a["depth"], 0);
  EXPECT_EQ(b["depth"], 16);
  const double kv0 = a["kv_bytes_per_token"], kv16 = b["kv_bytes_per_token"];
  EXPECT_GT(kv0, 0);
  EXPECT_NEAR(kv16, 9 * kv0, 1e-6 * kv16);
  EXPECT_GT(b["tg"]["tokens_per_s"].get<double>(), 0);
  EXPECT_GT(b["pp"]["tokens_per_s"].get<double>(), 0);
  // Each decode run against the probes either side of it; the run-wide limit is the highest.
  for (const json* j : {&a, &b}) {
    const json& runs = (*j)["tg"]["per_run"];
    ASSERT_EQ(runs.size(), 2u) << j->dump();
    const double per_token =
        (*j)["weight_bytes_per_token"].get<double>() + (*j)["kv_bytes_per_token"].get<double>();
    double highest = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
      const double limit = runs[i]["limit_bytes_per_s"];
      EXPECT_EQ(runs[i]["tokens_per_s"].get<double>(), (*j)["tg"]["runs"][i].get<double>());
      EXPECT_NEAR(runs[i]["bw_ratio"].get<double>(),
                  runs[i]["tokens_per_s"].get<double>() * per_token / limit, 1e-9);
      highest = std::max(highest, limit);
    }
    EXPECT_LE(highest, (*j)["mem_bw"]["bytes_per_s"].get<double>());
    // The reading after the runs is the last run's closing probe.
    const double after = (*j)["mem_bw"]["after_runs"];
    EXPECT_GT(after, 0);
    EXPECT_GE(runs[1]["limit_bytes_per_s"].get<double>(), after);
    const double r0 = runs[0]["bw_ratio"], r1 = runs[1]["bw_ratio"];
    EXPECT_NEAR((*j)["bw_ratio_run_median"].get<double>(), (r0 + r1) / 2, 1e-9);
  }
  // --bw-each-token: one ratio a decode step against the readings either side of it.
  const std::string each = bench("--bw-each-token 4M", &rc);
  ASSERT_EQ(rc, 0) << each;
  const json c = json::parse(each.substr(each.find('{')));
  const json& per_token = c["tg"]["per_token"];
  EXPECT_EQ(per_token["tokens"], 6) << c.dump();  // -n 3, -r 2
  EXPECT_EQ(per_token["probe_bytes"], 4 << 20);
  EXPECT_GT(per_token["bw_ratio_p10"].get<double>(), 0);
  EXPECT_LE(per_token["bw_ratio_p10"].get<double>(), per_token["bw_ratio_median"].get<double>());
  EXPECT_LE(per_token["bw_ratio_median"].get<double>(), per_token["bw_ratio_p90"].get<double>());
  EXPECT_EQ(c["bw_ratio_token_median"], per_token["bw_ratio_median"]);
  bench("--bw-each-token 4M --sequences 2", &rc);
  EXPECT_NE(rc, 0);
  const std::string refused = bench("-d 16 --sequences 2", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(refused.find("-d goes with neither"), std::string::npos) << refused;
  bench("-d -1", &rc);
  EXPECT_NE(rc, 0);
}

}  // namespace
}  // namespace substrate
