#include "core/aligned_buffer.h"

#include <cstring>

namespace substrate {

Expected<AlignedBuffer> AlignedBuffer::Allocate(size_t size, MemoryLedger* ledger,
                                                const std::string& account, size_t alignment) {
  AlignedBuffer buf;
  if (ledger) {
    ASSIGN_OR_RETURN(buf.charge_, ledger->Charge(account, size));
  }
  size_t rounded = (size + alignment - 1) / alignment * alignment;
  if (rounded == 0) rounded = alignment;
  buf.data_ = std::aligned_alloc(alignment, rounded);
  if (!buf.data_) return OutOfMemory("allocation of " + FormatBytes(size) + " failed");
  std::memset(buf.data_, 0, rounded);
  buf.size_ = size;
  return buf;
}

}  // namespace substrate
