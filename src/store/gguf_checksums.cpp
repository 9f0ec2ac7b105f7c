#include "store/gguf_checksums.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/aligned_buffer.h"
#include "core/file_io.h"
#include "core/log.h"
#include "format/model_fingerprint.h"
#include "store/crc32c.h"

namespace substrate {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "substrate-gguf-crc32c";
constexpr uint64_t kChunk = 16ull << 20;  // bytes per read of the checksum pass
constexpr uint64_t kAlign = 4096;

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Size and modification time of the file (the first part of a split), and of the other parts.
struct FileKey {
  uint64_t bytes = 0;
  int64_t mtime_ns = 0;
  json parts = json::array();  // [[bytes, mtime_ns], ...] of parts 2..N
  std::string fingerprint;

  bool operator==(const FileKey& o) const {
    return bytes == o.bytes && mtime_ns == o.mtime_ns && parts == o.parts;
  }
};

Expected<FileKey> KeyOf(const ModelFile& meta) {
  FileKey k;
  for (int i = 0; i < meta.n_files(); ++i) {
    const std::string& path = meta.file(i).path();
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return IOError("cannot stat '" + path + "'");
    const auto bytes = static_cast<uint64_t>(st.st_size);
    const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    if (i == 0) {
      k.bytes = bytes;
      k.mtime_ns = mtime;
    } else {
      k.parts.push_back({bytes, mtime});
    }
  }
  ASSIGN_OR_RETURN(uint64_t fp, WeightFingerprint(meta));
  k.fingerprint = Hex(fp);
  return k;
}

// Beside the file, then in the cache folder (named by the file's absolute path).
std::vector<std::string> RecordPaths(const std::string& path) {
  std::error_code ec;
  const std::string abs = std::filesystem::absolute(path, ec).lexically_normal().string();
  const std::string base = std::filesystem::path(path).filename().string();
  return {path + ".crc32c.json",
          GgufChecksumCacheDir() + "/" + base + "." + Hex(Fnv1a(kFnvOffset, abs.data(), abs.size())) +
              ".crc32c.json"};
}

// The record's checksums when it describes this file and these ranges, else false.
bool ReadRecord(const std::string& rpath, const FileKey& key,
                std::vector<GgufChecksumRange>* ranges, Env* env) {
  auto text = ReadFileToString(rpath, 1ull << 30, env);
  if (!text.ok()) return false;
  try {
    const json j = json::parse(*text);
    if (j.value("format", "") != kFormat || j.at("bytes").get<uint64_t>() != key.bytes ||
        j.at("mtime_ns").get<int64_t>() != key.mtime_ns ||
        j.value("parts", json::array()) != key.parts ||
        j.at("fingerprint").get<std::string>() != key.fingerprint)
      return false;
    const json& r = j.at("ranges");
    if (r.size() != ranges->size()) return false;
    std::vector<uint32_t> crc(ranges->size());
    for (size_t i = 0; i < ranges->size(); ++i) {
      // [offset, bytes, crc] or, in a part after the first, [offset, bytes, crc, part].
      const int file = r[i].size() > 3 ? r[i].at(3).get<int>() : 0;
      if (r[i].at(0).get<uint64_t>() != (*ranges)[i].offset ||
          r[i].at(1).get<uint64_t>() != (*ranges)[i].bytes || file != (*ranges)[i].file)
        return false;
      crc[i] = r[i].at(2).get<uint32_t>();
    }
    for (size_t i = 0; i < ranges->size(); ++i) (*ranges)[i].crc = crc[i];
    return true;
  } catch (const json::exception&) {
    return false;  // a damaged record is taken again
  }
}

Status WriteRecord(const std::string& rpath, const FileKey& key,
                   const std::vector<GgufChecksumRange>& ranges, Env* env) {
  json r = json::array();
  for (const GgufChecksumRange& g : ranges) {
    r.push_back({g.offset, g.bytes, g.crc});
    if (g.file != 0) r.back().push_back(g.file);
  }
  json j{{"format", kFormat}, {"version", 1}, {"bytes", key.bytes},
         {"mtime_ns", key.mtime_ns}, {"fingerprint", key.fingerprint}, {"ranges", r}};
  if (!key.parts.empty()) j["parts"] = key.parts;
  ASSIGN_OR_RETURN(auto w, AtomicFileWriter::Create(rpath, env));
  RETURN_IF_ERROR(w->Append(j.dump()));
  return w->Commit();
}

// One sequential pass over file `file`: the CRC32C of each of its ranges, reading aligned chunks
// (ranges do not overlap).
Status ComputeFile(const RandomAccessFile& f, int file, std::vector<GgufChecksumRange>* ranges) {
  std::vector<size_t> order;
  for (size_t i = 0; i < ranges->size(); ++i)
    if ((*ranges)[i].file == file) order.push_back(i);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return (*ranges)[a].offset < (*ranges)[b].offset; });
  if (order.empty()) return Status::Ok();
  ASSIGN_OR_RETURN(AlignedBuffer buf, AlignedBuffer::Allocate(kChunk));
  auto io = IoReader::Create(IoMode::kAuto);
  size_t next = 0;  // first range not finished
  const uint64_t start = (*ranges)[order[0]].offset / kAlign * kAlign;
  for (uint64_t c0 = start; c0 < f.size() && next < order.size(); c0 += kChunk) {
    const uint64_t n = std::min(kChunk, f.size() - c0);
    RETURN_IF_ERROR(io->Read(f, c0, n, buf.data()));
    if (!f.direct() && f.fd() >= 0)  // buffered: keep the pass out of the page cache
      ::posix_fadvise(f.fd(), static_cast<off_t>(c0), static_cast<off_t>(n), POSIX_FADV_DONTNEED);
    const uint64_t c1 = c0 + n;
    for (size_t i = next; i < order.size(); ++i) {
      GgufChecksumRange& g = (*ranges)[order[i]];
      if (g.offset >= c1) break;
      const uint64_t b = std::max(g.offset, c0), e = std::min(g.offset + g.bytes, c1);
      if (e > b) g.crc = Crc32c(buf.data() + (b - c0), e - b, g.crc);
      if (g.offset + g.bytes <= c1 && i == next) ++next;
    }
  }
  return Status::Ok();
}

}  // namespace

