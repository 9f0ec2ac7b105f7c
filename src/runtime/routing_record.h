// What a run of a MoE read in place learned of its routing: the share of the routed experts'
// uses that its expert cache served, with the cache's slot count. `fit` assumes uniform routing
// (a cache of S of E experts serves S / E of the uses) before any run; a router that concentrates
// (or a trained model's skew) makes that wrong by several times, so a run keeps what it measured
// and later `fit` answers for the same file and slot count use it, and say so.
//
// Kept in the checksum records' cache folder (store/gguf_checksums.h: $SUBSTRATE_CACHE_DIR, else
// $XDG_CACHE_HOME/substrate, else $HOME/.cache/substrate), one file per model path, written
// atomically; the record names the file's size and modification time, so a changed file's
// record is ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace substrate {

struct RoutingRecord {
  int64_t expert_slots = 0;  // the expert cache's slots during the run
  uint64_t uses = 0;         // routed expert uses counted
  double hit_rate = 0;       // of those, the share found in the cache
};

// Fewer uses than this say little about a routing distribution: such runs are not recorded.
constexpr uint64_t kRoutingRecordMinUses = 256;

// Records `r` for the GGUF at `path` (best effort: a record that cannot be written is skipped).
void SaveRoutingRecord(const std::string& path, const RoutingRecord& r);

// A record is used for caches within this share of its slot count: a run's context and batch
// move the slots a little (the hit rate barely), a different budget moves them a lot.
constexpr double kRoutingRecordSlotTolerance = 0.25;

// The record of the GGUF at `path` for a cache of about `expert_slots` slots, if one matches the
// file.
std::optional<RoutingRecord> LoadRoutingRecord(const std::string& path, int64_t expert_slots);

}  // namespace substrate
