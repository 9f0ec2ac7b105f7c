#include "runtime/draft_model.h"

#include <algorithm>
#include <chrono>

#include "format/model_file.h"
#include "model/hparams.h"
#include "model/sampler.h"
#include "runtime/residency_manager.h"
#include "tokenizer/tokenizer.h"

namespace substrate {
namespace {

// Rows of the output matrix (or of the tied token embedding): the vocabulary the model scores.
int64_t ScoredVocab(const ModelFile& file) {
  for (const char* name : {"output.weight", "token_embd.weight"})
    for (const TensorInfo& t : file.tensors())
      if (t.name == name && t.ne.size() > 1) return static_cast<int64_t>(t.ne[1]);
  return 0;
}

// The reserve beside the drafter's weights: one run's scratch and KV cache (the rule the
// target's own reserve follows), plus the other sessions' KV caches.
uint64_t RunReserve(const ModelHParams& hp, const EngineOptions& opt, int64_t n_ctx) {
  return EstimateRunReserve(hp, n_ctx, std::min<int64_t>(n_ctx, Model::kMaxBatch), opt.kv_type) +
         KvCache::Bytes(hp, n_ctx, opt.kv_type) *
             static_cast<uint64_t>(std::max(opt.n_sessions, 1) - 1);
}

int64_t ContextOf(const ModelHParams& hp, const EngineOptions& opt) {
  return opt.n_ctx > 0 ? opt.n_ctx : std::min<int64_t>(hp.n_ctx_train, 4096);
}

}  // namespace

Status CheckSameVocabulary(const std::string& target_path, const Metadata& target,
                           const std::string& draft_path, const Metadata& draft) {
  const std::string both = " (target " + target_path + ", draft model " + draft_path + ")";
  auto t = Tokenizer::FromMetadata(target);
  auto d = Tokenizer::FromMetadata(draft);
  if (t.ok() != d.ok())
    return InvalidArgument(std::string("the draft model and the target have different "
                                       "vocabularies: only the ") +
                           (t.ok() ? "target" : "draft model") + " has a tokenizer" + both);
  if (!t.ok()) return Status::Ok();  // token ids only: n_vocab is compared by the caller
  const Vocab& tv = (*t)->vocab();
  const Vocab& dv = (*d)->vocab();
  if (tv.n_tokens() != dv.n_tokens())
    return InvalidArgument("the draft model and the target have different vocabularies: " +
                           std::to_string(dv.n_tokens()) + " tokens against " +
                           std::to_string(tv.n_tokens()) + both);
  for (int i = 0; i < tv.n_tokens(); ++i) {
    if (tv.tokens[static_cast<size_t>(i)] != dv.tokens[static_cast<size_t>(i)])
      return InvalidArgument("the draft model and the target have different vocabularies: token " +
                             std::to_string(i) + " is '" + dv.tokens[static_cast<size_t>(i)] +
                             "' in the draft model and '" + tv.tokens[static_cast<size_t>(i)] +
                             "' in the target" + both);
  }
  return Status::Ok();
}

Expected<std::unique_ptr<DraftModel>> DraftModel::Load(const std::string& path,
                                                       const std::string& target_path,
                                                       const ModelFile& target,
                                                       const EngineOptions& opt, ThreadPool* pool) {
  // The vocabularies first, from the files' metadata: a mismatch fails before any weight read.
  {
    auto file = ModelFile::Open(path);
    if (!file.ok()) return file.status().WithContext("opening draft model '" + path + "'");
    RETURN_IF_ERROR(CheckSameVocabulary(target_path, target.metadata(), path, (*file)->metadata()));
    const int64_t tv = ScoredVocab(target), dv = ScoredVocab(**file);
    if (tv > 0 && dv > 0 && tv != dv)
      return InvalidArgument(
          "the draft model and the target have different vocabularies: the "
          "draft model scores " +
          std::to_string(dv) + " tokens, the target " + std::to_string(tv) + " (target " +
          target_path + ", draft model " + path + ")");
  }
  std::unique_ptr<DraftModel> d(new DraftModel());
  d->path_ = path;
  MemoryLedger* ledger = opt.ledger ? opt.ledger : &MemoryLedger::Global();
  EngineOptions o;
  o.device = opt.device;
  o.gpu = opt.gpu;
  o.pool = pool;
  o.ledger = ledger;  // the cap is the target's, set already
  o.require_tokenizer = false;
  o.kv_type = opt.kv_type;
  o.gguf_in_place = EngineOptions::InPlace::kNever;  // the drafter is the small one: resident
  const uint64_t before = ledger->current();
  auto e = Engine::Load(path, o);
  if (!e.ok()) {
    if (e.status().code() == StatusCode::kOutOfMemory)
      return e.status().WithContext("the draft model " + path +
                                    " is loaded resident and must fit the budget (--max-ram) "
                                    "beside the target's minimum");
    return e.status().WithContext("draft model");
  }
  d->engine_ = std::move(e).value();
  const ModelHParams& hp = d->engine_->model().hparams();
  d->reserve_bytes_ = ledger->current() - before + RunReserve(hp, opt, ContextOf(hp, opt));
  return d;
}

Expected<uint64_t> DraftModel::EstimateReserve(const std::string& path, const EngineOptions& opt) {
  auto file = ModelFile::Open(path);
  if (!file.ok()) return file.status().WithContext("opening draft model '" + path + "'");
  auto hp = ModelHParams::FromMetadata((*file)->metadata());
  if (!hp.ok()) return hp.status().WithContext(path);
  uint64_t weights = 0;
  for (const TensorInfo& t : (*file)->tensors()) weights += t.bytes;
  return weights + RunReserve(*hp, opt, ContextOf(*hp, opt));
}

DraftModel::~DraftModel() = default;

Expected<std::unique_ptr<KvCache>> DraftModel::NewCache(int64_t n_ctx) {
  Model& m = engine_->model();
  ASSIGN_OR_RETURN(KvCache c, KvCache::Create(m.hparams(), n_ctx, m.backend(), engine_->kv_type()));
  return std::make_unique<KvCache>(std::move(c));
}

Expected<std::vector<int32_t>> DraftModel::Draft(KvCache& cache,
                                                 const std::vector<int32_t>& history, int k,
                                                 PassRunner& passes, GenerateStats* st) {
  std::vector<int32_t> out;
  const int64_t h = static_cast<int64_t>(history.size());
  // The cache takes the history and every drafted token but the last.
  k = static_cast<int>(std::min<int64_t>(k, cache.n_ctx() - h + 1));
  if (k <= 0 || h == 0) return out;
  const auto t0 = std::chrono::steady_clock::now();
  Model& m = engine_->model();
  const int64_t V = m.hparams().n_vocab;
  const Tokenizer* tok = engine_->tokenizer();
  RETURN_IF_ERROR(passes.Exclusive([&]() -> Status {
    // In step with the history: keep the prefix they share (the last history token is always
    // evaluated, its logits give the first draft), drop what the target rejected.
    const std::vector<int32_t>& have = cache.tokens();
    size_t common = 0;
    while (common < have.size() && common + 1 < history.size() && have[common] == history[common])
      ++common;
    cache.Truncate(static_cast<int64_t>(common));
    RETURN_IF_ERROR(m.Forward(history.data() + common, h - static_cast<int64_t>(common), cache,
                              false, &logits_));
    ++st->n_draft_passes;
    for (;;) {
      // Greedy whatever the target samples with: Sampler::Verify keeps the target's
      // distribution for any proposal.
      out.push_back(Argmax(logits_.data(), V));
      // Nothing follows an end-of-generation token: the target stops there too.
      if (static_cast<int>(out.size()) == k || (tok && tok->IsEog(out.back()))) break;
      RETURN_IF_ERROR(m.Forward(&out.back(), 1, cache, false, &logits_));
      ++st->n_draft_passes;
    }
    return Status::Ok();
  }));
  st->draft_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace substrate
