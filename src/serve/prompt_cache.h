// The prompt cache on disk (--prompt-cache-dir): KV caches of evaluated prompts, kept across
// restarts, so that a prompt starting with a long prefix seen before (a system prompt, an
// agent's growing conversation) restores that prefix instead of evaluating it again.
//
// Entries live in DIR/<model fingerprint>/ as session files (runtime/kv_session: checksummed,
// written to a temporary name and renamed); an index (index.json, written the same way)
// holds each entry's tokens, size and last use. The oldest entries are removed when the total
// passes --prompt-cache-size. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace substrate::serve {

struct PromptCacheStats {
  uint64_t hits = 0;  // lookups that found a longer prefix than the slot had
  uint64_t misses = 0;
  uint64_t stores = 0;
  uint64_t evictions = 0;
  uint64_t restored_tokens = 0;  // prompt tokens restored from disk
  uint64_t entries = 0;
  uint64_t bytes = 0;
};

class DiskPromptCache {
 public:
  // Opens (creating) DIR/<fingerprint as 16 hex digits>/ and reads its index; entries whose
  // file is missing are dropped.
  static Expected<std::unique_ptr<DiskPromptCache>> Open(const std::string& dir,
                                                         uint64_t fingerprint, uint64_t max_bytes);

  struct Hit {
    std::string path;
    size_t common = 0;  // prompt tokens the entry holds
  };
  // The entry sharing the longest prefix with `prompt`, when that is more than `have` tokens
  // plus kMinGain (a restore must be worth reading the file).
  std::optional<Hit> Lookup(const std::vector<int32_t>& prompt, size_t have);
  // After a restore from `hit`: counts it and marks the entry used.
  void Restored(const Hit& hit, size_t tokens);
  // Keeps `tokens` (a session's cached tokens) unless an entry already holds them or more;
  // `save(path)` writes the session file. Evicts the oldest entries beyond the size limit.
  Status Store(const std::vector<int32_t>& tokens,
               const std::function<Status(const std::string&)>& save);

  PromptCacheStats stats() const;
  const std::string& dir() const { return dir_; }

  static constexpr size_t kMinGain = 16;    // tokens
  static constexpr size_t kMinTokens = 32;  // shorter prompts are not worth a file

 private:
  struct Entry {
    std::string file;  // name inside dir_
    std::vector<int32_t> tokens;
    uint64_t bytes = 0;
    uint64_t last_used = 0;
  };
  DiskPromptCache() = default;
  Status WriteIndexLocked();
  void EvictLocked();

  std::string dir_;
  uint64_t max_bytes_ = 0;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
  PromptCacheStats stats_;
};

}  // namespace substrate::serve
