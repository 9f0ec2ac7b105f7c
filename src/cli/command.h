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

// Tiny flag parser shared by the commands: --name value, --name=value, -x value, --flag.
class Flags {
 public:
  // `with_value` lists the flags that take a value ("-m", "--model", ...); others are booleans.
  Flags(const std::vector<std::string>& args, const std::vector<std::string>& with_value);
  const Status& status() const { return status_; }
  bool Has(const std::string& name) const;
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

}  // namespace substrate::cli
