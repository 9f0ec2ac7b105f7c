#include "core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace substrate {
namespace {
std::string Errno() { return std::strerror(errno); }
}  // namespace

Expected<std::unique_ptr<RandomAccessFile>> RandomAccessFile::Open(const std::string& path,
                                                                   bool direct_io) {
  int flags = O_RDONLY | O_CLOEXEC;
  bool direct = false;
  int fd = -1;
  if (direct_io) {
    fd = ::open(path.c_str(), flags | O_DIRECT);
    direct = fd >= 0;
  }
  if (fd < 0) fd = ::open(path.c_str(), flags);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound("cannot open '" + path + "': no such file");
    return IOError("cannot open '" + path + "': " + Errno());
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    std::string err = Errno();
    ::close(fd);
    return IOError("cannot stat '" + path + "': " + err);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return InvalidArgument("'" + path + "' is a directory, not a file");
  }
  return std::unique_ptr<RandomAccessFile>(
      new RandomAccessFile(path, fd, static_cast<uint64_t>(st.st_size), direct));
}

RandomAccessFile::~RandomAccessFile() { ::close(fd_); }

Status RandomAccessFile::Read(uint64_t offset, uint64_t n, void* dst) const {
  if (offset > size_ || n > size_ - offset) {
    return Corruption("'" + path_ + "': read of " + std::to_string(n) + " bytes at offset " +
                      std::to_string(offset) + " is past the end of the file (size " +
                      std::to_string(size_) + ")");
  }
  auto* out = static_cast<uint8_t*>(dst);
  while (n > 0) {
    ssize_t got = ::pread(fd_, out, n, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return IOError("'" + path_ + "': read at offset " + std::to_string(offset) + ": " + Errno());
    }
    if (got == 0) return Corruption("'" + path_ + "': unexpected end of file at " + std::to_string(offset));
    out += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
  return Status::Ok();
}

Expected<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::Create(const std::string& path) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return IOError("cannot create '" + tmp + "': " + Errno());
  return std::unique_ptr<AtomicFileWriter>(new AtomicFileWriter(path, tmp, fd));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

Status AtomicFileWriter::FlushBuffer() {
  const char* p = buffer_.data();
  size_t n = buffer_.size();
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return IOError("writing '" + tmp_ + "': " + Errno());
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  buffer_.clear();
  return Status::Ok();
}

Status AtomicFileWriter::Append(const void* data, uint64_t n) {
  if (committed_) return Internal("AtomicFileWriter: append after commit");
  buffer_.append(static_cast<const char*>(data), n);
  offset_ += n;
  if (buffer_.size() >= (8u << 20)) return FlushBuffer();
  return Status::Ok();
}

Status AtomicFileWriter::PadTo(uint64_t alignment) {
  uint64_t pad = (alignment - offset_ % alignment) % alignment;
  if (pad == 0) return Status::Ok();
  std::string zeros(pad, '\0');
  return Append(zeros.data(), pad);
}

Status AtomicFileWriter::Commit() {
  RETURN_IF_ERROR(FlushBuffer());
  if (::fsync(fd_) != 0) return IOError("fsync '" + tmp_ + "': " + Errno());
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    return IOError("rename '" + tmp_ + "' to '" + path_ + "': " + Errno());
  committed_ = true;
  return Status::Ok();
}

Expected<std::string> ReadFileToString(const std::string& path, uint64_t max_bytes) {
  ASSIGN_OR_RETURN(auto file, RandomAccessFile::Open(path));
  if (file->size() > max_bytes)
    return InvalidArgument("'" + path + "' is too large (" + std::to_string(file->size()) + " bytes)");
  std::string s(file->size(), '\0');
  RETURN_IF_ERROR(file->Read(0, s.size(), s.data()));
  return s;
}

Status WriteFileAtomic(const std::string& path, std::string_view contents) {
  ASSIGN_OR_RETURN(auto w, AtomicFileWriter::Create(path));
  RETURN_IF_ERROR(w->Append(contents));
  return w->Commit();
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace substrate
