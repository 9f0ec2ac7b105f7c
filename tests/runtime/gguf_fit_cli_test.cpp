// The command line over a GGUF read in place: `substrate run -m FILE.gguf --max-ram SIZE` below
// the weights prints the resident run's text from the runtime (its stats say "source": "gguf"),
// and `substrate fit` answers resident / out of core / impossible (exit 3, with the smallest
// budget that runs, which then does run). `substrate split` writes parts that info, run, fit and
// pack read as one model; --print-plan shows the plan a run chose.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "store/store_fixture.h"

namespace substrate {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Out {
  int rc = -1;
  std::string text;
};

Out Cmd(const std::string& args, const std::string& cache_dir = "cli_cache") {
  const std::string cache = testing::StoreTestPath(cache_dir);
  FILE* f = popen(("SUBSTRATE_CACHE_DIR=" + cache + " " + SUBSTRATE_BINARY + " " + args + " 2>&1").c_str(), "r");
  Out o;
  if (!f) return o;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) o.text.append(buf, n);
  const int st = pclose(f);
  o.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return o;
}

json LastJson(const std::string& text) {
  const size_t at = text.find('{');
  if (at == std::string::npos) return json();
  return json::parse(text.substr(at), nullptr, false);
}

const std::string kModel = std::string(SUBSTRATE_SHARED_DIR) + "/gguf/tiny-coder-moe-Q8_0.gguf";

class GgufCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kModel)) GTEST_SKIP() << "no fixture " << kModel;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(testing::StoreTestPath("cli_cache"), ec);
    fs::remove_all(testing::StoreTestPath("cli_cache_routing"), ec);
  }
};

TEST_F(GgufCli, RunInPlaceGivesTheResidentText) {
  const std::string args = "run -m " + kModel + " -p 'def fib(n):' -n 16 -c 256 --json";
  Out resident = Cmd(args);
  ASSERT_EQ(resident.rc, 0) << resident.text;
  Out in_place = Cmd(args + " --max-ram 26M");
  ASSERT_EQ(in_place.rc, 0) << in_place.text;
  const json a = LastJson(resident.text), b = LastJson(in_place.text);
  ASSERT_TRUE(b.contains("store")) << in_place.text;
  EXPECT_EQ(b["store"]["source"], "gguf");
  EXPECT_GT(b["store"]["stream_bytes_read"].get<uint64_t>(), 0u);
  EXPECT_LE(b["memory"]["peak"].get<uint64_t>(), 26ull << 20);
  EXPECT_EQ(a["text"], b["text"]);
}

TEST_F(GgufCli, FitSaysResidentOutOfCoreOrImpossible) {
  Out roomy = Cmd("fit -m " + kModel + " --max-ram 1G -c 256 --json --no-measure");
  ASSERT_EQ(roomy.rc, 0) << roomy.text;
  EXPECT_EQ(LastJson(roomy.text)["verdict"], "resident");

  Out tight = Cmd("fit -m " + kModel + " --max-ram 26M -c 256 --json --no-measure");
  ASSERT_EQ(tight.rc, 0) << tight.text;
  const json t = LastJson(tight.text);
  EXPECT_EQ(t["verdict"], "out_of_core");
  EXPECT_LE(t["memory"]["total"].get<uint64_t>(), 26ull << 20);
  EXPECT_GT(t["per_token"]["disk_bytes"].get<uint64_t>(), 0u);
  EXPECT_NE(t["command"].get<std::string>().find("--max-ram"), std::string::npos);

  Out none = Cmd("fit -m " + kModel + " --max-ram 10M -c 256 --json --no-measure");
  ASSERT_EQ(none.rc, 3) << none.text;
  const json n = LastJson(none.text);
  EXPECT_EQ(n["verdict"], "impossible");
  const uint64_t minimum = n["minimum_budget"].get<uint64_t>();
  ASSERT_GT(minimum, 10ull << 20);
  EXPECT_NE(n["message"].get<std::string>().find("minimum"), std::string::npos);
  // The minimum it names runs; a little less does not.
  Out at_min = Cmd("run -m " + kModel + " -p 'x' -n 2 -c 256 --json --max-ram " + std::to_string(minimum));
  EXPECT_EQ(at_min.rc, 0) << at_min.text;
  Out below = Cmd("fit -m " + kModel + " -c 256 --json --no-measure --max-ram " +
                  std::to_string(minimum - (512ull << 10)));
  EXPECT_EQ(below.rc, 3) << below.text;
}

