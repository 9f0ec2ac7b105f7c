#include "kernels/cpu_features.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace substrate {
namespace {

Isa Detect() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                __builtin_cpu_supports("avx512dq") &&
                // The AVX-512 units are built with -mavxvnni too, so the compiler may pick
                // VEX-encoded VNNI: require it rather than fault on AVX-512-only parts.
                __builtin_cpu_supports("avxvnni");
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
  return std::min(want, detected);
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

bool CpuHasAvx512Bf16() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = DetectedIsa() == Isa::kAvx512 && __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
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
  }
  return "?";
}

}  // namespace substrate
