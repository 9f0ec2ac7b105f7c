#include "core/file_io.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "core/log.h"

namespace substrate {
namespace {

constexpr size_t kFlushBytes = 8u << 20;

// A process with this id exists (kill(pid, 0) reaches it, or it exists but is not ours).
bool ProcessAlive(long pid) {
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

// The PID of "NAME.tmp.PID" for target NAME; 0 when `entry` is not one.
long TempPid(const std::string& entry, const std::string& name) {
  const std::string prefix = name + ".tmp.";
  if (entry.size() <= prefix.size() || entry.compare(0, prefix.size(), prefix) != 0) return 0;
  char* end = nullptr;
  const long pid = std::strtol(entry.c_str() + prefix.size(), &end, 10);
  return *end == '\0' ? pid : 0;
}

// Temporary files of killed writers of `path` (their PID gone); a leftover may be as large as
// the file itself (a 13 MB session, a GB-sized store file), and nothing else removes it.
void RemoveStaleTemps(Env* env, const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  auto children = env->GetChildren(dir);
  if (!children.ok()) return;  // best effort: the write itself succeeded
  for (const std::string& c : *children) {
    const long pid = TempPid(c, name);
    if (pid == 0 || pid == static_cast<long>(::getpid()) || ProcessAlive(pid)) continue;
    Status st = env->RemoveFile(slash == std::string::npos ? c : dir + c);
    if (!st.ok()) LOG_WARN("%s", st.ToString().c_str());
  }
}

}  // namespace

Expected<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::Create(const std::string& path,
                                                                     Env* env) {
  if (!env) env = Env::Default();
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  ASSIGN_OR_RETURN(auto file, env->NewWritableFile(tmp));
  return std::unique_ptr<AtomicFileWriter>(
      new AtomicFileWriter(env, path, std::move(tmp), std::move(file)));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (committed_) return;
  file_.reset();
  (void)env_->RemoveFile(tmp_);
}

Status AtomicFileWriter::FlushBuffer() {
  Status st = file_->Append(buffer_.data(), buffer_.size());
  buffer_.clear();
  return st;
}

Status AtomicFileWriter::Append(const void* data, uint64_t n) {
  if (committed_) return Internal("AtomicFileWriter: append after commit");
  buffer_.append(static_cast<const char*>(data), n);
  offset_ += n;
  if (buffer_.size() >= kFlushBytes) return FlushBuffer();
  return Status::Ok();
}

Status AtomicFileWriter::PadTo(uint64_t alignment) {
  uint64_t pad = (alignment - offset_ % alignment) % alignment;
  if (pad == 0) return Status::Ok();
  std::string zeros(pad, '\0');
  return Append(zeros.data(), pad);
}

Status AtomicFileWriter::Commit() {
  if (committed_) return Internal("AtomicFileWriter: committed twice");
  RETURN_IF_ERROR(FlushBuffer());
  RETURN_IF_ERROR(file_->Sync());
  RETURN_IF_ERROR(file_->Close());
  RETURN_IF_ERROR(env_->RenameFile(tmp_, path_));
  committed_ = true;
  RemoveStaleTemps(env_, path_);
  return Status::Ok();
}

Expected<std::string> ReadFileToString(const std::string& path, uint64_t max_bytes, Env* env) {
  ASSIGN_OR_RETURN(auto file, (env ? env : Env::Default())->NewRandomAccessFile(path, false));
  if (file->size() > max_bytes)
    return InvalidArgument("'" + path + "' is too large (" + std::to_string(file->size()) + " bytes)");
  std::string s(file->size(), '\0');
  RETURN_IF_ERROR(file->Read(0, s.size(), s.data()));
  return s;
}

Status WriteFileAtomic(const std::string& path, std::string_view contents, Env* env) {
  ASSIGN_OR_RETURN(auto w, AtomicFileWriter::Create(path, env));
  RETURN_IF_ERROR(w->Append(contents));
  return w->Commit();
}

bool FileExists(const std::string& path) {
  return Env::Default()->FileExists(path);
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace substrate
