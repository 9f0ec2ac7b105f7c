#include "runtime/read_probe.h"

#include <algorithm>
#include <chrono>

#include "core/aligned_buffer.h"

namespace substrate {

Expected<ReadProbe> ProbeStoreRead(const StoreIndex& index, uint64_t max_bytes,
                                   uint64_t chunk_bytes, IoMode mode, MemoryLedger* ledger) {
  constexpr uint64_t kAlign = 4096;
  if (index.n_files() == 0) return NotFound("store '" + index.dir() + "': no data file to probe");
  size_t largest = 0;
  for (size_t i = 1; i < index.n_files(); ++i)
    if (index.file(i).size() > index.file(largest).size()) largest = i;
  const std::string path = index.file(largest).path();
  // Opened again with O_DIRECT: the store may have been opened without it.
  ASSIGN_OR_RETURN(auto f, RandomAccessFile::Open(path, /*direct_io=*/true));
  uint64_t limit = std::min(f->size(), max_bytes);
  if (limit < f->size()) limit = limit / kAlign * kAlign;
  if (limit == 0) return InvalidArgument("read probe: nothing to read (" + std::to_string(max_bytes) + " bytes asked)");
  const uint64_t chunk = std::max<uint64_t>(kAlign, std::min(chunk_bytes, limit) / kAlign * kAlign);
  ASSIGN_OR_RETURN(AlignedBuffer buf, AlignedBuffer::Allocate(chunk, ledger, "read_probe"));
  auto io = IoReader::Create(mode);
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t off = 0; off < limit; off += chunk)
    RETURN_IF_ERROR(io->Read(*f, off, std::min(chunk, limit - off), buf.data()));
  ReadProbe p;
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  p.file = path.substr(path.rfind('/') + 1);
  p.bytes = limit;
  p.bytes_per_s = p.seconds > 0 ? static_cast<double>(limit) / p.seconds : 0;
  p.direct = f->direct();
  p.uring = io->uring();
  return p;
}

}  // namespace substrate
