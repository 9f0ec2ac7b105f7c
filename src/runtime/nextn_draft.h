// NextnDrafter: speculative decoding's drafter when it is the model's own next-n (multi-token
// prediction) layer (`--draft-mtp`; DeepSeek-V3's MTP module, GLM-4.5's next-n layer). That
// layer predicts the token after next from the main stack's last hidden state at a position and
// the embedding of the token that followed it:
//
//   entry i = NextnLayer(h_i, t_{i+1})  ->  logits of t_{i+2}
//
// Each session keeps a next-n cache (the layer's keys and values, one entry per position, with
// t_{i+1} as the entry's token) in step with the target: the target's passes keep their hidden
// rows (KvCache::set_keep_hidden), and before a draft the entries the accepted tokens added are
// computed from them (the catch-up). The entry of the newest position gives the first draft;
// further drafts chain the layer on its own output hidden state (as vLLM chains DeepSeek's single
// MTP module), and those chained entries are dropped after the draft. The target verifies the
// drafts in one pass, so the output is the target's own.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/model.h"
#include "runtime/engine.h"

namespace substrate {

class NextnDrafter {
 public:
  // `model` has its next-n layer enabled (Model::EnableNextn) and outlives the drafter.
  explicit NextnDrafter(Model* model) : model_(model) {}

  // A session's next-n cache of n_ctx positions (charged to the ledger's kv_cache account).
  Expected<std::unique_ptr<KvCache>> NewCache(int64_t n_ctx, DType type);

  // The entries of `nextn` that still hold for `history` (the tokens of the conversation): those
  // whose following token is the history's. Cuts the cache back to them and returns how many.
  static int64_t KeepValid(KvCache& nextn, const std::vector<int32_t>& history);

  // Computes entries up to position `upto` (exclusive) from `target`'s hidden rows and the
  // history, and lets the target forget the rows used. Does nothing when the rows are not there
  // (a session restored from disk: the next prefill recomputes them, Engine::Prefill).
  Status CatchUp(KvCache& nextn, KvCache& target, const std::vector<int32_t>& history, int64_t upto,
                 PassRunner& passes, GenerateStats* st);

  // Up to `k` tokens greedily continuing `history` (its last token not yet in `target`). Empty
  // when the target's hidden rows for the catch-up are gone.
  Expected<std::vector<int32_t>> Draft(KvCache& nextn, KvCache& target,
                                       const std::vector<int32_t>& history, int k,
                                       PassRunner& passes, GenerateStats* st);

 private:
  // Entries [nextn.n_past(), upto) from target's rows; the last one's logits when asked.
  Status Run(KvCache& nextn, const KvCache& target, const std::vector<int32_t>& history,
             int64_t upto, std::vector<float>* logits, GenerateStats* st);

  Model* model_;
  std::vector<float> logits_, hidden_, next_hidden_;
};

}  // namespace substrate
