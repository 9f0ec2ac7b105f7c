#include "kernels/profile.h"

#include <atomic>
#include <mutex>

#include "format/dtype.h"

namespace substrate {
namespace {

struct Slot {
  double seconds = 0;
  uint64_t calls = 0, bytes = 0;
};

std::atomic<bool> g_enabled{false};
std::mutex g_mu;
Slot g_slots[64];

}  // namespace

void SetKernelProfiling(bool on) { g_enabled.store(on, std::memory_order_relaxed); }
bool KernelProfilingEnabled() { return g_enabled.load(std::memory_order_relaxed); }

void ResetKernelProfile() {
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto& s : g_slots) s = Slot();
}

void AddKernelProfile(int slot, double seconds, uint64_t bytes) {
  if (slot < 0 || slot >= 64) return;
  std::lock_guard<std::mutex> lock(g_mu);
  g_slots[slot].seconds += seconds;
  g_slots[slot].calls += 1;
  g_slots[slot].bytes += bytes;
}

std::vector<KernelProfileEntry> KernelProfile() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<KernelProfileEntry> out;
  for (int i = 0; i < 64; ++i) {
    if (g_slots[i].calls == 0) continue;
    std::string name = i == kProfileQuantizeAct ? "quantize_act"
                       : i == kProfileAttention
                           ? "attention"
                           : std::string("matmul.") + DTypeName(static_cast<DType>(i));
    out.push_back({name, g_slots[i].seconds, g_slots[i].calls, g_slots[i].bytes});
  }
  return out;
}

}  // namespace substrate
