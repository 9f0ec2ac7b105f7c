#include "runtime/routing_record.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "format/model_fingerprint.h"
#include "store/gguf_checksums.h"

namespace substrate {
namespace {

struct FileKey {
  uint64_t bytes = 0;
  int64_t mtime_ns = 0;
};

std::optional<FileKey> KeyOf(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileKey{static_cast<uint64_t>(st.st_size),
                 static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

// In the cache folder, named by the file's absolute path (not beside the file: a record changes
// with every run, and a model's folder may be shared or read-only).
std::string RecordPath(const std::string& path) {
  std::error_code ec;
  const std::string abs = std::filesystem::absolute(path, ec).lexically_normal().string();
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(Fnv1a(kFnvOffset, abs.data(), abs.size())));
  return GgufChecksumCacheDir() + "/" + std::filesystem::path(path).filename().string() + "." +
         hex + ".routing.json";
}

}  // namespace

void SaveRoutingRecord(const std::string& path, const RoutingRecord& r) {
  const auto key = KeyOf(path);
  if (!key || r.uses < kRoutingRecordMinUses || r.expert_slots <= 0) return;
  const nlohmann::json j = {{"bytes", key->bytes},
                            {"mtime_ns", key->mtime_ns},
                            {"expert_slots", r.expert_slots},
                            {"uses", r.uses},
                            {"hit_rate", r.hit_rate}};
  const std::string p = RecordPath(path);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(p).parent_path(), ec);
  (void)WriteFileAtomic(p, j.dump() + "\n");
}

std::optional<RoutingRecord> LoadRoutingRecord(const std::string& path, int64_t expert_slots) {
  const auto key = KeyOf(path);
  if (!key) return std::nullopt;
  auto text = ReadFileToString(RecordPath(path), 1 << 20);
  if (!text.ok()) return std::nullopt;
  try {  // a damaged or foreign record is no record
    const nlohmann::json j = nlohmann::json::parse(*text);
    const RoutingRecord r{j.at("expert_slots").get<int64_t>(), j.at("uses").get<uint64_t>(),
                          j.at("hit_rate").get<double>()};
    if (j.at("bytes").get<uint64_t>() != key->bytes ||
        j.at("mtime_ns").get<int64_t>() != key->mtime_ns ||
        std::abs(static_cast<double>(r.expert_slots - expert_slots)) >
            kRoutingRecordSlotTolerance * static_cast<double>(expert_slots))
      return std::nullopt;
    if (r.uses >= kRoutingRecordMinUses && r.hit_rate >= 0 && r.hit_rate <= 1) return r;
  } catch (const nlohmann::json::exception&) {
  }
  return std::nullopt;
}

}  // namespace substrate
