// Helpers for format tests: fixture paths, temp files, and a hand-rolled GGUF byte builder that
// is independent of our writer (so reader and writer are not only checked against each other).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/file_io.h"

namespace substrate::testing {

inline std::string SharedDir() { return SUBSTRATE_SHARED_DIR; }
inline std::string SharedPath(const std::string& rel) { return SharedDir() + "/" + rel; }

#define SKIP_IF_NO_SHARED(path)                                                      \
  do {                                                                               \
    if (!::substrate::FileExists(path))                                              \
      GTEST_SKIP() << "fixture " << (path) << " is absent (../shared not mounted)"; \
  } while (0)

// A temporary directory removed (with its files) at destruction.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/substrate_format_test_XXXXXX";
    path_ = ::mkdtemp(tmpl) ? tmpl : "/tmp";
  }
  ~TempDir() {
    std::string cmd = "rm -rf '" + path_ + "'";
    if (path_ != "/tmp") (void)!std::system(cmd.c_str());
  }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Plain write (no fsync: tests write thousands of small files).
inline bool WriteBytesNoSync(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  return std::fclose(f) == 0 && ok;
}
inline void WriteBytes(const std::string& path, const std::string& bytes) {
  ASSERT_TRUE(WriteBytesNoSync(path, bytes));
}

// Appends little-endian GGUF encodings.
class GgufBytes {
 public:
  template <typename T>
  GgufBytes& Pod(T v) {
    b_.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  GgufBytes& Str(const std::string& s) {
    Pod<uint64_t>(s.size());
    b_ += s;
    return *this;
  }
  GgufBytes& Header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b_ += "GGUF";
    Pod<uint32_t>(version);
    Pod<uint64_t>(n_tensors);
    Pod<uint64_t>(n_kv);
    return *this;
  }
  GgufBytes& KvU32(const std::string& k, uint32_t v) {
    Str(k);
    Pod<uint32_t>(4);
    return Pod<uint32_t>(v);
  }
  GgufBytes& KvStr(const std::string& k, const std::string& v) {
    Str(k);
    Pod<uint32_t>(8);
    return Str(v);
  }
  GgufBytes& TensorInfo(const std::string& name, std::vector<uint64_t> ne, uint32_t type,
                        uint64_t offset) {
    Str(name);
    Pod<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) Pod<uint64_t>(d);
    Pod<uint32_t>(type);
    return Pod<uint64_t>(offset);
  }
  GgufBytes& PadTo(size_t alignment) {
    while (b_.size() % alignment) b_ += '\0';
    return *this;
  }
  GgufBytes& Raw(const std::string& s) {
    b_ += s;
    return *this;
  }
  const std::string& bytes() const { return b_; }
  size_t size() const { return b_.size(); }

 private:
  std::string b_;
};

}  // namespace substrate::testing