// The prediction is the stated model over the measured figures, for a plan that misses experts
// (the MoE: its embedding read by rows, every other dense op resident) and for one that streams
// dense ops (the dense model, whose tied output keeps the table whole).
TEST_F(GgufCli, FitMeasuresAndPredicts) {
  const std::string dense_model = std::string(SUBSTRATE_SOURCE_DIR) + "/models/tiny-coder-Q8_0.gguf";
  for (const auto& [model, dense] : {std::pair{kModel, false}, std::pair{dense_model, true}}) {
    SCOPED_TRACE(model);
    Out o = Cmd("fit -m " + model + " --max-ram 23M -c 256 --json -t 1");
    ASSERT_EQ(o.rc, 0) << o.text;
    const json j = LastJson(o.text);
    const json& m = j["measured"];
    const json& t = j["per_token"];
    EXPECT_EQ(m["threads"].get<int>(), 1);
    const double dense_bytes = t["dense_disk_bytes"], expert_bytes = t["expert_disk_bytes"];
    EXPECT_EQ(dense_bytes > 0, dense);
    EXPECT_EQ(expert_bytes > 0, !dense);
    EXPECT_EQ(t["dense_disk_bytes"].get<uint64_t>() + t["expert_disk_bytes"].get<uint64_t>(),
              t["disk_bytes"].get<uint64_t>());
    EXPECT_EQ(t.contains("assumption"), !dense);  // the expert cache's hit rate
    // Each kind of read the plan makes was probed.
    const double dense_rate = m["dense_read_bytes_per_s"], expert_rate = m["expert_read_bytes_per_s"];
    EXPECT_EQ(dense_rate > 0, dense);
    EXPECT_EQ(expert_rate > 0, !dense);
    EXPECT_GT(m["disk_bytes_per_s"].get<double>(), 0);
    EXPECT_GT(m["disk_probe_bytes"].get<double>(), 0);
    const double compute = m["compute_seconds_per_token"];
    ASSERT_GT(compute, 0);
    EXPECT_GT(m["compute_bytes_per_s"].get<double>(), 0);
    const double dense_s = dense ? dense_bytes / dense_rate : 0;
    const double expert_s = dense ? 0 : expert_bytes / expert_rate;
    const json& p = j["predicted"];
    EXPECT_NEAR(p["disk_seconds"].get<double>(), dense_s + expert_s,
                1e-9 + 1e-6 * (dense_s + expert_s));
    const double tps = 1 / (std::max(compute, dense_s) + expert_s);
    EXPECT_NEAR(p["tokens_per_s"].get<double>(), tps, 1e-6 * tps);
    const std::string bound = p["bound"];
    EXPECT_EQ(bound, dense_s + expert_s > compute ? "disk" : "compute");
  }
}

TEST_F(GgufCli, FitPredictsAResidentRunFromComputeAlone) {
  Out o = Cmd("fit -m " + kModel + " --max-ram 1G -c 256 --json");
  ASSERT_EQ(o.rc, 0) << o.text;
  const json j = LastJson(o.text);
  EXPECT_EQ(j["verdict"], "resident");
  EXPECT_EQ(j["predicted"]["bound"], "compute");
  EXPECT_EQ(j["measured"]["disk_probe_bytes"].get<uint64_t>(), 0u);  // nothing read per token
  const double compute = j["measured"]["compute_seconds_per_token"];
  ASSERT_GT(compute, 0);
  EXPECT_NEAR(j["predicted"]["tokens_per_s"].get<double>(), 1 / compute, 1e-6 / compute);
}

