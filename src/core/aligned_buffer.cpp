#include "core/aligned_buffer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace substrate {

Expected<AlignedBuffer> AlignedBuffer::Allocate(size_t size, MemoryLedger* ledger,
                                                const std::string& account, size_t alignment) {
  AlignedBuffer buf;
  if (ledger) {
    ASSIGN_OR_RETURN(buf.charge_, ledger->Charge(account, size));
  }
  // Large buffers (weights, KV cache) are streamed every token: back them with 2 MiB pages
  // where the kernel allows (THP "madvise" mode), which cuts TLB misses on those streams.
  // The start is 2 MiB-aligned; the size is not rounded to 2 MiB, so nothing extra is touched.
  const size_t kHugePage = 2u << 20;
  const bool huge = size >= 2 * kHugePage;
  size_t rounded = (size + alignment - 1) / alignment * alignment;
  if (rounded == 0) rounded = alignment;
  if (huge) {
    if (posix_memalign(&buf.data_, std::max(alignment, kHugePage), rounded) != 0) buf.data_ = nullptr;
  } else {
    buf.data_ = std::aligned_alloc(alignment, rounded);
  }
  if (!buf.data_) return OutOfMemory("allocation of " + FormatBytes(size) + " failed");
#ifdef MADV_HUGEPAGE
  if (huge) madvise(buf.data_, rounded, MADV_HUGEPAGE);  // advice only: failure is harmless
#endif
  std::memset(buf.data_, 0, rounded);  // after the advice, so the first touch gets huge pages
  buf.size_ = size;
  return buf;
}

}  // namespace substrate
