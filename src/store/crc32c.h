// CRC32C (Castagnoli), the checksum of every store data range: AVX-512 carry-less
// multiplication where the CPU has it, else the SSE4.2 instruction (the runtime verifies every
// range it streams), else slicing-by-8 tables.
#pragma once

#include <cstddef>
#include <cstdint>

namespace substrate {

// Continues `crc` (0 to start) over n bytes.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

// The ways Crc32c computes, slowest first; all give the same result.
enum class Crc32cPath { kTable = 0, kInstruction = 1, kClmul = 2 };
// The fastest this CPU has.
Crc32cPath BestCrc32cPath();
// For tests: Crc32c takes no path above `limit` from now on; returns the previous limit.
Crc32cPath SetCrc32cPathForTesting(Crc32cPath limit);

}  // namespace substrate
