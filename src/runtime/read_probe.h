// ReadProbe: the disk's read rate measured in the same run as a streamed decode, for `bench
// --store` to set the runtime's disk read rate against — the dd iflag=direct of the run: one data
// file of the store (its largest) read from the start with O_DIRECT through the same IoReader the
// prefetch scheduler uses (io_uring with requests in flight, or pread), into one ledger-charged
// buffer reused chunk by chunk.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/memory_ledger.h"
#include "core/status.h"
#include "store/store_index.h"

namespace substrate {

struct ReadProbe {
  std::string file;  // data file name within the store
  uint64_t bytes = 0;
  double seconds = 0;
  double bytes_per_s = 0;
  bool direct = false;  // O_DIRECT held (false where the filesystem refused it: page cache)
  bool uring = false;
};

// Reads up to max_bytes of the store's largest data file in chunks of chunk_bytes (rounded to
// 4096) charged to `ledger` (account "read_probe"). NotFound when the store has no data file.
Expected<ReadProbe> ProbeStoreRead(const StoreIndex& index, uint64_t max_bytes,
                                   uint64_t chunk_bytes, IoMode mode, MemoryLedger* ledger);

// The rate at which the prefetch scheduler's worker gets an op's bytes ready, measured the way it
// reads them: each op of `ops` in turn (cycling through the list), every span of its tier 0 read
// with O_DIRECT through one IoReader (io_uring with requests in flight, or pread), then CRC32C
// over the op's bytes before the next op's reads start (PrefetchScheduler::Execute: the disk
// idles while the worker checks). The reads of the first warmup_seconds are not counted (a VM's
// disk may take a moment to reach its sustained rate, which a decode then keeps); counted reads
// go on until both min_bytes and min_seconds are passed, or max_bytes (warm-up included) are
// read. A span larger than the buffer (max_buffer, rounded to 4096; ledger account
// "read_probe") is read in buffer-sized parts.
struct OpReadProbe {
  uint64_t bytes = 0;         // counted (after the warm-up)
  uint64_t warmup_bytes = 0;  // read during the warm-up
  int n_ops = 0;              // op reads done, warm-up included (an op read again counts again)
  double seconds = 0;         // counted reads and checks
  double check_seconds = 0;   // of which CRC32C
  double bytes_per_s = 0;     // bytes / seconds: the worker's rate, checks included
  bool direct = false;
  bool uring = false;
};
Expected<OpReadProbe> ProbeOpReads(const StoreIndex& index, const std::vector<int>& ops,
                                   double warmup_seconds, uint64_t min_bytes, double min_seconds,
                                   uint64_t max_bytes, uint64_t max_buffer, IoMode mode,
                                   MemoryLedger* ledger);

// The disk as an expert cache's misses meet it: `readers` threads (the prefetch scheduler's
// workers) each running ProbeOpReads over its share of `ops` (routed experts, in no order), at
// the same time. bytes_per_s: all counted bytes over the slowest reader's counted time; the
// other limits are ProbeOpReads', per reader. A sequential read from a file's start can claim
// more than such reads get (a virtual disk whose host reads ahead), so a bench holding a decode
// against the disk needs this rate.
Expected<OpReadProbe> ProbeConcurrentOpReads(const StoreIndex& index, const std::vector<int>& ops,
                                             int readers, double warmup_seconds, uint64_t min_bytes,
                                             double min_seconds, uint64_t max_bytes,
                                             uint64_t max_buffer, IoMode mode,
                                             MemoryLedger* ledger);

}  // namespace substrate
