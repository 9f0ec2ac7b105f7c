// Buffer: a block of a backend's memory (host RAM for the CPU backend, device memory for a GPU
// one), owned, charged to the memory ledger, and given back to its backend when destroyed.
#pragma once

#include <cstddef>
#include <utility>

#include "core/memory_ledger.h"

namespace substrate {

class Buffer {
 public:
  // How the memory is given back: free(ctx, data).
  using FreeFn = void (*)(void* ctx, void* data);

  Buffer() = default;
  Buffer(void* data, size_t size, LedgerCharge charge, FreeFn free_fn, void* ctx)
      : data_(data), size_(size), charge_(std::move(charge)), free_(free_fn), ctx_(ctx) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      Reset();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      charge_ = std::move(o.charge_);
      free_ = std::exchange(o.free_, nullptr);
      ctx_ = std::exchange(o.ctx_, nullptr);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Reset(); }

  // Backend memory: the host may dereference it only when the backend says its memory is the
  // host's (CpuBackend).
  void* data() const { return data_; }
  size_t size() const { return size_; }

  void Reset() {
    if (data_ && free_) free_(ctx_, data_);
    data_ = nullptr;
    size_ = 0;
    charge_.Reset();
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  LedgerCharge charge_;
  FreeFn free_ = nullptr;
  void* ctx_ = nullptr;
};

}  // namespace substrate