std::string GgufChecksumCacheDir() {
  if (const char* d = std::getenv("SUBSTRATE_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/substrate";
  if (const char* d = std::getenv("HOME"); d && *d) return std::string(d) + "/.cache/substrate";
  return "/tmp/substrate-cache";
}

Expected<GgufChecksumResult> LoadOrComputeGgufChecksums(const ModelFile& meta,
                                                       const std::vector<const RandomAccessFile*>& direct,
                                                       std::vector<GgufChecksumRange>* ranges,
                                                       Env* env) {
  ASSIGN_OR_RETURN(FileKey key, KeyOf(meta));
  GgufChecksumResult res;
  const std::vector<std::string> paths = RecordPaths(meta.path());
  for (const std::string& p : paths)
    if (ReadRecord(p, key, ranges, env)) {
      res.record = p;
      return res;
    }
  for (GgufChecksumRange& g : *ranges) g.crc = 0;
  LOG_WARN("%s: taking the checksums of its %zu weight ranges (once; kept in a record beside it "
           "or in %s)", meta.path().c_str(), ranges->size(), GgufChecksumCacheDir().c_str());
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < direct.size(); ++i)
    RETURN_IF_ERROR(ComputeFile(*direct[i], static_cast<int>(i), ranges)
                        .WithContext("checksumming '" + direct[i]->path() + "'"));
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.computed = true;
  // The file may have changed while it was read: its key then differs and the record is not kept.
  ASSIGN_OR_RETURN(FileKey after, KeyOf(meta));
  if (!(after == key))
    return Corruption("'" + meta.path() + "' changed while its checksums were taken");
  for (const std::string& p : paths) {
    if (p != paths.front()) {
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(p).parent_path(), ec);
    }
    if (WriteRecord(p, key, *ranges, env).ok()) {
      res.record = p;
      return res;
    }
  }
  LOG_WARN("%s: could not keep its checksum record (neither beside it nor in %s)",
           meta.path().c_str(), GgufChecksumCacheDir().c_str());
  return res;
}

}  // namespace substrate
