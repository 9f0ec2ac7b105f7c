#include "core/aligned_buffer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace substrate {

void* AllocateZeroed(size_t size, size_t alignment) {
  const size_t kHugePage = 2u << 20;
  const bool huge = size >= 2 * kHugePage;
  size_t rounded = (size + alignment - 1) / alignment * alignment;
  if (rounded == 0) rounded = alignment;
  void* p = nullptr;
  if (huge) {
    if (posix_memalign(&p, std::max(alignment, kHugePage), rounded) != 0) p = nullptr;
  } else {
    p = std::aligned_alloc(alignment, rounded);
  }
  if (!p) return nullptr;
#ifdef MADV_HUGEPAGE
  if (huge) madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure is harmless
#endif
  std::memset(p, 0, rounded);  // after the advice, so the first touch gets huge pages
  return p;
}

Expected<AlignedBuffer> AlignedBuffer::Allocate(size_t size, MemoryLedger* ledger,
                                                const std::string& account, size_t alignment) {
  AlignedBuffer buf;
  if (ledger) {
    ASSIGN_OR_RETURN(buf.charge_, ledger->Charge(account, size));
  }
  buf.data_ = AllocateZeroed(size, alignment);
  if (!buf.data_) return OutOfMemory("allocation of " + FormatBytes(size) + " failed");
  buf.size_ = size;
  return buf;
}

}  // namespace substrate
