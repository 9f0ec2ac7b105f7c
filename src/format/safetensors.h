// safetensors header parsing: an 8-byte little-endian header length, a JSON object
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the data.
// Every entry is validated (dtype, rank, element count vs. byte range, ranges inside the data
// section, no overlaps) before anything trusts it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "core/status.h"
#include "format/dtype.h"

namespace substrate {

struct SafetensorsEntry {
  std::string name;
  DType type = DType::kF32;
  std::vector<uint64_t> shape;  // as stored: outermost first (PyTorch order)
  uint64_t offset = 0;          // absolute offset in the file
  uint64_t bytes = 0;
};

// Header larger than this is refused (real ones are well under 10 MB).
inline constexpr uint64_t kMaxSafetensorsHeader = 100ull << 20;

// Parses the header of a whole file. Entries come sorted by name (the order the reference
// converter iterates them in).
Expected<std::vector<SafetensorsEntry>> ReadSafetensorsHeader(const RandomAccessFile& file);

// Parses a header given as its JSON text; `data_size` is the size of the data section and
// `data_start` its absolute offset. `name` is for messages. Shared by the file reader and the
// fuzz target.
Expected<std::vector<SafetensorsEntry>> ParseSafetensorsHeader(const std::string& json,
                                                               uint64_t data_start,
                                                               uint64_t data_size,
                                                               const std::string& name);

}  // namespace substrate
