// Every subcommand's command line, through the built binary: an unknown flag, a value flag
// without its value or a stray argument is refused with the command's usage and exit 2; every
// flag a usage text names is one the command declares. The commands are read from
// `substrate --help`, so a new command is covered without touching this file.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

struct Result {
  int rc = -1;
  std::string out;  // stdout and stderr together
};

Result RunCli(const std::string& args) {
  Result r;
  const std::string cmd = std::string(SUBSTRATE_BINARY) + " " + args + " 2>&1 </dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::vector<std::string> Commands() {
  Result r = RunCli("--help");
  std::vector<std::string> out;
  std::regex line(R"(^  ([a-z][a-z0-9-]*) )");
  std::smatch m;
  size_t pos = 0;
  while (pos < r.out.size()) {
    size_t end = r.out.find('\n', pos);
    if (end == std::string::npos) end = r.out.size();
    std::string l = r.out.substr(pos, end - pos);
    if (std::regex_search(l, m, line)) out.push_back(m[1]);
    pos = end + 1;
  }
  return out;
}

// The flags a usage text names: "-m", "--top-k", ... (not "-h"/"--help").
std::set<std::string> UsageFlags(const std::string& usage) {
  std::set<std::string> flags;
  std::regex flag(R"((^|[\s\[|(])(--?[a-z][a-z0-9-]*))");
  for (auto it = std::sregex_iterator(usage.begin(), usage.end(), flag);
       it != std::sregex_iterator(); ++it) {
    const std::string f = (*it)[2];
    if (f != "-h" && f != "--help") flags.insert(f);
  }
  return flags;
}

TEST(CliFlags, EveryCommandIsListed) {
  const auto cmds = Commands();
  EXPECT_GE(cmds.size(), 18u);
  for (const char* c : {"run", "serve", "bench", "pack", "tokenize"})
    EXPECT_NE(std::find(cmds.begin(), cmds.end(), c), cmds.end()) << c;
}

TEST(CliFlags, UnknownFlagIsUsageAndExit2) {
  for (const std::string& cmd : Commands()) {
    SCOPED_TRACE(cmd);
    Result help = RunCli(cmd + " --help");
    EXPECT_EQ(help.rc, 0) << help.out;
    EXPECT_TRUE(Contains(help.out, "usage: substrate " + cmd)) << help.out;

    Result r = RunCli(cmd + " --bogus");
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_TRUE(Contains(r.out, "unknown flag '--bogus'")) << r.out;
    EXPECT_TRUE(Contains(r.out, "usage: substrate " + cmd)) << r.out;

    Result eq = RunCli(cmd + " --bogus=1");
    EXPECT_EQ(eq.rc, 2) << eq.out;
    EXPECT_TRUE(Contains(eq.out, "'--bogus'")) << eq.out;
  }
}

// Each flag of each usage text, alone: a value flag says it needs its value (exit 2); a switch
// is accepted (the command then fails for what is missing, never for the flag itself).
TEST(CliFlags, EveryFlagInAUsageIsDeclared) {
  for (const std::string& cmd : Commands()) {
    const std::string usage = RunCli(cmd + " --help").out;
    const auto flags = UsageFlags(usage);
    EXPECT_FALSE(flags.empty()) << cmd;
    for (const std::string& f : flags) {
      SCOPED_TRACE(cmd + " " + f);
      Result r = RunCli(cmd + " " + f);
      EXPECT_FALSE(Contains(r.out, "unknown flag")) << r.out;
      if (Contains(r.out, "needs a value")) {
        EXPECT_EQ(r.rc, 2) << r.out;
        EXPECT_TRUE(Contains(r.out, "flag " + f + " needs a value")) << r.out;
        EXPECT_TRUE(Contains(r.out, "usage: substrate " + cmd)) << r.out;
      } else {
        EXPECT_NE(r.rc, 0) << r.out;  // nothing runs with a switch alone
        EXPECT_FALSE(Contains(r.out, "takes no value")) << r.out;
      }
    }
  }
}

