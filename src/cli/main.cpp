// substrate: thin dispatch to the registered subcommands.
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cli/command.h"

namespace substrate::cli {

std::vector<Command>& Commands() {
  static std::vector<Command> commands;
  return commands;
}

int PrintError(const std::string& command, const Status& status) {
  std::fprintf(stderr, "substrate %s: %s\n", command.c_str(), status.ToString().c_str());
  return 1;
}

namespace {
bool Contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}
// "-3", "-.5": a negative number is a value, never a flag.
bool LooksLikeFlag(const std::string& a) {
  return a.size() > 1 && a[0] == '-' && !std::isdigit(static_cast<unsigned char>(a[1])) &&
         a[1] != '.';
}
}  // namespace

Flags::Flags(const std::vector<std::string>& args, const FlagSpec& spec) {
  auto is_switch = [&](const std::string& n) {
    return n == "-h" || n == "--help" || Contains(spec.switches, n);
  };
  auto fail = [&](std::string message) {
    if (status_.ok()) status_ = InvalidArgument(std::move(message));
  };
  for (size_t i = 0; i < args.size() && status_.ok(); ++i) {
    const std::string& a = args[i];
    if (!LooksLikeFlag(a)) {
      if (spec.max_positional >= 0 &&
          positional_.size() >= static_cast<size_t>(spec.max_positional))
        fail("unexpected argument '" + a + "'" +
             (spec.max_positional == 0 ? " (this command takes only flags)" : ""));
      positional_.push_back(a);
      continue;
    }
    const auto eq = a.find('=');
    if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
      const std::string name = a.substr(0, eq);
      if (Contains(spec.values, name)) {
        values_.emplace_back(name, a.substr(eq + 1));
      } else if (is_switch(name)) {
        fail("flag " + name + " takes no value");
      } else {
        fail("unknown flag '" + name + "'");
      }
    } else if (Contains(spec.values, a)) {
      // The next argument is the value, unless it is another of this command's flags: then
      // the value was forgotten ("-m -p hi" must not load a model called "-p").
      if (i + 1 >= args.size() ||
          (LooksLikeFlag(args[i + 1]) &&
           (Contains(spec.values, args[i + 1]) || is_switch(args[i + 1])))) {
        fail("flag " + a + " needs a value");
      } else {
        values_.emplace_back(a, args[++i]);
      }
    } else if (is_switch(a)) {
      values_.emplace_back(a, "");
    } else {
      fail("unknown flag '" + a + "'");
    }
  }
}

bool Flags::Has(const std::string& name) const {
  for (const auto& [k, v] : values_)
    if (k == name) return true;
  return false;
}

std::string Flags::Get(const std::vector<std::string>& names, const std::string& fallback) const {
  std::string out = fallback;
  for (const auto& [k, v] : values_)
    if (std::find(names.begin(), names.end(), k) != names.end()) out = v;
  return out;
}

std::vector<std::string> Flags::GetAll(const std::vector<std::string>& names) const {
  std::vector<std::string> out;
  for (const auto& [k, v] : values_)
    if (std::find(names.begin(), names.end(), k) != names.end()) out.push_back(v);
  return out;
}

Expected<long long> Flags::GetInt(const std::vector<std::string>& names, long long fallback) const {
  std::string v = Get(names);
  if (v.empty()) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (*end != '\0') return InvalidArgument("flag " + names.front() + " needs an integer, got '" + v + "'");
  return x;
}

Expected<double> Flags::GetDouble(const std::vector<std::string>& names, double fallback) const {
  std::string v = Get(names);
  if (v.empty()) return fallback;
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (*end != '\0') return InvalidArgument("flag " + names.front() + " needs a number, got '" + v + "'");
  return x;
}

int UsageError(const std::string& command, const Status& status, const std::string& usage) {
  std::fprintf(stderr, "substrate %s: %s\n", command.c_str(), status.message().c_str());
  std::fputs(usage.c_str(), stderr);
  if (!usage.empty() && usage.back() != '\n') std::fputc('\n', stderr);
  return 2;
}

int HardwareThreads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max(1u, std::thread::hardware_concurrency());
}

Expected<int> ThreadsFlag(const Flags& f, const std::vector<std::string>& names) {
  ASSIGN_OR_RETURN(long long t, f.GetInt(names, 0));
  if (t < 0)
    return InvalidArgument(names.front() + " " + std::to_string(t) +
                           ": a thread count is >= 0 (0: all)");
  const int hw = HardwareThreads();
  if (t > hw) {
    std::fprintf(
        stderr, "substrate: warning: %s %lld is more than the %d hardware threads here; using %d\n",
        names.front().c_str(), t, hw, hw);
    return hw;
  }
  return static_cast<int>(t);
}

namespace {
void PrintUsage() {
  std::printf("substrate: run language models larger than memory, under a hard RAM budget\n\n"
              "usage: substrate <command> [args]\n\ncommands:\n");
  auto cmds = Commands();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  for (const auto& c : cmds) std::printf("  %-14s %s\n", c.name.c_str(), c.summary.c_str());
}
}  // namespace

}  // namespace substrate::cli

int main(int argc, char** argv) {
  using namespace substrate::cli;
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    PrintUsage();
    return argc < 2 ? 2 : 0;
  }
  std::string name = argv[1];
  for (const auto& c : Commands()) {
    if (c.name == name) return c.fn(std::vector<std::string>(argv + 2, argv + argc));
  }
  std::fprintf(stderr, "substrate: unknown command '%s' (see 'substrate --help')\n", name.c_str());
  return 2;
}
