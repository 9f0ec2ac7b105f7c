// Split GGUFs, as llama.cpp's gguf-split writes them: a model in N files named
// PREFIX-00001-of-0000N.gguf .. PREFIX-0000N-of-0000N.gguf, each a complete GGUF (header, metadata,
// tensor infos of its own tensors, its own data section). The first part carries the model's
// metadata; every part carries split.no (u16, 0-based), split.count (u16) and split.tensors.count
// (i32, the tensors of all parts). GgufFile::Open reads such a set as one model given any of its
// names; WriteGgufSplit writes one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/env.h"
#include "format/model_file.h"

namespace substrate {

inline constexpr const char* kGgufSplitNo = "split.no";
inline constexpr const char* kGgufSplitCount = "split.count";
inline constexpr const char* kGgufSplitTensorsCount = "split.tensors.count";

// "PREFIX-00002-of-00003.gguf" for part index 1 (0-based) of 3.
std::string GgufSplitPath(const std::string& prefix, int index, int count);

struct GgufSplitName {
  std::string prefix;
  int index = 0;  // 0-based
  int count = 0;
};
// The prefix, part and count of a name that follows GgufSplitPath's pattern; nullopt otherwise.
std::optional<GgufSplitName> ParseGgufSplitPath(const std::string& path);

struct GgufSplitOptions {
  uint64_t max_bytes = 0;  // a part's tensor data (each tensor padded to the alignment) at most
  int max_tensors = 0;     // or: tensors per part (exactly one of the two is set)
  Env* env = nullptr;      // nullptr: Env::Default()
};

// Writes `in` (a GGUF, itself possibly split) as a split GGUF PREFIX-0000K-of-0000N.gguf, tensors
// in the file's order; a tensor larger than max_bytes gets a part of its own. Each part is written
// under a temporary name and renamed when whole; the first part, which names the model, last, so
// an interrupted run leaves no set that opens. Returns the parts' paths.
Expected<std::vector<std::string>> WriteGgufSplit(const ModelFile& in, const std::string& prefix,
                                                  const GgufSplitOptions& options);

}  // namespace substrate