TEST(CliFlags, RunRefusesWhatItUsedToIgnore) {
  // The issue's case: runs nothing, names the flag (no model is opened before flags parse).
  Result bogus = RunCli("run -m /nonexistent.gguf -p hi --bogus");
  EXPECT_EQ(bogus.rc, 2) << bogus.out;
  EXPECT_TRUE(Contains(bogus.out, "--bogus")) << bogus.out;
  EXPECT_FALSE(Contains(bogus.out, "nonexistent")) << bogus.out;

  Result last = RunCli("run -p hi -m");
  EXPECT_EQ(last.rc, 2) << last.out;
  EXPECT_TRUE(Contains(last.out, "flag -m needs a value")) << last.out;

  // "-m -p hi" must not open a model called "-p".
  Result swallowed = RunCli("run -m -p hi");
  EXPECT_EQ(swallowed.rc, 2) << swallowed.out;
  EXPECT_TRUE(Contains(swallowed.out, "flag -m needs a value")) << swallowed.out;

  Result stray = RunCli("run -m /nonexistent.gguf -p hello world");
  EXPECT_EQ(stray.rc, 2) << stray.out;
  EXPECT_TRUE(Contains(stray.out, "unexpected argument 'world'")) << stray.out;

  Result switch_value = RunCli("run -m /nonexistent.gguf -p hi --json=yes");
  EXPECT_EQ(switch_value.rc, 2) << switch_value.out;
  EXPECT_TRUE(Contains(switch_value.out, "--json takes no value")) << switch_value.out;

  // Negative numbers are values, and --name=value works for value flags.
  Result negative = RunCli("run -m /nonexistent.gguf -p hi --seed=-1 --repeat-last-n -1");
  EXPECT_FALSE(Contains(negative.out, "needs a value")) << negative.out;
  EXPECT_TRUE(Contains(negative.out, "nonexistent")) << negative.out;  // got as far as opening
}

TEST(CliFlags, PositionalCounts) {
  Result two = RunCli("info a.gguf b.gguf");
  EXPECT_EQ(two.rc, 2) << two.out;
  EXPECT_TRUE(Contains(two.out, "unexpected argument 'b.gguf'")) << two.out;
  Result quantize = RunCli("quantize a b");
  EXPECT_EQ(quantize.rc, 2) << quantize.out;
  // detokenize takes any number of ids.
  Result ids = RunCli("detokenize 1 2 3 4");
  EXPECT_FALSE(Contains(ids.out, "unexpected argument")) << ids.out;
  EXPECT_TRUE(Contains(ids.out, "-m MODEL")) << ids.out;
}

// Sampling values the server refuses are refused by run and chat too, naming the flag; none
// of them opens the model.
TEST(CliFlags, RunRejectsSamplingValuesTheServerRejects) {
  for (const char* bad :
       {"--top-p 2", "--top-p -0.5", "--top-k -3", "--temp nan", "--temp inf", "--temp -1",
        "--min-p nan", "--min-p 1.5", "--repeat-penalty 0", "--top-p nan"}) {
    for (const char* cmd : {"run", "chat"}) {
      SCOPED_TRACE(std::string(cmd) + " " + bad);
      const std::string prompt = std::string(cmd) == "run" ? " -p hi " : " ";
      Result r = RunCli(std::string(cmd) + " -m /nonexistent.gguf" + prompt + bad);
      EXPECT_NE(r.rc, 0) << r.out;
      const std::string flag = std::string(bad).substr(0, std::string(bad).find(' '));
      EXPECT_TRUE(Contains(r.out, flag)) << r.out;
      EXPECT_FALSE(Contains(r.out, "nonexistent")) << r.out;
    }
  }
  // In range: gets as far as the model.
  Result ok = RunCli("run -m /nonexistent.gguf -p hi --top-p 1 --top-k 0 --min-p 0 --temp 0.7");
  EXPECT_TRUE(Contains(ok.out, "nonexistent")) << ok.out;
}

TEST(CliFlags, ThreadsAboveTheCoresAreClampedWithAWarning) {
  const std::string m = std::string(SUBSTRATE_SHARED_DIR) + "/gguf/tiny-coder-Q8_0.gguf";
  if (!std::filesystem::exists(m)) GTEST_SKIP() << "no fixture " << m;
  Result r = RunCli("run -m " + m + " -p \"def f(\" -n 4 -t 4096");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "warning: -t 4096 is more than the")) << r.out;
  Result neg = RunCli("run -m " + m + " -p hi -n 4 -t -2");
  EXPECT_NE(neg.rc, 0) << neg.out;
  EXPECT_TRUE(Contains(neg.out, "-t -2")) << neg.out;
}

}  // namespace
