// Internal timers for `substrate bench --profile`: how much of a forward pass the kernels take,
// per weight type, and how many bytes they read. Off by default (one relaxed atomic load per
// MatMul); meant for a single-threaded caller of MatMul (the token loop).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace substrate {

struct KernelProfileEntry {
  std::string name;  // "matmul.Q4_K", "quantize_act", "attention"
  double seconds = 0;
  uint64_t calls = 0;
  uint64_t bytes = 0;  // weight bytes read
};

void SetKernelProfiling(bool on);
bool KernelProfilingEnabled();
void ResetKernelProfile();
// Slot: a DType id for matmuls, kProfileQuantizeAct for activation quantization,
// kProfileAttention for attention (bytes: K/V cache read).
constexpr int kProfileQuantizeAct = 63;
constexpr int kProfileAttention = 62;
void AddKernelProfile(int slot, double seconds, uint64_t bytes);
std::vector<KernelProfileEntry> KernelProfile();

}  // namespace substrate
