// RowReader: a 2-D tensor read from disk a few rows at a time instead of held in memory. A token
// embedding needs one row per token, yet held whole it takes as much memory as dozens of
// streamed experts (qwen2moe-a2.7b: 175 MB, 36 expert slots); out of core those bytes serve the
// expert cache better, for one small read per token.
//
// Every byte is checked as the rest of the runtime checks it: at open the reader reads the
// tensor once, compares it with its range's CRC32C and keeps a CRC32C per block of the file
// (kBlockBytes, aligned for O_DIRECT), so each later read of a row reads and checks the blocks
// the row lies in.
//
// Threading: Read is serialized inside (the reader has one IoReader and one block buffer).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/env.h"
#include "core/memory_ledger.h"
#include "store/store_index.h"

namespace substrate {

class RowReader {
 public:
  static constexpr uint64_t kBlockBytes = 16 << 10;
  // Blocks a row may span: rows up to kBlockBytes * (kMaxRowBlocks - 1) bytes (a row of 16,384
  // F32 or 65,536 Q4_0 values fits with room).
  static constexpr uint64_t kMaxRowBlocks = 4;
  // Whether rows of `row_bytes` are short enough to be read by rows: kMaxRowBlocks covers them
  // wherever they start.
  static constexpr bool RowFits(uint64_t row_bytes) {
    return row_bytes > 0 && row_bytes <= kBlockBytes * (kMaxRowBlocks - 1);
  }

  // Range `r` of `index` holds `rows` rows of `row_bytes` each. Reads it once (in chunks of a
  // few MiB, charged to `ledger` while it lasts) to take the block checksums; Corruption when
  // the range does not match its CRC32C. The block buffer and the checksums stay charged.
  static Expected<std::unique_ptr<RowReader>> Open(const StoreIndex& index, const StoreRange& r,
                                                   int64_t rows, uint64_t row_bytes, IoMode mode,
                                                   MemoryLedger* ledger, Env* env);

  // Copies row ids[i] to dst + i * row_bytes(), for i < n (ids within [0, rows)). Corruption
  // when a block read no longer matches its checksum (the file changed under the session).
  Status Read(const int32_t* ids, int64_t n, uint8_t* dst);

  // What an open reader keeps charged for a range of `bytes`: its block checksums and the
  // buffer of one row's blocks (the open's read buffer comes and goes before).
  static uint64_t HeldBytes(uint64_t bytes) {
    return (bytes / kBlockBytes + 2) * sizeof(uint32_t) + kMaxRowBlocks * kBlockBytes;
  }

  uint64_t row_bytes() const { return row_bytes_; }
  uint64_t bytes_read() const;  // by Read (the open's pass not counted)
  uint64_t rows_read() const;

 private:
  RowReader(const StoreIndex& index, const StoreRange& r) : index_(index), range_(r) {}
  // File offset where block b starts; blocks cover [start_, range end) from a 4096 boundary.
  uint64_t BlockStart(uint64_t b) const { return start_ + b * kBlockBytes; }
  // CRC32C of the part of [data, data + n) (file bytes from `file_offset`) inside the range.
  uint32_t RangeCrc(uint64_t file_offset, const uint8_t* data, uint64_t n) const;

  const StoreIndex& index_;
  const StoreRange range_;
  int64_t rows_ = 0;
  uint64_t row_bytes_ = 0;
  uint64_t start_ = 0;  // range_.offset rounded down to 4096
  std::vector<uint32_t> block_crc_;
  LedgerCharge crc_charge_;
  std::unique_ptr<IoReader> io_;

  mutable std::mutex mu_;
  AlignedBuffer buf_;  // the blocks of one row
  uint64_t bytes_read_ = 0, rows_read_ = 0;
};

}  // namespace substrate
