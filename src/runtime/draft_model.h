// DraftModel: speculative decoding's drafter when it is a model (`--draft-model M`): a smaller
// model with the target's vocabulary, loaded resident into the target's memory ledger and run on
// its thread pool. Engine::Generate asks it for up to K tokens, the target verifies them in one
// multi-token pass and keeps what plain decoding would have picked (Sampler::Verify), so the
// output is the target's own.
//
// The drafter keeps one KV cache per session, in step with the conversation: before each draft
// it is cut back to the longest prefix it shares with the history (the tokens the target
// rejected go) and only the tokens after that are evaluated, so a draft costs one pass per
// drafted token plus the catch-up of the tokens the target added (its correction, or the token
// after a fully accepted draft).
//
// Budget: the drafter is charged first; the target's plan (resident, or out of core) gets what
// is left of the cap after the drafter's weights, its scratch and one KV cache per session
// (reserve_bytes()).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace substrate {

class DraftModel {
 public:
  // Opens `path` resident, on `pool`, charging opt.ledger (whose cap the target's Open has
  // set): a drafter that does not fit fails with OutOfMemory naming it. Refuses one whose
  // vocabulary (n_vocab, or any token's text) differs from the target's (`target`, opened from
  // `target_path`), naming both files, before reading its weights. `opt` is the target's:
  // device, ledger, KV type, context, sessions.
  static Expected<std::unique_ptr<DraftModel>> Load(const std::string& path,
                                                    const std::string& target_path,
                                                    const ModelFile& target,
                                                    const EngineOptions& opt, ThreadPool* pool);
  // What the target's budget leaves to a drafter at `path` without loading it (Engine::Plan):
  // its weights' file bytes, one run's scratch and KV cache, and the other sessions' KV caches.
  static Expected<uint64_t> EstimateReserve(const std::string& path, const EngineOptions& opt);
  ~DraftModel();

  // Bytes of the budget the drafter takes (charged at load, plus the scratch and the sessions'
  // KV caches it will charge): what the target's plan must leave free.
  uint64_t reserve_bytes() const { return reserve_bytes_; }
  const std::string& path() const { return path_; }
  Engine& engine() { return *engine_; }

  // A session's drafting cache of n_ctx positions (charged to the ledger's kv_cache account).
  Expected<std::unique_ptr<KvCache>> NewCache(int64_t n_ctx);

  // Up to `k` tokens greedily continuing `history`, from `cache` brought in step with it first.
  // Its passes run through `passes` with the model to themselves (PassRunner::Exclusive), so a
  // server's slots may draft while others verify. Counts its passes and time in `st`.
  Expected<std::vector<int32_t>> Draft(KvCache& cache, const std::vector<int32_t>& history, int k,
                                       PassRunner& passes, GenerateStats* st);

 private:
  DraftModel() = default;
  std::string path_;
  std::unique_ptr<Engine> engine_;
  uint64_t reserve_bytes_ = 0;
  std::vector<float> logits_;  // the last drafted position's logits, reused across drafts
};

// Fails (InvalidArgument naming both files) unless the two models share one vocabulary: the same
// n_vocab and, where either has a tokenizer, the same token texts in the same order.
Status CheckSameVocabulary(const std::string& target_path, const Metadata& target,
                           const std::string& draft_path, const Metadata& draft);

}  // namespace substrate
