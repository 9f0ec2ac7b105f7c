// AlignedBuffer: an owned, aligned, optionally ledger-charged block of bytes. The default
// alignment (4096) suits O_DIRECT reads and every SIMD width.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "core/memory_ledger.h"
#include "core/status.h"

namespace substrate {

// `size` zeroed bytes at `alignment` (free with std::free), or null. Large blocks (weights, KV
// caches: streamed every token) start on a 2 MiB boundary and are advised to use 2 MiB pages
// where the kernel allows (THP "madvise" mode), which cuts TLB misses on those streams; the size
// is not rounded to 2 MiB, so nothing extra is touched.
void* AllocateZeroed(size_t size, size_t alignment);

class AlignedBuffer {
 public:
  static constexpr size_t kDefaultAlignment = 4096;

  AlignedBuffer() = default;
  AlignedBuffer(AlignedBuffer&& o) noexcept { *this = std::move(o); }
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      std::free(data_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      charge_ = std::move(o.charge_);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { std::free(data_); }

  // Allocates `size` bytes (zeroed), charged to `account` of `ledger` when a ledger is given.
  static Expected<AlignedBuffer> Allocate(size_t size, MemoryLedger* ledger = nullptr,
                                          const std::string& account = "scratch",
                                          size_t alignment = kDefaultAlignment);

  uint8_t* data() { return static_cast<uint8_t*>(data_); }
  const uint8_t* data() const { return static_cast<const uint8_t*>(data_); }
  template <typename T>
  T* as() { return static_cast<T*>(data_); }
  template <typename T>
  const T* as() const { return static_cast<const T*>(data_); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  LedgerCharge charge_;
};

}  // namespace substrate
