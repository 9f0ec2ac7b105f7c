#include "runtime/read_probe.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/aligned_buffer.h"
#include "store/crc32c.h"

namespace substrate {
namespace {
// The probe's checks' result goes somewhere, so they cannot be optimised away.
volatile uint32_t g_probe_crc = 0;
}  // namespace

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

Expected<OpReadProbe> ProbeOpReads(const StoreIndex& index, const std::vector<int>& ops,
                                   double warmup_seconds, uint64_t min_bytes, double min_seconds,
                                   uint64_t max_bytes, uint64_t max_buffer, IoMode mode,
                                   MemoryLedger* ledger) {
  constexpr uint64_t kAlign = 4096;
  uint64_t largest_span = 0;
  std::vector<std::unique_ptr<RandomAccessFile>> files(index.n_files());
  for (int o : ops) {
    if (o < 0 || o >= static_cast<int>(index.ops().size()))
      return InvalidArgument("read probe: op " + std::to_string(o) + " is not in the index");
    for (const StoreOp::Span& s : index.ops()[o].spans[0]) {
      largest_span = std::max(largest_span, s.bytes);
      // Opened again with O_DIRECT: the index may have been opened without it.
      if (!files[s.file]) {
        ASSIGN_OR_RETURN(files[s.file], RandomAccessFile::Open(index.file(s.file).path(), true));
      }
    }
  }
  if (largest_span == 0) return InvalidArgument("read probe: no op bytes to read");
  const uint64_t buf_bytes = std::max<uint64_t>(
      kAlign, (std::min(largest_span, max_buffer) + kAlign - 1) / kAlign * kAlign);
  ASSIGN_OR_RETURN(AlignedBuffer buf, AlignedBuffer::Allocate(buf_bytes, ledger, "read_probe"));
  auto io = IoReader::Create(mode);
  OpReadProbe p;
  p.direct = true;
  uint32_t crc = 0;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  bool warm = warmup_seconds <= 0;
  auto t0 = start;  // start of the counted reads
  double check = 0;
  for (size_t i = 0;; i = (i + 1) % ops.size()) {
    const StoreOp& op = index.ops()[ops[i]];
    uint64_t op_bytes = 0;
    for (const StoreOp::Span& s : op.spans[0]) {
      const RandomAccessFile& f = *files[s.file];
      p.direct = p.direct && f.direct();
      for (uint64_t at = 0; at < s.bytes; at += buf_bytes) {
        const uint64_t n = std::min(buf_bytes, s.bytes - at);
        RETURN_IF_ERROR(io->Read(f, s.offset + at, n, buf.data()));
      }
      op_bytes += s.bytes;
    }
    // The worker checks an op's ranges once they are all in: as many bytes, from memory.
    const auto c0 = Clock::now();
    for (uint64_t at = 0; at < op_bytes; at += buf_bytes)
      crc = Crc32c(buf.data(), std::min(buf_bytes, op_bytes - at), crc);
    check += since(c0);
    ++p.n_ops;
    if (!warm) {
      p.warmup_bytes += op_bytes;
      if (since(start) >= warmup_seconds) {
        warm = true;
        t0 = Clock::now();
        check = 0;
      }
      if (p.warmup_bytes >= max_bytes) break;
      continue;
    }
    p.bytes += op_bytes;
    const double t = since(t0);
    if ((p.bytes >= min_bytes && t >= min_seconds) || p.bytes + p.warmup_bytes >= max_bytes) break;
  }
  if (p.bytes == 0) {  // stopped in the warm-up: what it read is all there is
    p.bytes = p.warmup_bytes;
    p.warmup_bytes = 0;
    t0 = start;
  }
  p.seconds = since(t0);
  p.check_seconds = check;
  p.bytes_per_s = p.seconds > 0 ? static_cast<double>(p.bytes) / p.seconds : 0;
  p.uring = io->uring();
  g_probe_crc = crc;
  return p;
}

Expected<OpReadProbe> ProbeConcurrentOpReads(const StoreIndex& index, const std::vector<int>& ops,
                                             int readers, double warmup_seconds, uint64_t min_bytes,
                                             double min_seconds, uint64_t max_bytes,
                                             uint64_t max_buffer, IoMode mode,
                                             MemoryLedger* ledger) {
  readers = std::max(1, std::min(readers, static_cast<int>(ops.size())));
  std::vector<std::vector<int>> share(static_cast<size_t>(readers));
  for (size_t i = 0; i < ops.size(); ++i) share[i % share.size()].push_back(ops[i]);
  std::vector<Expected<OpReadProbe>> got(share.size(), Internal("read probe: not run"));
  std::vector<std::thread> threads;
  for (size_t r = 0; r < share.size(); ++r)
    threads.emplace_back([&, r] {
      got[r] = ProbeOpReads(index, share[r], warmup_seconds, min_bytes, min_seconds, max_bytes,
                            max_buffer, mode, ledger);
    });
  for (std::thread& t : threads) t.join();
  OpReadProbe all;
  all.direct = true;  // held by every reader
  for (auto& g : got) {
    if (!g.ok()) return g.status();
    all.bytes += g->bytes;
    all.warmup_bytes += g->warmup_bytes;
    all.n_ops += g->n_ops;
    all.seconds = std::max(all.seconds, g->seconds);
    all.check_seconds += g->check_seconds;
    all.direct = all.direct && g->direct;
    all.uring = g->uring;
  }
  all.bytes_per_s = all.seconds > 0 ? static_cast<double>(all.bytes) / all.seconds : 0;
  return all;
}

}  // namespace substrate
