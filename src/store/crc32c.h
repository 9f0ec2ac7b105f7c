// CRC32C (Castagnoli), the checksum of every store data range. Software table (byte at a
// time); the store verifies each range once at load, so this is not on the token path.
#pragma once

#include <cstddef>
#include <cstdint>

namespace substrate {

// Continues `crc` (0 to start) over n bytes.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace substrate
