// Running the built `substrate` binary from the quant tests: output (stdout and stderr) and
// exit code, temporary paths, file checks.
#pragma once

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace substrate::testing {

struct CmdResult {
  int code;
  std::string output;
};

inline CmdResult Substrate(const std::string& args) {
  const std::string cmd = std::string(SUBSTRATE_BINARY) + " " + args + " 2>&1";
  CmdResult r{-1, {}};
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

inline std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/substrate_quant_" + std::to_string(getpid()) + "_" + name;
}

inline bool Exists(const std::string& path) { return std::ifstream(path).good(); }

inline uint64_t SizeOf(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

}  // namespace substrate::testing
