// Subcommand registry. Each src/cli/cmd_*.cpp registers its commands with a static
// CommandRegistrar, so adding a command touches no shared file:
//
//   static CommandRegistrar reg("info", "print a model's metadata and tensors", &RunInfo);
//
// A command gets its arguments (without the program and command names) and returns the exit
// code; it prints its own errors through PrintError.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace substrate::cli {

using CommandFn = int (*)(const std::vector<std::string>& args);

struct Command {
  std::string name;
  std::string summary;
  CommandFn fn;
};

std::vector<Command>& Commands();

struct CommandRegistrar {
  CommandRegistrar(std::string name, std::string summary, CommandFn fn) {
    Commands().push_back({std::move(name), std::move(summary), fn});
  }
};

// "substrate <cmd>: <message>" on stderr; returns the exit code to use (1).
int PrintError(const std::string& command, const Status& status);

// A command's flags, declared in full: the parser rejects anything else, so a typo never runs
// silently with a default. -h and --help are always known.
struct FlagSpec {
  FlagSpec(std::vector<std::string> values_, std::vector<std::string> switches_ = {},
           int max_positional_ = 0)
      : values(std::move(values_)),
        switches(std::move(switches_)),
        max_positional(max_positional_) {}
  std::vector<std::string> values;    // flags that take a value: "-m", "--model", ...
  std::vector<std::string> switches;  // flags that take none: "--json", ...
  int max_positional = 0;             // arguments that are not flags; -1: any number
};

// Tiny flag parser shared by the commands: --name value, --name=value, -x value, --switch.
// An undeclared flag, a value flag without its value (at the end, or followed by another
// declared flag), a value given to a switch or one positional argument too many make status()
// InvalidArgument naming it; commands answer that with UsageError (exit 2).
class Flags {
 public:
  Flags(const std::vector<std::string>& args, const FlagSpec& spec);
  const Status& status() const { return status_; }
  bool Has(const std::string& name) const;
  bool help() const { return Has("-h") || Has("--help"); }
  // The last value given for any of `names` (e.g. {"-m", "--model"}), or `fallback`.
  std::string Get(const std::vector<std::string>& names, const std::string& fallback = "") const;
  // All values given for a repeated flag.
  std::vector<std::string> GetAll(const std::vector<std::string>& names) const;
  Expected<long long> GetInt(const std::vector<std::string>& names, long long fallback) const;
  Expected<double> GetDouble(const std::vector<std::string>& names, double fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::vector<std::pair<std::string, std::string>> values_;
  std::vector<std::string> positional_;
  Status status_;
};

// "substrate <cmd>: <message>" and then the command's usage on stderr; returns 2, the exit code
// of a command line that cannot be run as written.
int UsageError(const std::string& command, const Status& status, const std::string& usage);

// -t/--threads: 0 (the default: every hardware thread) or a positive count. More threads than
// this process may run on only oversubscribes the cores (the pool's workers spin), so a larger
// count is clamped to them with a one-line warning.
Expected<int> ThreadsFlag(const Flags& f,
                          const std::vector<std::string>& names = {"-t", "--threads"});
// The hardware threads this process may run on (its CPU affinity set).
int HardwareThreads();

}  // namespace substrate::cli
