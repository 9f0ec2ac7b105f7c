// End-to-end: `substrate info` on a GGUF file and on a HF folder.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace substrate {
namespace {

using testing::SharedPath;

// Runs a command and returns (exit code, stdout).
std::pair<int, std::string> RunCommand(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {-1, ""};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = ::pclose(p);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

TEST(InfoCli, GgufAndHfFolderAgree) {
  std::string gguf = SharedPath("gguf/tiny-coder-bf16.gguf"), dir = SharedPath("models/tiny-coder");
  SKIP_IF_NO_SHARED(gguf);
  auto [rc1, out1] = RunCommand(std::string(SUBSTRATE_BINARY) + " info --json " + gguf);
  auto [rc2, out2] = RunCommand(std::string(SUBSTRATE_BINARY) + " info --json " + dir);
  ASSERT_EQ(rc1, 0);
  ASSERT_EQ(rc2, 0);
  auto a = nlohmann::json::parse(out1), b = nlohmann::json::parse(out2);
  EXPECT_EQ(a["architecture"], "qwen2");
  EXPECT_EQ(b["architecture"], "qwen2");
  EXPECT_EQ(a["n_tensors"], 74);
  EXPECT_EQ(b["n_tensors"], 74);
  EXPECT_EQ(a["n_params"], b["n_params"]);
  EXPECT_EQ(a["metadata"]["qwen2.block_count"], 6);
  EXPECT_EQ(a["metadata"]["tokenizer.ggml.tokens"]["count"], 8192);
  EXPECT_EQ(a["tensors"][0]["name"], "token_embd.weight");
  EXPECT_EQ(a["tensors"][0]["shape"], nlohmann::json::array({256, 8192}));

  auto [rc3, text] = RunCommand(std::string(SUBSTRATE_BINARY) + " info " + gguf);
  EXPECT_EQ(rc3, 0);
  EXPECT_NE(text.find("blk.5.attn_q.weight"), std::string::npos);
  EXPECT_NE(text.find("totals: 74 tensors"), std::string::npos);
}

TEST(InfoCli, BadInputFailsCleanly) {
  testing::TempDir dir;
  testing::WriteBytes(dir.File("bad.gguf"), std::string("GGUF\x03\0\0\0garbage", 15));
  auto [rc, out] = RunCommand(std::string(SUBSTRATE_BINARY) + " info " + dir.File("bad.gguf") + " 2>&1");
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("Corruption"), std::string::npos) << out;
  auto [rc2, out2] = RunCommand(std::string(SUBSTRATE_BINARY) + " info /nonexistent.gguf 2>&1");
  EXPECT_EQ(rc2, 1);
  EXPECT_NE(out2.find("no such file"), std::string::npos) << out2;
}

}  // namespace
}  // namespace substrate
