// End to end through the built binary: synth-moe -> feasibility -> compile -> inspect --svg,
// and clear refusals of bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>

namespace {

struct CmdResult {
  int code;
  std::string out;
};

CmdResult Sh(const std::string& args) {
  std::string cmd = std::string(SUBSTRATE_BINARY) + " " + args + " 2>&1";
  CmdResult r{-1, ""};
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(CompilerCli, SynthCompileInspect) {
  const std::string dir = ::testing::TempDir();
  const std::string prof = dir + "/cli_moe.json", plan = dir + "/cli_plan.json", svg = dir + "/cli.svg";
  CmdResult r = Sh("synth-moe --layers 27 --experts 64 --top-k 8 --mem-bw 2e10 --ssd-bw 3e9 --out " + prof);
  ASSERT_EQ(r.code, 0) << r.out;

  r = Sh("feasibility " + prof + " --max-ram 2G --quality 0.05 --tps 4");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("\"status\": \"infeasible\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"binding_axis\""), std::string::npos);
  EXPECT_NE(r.out.find("raise max-ram to"), std::string::npos) << r.out;

  r = Sh("feasibility " + prof + " --max-ram 36G --quality 0.05 --tps 4");
  EXPECT_EQ(r.code, 0) << r.out;

  r = Sh("compile " + prof + " --max-ram 36G --quality 0.05 --tps 4 --max-concurrent 6 -o " + plan);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("1810 ops"), std::string::npos) << r.out;

  r = Sh("inspect " + plan + " --svg " + svg);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("every invariant holds"), std::string::npos);
  EXPECT_NE(r.out.find("block_0.attn"), std::string::npos);
  std::string pic = Slurp(svg);
  EXPECT_EQ(pic.rfind("<svg", 0), 0u);
  EXPECT_NE(pic.find("</svg>"), std::string::npos);
  EXPECT_NE(pic.find("polyline"), std::string::npos);
}

TEST(CompilerCli, BadInputIsRefusedWithAMessage) {
  const std::string dir = ::testing::TempDir();
  CmdResult r = Sh("inspect " + dir + "/does-not-exist.json");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("does-not-exist.json"), std::string::npos) << r.out;

  const std::string bad = dir + "/bad_plan.json";
  { std::ofstream(bad) << "{\"schema\": \"substrate.plan_bundle\", \"version\": 1"; }
  r = Sh("inspect " + bad);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("not valid JSON"), std::string::npos) << r.out;

  const std::string prof = dir + "/cli_small.json";
  ASSERT_EQ(Sh("synth-moe --layers 2 --experts 4 --top-k 2 --d-model 256 --ffn 256 --vocab 512 "
               "--mem-bw 1e10 --ssd-bw 1e9 -o " + prof).code, 0);
  r = Sh("compile " + prof + " --max-ram 1K --quality 0.05 -o " + dir + "/never.json");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("infeasible, binding axis memory"), std::string::npos) << r.out;
  EXPECT_FALSE(std::ifstream(dir + "/never.json").good());
  r = Sh("compile " + prof + " --max-ram lots --quality 0.05 -o " + dir + "/never.json");
  EXPECT_NE(r.code, 0);
}

}  // namespace
