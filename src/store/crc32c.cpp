#include "store/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace substrate {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

constexpr std::array<std::array<uint32_t, 256>, 8> MakeTables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i)
    for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  return t;
}

constexpr auto kTables = MakeTables();

#if defined(__x86_64__)
// SSE4.2's crc32 instruction computes exactly this polynomial, 8 bytes per instruction: the
// runtime verifies every range it streams, at disk speed, so the table version (~1 GB/s) would
// be the bottleneck. One chain of the instruction waits for each result (3 cycles of latency,
// ~9 GB/s); three chains over three blocks run at its throughput, and their registers are
// joined by shifting one past the next block's length (processing that many zero bytes: a
// linear map of the register, kept as four byte tables).
constexpr size_t kLong = 8192, kShort = 256;

struct Shift {
  uint32_t t[4][256];
  uint32_t operator()(uint32_t c) const {
    return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
  }
};

__attribute__((target("sse4.2"))) Shift MakeShift(size_t bytes) {
  Shift s;
  for (int k = 0; k < 4; ++k)
    for (uint32_t b = 0; b < 256; ++b) {
      uint64_t r = b << (8 * k);
      for (size_t i = 0; i < bytes / 8; ++i) r = _mm_crc32_u64(r, 0);
      s.t[k][b] = static_cast<uint32_t>(r);
    }
  return s;
}

// Whole runs of three blocks of `len` bytes, each block on its own chain.
__attribute__((target("sse4.2"))) void ThreeChains(const uint8_t*& p, size_t& n, uint64_t& c,
                                                   size_t len, const Shift& shift) {
  while (n >= 3 * len) {
    uint64_t c0 = c, c1 = 0, c2 = 0;
    for (const uint8_t* end = p + len; p < end; p += 8) {
      uint64_t v0, v1, v2;
      std::memcpy(&v0, p, 8);
      std::memcpy(&v1, p + len, 8);
      std::memcpy(&v2, p + 2 * len, 8);
      c0 = _mm_crc32_u64(c0, v0);
      c1 = _mm_crc32_u64(c1, v1);
      c2 = _mm_crc32_u64(c2, v2);
    }
    c = shift(shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1)) ^
        static_cast<uint32_t>(c2);
    p += 2 * len;
    n -= 3 * len;
  }
}

__attribute__((target("sse4.2"))) uint32_t Crc32cHw(const uint8_t* p, size_t n, uint32_t crc) {
  uint64_t c = ~crc;
  if (n >= 3 * kShort) {
    static const Shift long_shift = MakeShift(kLong), short_shift = MakeShift(kShort);
    ThreeChains(p, n, c, kLong, long_shift);
    ThreeChains(p, n, c, kShort, short_shift);
  }
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}

bool HaveHwCrc() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

// Slicing-by-8: eight table lookups per 8 bytes.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
#if defined(__x86_64__)
  if (HaveHwCrc()) return Crc32cHw(static_cast<const uint8_t*>(data), n, crc);
#endif
  const uint8_t* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  while (n >= 8) {
    const uint32_t lo =
        crc ^ (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24);
    crc = kTables[7][lo & 0xff] ^ kTables[6][(lo >> 8) & 0xff] ^ kTables[5][(lo >> 16) & 0xff] ^
          kTables[4][lo >> 24] ^ kTables[3][p[4]] ^ kTables[2][p[5]] ^ kTables[1][p[6]] ^
          kTables[0][p[7]];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ kTables[0][(crc ^ *p++) & 0xff];
  return ~crc;
}

}  // namespace substrate
