#include "kernels/cpu_features.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace substrate {
namespace {

// AMX-TILE and AMX-INT8 (CPUID leaf 7 EDX bits 24, 25), and the kernel's permission to use the
// tile data state, which Linux grants per process on request (XFEATURE_XTILEDATA = 18). Without
// the grant the first tile instruction faults, so a refusal means no AMX.
bool AmxUsable() {
#if defined(__x86_64__) && defined(__linux__)
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!((d >> 24) & 1) || !((d >> 25) & 1)) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

#if defined(__x86_64__) || defined(__i386__)
// AVX-VNNI (VEX-encoded): CPUID leaf 7 sub-leaf 1, EAX bit 4 (clang 14's __builtin_cpu_supports
// does not know the name).
bool AvxVnni() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 4) & 1);
}
#endif

Isa Detect() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                __builtin_cpu_supports("avx512dq");
  // The AMX units are built with -mavxvnni too (the compiler may pick VEX-encoded VNNI there):
  // every AMX part has it, but check rather than fault.
  if (avx512 && AvxVnni() && AmxUsable()) return Isa::kAmx;
  if (avx512) return Isa::kAvx512;
  if (avx2) return Isa::kAvx2;
#endif
  return Isa::kScalar;
}

Isa FromEnv(Isa detected) {
  const char* env = std::getenv("SUBSTRATE_ISA");
  if (!env) return detected;
  Isa want = detected;
  if (!std::strcmp(env, "scalar")) want = Isa::kScalar;
  if (!std::strcmp(env, "avx2")) want = Isa::kAvx2;
  if (!std::strcmp(env, "avx512")) want = Isa::kAvx512;
  if (!std::strcmp(env, "amx")) want = Isa::kAmx;
  return std::min(want, detected);
}

bool IsAmd() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  char vendor[13];
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  vendor[12] = 0;
  return !std::strcmp(vendor, "AuthenticAMD");
#else
  return false;
#endif
}

PrefetchDistances DetectPrefetch() {
  PrefetchDistances d;
  if (IsAmd()) d = {6144, 0};
  if (const char* env = std::getenv("SUBSTRATE_PREFETCH")) {
    int l1 = 0, l2 = 0;
    if (std::sscanf(env, "%d,%d", &l1, &l2) == 2 && l1 >= 0 && l2 >= 0) d = {l1, l2};
  }
  return d;
}

PrefetchDistances& PrefetchStorage() {
  static PrefetchDistances d = DetectPrefetch();
  return d;
}

std::atomic<int>& ActiveStorage() {
  static std::atomic<int> active{static_cast<int>(FromEnv(DetectedIsa()))};
  return active;
}

}  // namespace

Isa DetectedIsa() {
  static const Isa isa = Detect();
  return isa;
}

Isa ActiveIsa() { return static_cast<Isa>(ActiveStorage().load(std::memory_order_relaxed)); }

Isa SetIsaForTesting(Isa isa) {
  Isa clamped = std::min(isa, DetectedIsa());
  return static_cast<Isa>(ActiveStorage().exchange(static_cast<int>(clamped)));
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAmx: return "amx";
  }
  return "?";
}

PrefetchDistances DecodePrefetch() { return PrefetchStorage(); }

PrefetchDistances SetDecodePrefetchForTesting(PrefetchDistances d) {
  return std::exchange(PrefetchStorage(), d);
}

}  // namespace substrate