TEST_F(GgufCli, FitTakesAGivenExpertHitRateForUniformRouting) {
  const std::string base = "fit -m " + kModel + " --max-ram 23M -c 256 --json --no-measure";
  const json uniform = LastJson(Cmd(base).text);
  const json none = LastJson(Cmd(base + " --expert-hit-rate 0").text);
  const json all = LastJson(Cmd(base + " --expert-hit-rate 1").text);
  const json half = LastJson(Cmd(base + " --expert-hit-rate 0.5").text);
  const uint64_t dense = uniform["per_token"]["dense_disk_bytes"];
  const double u = uniform["per_token"]["expert_hit_rate"];
  ASSERT_GT(u, 0);
  ASSERT_LT(u, 1);
  EXPECT_NE(uniform["per_token"]["assumption"].get<std::string>().find("uniform"), std::string::npos);
  EXPECT_NE(half["per_token"]["assumption"].get<std::string>().find("given"), std::string::npos);
  // Every routed expert read, none, half of them; the dense part does not change.
  const double routed = none["per_token"]["expert_disk_bytes"].get<double>();
  EXPECT_NEAR(uniform["per_token"]["expert_disk_bytes"].get<double>(), routed * (1 - u), 1.0);
  EXPECT_EQ(all["per_token"]["expert_disk_bytes"].get<uint64_t>(), 0u);
  EXPECT_NEAR(half["per_token"]["expert_disk_bytes"].get<double>(), routed / 2, 1.0);
  EXPECT_EQ(all["per_token"]["disk_bytes"].get<uint64_t>(), dense);
  EXPECT_EQ(half["per_token"]["dense_disk_bytes"].get<uint64_t>(), dense);
  for (const char* bad : {"1.5", "nan", "x", "0.5x"}) {
    Out o = Cmd(base + " --expert-hit-rate " + bad);
    EXPECT_NE(o.rc, 0) << bad;
    EXPECT_NE(o.text.find("--expert-hit-rate must be"), std::string::npos) << o.text;
  }
}

// A run in place leaves its expert cache's hit rate; fit then uses it for the same file and
// slot count instead of uniform routing, and says so; another slot count stays uniform.
TEST_F(GgufCli, FitUsesTheRoutingAPreviousRunMeasured) {
  const std::string cache = "cli_cache_routing";
  std::error_code ec;
  fs::remove_all(testing::StoreTestPath(cache), ec);
  const std::string fit = "fit -m " + kModel + " -c 256 --json --no-measure --max-ram ";
  const json before = LastJson(Cmd(fit + "23M", cache).text);
  ASSERT_NE(before["per_token"]["assumption"].get<std::string>().find("uniform"), std::string::npos);
  Out run = Cmd("run -m " + kModel + " -p 'def fib(n):' -n 64 -c 256 --temp 0 --json --max-ram 23M", cache);
  ASSERT_EQ(run.rc, 0) << run.text;
  const json st = LastJson(run.text)["store"];
  const double uses = st["expert_hits"].get<double>() + st["expert_late"].get<double>() +
                      st["expert_misses"].get<double>();
  ASSERT_GE(uses, 256) << run.text;
  const double measured =
      1 - (st["expert_misses"].get<double>() + st["expert_hint_used"].get<double>()) / uses;

  const json after = LastJson(Cmd(fit + "23M", cache).text);
  auto slots = [](const json& j) { return j["memory"]["expert_cache"]["slots"].get<int>(); };
  EXPECT_EQ(slots(after), slots(before));
  EXPECT_NE(after["per_token"]["assumption"].get<std::string>().find("previous run"), std::string::npos)
      << after.dump();
  EXPECT_NEAR(after["per_token"]["expert_hit_rate"].get<double>(), std::clamp(measured, 0.0, 1.0), 1e-9);
  const double routed =
      LastJson(Cmd(fit + "23M --expert-hit-rate 0", cache).text)["per_token"]["expert_disk_bytes"];
  EXPECT_NEAR(after["per_token"]["expert_disk_bytes"].get<double>(),
              routed * (1 - after["per_token"]["expert_hit_rate"].get<double>()), 1.0);

  const json other = LastJson(Cmd(fit + "26M", cache).text);
  ASSERT_NE(slots(other), slots(after));
  EXPECT_NE(other["per_token"]["assumption"].get<std::string>().find("uniform"), std::string::npos);
}

TEST_F(GgufCli, FitRefusesABadThreadCount) {
  Out o = Cmd("fit -m " + kModel + " -t -1 --no-measure");
  EXPECT_NE(o.rc, 0);
  EXPECT_NE(o.text.find("-t must be"), std::string::npos) << o.text;
}

