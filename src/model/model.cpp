#include "model/model.h"

#include <algorithm>
#include <optional>

#include "backend/cpu/cpu_backend.h"
#include "format/model_file.h"
#include "model/arch.h"

namespace substrate {

Model::~Model() = default;

Expected<std::unique_ptr<Model>> Model::Create(const Metadata& md, WeightSource* source,
                                               ThreadPool* pool, MemoryLedger* ledger) {
  auto backend = std::make_unique<CpuBackend>(pool, ledger);
  ASSIGN_OR_RETURN(auto m, Create(md, source, backend.get(), ledger));
  m->own_backend_ = std::move(backend);
  return m;
}

Expected<std::unique_ptr<Model>> Model::Create(const Metadata& md, WeightSource* source,
                                               Backend* backend, MemoryLedger* ledger) {
  std::unique_ptr<Model> m(new Model());
  ASSIGN_OR_RETURN(m->hp_, ModelHParams::FromMetadata(md));
  ModelHParams& hp = m->hp_;
  m->source_ = source;
  m->backend_ = backend;
  m->scratch_ = std::make_unique<Scratch>(backend, ledger);

  const uint64_t d = static_cast<uint64_t>(hp.n_embd);
  ASSIGN_OR_RETURN(m->token_embd_, RequireTensor(*source, "token_embd.weight", {d, 0}));
  ASSIGN_OR_RETURN(m->output_norm_, RequireTensor(*source, "output_norm.weight", {d}));
  ASSIGN_OR_RETURN(m->output_, OptionalTensor(*source, "output.weight", {d, 0}));
  if (m->output_ == kNoTensor) m->output_ = m->token_embd_;  // tied embeddings
  hp.n_vocab = static_cast<int64_t>(source->Info(m->output_).ne[1]);
  RETURN_IF_ERROR(m->ResolveLayers());
  return m;
}

Status Model::ResolveLayers() {
  ModelHParams& hp = hp_;
  ops_ = ListOps(hp, [&](const std::string& n) { return source_->Resolve(n) != kNoTensor; });
  op_index_.clear();
  for (size_t i = 0; i < ops_.size(); ++i) op_index_[ops_[i].id] = static_cast<int>(i);
  op_tiers_.assign(ops_.size(), static_cast<uint8_t>(source_->DefaultTier()));
  source_->BindOpTiers(ops_, op_tiers_.data());
  embd_op_ = OpIndex(OpIdTokenEmbd());
  output_op_ = OpIndex(OpIdOutput());

  layers_.resize(static_cast<size_t>(hp.n_layer));
  for (int il = 0; il < hp.n_layer; ++il) RETURN_IF_ERROR(ResolveLayer(il, &layers_[il]));
  nextn_ = LayerWeights();
  if (hp.list_nextn) {
    RETURN_IF_ERROR(ResolveLayer(hp.n_layer, &nextn_));
    RETURN_IF_ERROR(ResolveSlots(*source_, hp.n_layer, NextnTensors(hp), &nextn_));
    nextn_.nextn_op = OpIndex(OpIdNextn(hp.n_layer));
  }
  return Status::Ok();
}

Status Model::ResolveLayer(int il, LayerWeights* wp) {
  const ModelHParams& hp = hp_;
  LayerWeights& w = *wp;
  RETURN_IF_ERROR(ResolveSlots(*source_, il, hp.spec->attention_tensors(hp), &w));
  w.attn_op = OpIndex(OpIdAttention(il));
  if (!hp.is_moe_layer(il)) {
    RETURN_IF_ERROR(ResolveSlots(*source_, il, FfnTensors(hp), &w));
    w.ffn_op = OpIndex(OpIdFfn(il));
  } else {
    RETURN_IF_ERROR(ResolveSlots(*source_, il, MoeRouterTensors(hp), &w));
    RETURN_IF_ERROR(ResolveSlots(*source_, il, MoeExpertTensors(hp), &w));
    RETURN_IF_ERROR(ResolveSlots(*source_, il, MoeSharedTensors(hp), &w));
    w.router_op = OpIndex(OpIdMoeRouter(il));
    w.expert_op0 = OpIndex(OpIdMoeExpert(il, 0));
    w.shared_op = OpIndex(OpIdMoeShared(il));
    // A shared expert is gate, up and down of one width.
    const bool any = w.gate_shexp != kNoTensor || w.up_shexp != kNoTensor ||
                     w.down_shexp != kNoTensor;
    if (any) {
      const bool all = w.gate_shexp != kNoTensor && w.up_shexp != kNoTensor &&
                       w.down_shexp != kNoTensor;
      const bool same = all && source_->Info(w.gate_shexp).ne[1] == source_->Info(w.up_shexp).ne[1] &&
                        source_->Info(w.gate_shexp).ne[1] == source_->Info(w.down_shexp).ne[0];
      if (!same)
        return Corruption("layer " + std::to_string(il) +
                          ": the shared expert needs ffn_{gate,up,down}_shexp of one width");
    }
  }
  if (hp.spec->check_layer) RETURN_IF_ERROR(hp.spec->check_layer(hp, il, w));
  if (w.q_norm != kNoTensor) hp_.qk_norm = true;
  return Status::Ok();
}

Status Model::EnableNextn() {
  if (hp_.n_nextn == 0)
    return NotFound("the model has no next-n (multi-token prediction) layer: its metadata has no " +
                    hp_.arch + ".nextn_predict_layers");
  if (hp_.list_nextn) return Status::Ok();
  hp_.list_nextn = true;
  Status st = ResolveLayers();
  if (st.ok()) return st;
  hp_.list_nextn = false;
  RETURN_IF_ERROR(ResolveLayers());
  return st.WithContext("the next-n layer blk." + std::to_string(hp_.n_layer));
}

Status Model::ForwardNextn(const int32_t* next_tokens, const float* hidden, int64_t n,
                           KvCache& cache, std::vector<float>* logits,
                           std::vector<float>* hidden_out) {
  if (!nextn_enabled()) return InvalidArgument("a next-n pass without the next-n layer enabled");
  RETURN_IF_ERROR(CheckTokens(next_tokens, n, cache));
  if (n > kMaxBatch) return InvalidArgument("a next-n pass of more than one batch");
  const int il = hp_.n_layer;
  const LayerWeights& w = nextn_;
  const int64_t d = hp_.n_embd;
  ForwardContext c;
  c.hp = &hp_;
  c.source = source_;
  c.be = backend_;
  c.scratch = scratch_.get();
  c.n = n;
  pos_.clear();
  for (int64_t t = 0; t < n; ++t) pos_.push_back(static_cast<int32_t>(cache.n_past() + t));
  seq_rows_.assign(1, SequenceRows{&cache, 0, n, cache.n_past()});
  c.pos = pos_.data();
  c.seqs = seq_rows_.data();
  c.n_seqs = 1;
  c.layers = layers_.data();
  c.ops = ops_.data();
  c.tiers = op_tiers_.data();
  c.kv_layer0 = il;
  ASSIGN_OR_RETURN(c.x, scratch_->Get(Scratch::kX, n, d));
  {
    // x = eh_proj [enorm(embed(next)); hnorm(hidden)]; the embeddings are the main model's
    // unless the layer has its own.
    OpScope scope(c, w.nextn_op);
    ASSIGN_OR_RETURN(Tensor e, scratch_->Get(Scratch::kXNorm, n, d));
    {
      const bool own = w.nextn_embd != kNoTensor;
      const int op = own ? w.nextn_op : embd_op_;
      std::optional<OpScope> borrowed;
      if (!own) borrowed.emplace(c, op);
      RETURN_IF_ERROR(EmbedTokens(c, own ? w.nextn_embd : token_embd_, op, next_tokens, n, e));
    }
    RETURN_IF_ERROR(NormRows(c, w.nextn_op, w.enorm, e, e));
    ASSIGN_OR_RETURN(Tensor h, scratch_->Get(Scratch::kTmp, n, d));
    backend_->Upload(hidden, h);
    RETURN_IF_ERROR(NormRows(c, w.nextn_op, w.hnorm, h, h));
    ASSIGN_OR_RETURN(Tensor cat, scratch_->Get(Scratch::kGathered, n, 2 * d));
    backend_->CopyColumns(e, 0, cat, 0, d);
    backend_->CopyColumns(h, 0, cat, d, d);
    RETURN_IF_ERROR(Linear(c, w.nextn_op, w.eh_proj, cat, c.x));
  }
  RETURN_IF_ERROR(hp_.spec->attention(c, il, w));
  RETURN_IF_ERROR(hp_.is_moe_layer(il) ? MoeBlock(c, il, w) : FfnBlock(c, il, w));
  cache.Append(next_tokens, n);
  const Tensor last = c.x.Rows(n - 1, 1);
  if (hidden_out) {
    hidden_out->resize(static_cast<size_t>(d));
    backend_->Download(last, hidden_out->data());
  }
  if (!logits) return Status::Ok();
  // The head: the layer's own norm and vocabulary matrix, else the main model's.
  const bool own = w.nextn_head != kNoTensor;
  const int op = own ? w.nextn_op : output_op_;
  OpScope scope(c, op);
  ASSIGN_OR_RETURN(Tensor xn, scratch_->Get(Scratch::kXNorm, 1, d));
  const TensorId norm = w.nextn_head_norm != kNoTensor ? w.nextn_head_norm : output_norm_;
  RETURN_IF_ERROR(NormRows(c, w.nextn_head_norm != kNoTensor ? w.nextn_op : output_op_, norm,
                           last, xn));
  ASSIGN_OR_RETURN(Tensor out, scratch_->Get(Scratch::kLogits, 1, hp_.n_vocab));
  RETURN_IF_ERROR(Linear(c, op, own ? w.nextn_head : output_, xn, out));
  logits->resize(static_cast<size_t>(hp_.n_vocab));
  backend_->Download(out, logits->data());
  return Status::Ok();
}

int Model::OpIndex(const std::string& id) const {
  auto it = op_index_.find(id);
  return it == op_index_.end() ? -1 : it->second;
}

Status Model::CheckTokens(const int32_t* tokens, int64_t n, const KvCache& cache) const {
  if (n <= 0) return InvalidArgument("forward pass over no tokens");
  if (cache.n_past() + n > cache.n_ctx()) {
    return InvalidArgument("context full: " + std::to_string(cache.n_past()) + " + " +
                           std::to_string(n) + " tokens exceed the context size " +
                           std::to_string(cache.n_ctx()));
  }
  for (int64_t t = 0; t < n; ++t) {
    if (tokens[t] < 0 || tokens[t] >= hp_.n_vocab) {
      return InvalidArgument("token id " + std::to_string(tokens[t]) +
                             " out of range (vocabulary of " + std::to_string(hp_.n_vocab) +
                             ")");
    }
  }
  return Status::Ok();
}

Status Model::Forward(const int32_t* tokens, int64_t n, KvCache& cache, bool all_logits,
                      std::vector<float>* logits) {
  RETURN_IF_ERROR(CheckTokens(tokens, n, cache));
  const int64_t V = hp_.n_vocab;
  logits->resize(static_cast<size_t>((all_logits ? n : 1) * V));
  for (int64_t done = 0; done < n;) {
    const int64_t b = std::min(kMaxBatch, n - done);
    const bool last = done + b == n;
    SequencePass p{tokens + done, b, &cache, all_logits,
                   all_logits ? logits->data() + done * V : (last ? logits->data() : nullptr)};
    RETURN_IF_ERROR(ForwardBatch(&p, 1, false));
    done += b;
  }
  return Status::Ok();
}

Status Model::ForwardSequences(const SequencePass* seqs, int n_seqs) {
  int64_t total = 0;
  for (int i = 0; i < n_seqs; ++i) {
    RETURN_IF_ERROR(CheckTokens(seqs[i].tokens, seqs[i].n, *seqs[i].cache));
    for (int j = 0; j < i; ++j)
      if (seqs[j].cache == seqs[i].cache)
        return InvalidArgument("a multi-sequence pass names one KV cache twice");
    total += seqs[i].n;
  }
  if (n_seqs <= 0) return InvalidArgument("forward pass over no sequences");
  if (total > kMaxBatch)
    return InvalidArgument("a multi-sequence pass of " + std::to_string(total) +
                           " tokens exceeds the largest batch (" + std::to_string(kMaxBatch) +
                           ")");
  return ForwardBatch(seqs, n_seqs, false);
}

Status Model::EmbedTokens(ForwardContext& c, TensorId table, int op, const int32_t* tokens,
                          int64_t n, const Tensor& out) {
  if (!source_->ReadsRows(table)) {
    ASSIGN_OR_RETURN(WeightHandle h, c.Acquire(table, op));
    backend_->EmbedRows(h.view(), tokens, n, out);
    return Status::Ok();
  }
  // The rows looked up, as a table of n rows of their own (a backend uploads such a view's
  // rows as it would a table's).
  const TensorInfo& info = source_->Info(table);
  const uint64_t row_bytes = RowBytes(info.type, info.ne[0]).value_or(0);
  embd_rows_.resize(static_cast<size_t>(row_bytes * static_cast<uint64_t>(n)));
  RETURN_IF_ERROR(source_->ReadRows(table, tokens, n, embd_rows_.data()));
  embd_ids_.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) embd_ids_[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  WeightView v;
  v.type = info.type;
  v.data = embd_rows_.data();
  v.bytes = embd_rows_.size();
  v.rows = n;
  v.cols = static_cast<int64_t>(info.ne[0]);
  backend_->EmbedRows(v, embd_ids_.data(), n, out);
  return Status::Ok();
}

Status Model::Output(ForwardContext& c, const SequencePass* seqs) {
  const int64_t d = hp_.n_embd, V = hp_.n_vocab;
  // The rows whose logits are wanted: a sequence's every row, its last, or none.
  auto wanted = [&](int s) -> int64_t {
    if (!seqs[s].logits) return 0;
    return seqs[s].all_logits ? c.seqs[s].n : 1;
  };
  int64_t rows = 0;
  for (int s = 0; s < c.n_seqs; ++s) rows += wanted(s);
  if (rows == 0) {
    output_finite_ = c.check_finite || backend_->AllFinite(c.x);
    return Status::Ok();
  }
  OpScope scope(c, output_op_);
  Tensor x;
  if (c.n_seqs == 1) {
    x = c.x.Rows(c.n - rows, rows);
  } else {
    // Gather them (rows of several sequences are not contiguous).
    ASSIGN_OR_RETURN(x, scratch_->Get(Scratch::kTmp, rows, d));
    for (int s = 0, k = 0; s < c.n_seqs; ++s) {
      const int64_t m = wanted(s);
      const SequenceRows& r = c.seqs[s];
      if (m > 0) backend_->CopyColumns(c.x.Rows(r.row0 + r.n - m, m), 0, x.Rows(k, m), 0, d);
      k += static_cast<int>(m);
    }
  }
  ASSIGN_OR_RETURN(Tensor xn, scratch_->Get(Scratch::kXNorm, rows, d));
  RETURN_IF_ERROR(NormRows(c, output_op_, output_norm_, x, xn));
  ASSIGN_OR_RETURN(Tensor logits, scratch_->Get(Scratch::kLogits, rows, V));
  RETURN_IF_ERROR(Linear(c, output_op_, output_, xn, logits));
  RETURN_IF_ERROR(c.CheckFinite(logits, output_op_));
  // The logits and the pass's last hidden state in one wait.
  output_finite_ = c.check_finite || backend_->AllFinite(logits, &c.x);
  for (int s = 0, k = 0; s < c.n_seqs; ++s) {
    const int64_t m = wanted(s);
    if (m > 0) backend_->Download(logits.Rows(k, m), seqs[s].logits);
    k += static_cast<int>(m);
  }
  return Status::Ok();
}

Status Model::ForwardBatch(const SequencePass* seqs, int n_seqs, bool check_finite) {
  ForwardContext c;
  c.hp = &hp_;
  c.source = source_;
  c.be = backend_;
  c.scratch = scratch_.get();
  seq_rows_.resize(static_cast<size_t>(n_seqs));
  pos_.clear();
  tokens_.clear();
  for (int s = 0; s < n_seqs; ++s) {
    const SequencePass& p = seqs[s];
    seq_rows_[s] = {p.cache, c.n, p.n, p.cache->n_past()};
    for (int64_t t = 0; t < p.n; ++t) pos_.push_back(static_cast<int32_t>(p.cache->n_past() + t));
    tokens_.insert(tokens_.end(), p.tokens, p.tokens + p.n);
    c.n += p.n;
  }
  c.pos = pos_.data();
  c.seqs = seq_rows_.data();
  c.n_seqs = n_seqs;
  c.layers = layers_.data();
  c.ops = ops_.data();
  c.tiers = op_tiers_.data();
  c.check_finite = check_finite;
  c.cached_bonus = cached_bonus_;
  c.observer = observer_;
  const int64_t n = c.n;
  ASSIGN_OR_RETURN(c.x, scratch_->Get(Scratch::kX, n, hp_.n_embd));

  {
    OpScope scope(c, embd_op_);
    RETURN_IF_ERROR(EmbedTokens(c, token_embd_, embd_op_, tokens_.data(), n, c.x));
    RETURN_IF_ERROR(c.CheckFinite(c.x, embd_op_));
  }
  for (int il = 0; il < hp_.n_layer; ++il) {
    const LayerWeights& w = layers_[il];
    const int ffn_op = hp_.is_moe_layer(il) ? w.router_op : w.ffn_op;
    if (observer_) observer_->BeforeBlock(w.attn_op, c.x);
    RETURN_IF_ERROR(hp_.spec->attention(c, il, w));
    if (observer_) {
      observer_->AfterBlock(w.attn_op, c.x);
      observer_->BeforeBlock(ffn_op, c.x);
    }
    RETURN_IF_ERROR(hp_.is_moe_layer(il) ? MoeBlock(c, il, w) : FfnBlock(c, il, w));
    if (observer_) observer_->AfterBlock(ffn_op, c.x);
  }
  for (int s = 0; s < n_seqs; ++s) {
    const SequenceRows& r = seq_rows_[s];
    // A next-n drafter's input: the rows' last hidden state, before the output norm.
    if (r.cache->keeps_hidden())
      backend_->Download(c.x.Rows(r.row0, r.n), r.cache->HiddenRows(r.pos0, r.n, hp_.n_embd));
    r.cache->Append(seqs[s].tokens, seqs[s].n);
  }
  RETURN_IF_ERROR(Output(c, seqs));
  if (check_finite || output_finite_) return Status::Ok();
  // Something produced NaN or infinities: evaluate the pass again, checking after every op,
  // so the error names where they first appear. seq_rows_ is rebuilt by the second pass, so
  // the positions to go back to are taken first.
  std::vector<int64_t> pos0(static_cast<size_t>(n_seqs));
  for (int s = 0; s < n_seqs; ++s) pos0[s] = seq_rows_[s].pos0;
  for (int s = 0; s < n_seqs; ++s) seqs[s].cache->Truncate(pos0[s]);
  RETURN_IF_ERROR(ForwardBatch(seqs, n_seqs, true));
  for (int s = 0; s < n_seqs; ++s) seqs[s].cache->Truncate(pos0[s]);
  return Corruption("the forward pass at position " + std::to_string(pos0[0]) +
                    " produced NaN or infinite values that a second, checked evaluation did "
                    "not reproduce");
}

}  // namespace substrate
