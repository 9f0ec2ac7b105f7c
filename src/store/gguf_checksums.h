// The checksums of a GGUF read in place (StoreIndex::OpenGguf): a GGUF carries none, so the
// CRC32C of every range the runtime reads (a tensor, or one expert slice) is computed once, in
// one sequential O_DIRECT pass over the file, and kept in a record beside it (FILE.crc32c.json)
// or, where that folder is not writable, in the cache folder ($SUBSTRATE_CACHE_DIR, else
// $XDG_CACHE_HOME/substrate, else $HOME/.cache/substrate). The record names the file's size,
// modification time and sampled weight fingerprint (format/model_fingerprint.h): a file changed
// since is noticed at open (and its checksums taken again); one changed under a running session
// fails the next read of a changed range with a checksum mismatch. A split GGUF has one record,
// beside its first part, naming every part's size and modification time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "format/model_file.h"

namespace substrate {

struct GgufChecksumRange {
  int file = 0;         // the part (ModelFile::file index)
  uint64_t offset = 0;  // in that file
  uint64_t bytes = 0;
  uint32_t crc = 0;     // filled in
};

struct GgufChecksumResult {
  std::string record;     // the record's path ("" when it could not be written)
  bool computed = false;  // false: read from a valid record
  double seconds = 0;     // the checksum pass's time (computed)
};

// Fills every range's crc: from a record of `meta`'s files (their sizes and mtimes, and the
// fingerprint, matching; the same ranges), else by reading `direct` (the files, in meta's order,
// opened with O_DIRECT where allowed) and writing the record. Errors: the files' reads; a record
// that cannot be written is only a warning (the checksums are taken again next time).
Expected<GgufChecksumResult> LoadOrComputeGgufChecksums(const ModelFile& meta,
                                                       const std::vector<const RandomAccessFile*>& direct,
                                                       std::vector<GgufChecksumRange>* ranges,
                                                       Env* env = nullptr);

// The folder of checksum records for files whose own folder is not writable.
std::string GgufChecksumCacheDir();

}  // namespace substrate
