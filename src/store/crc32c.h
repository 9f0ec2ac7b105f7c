// CRC32C (Castagnoli), the checksum of every store data range: the SSE4.2 instruction where the
// CPU has it (the runtime verifies every range it streams), slicing-by-8 tables otherwise.
#pragma once

#include <cstddef>
#include <cstdint>

namespace substrate {

// Continues `crc` (0 to start) over n bytes.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace substrate
