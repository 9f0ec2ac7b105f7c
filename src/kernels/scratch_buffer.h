// Per-thread kernel scratch (quantized activations, GEMM panels, attention scores): a 64-byte-
// aligned buffer that grows geometrically (at least doubling, from 16 KiB) to the largest size
// asked of it and is charged to the global ledger's "scratch" account, so a steady forward pass
// allocates nothing, even as the context (and with it the attention scores) grows a token at a
// time. A charge the ledger refuses leaves the buffer
// uncharged rather than failing the kernel (kernels have no error path).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/memory_ledger.h"

namespace substrate {

class ScratchBuffer {
 public:
  uint8_t* Reserve(size_t n) {
    if (bytes_.size() < n + kAlign) {
      bytes_.assign(std::max({n + kAlign, 2 * bytes_.size(), kMinBytes}), 0);
      auto c = MemoryLedger::Global().Charge("scratch", bytes_.size());
      charge_ = c.ok() ? std::move(c).value() : LedgerCharge();
    }
    auto p = reinterpret_cast<uintptr_t>(bytes_.data());
    return bytes_.data() + (kAlign - p % kAlign) % kAlign;
  }

 private:
  static constexpr size_t kAlign = 64;
  static constexpr size_t kMinBytes = 16 << 10;
  std::vector<uint8_t> bytes_;
  LedgerCharge charge_;
};

}  // namespace substrate
