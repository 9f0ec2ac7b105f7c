#include "runtime/row_reader.h"

#include <fcntl.h>

#include <algorithm>
#include <cstring>

#include "store/crc32c.h"

namespace substrate {
namespace {
constexpr uint64_t kAlign = 4096;
constexpr uint64_t kOpenChunk = 4 << 20;  // per read of the open's pass (a multiple of blocks)

// A file system that refused O_DIRECT: drop what a read cached, or the page cache would come to
// hold the table this reader exists not to hold.
void DropCached(const RandomAccessFile& f, uint64_t offset, uint64_t n) {
  if (!f.direct() && f.fd() >= 0)
    ::posix_fadvise(f.fd(), static_cast<off_t>(offset), static_cast<off_t>(n), POSIX_FADV_DONTNEED);
}
}  // namespace

uint32_t RowReader::RangeCrc(uint64_t file_offset, const uint8_t* data, uint64_t n) const {
  const uint64_t lo = std::max(file_offset, range_.offset);
  const uint64_t hi = std::min(file_offset + n, range_.offset + range_.bytes);
  return hi > lo ? Crc32c(data + (lo - file_offset), hi - lo) : 0;
}

Expected<std::unique_ptr<RowReader>> RowReader::Open(const StoreIndex& index, const StoreRange& r,
                                                     int64_t rows, uint64_t row_bytes, IoMode mode,
                                                     MemoryLedger* ledger, Env* env) {
  if (rows <= 0 || row_bytes == 0 || static_cast<uint64_t>(rows) * row_bytes != r.bytes)
    return InvalidArgument(r.what + ": " + std::to_string(r.bytes) + " bytes are not " +
                           std::to_string(rows) + " rows of " + std::to_string(row_bytes));
  std::unique_ptr<RowReader> rr(new RowReader(index, r));
  rr->rows_ = rows;
  rr->row_bytes_ = row_bytes;
  rr->start_ = r.offset / kAlign * kAlign;
  const uint64_t end = r.offset + r.bytes;
  const uint64_t n_blocks = (end - rr->start_ + kBlockBytes - 1) / kBlockBytes;
  if (ledger) {
    ASSIGN_OR_RETURN(rr->crc_charge_, ledger->Charge("weights", n_blocks * sizeof(uint32_t)));
  }
  rr->block_crc_.resize(n_blocks);
  if (!RowFits(row_bytes))
    return InvalidArgument(r.what + ": rows of " + std::to_string(row_bytes) +
                           " bytes are too long to read by rows");
  ASSIGN_OR_RETURN(rr->buf_,
                   AlignedBuffer::Allocate(kMaxRowBlocks * kBlockBytes, ledger, "weights"));
  rr->io_ = (env ? env : Env::Default())->NewIoReader(mode);

  // One pass over the range: each block's checksum, and the whole range's against the index.
  const RandomAccessFile& f = index.file(r.file);
  ASSIGN_OR_RETURN(AlignedBuffer chunk, AlignedBuffer::Allocate(kOpenChunk, ledger, "stream"));
  uint32_t whole = 0;
  for (uint64_t pos = rr->start_; pos < end; pos += kOpenChunk) {
    const uint64_t n = std::min(kOpenChunk, end - pos);
    RETURN_IF_ERROR(rr->io_->Read(f, pos, n, chunk.data()));
    DropCached(f, pos, n);
    for (uint64_t b = 0; b * kBlockBytes < n; ++b) {
      const uint64_t at = pos + b * kBlockBytes;
      const uint64_t len = std::min(kBlockBytes, end - at);
      const uint8_t* data = chunk.data() + b * kBlockBytes;
      rr->block_crc_[(at - rr->start_) / kBlockBytes] = rr->RangeCrc(at, data, len);
      const uint64_t lo = std::max(at, r.offset);
      whole = Crc32c(data + (lo - at), at + len - lo, whole);
    }
  }
  RETURN_IF_ERROR(index.CheckCrc(r, whole));
  return rr;
}

Status RowReader::Read(const int32_t* ids, int64_t n, uint8_t* dst) {
  std::lock_guard<std::mutex> lock(mu_);
  const RandomAccessFile& f = index_.file(range_.file);
  const uint64_t end = range_.offset + range_.bytes;
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= rows_)
      return InvalidArgument(range_.what + ": row " + std::to_string(ids[i]) + " of " +
                             std::to_string(rows_));
    const uint64_t at = range_.offset + static_cast<uint64_t>(ids[i]) * row_bytes_;
    const uint64_t b0 = (at - start_) / kBlockBytes;
    const uint64_t b1 = (at + row_bytes_ - 1 - start_) / kBlockBytes;
    const uint64_t from = BlockStart(b0), to = std::min(BlockStart(b1 + 1), end);
    RETURN_IF_ERROR(io_->Read(f, from, to - from, buf_.data()));
    DropCached(f, from, to - from);
    for (uint64_t b = b0; b <= b1; ++b) {
      const uint64_t bs = BlockStart(b);
      const uint64_t len = std::min(kBlockBytes, end - bs);
      const uint32_t got = RangeCrc(bs, buf_.data() + (bs - from), len);
      if (got != block_crc_[b])
        return Corruption("'" + f.path() + "': " + range_.what + ", block at offset " +
                          std::to_string(bs) + ": checksum mismatch (crc32c " +
                          std::to_string(got) + ", " + std::to_string(block_crc_[b]) +
                          " when the session opened): the file changed under the running "
                          "session; stopping rather than computing with mixed bytes");
    }
    std::memcpy(dst + static_cast<uint64_t>(i) * row_bytes_, buf_.data() + (at - from), row_bytes_);
    bytes_read_ += to - from;
  }
  rows_read_ += static_cast<uint64_t>(n);
  return Status::Ok();
}

uint64_t RowReader::bytes_read() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_read_;
}

uint64_t RowReader::rows_read() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rows_read_;
}

}  // namespace substrate
