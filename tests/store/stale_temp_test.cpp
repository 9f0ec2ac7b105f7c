// Killed atomic writes leave `FILE.tmp.PID` behind (as large as the file: 13 MB for a session);
// through the binary, the next successful write of the same file removes those whose PID is
// gone, and only those: a pack over a store, a run saving its --prompt-cache.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "store_fixture.h"

namespace substrate {
namespace {

namespace fs = std::filesystem;

int RunCli(const std::string& args) {
  const int rc =
      std::system((std::string(SUBSTRATE_BINARY) + " " + args + " >/dev/null 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// A pid that existed and is gone: a child that exited and was reaped.
std::string DeadPid() {
  const pid_t p = fork();
  if (p == 0) _exit(0);
  int st = 0;
  waitpid(p, &st, 0);
  return std::to_string(p);
}

TEST(StaleTemps, PackAndPromptCacheRemoveTheDeadWritersTemps) {
  const std::string model = std::string(SUBSTRATE_SHARED_DIR) + "/gguf/tiny-coder-Q8_0.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "no fixture " << model;
  const std::string dir = testing::StoreTestPath("stale_temps");
  fs::create_directories(dir);
  const std::string dead = DeadPid(), alive = std::to_string(getppid());
  const std::vector<std::string> stale = {"manifest.json.tmp." + dead,
                                          "block_0.attn.t0.bin.tmp." + dead,
                                          "model.gguf.tmp." + dead, "s.kv.tmp." + dead};
  const std::vector<std::string> kept = {"manifest.json.tmp." + alive, "unrelated.tmp." + dead};
  for (const auto& n : stale) std::ofstream(dir + "/" + n) << "killed half-way";
  for (const auto& n : kept) std::ofstream(dir + "/" + n) << "not ours to remove";

  ASSERT_EQ(RunCli("pack -m " + model + " -o " + dir + " --skeleton keep"), 0);
  ASSERT_EQ(RunCli("run -m " + model + " -p hi -n 2 --prompt-cache " + dir + "/s.kv"), 0);
  for (const auto& n : stale) EXPECT_FALSE(fs::exists(dir + "/" + n)) << n;
  for (const auto& n : kept) EXPECT_TRUE(fs::exists(dir + "/" + n)) << n;
  EXPECT_TRUE(fs::exists(dir + "/manifest.json"));
  EXPECT_TRUE(fs::exists(dir + "/s.kv"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace substrate
