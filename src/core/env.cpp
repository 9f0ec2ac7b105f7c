#include "core/env.h"

namespace substrate {

Expected<std::unique_ptr<RandomAccessFile>> RandomAccessFile::Open(const std::string& path,
                                                                   bool direct_io) {
  return Env::Default()->NewRandomAccessFile(path, direct_io);
}

Status RandomAccessFile::Read(uint64_t offset, uint64_t n, void* dst) const {
  if (offset > size_ || n > size_ - offset) {
    return Corruption("'" + path_ + "': read of " + std::to_string(n) + " bytes at offset " +
                      std::to_string(offset) + " is past the end of the file (size " +
                      std::to_string(size_) + ")");
  }
  auto* out = static_cast<uint8_t*>(dst);
  while (n > 0) {
    ASSIGN_OR_RETURN(uint64_t got, ReadAt(offset, n, out));
    if (got == 0)
      return Corruption("'" + path_ + "': unexpected end of file at " + std::to_string(offset) +
                        " (file changed under the reader?)");
    out += got;
    offset += got;
    n -= got;
  }
  return Status::Ok();
}

Expected<IoMode> ParseIoMode(const std::string& s) {
  if (s == "auto") return IoMode::kAuto;
  if (s == "uring") return IoMode::kUring;
  if (s == "pread") return IoMode::kPread;
  return InvalidArgument("io mode '" + s + "': expected auto, uring or pread");
}

std::unique_ptr<IoReader> IoReader::Create(IoMode mode, Env* env) {
  return (env ? env : Env::Default())->NewIoReader(mode);
}

}  // namespace substrate
