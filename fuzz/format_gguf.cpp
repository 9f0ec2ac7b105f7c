// libFuzzer target: the GGUF header parser (metadata, nested arrays, tensor infos, alignment,
// bounds and overlap checks) on arbitrary bytes. Any crash, leak, UB or huge allocation is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "format/gguf_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  substrate::Metadata md;
  std::vector<substrate::TensorInfo> tensors;
  substrate::Status s = substrate::ParseGgufHeader(bytes, &md, &tensors);
  if (s.ok()) {
    // Whatever parsed must be self-consistent: every tensor inside the input.
    for (const auto& t : tensors)
      if (t.parts.size() != 1 || t.parts[0].offset + t.bytes > size) __builtin_trap();
  }
  return 0;
}
