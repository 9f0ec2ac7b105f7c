// ReadProbe: the disk's read rate measured in the same run as a streamed decode, for `bench
// --store` to set the runtime's disk read rate against — the dd iflag=direct of the run: one data
// file of the store (its largest) read from the start with O_DIRECT through the same IoReader the
// prefetch scheduler uses (io_uring with requests in flight, or pread), into one ledger-charged
// buffer reused chunk by chunk.
#pragma once

#include <cstdint>
#include <string>

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

}  // namespace substrate
