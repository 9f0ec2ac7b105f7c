// substrate pack end to end: writes a store the StoreWeightSource opens; bad flags fail cleanly.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "core/memory_ledger.h"
#include "store/store_weight_source.h"

namespace substrate {
namespace {

namespace fs = std::filesystem;

int RunCli(const std::string& args) {
  const std::string cmd = std::string(SUBSTRATE_BINARY) + " " + args + " >/dev/null 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(PackCli, SkeletonOnlyStoreOpens) {
  const std::string model = std::string(SUBSTRATE_SHARED_DIR) + "/gguf/tiny-coder-moe-bf16.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "no fixture " << model;
  const std::string out =
      (fs::temp_directory_path() / ("substrate_pack_cli_" + std::to_string(getpid()))).string();
  ASSERT_EQ(RunCli("pack -m " + model + " -o " + out + " --skeleton Q4_K --tiers 1"), 0);
  MemoryLedger ledger;
  auto src = StoreWeightSource::Open(out, &ledger);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_EQ((*src)->n_tiers(), 1);
  EXPECT_NE((*src)->Resolve("blk.0.attn_q.weight"), kNoTensor);
  fs::remove_all(out);
  EXPECT_NE(RunCli("pack -m " + model + " -o " + out + " --skeleton NOPE"), 0);
  EXPECT_NE(RunCli("pack -m /nonexistent -o " + out), 0);
  EXPECT_NE(RunCli("pack -m " + model), 0);
  fs::remove_all(out);
}

TEST(PackCli, KeepAndPlan) {
  const std::string model = std::string(SUBSTRATE_SHARED_DIR) + "/gguf/tiny-coder-moe-Q4_K_M.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "no fixture " << model;
  const std::string out =
      (fs::temp_directory_path() / ("substrate_pack_keep_" + std::to_string(getpid()))).string();
  ASSERT_EQ(RunCli("pack -m " + model + " -o " + out + " --skeleton keep --threads 2"), 0);
  {
    MemoryLedger ledger;
    auto src = StoreWeightSource::Open(out, &ledger);
    ASSERT_TRUE(src.ok()) << src.status().ToString();
    EXPECT_EQ((*src)->n_tiers(), 1);  // a kept skeleton is exact: no residuals unless asked
  }
  fs::remove_all(out);
  // A plan naming an op this model lacks fails, naming it, and writes no store.
  const std::string plan = out + ".plan.json";
  std::ofstream(plan) << R"({"op_bundles": [{"op_id": "block_77.attn", "tiers": [{"precision": "Q8_0"}]}]})";
  const std::string cmd = std::string(SUBSTRATE_BINARY) + " pack -m " + model + " -o " + out +
                          " --plan " + plan + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string text;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) text += buf;
  EXPECT_NE(pclose(p), 0);
  EXPECT_NE(text.find("block_77.attn"), std::string::npos) << text;
  EXPECT_FALSE(fs::exists(out + "/manifest.json"));
  std::ofstream(plan) << "{not json";
  EXPECT_NE(RunCli("pack -m " + model + " -o " + out + " --plan " + plan), 0);
  EXPECT_NE(RunCli("pack -m " + model + " -o " + out + " --plan /nonexistent.json"), 0);
  fs::remove(plan);
  fs::remove_all(out);
}

}  // namespace
}  // namespace substrate