TEST_F(GgufCli, SplitThenEveryCommandReadsOneModel) {
  const std::string prefix = testing::StoreTestPath("cli_split");
  Out split = Cmd("split " + kModel + " " + prefix + " --max-size 6M");
  ASSERT_EQ(split.rc, 0) << split.text;
  std::vector<std::string> parts;
  std::istringstream lines(split.text);
  for (std::string l; std::getline(lines, l);)
    if (l.ends_with(".gguf")) parts.push_back(l);
  ASSERT_GE(parts.size(), 2u) << split.text;
  EXPECT_EQ(parts[0], prefix + "-00001-of-0000" + std::to_string(parts.size()) + ".gguf");
  const std::string last = parts.back();

  Out info = Cmd("info " + last);
  ASSERT_EQ(info.rc, 0) << info.text;
  EXPECT_NE(info.text.find("split in " + std::to_string(parts.size()) + " files"), std::string::npos)
      << info.text;

  const std::string args = " -p 'def fib(n):' -n 16 -c 256 --json";
  Out resident = Cmd("run -m " + kModel + args);
  ASSERT_EQ(resident.rc, 0) << resident.text;
  const std::string want = LastJson(resident.text)["text"];
  Out in_place = Cmd("run -m " + last + args + " --max-ram 26M");
  ASSERT_EQ(in_place.rc, 0) << in_place.text;
  const json b = LastJson(in_place.text);
  EXPECT_EQ(b["store"]["source"], "gguf");
  EXPECT_EQ(b["text"], want);

  Out fit = Cmd("fit -m " + parts[0] + " --max-ram 26M -c 256 --json --no-measure");
  ASSERT_EQ(fit.rc, 0) << fit.text;
  EXPECT_EQ(LastJson(fit.text)["verdict"], "out_of_core");

  const std::string store = testing::StoreTestPath("cli_split_store");
  Out pack = Cmd("pack -m " + last + " -o " + store + " --skeleton keep");
  ASSERT_EQ(pack.rc, 0) << pack.text;
  Out packed = Cmd("run --store " + store + args + " --max-ram 26M");
  ASSERT_EQ(packed.rc, 0) << packed.text;
  EXPECT_EQ(LastJson(packed.text)["text"], want);

  std::error_code ec;
  fs::remove_all(store, ec);
  for (const std::string& p : parts) fs::remove(p, ec);
  fs::remove(parts[0] + ".crc32c.json", ec);
}

TEST_F(GgufCli, SplitRefusesBadArguments) {
  EXPECT_EQ(Cmd("split " + kModel + " x").rc, 2) << "neither --max-size nor --tensors";
  EXPECT_EQ(Cmd("split " + kModel + " x --max-size 1M --tensors 3").rc, 2);
  EXPECT_EQ(Cmd("split " + kModel + " x.gguf --tensors 3").rc, 2) << "a prefix, not a file name";
}

// Without a prompt, run prints the plan on stdout and exits; with one, the plan goes to stderr
// and the run's output (here its JSON) follows on stdout.
TEST_F(GgufCli, PrintPlan) {
  Out plan = Cmd("run -m " + kModel + " --max-ram 26M -c 256 --print-plan");
  ASSERT_EQ(plan.rc, 0) << plan.text;
  for (const char* part : {"plan (automatic)", "read in place", "resident", "attention",
                           "expert cache", "slots", "reserve", "per token", "read from disk"})
    EXPECT_NE(plan.text.find(part), std::string::npos) << part << " in:\n" << plan.text;
  EXPECT_EQ(plan.text.find('{'), std::string::npos) << "nothing generated:\n" << plan.text;

  Out run = Cmd("run -m " + kModel + " -p 'x' -n 2 -c 256 --max-ram 26M --print-plan --json");
  ASSERT_EQ(run.rc, 0) << run.text;
  EXPECT_NE(run.text.find("plan (automatic)"), std::string::npos) << run.text;
  EXPECT_TRUE(LastJson(run.text).contains("text")) << run.text;

  Out resident = Cmd("run -m " + kModel + " -c 256 --print-plan");
  ASSERT_EQ(resident.rc, 0) << resident.text;
  EXPECT_NE(resident.text.find("plan: resident"), std::string::npos) << resident.text;

  Out help = Cmd("run --help");
  EXPECT_NE(help.text.find("--print-plan"), std::string::npos);
}

}  // namespace
}  // namespace substrate
