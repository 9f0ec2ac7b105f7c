#include "store/crc32c.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
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

// AVX-512 carry-less multiplication (VPCLMULQDQ): 256 bytes a step in four registers of four
// 128-bit lanes each. A lane holding the polynomial A of 16 bytes is carried 2048 bits forward
// onto the lane that many bits later, A x^2048 mod P, by two 64 x 32-bit products: its first 8
// bytes (the high-degree half, A_hi) times x^(2048+63) mod P and its last 8 times x^(2048-1)
// mod P (the lanes are bit-reflected, so a product comes out one degree low: the constants
// carry one x less). What is left is a 16-byte polynomial congruent to the data, whose CRC the
// crc32 instruction finishes. Measured on one Zen 5 core: 56 GB/s in cache and 30 GB/s over
// cold ranges against the three chains' 27 and 14.5; it matters because every range the
// runtime streams is verified on the cores that also compute.
constexpr size_t kClmulStep = 256;
// Ranges come cold from the reads: requested 4 KiB ahead, 2 GiB of 4.9 MB ranges checked at
// 30 GB/s on one Zen 5 core instead of 24 (2 KiB: 25, 8 KiB: 26, none: 23).
constexpr size_t kPrefetchAhead = 4096;

// x^n mod P as a degree < 32 polynomial, bit i the coefficient of x^i (P with its x^32 term).
constexpr uint64_t XPowModP(size_t n) {
  constexpr uint64_t kP = 0x11EDC6F41ull;  // Castagnoli, unreflected
  uint64_t r = 1;
  for (size_t i = 0; i < n; ++i) {
    r <<= 1;
    if (r & (1ull << 32)) r ^= kP;
  }
  return r;
}

// A constant as a reflected lane half multiplies it: bit 63 - i holds the coefficient of x^i.
constexpr uint64_t Reflect64(uint64_t v) {
  uint64_t r = 0;
  for (int i = 0; i < 64; ++i)
    if (v & (1ull << i)) r |= 1ull << (63 - i);
  return r;
}

// The pair of constants that carries a lane `bits` forward: for its first and its last 8 bytes.
constexpr std::array<uint64_t, 2> FoldConstants(size_t bits) {
  return {Reflect64(XPowModP(bits + 63)), Reflect64(XPowModP(bits - 1))};
}

// The constant pair in every lane.
__attribute__((target("avx512f"))) inline __m512i EveryLane(const std::array<uint64_t, 2>& k) {
  const auto lo = static_cast<long long>(k[0]), hi = static_cast<long long>(k[1]);
  return _mm512_set4_epi64(hi, lo, hi, lo);
}

__attribute__((target("avx512f,vpclmulqdq"))) inline __m512i Fold(__m512i acc, __m512i k,
                                                                  __m512i data) {
  const __m512i a = _mm512_clmulepi64_epi128(acc, k, 0x00);  // first halves
  const __m512i b = _mm512_clmulepi64_epi128(acc, k, 0x11);  // last halves
  return _mm512_ternarylogic_epi64(a, b, data, 0x96);        // a ^ b ^ data
}

// CRC32C of whole steps (n a multiple of kClmulStep, at least one) continuing `crc`.
__attribute__((target("avx512f,vpclmulqdq,sse4.2"))) uint32_t Crc32cClmul(const uint8_t* p,
                                                                          size_t n, uint32_t crc) {
  static constexpr auto kStep = FoldConstants(8 * kClmulStep);
  // Joining the registers: register j is carried 512 (3 - j) bits to the last; then lane l of
  // that one 128 (3 - l) bits (its last lane is not moved: multiplying by x^0 keeps it).
  static constexpr std::array<std::array<uint64_t, 2>, 3> kRegs = {
      FoldConstants(3 * 512), FoldConstants(2 * 512), FoldConstants(512)};
  static constexpr std::array<std::array<uint64_t, 2>, 3> kLanes = {
      FoldConstants(3 * 128), FoldConstants(2 * 128), FoldConstants(128)};
  const __m512i step = EveryLane(kStep);
  __m512i acc[4];
  for (int j = 0; j < 4; ++j) acc[j] = _mm512_loadu_si512(p + 64 * j);
  // The register's start value enters as the first 32 bits of data (the reflected CRC's init).
  acc[0] = _mm512_xor_si512(acc[0], _mm512_maskz_set1_epi32(1, static_cast<int>(~crc)));
  for (size_t off = kClmulStep; off < n; off += kClmulStep) {
    for (size_t line = 0; line < kClmulStep; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(p + off + kPrefetchAhead + line), _MM_HINT_T0);
    for (int j = 0; j < 4; ++j) acc[j] = Fold(acc[j], step, _mm512_loadu_si512(p + off + 64 * j));
  }
  __m512i last = acc[3];
  for (int j = 0; j < 3; ++j) last = Fold(acc[j], EveryLane(kRegs[j]), last);
  const __m512i lanes = _mm512_set_epi64(0, 0, kLanes[2][1], kLanes[2][0], kLanes[1][1],
                                         kLanes[1][0], kLanes[0][1], kLanes[0][0]);
  // Lanes 0-2 carried to lane 3's place; lane 3 as it is (multiplied by nothing).
  const __m512i moved = _mm512_xor_si512(_mm512_clmulepi64_epi128(last, lanes, 0x00),
                                         _mm512_clmulepi64_epi128(last, lanes, 0x11));
  alignas(64) uint64_t q[8];
  _mm512_store_si512(q, moved);
  alignas(64) uint64_t l[8];
  _mm512_store_si512(l, last);
  const uint64_t lo = q[0] ^ q[2] ^ q[4] ^ l[6], hi = q[1] ^ q[3] ^ q[5] ^ l[7];
  // The 16 bytes' CRC from a zero register is the data's register: (A x^32) mod P.
  return ~static_cast<uint32_t>(_mm_crc32_u64(_mm_crc32_u64(0, lo), hi));
}

bool HaveHwCrc() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}

bool HaveClmul() {
  static const bool have =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq") && HaveHwCrc();
  return have;
}
#endif

std::atomic<Crc32cPath> g_path_limit{Crc32cPath::kClmul};

}  // namespace

Crc32cPath BestCrc32cPath() {
#if defined(__x86_64__)
  if (HaveClmul()) return Crc32cPath::kClmul;
  if (HaveHwCrc()) return Crc32cPath::kInstruction;
#endif
  return Crc32cPath::kTable;
}

Crc32cPath SetCrc32cPathForTesting(Crc32cPath limit) {
  return g_path_limit.exchange(limit);
}

// Slicing-by-8 where nothing faster is allowed: eight table lookups per 8 bytes.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
  const Crc32cPath path = std::min(g_path_limit.load(std::memory_order_relaxed), BestCrc32cPath());
  if (path == Crc32cPath::kClmul && n >= 4 * kClmulStep) {
    const size_t whole = n / kClmulStep * kClmulStep;
    crc = Crc32cClmul(p, whole, crc);
    p += whole;
    n -= whole;
  }
  if (path >= Crc32cPath::kInstruction) return Crc32cHw(p, n, crc);
#endif
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
