#include "serve/prompt_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/file_io.h"

namespace substrate::serve {

namespace {

Status MakeDirs(const std::string& path) {
  for (size_t at = 1; at <= path.size(); ++at) {
    if (at != path.size() && path[at] != '/') continue;
    const std::string part = path.substr(0, at);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST)
      return IOError("cannot create '" + part + "': " + std::strerror(errno));
  }
  return Status::Ok();
}

uint64_t HashTokens(const std::vector<int32_t>& t) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t x : t) {
    h = (h ^ static_cast<uint32_t>(x)) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  return h;
}

size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

Expected<std::unique_ptr<DiskPromptCache>> DiskPromptCache::Open(const std::string& dir,
                                                                 uint64_t fingerprint,
                                                                 uint64_t max_bytes) {
  std::unique_ptr<DiskPromptCache> c(new DiskPromptCache());
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fingerprint));
  std::string base = dir;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  c->dir_ = base + "/" + hex;
  c->max_bytes_ = max_bytes;
  RETURN_IF_ERROR(MakeDirs(c->dir_));
  auto index = ReadFileToString(c->dir_ + "/index.json", 1ull << 30);
  if (index.ok()) {
    nlohmann::json j = nlohmann::json::parse(*index, nullptr, false);
    if (!j.is_object() || !j.contains("entries") || !j["entries"].is_array())
      return Corruption("prompt cache index '" + c->dir_ + "/index.json' is damaged");
    for (const auto& e : j["entries"]) {
      Entry entry;
      entry.file = e.value("file", "");
      entry.bytes = e.value("bytes", uint64_t{0});
      entry.last_used = e.value("last_used", uint64_t{0});
      if (e.contains("tokens") && e["tokens"].is_array())
        for (const auto& t : e["tokens"]) entry.tokens.push_back(t.get<int32_t>());
      struct stat st {};
      if (entry.file.empty() || entry.file.find('/') != std::string::npos ||
          ::stat((c->dir_ + "/" + entry.file).c_str(), &st) != 0)
        continue;  // the file is gone: forget the entry
      c->clock_ = std::max(c->clock_, entry.last_used);
      c->entries_.push_back(std::move(entry));
    }
  }
  std::lock_guard<std::mutex> lock(c->mu_);
  c->EvictLocked();
  return c;
}

std::optional<DiskPromptCache::Hit> DiskPromptCache::Lookup(const std::vector<int32_t>& prompt,
                                                            size_t have) {
  std::lock_guard<std::mutex> lock(mu_);
  const Entry* best = nullptr;
  size_t best_n = 0;
  for (const Entry& e : entries_) {
    const size_t n = CommonPrefix(e.tokens, prompt);
    if (n > best_n) best = &e, best_n = n;
  }
  if (!best || best_n < have + kMinGain) {
    ++stats_.misses;
    return std::nullopt;
  }
  return Hit{dir_ + "/" + best->file, best_n};
}

void DiskPromptCache::Restored(const Hit& hit, size_t tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.hits;
  stats_.restored_tokens += tokens;
  for (Entry& e : entries_)
    if (dir_ + "/" + e.file == hit.path) e.last_used = ++clock_;
  (void)WriteIndexLocked();
}

Status DiskPromptCache::Store(const std::vector<int32_t>& tokens,
                              const std::function<Status(const std::string&)>& save) {
  if (tokens.size() < kMinTokens) return Status::Ok();
  char name[40];
  std::snprintf(name, sizeof name, "%016llx.kv",
                static_cast<unsigned long long>(HashTokens(tokens)));
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Entry& e : entries_)
      if (e.tokens.size() >= tokens.size() && CommonPrefix(e.tokens, tokens) == tokens.size()) {
        e.last_used = ++clock_;  // already held (or more)
        return Status::Ok();
      }
  }
  const std::string path = dir_ + "/" + name;
  RETURN_IF_ERROR(save(path));
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return IOError("prompt cache: '" + path + "' vanished");
  std::lock_guard<std::mutex> lock(mu_);
  // An entry this one extends is superseded by it.
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                [&](const Entry& e) {
                                  if (e.file == name) return true;
                                  if (e.tokens.size() < tokens.size() &&
                                      CommonPrefix(e.tokens, tokens) == e.tokens.size()) {
                                    ::unlink((dir_ + "/" + e.file).c_str());
                                    return true;
                                  }
                                  return false;
                                }),
                 entries_.end());
  entries_.push_back({name, tokens, static_cast<uint64_t>(st.st_size), ++clock_});
  ++stats_.stores;
  EvictLocked();
  return WriteIndexLocked();
}

void DiskPromptCache::EvictLocked() {
  uint64_t total = 0;
  for (const Entry& e : entries_) total += e.bytes;
  while (total > max_bytes_ && !entries_.empty()) {
    auto oldest =
        std::min_element(entries_.begin(), entries_.end(),
                         [](const Entry& a, const Entry& b) { return a.last_used < b.last_used; });
    total -= oldest->bytes;
    ::unlink((dir_ + "/" + oldest->file).c_str());
    entries_.erase(oldest);
    ++stats_.evictions;
  }
}

Status DiskPromptCache::WriteIndexLocked() {
  nlohmann::json j = {{"entries", nlohmann::json::array()}};
  for (const Entry& e : entries_)
    j["entries"].push_back(
        {{"file", e.file}, {"bytes", e.bytes}, {"last_used", e.last_used}, {"tokens", e.tokens}});
  return WriteFileAtomic(dir_ + "/index.json", j.dump());
}

PromptCacheStats DiskPromptCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  PromptCacheStats s = stats_;
  s.entries = entries_.size();
  for (const Entry& e : entries_) s.bytes += e.bytes;
  return s;
}

}  // namespace substrate::serve
