#include "runtime/nextn_draft.h"

#include <algorithm>
#include <chrono>

#include "model/sampler.h"

namespace substrate {

Expected<std::unique_ptr<KvCache>> NextnDrafter::NewCache(int64_t n_ctx, DType type) {
  ASSIGN_OR_RETURN(KvCache c, KvCache::Create(NextnCacheHParams(model_->hparams()), n_ctx,
                                              model_->backend(), type));
  return std::make_unique<KvCache>(std::move(c));
}

int64_t NextnDrafter::KeepValid(KvCache& nextn, const std::vector<int32_t>& history) {
  const std::vector<int32_t>& have = nextn.tokens();  // entry i holds t_{i+1}
  size_t m = 0;
  while (m < have.size() && m + 1 < history.size() && have[m] == history[m + 1]) ++m;
  nextn.Truncate(static_cast<int64_t>(m));
  return static_cast<int64_t>(m);
}

Status NextnDrafter::Run(KvCache& nextn, const KvCache& target, const std::vector<int32_t>& history,
                         int64_t upto, std::vector<float>* logits, GenerateStats* st) {
  while (nextn.n_past() < upto) {
    const int64_t p = nextn.n_past();
    const int64_t n = std::min(upto - p, Model::kMaxBatch);
    const bool last = p + n == upto;
    RETURN_IF_ERROR(model_->ForwardNextn(history.data() + p + 1, target.HiddenRow(p), n, nextn,
                                         last ? logits : nullptr, last ? &hidden_ : nullptr));
    ++st->n_draft_passes;
  }
  return Status::Ok();
}

Status NextnDrafter::CatchUp(KvCache& nextn, KvCache& target, const std::vector<int32_t>& history,
                             int64_t upto, PassRunner& passes, GenerateStats* st) {
  const int64_t m = KeepValid(nextn, history);
  upto = std::min<int64_t>(upto, static_cast<int64_t>(history.size()) - 1);
  if (m >= upto || !target.HoldsHidden(m, upto)) return Status::Ok();
  const auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(passes.Exclusive([&] { return Run(nextn, target, history, upto, nullptr, st); }));
  target.DropHiddenBefore(upto);
  st->draft_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::Ok();
}

Expected<std::vector<int32_t>> NextnDrafter::Draft(KvCache& nextn, KvCache& target,
                                                   const std::vector<int32_t>& history, int k,
                                                   PassRunner& passes, GenerateStats* st) {
  std::vector<int32_t> out;
  const int64_t p = target.n_past();  // history[p] is the newest token, not yet evaluated
  if (p <= 0 || static_cast<int64_t>(history.size()) != p + 1) return out;
  // The newest position's entry is evaluated again: its logits give the first draft.
  const int64_t m = std::min(KeepValid(nextn, history), p - 1);
  nextn.Truncate(m);
  // Chained entries after the newest position need room in the cache.
  k = static_cast<int>(std::min<int64_t>(k, nextn.n_ctx() - p + 1));
  if (k <= 0 || !target.HoldsHidden(m, p)) return out;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t V = model_->hparams().n_vocab;
  RETURN_IF_ERROR(passes.Exclusive([&]() -> Status {
    RETURN_IF_ERROR(Run(nextn, target, history, p, &logits_, st));
    for (;;) {
      // Greedy whatever the target samples with: Sampler::Verify keeps the target's
      // distribution for any proposal.
      out.push_back(Argmax(logits_.data(), V));
      if (static_cast<int>(out.size()) == k) break;
      next_hidden_.swap(hidden_);
      RETURN_IF_ERROR(
          model_->ForwardNextn(&out.back(), next_hidden_.data(), 1, nextn, &logits_, &hidden_));
      ++st->n_draft_passes;
    }
    return Status::Ok();
  }));
  // The chained entries took the layer's own hidden state, not the target's: they go.
  nextn.Truncate(p);
  target.DropHiddenBefore(p);
  st->draft_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace substrate
