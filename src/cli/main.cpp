// substrate: thin dispatch to the registered subcommands.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
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

Flags::Flags(const std::vector<std::string>& args, const std::vector<std::string>& with_value) {
  auto takes_value = [&](const std::string& n) {
    return std::find(with_value.begin(), with_value.end(), n) != with_value.end();
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() > 1 && a[0] == '-' && !(a.size() > 1 && (std::isdigit(a[1]) || a[1] == '.'))) {
      auto eq = a.find('=');
      if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
        values_.emplace_back(a.substr(0, eq), a.substr(eq + 1));
      } else if (takes_value(a)) {
        if (i + 1 >= args.size()) {
          status_ = InvalidArgument("flag " + a + " needs a value");
          return;
        }
        values_.emplace_back(a, args[++i]);
      } else {
        values_.emplace_back(a, "");
      }
    } else {
      positional_.push_back(a);
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
