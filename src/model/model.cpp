#include "model/model.h"

#include <algorithm>
#include <cstring>

#include "format/model_file.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "quant/quant.h"

namespace substrate {
namespace {

std::string Shape(const std::vector<uint64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

}  // namespace

Expected<TensorId> OptionalTensor(const WeightSource& s, const std::string& name,
                                  std::vector<uint64_t> ne) {
  const TensorId id = s.Resolve(name);
  if (id == kNoTensor) return kNoTensor;
  const TensorInfo& info = s.Info(id);
  // A 0 in `ne` accepts any size there; trailing 1s are equivalent to a shorter shape.
  std::vector<uint64_t> have = info.ne;
  while (have.size() > ne.size() && have.back() == 1) have.pop_back();
  bool ok = have.size() == ne.size();
  for (size_t i = 0; ok && i < ne.size(); ++i) ok = ne[i] == 0 || ne[i] == have[i];
  if (!ok) {
    return Corruption("tensor '" + name + "' has shape " + Shape(info.ne) + ", expected " +
                      Shape(ne) + " (0 = any)");
  }
  if (!CanDequantize(info.type) || !RowBytes(info.type, info.ne.empty() ? 1 : info.ne[0])) {
    return Unimplemented("tensor '" + name + "' has type " + DTypeName(info.type) +
                         " which this build cannot compute with");
  }
  return id;
}

Expected<TensorId> RequireTensor(const WeightSource& s, const std::string& name,
                                 std::vector<uint64_t> ne) {
  ASSIGN_OR_RETURN(TensorId id, OptionalTensor(s, name, ne));
  if (id == kNoTensor) return NotFound("model has no tensor '" + name + "'");
  return id;
}

Status ResolveFfnOrMoe(const WeightSource& s, const ModelHParams& hp, int il, LayerWeights* w) {
  const uint64_t d = static_cast<uint64_t>(hp.n_embd);
  ASSIGN_OR_RETURN(w->ffn_norm, RequireTensor(s, BlockTensor(il, "ffn_norm"), {d}));
  if (!hp.is_moe_layer(il)) {
    const uint64_t ff = static_cast<uint64_t>(hp.n_ff);
    ASSIGN_OR_RETURN(w->ffn_gate, RequireTensor(s, BlockTensor(il, "ffn_gate"), {d, ff}));
    ASSIGN_OR_RETURN(w->ffn_up, RequireTensor(s, BlockTensor(il, "ffn_up"), {d, ff}));
    ASSIGN_OR_RETURN(w->ffn_down, RequireTensor(s, BlockTensor(il, "ffn_down"), {ff, d}));
    return Status::Ok();
  }
  const uint64_t E = static_cast<uint64_t>(hp.n_expert), ff = static_cast<uint64_t>(hp.n_ff_exp);
  ASSIGN_OR_RETURN(w->gate_inp, RequireTensor(s, BlockTensor(il, "ffn_gate_inp"), {d, E}));
  ASSIGN_OR_RETURN(w->exp_probs_b, OptionalTensor(s, BlockTensor(il, "exp_probs_b", "bias"), {E}));
  ASSIGN_OR_RETURN(w->gate_exps, RequireTensor(s, BlockTensor(il, "ffn_gate_exps"), {d, ff, E}));
  ASSIGN_OR_RETURN(w->up_exps, RequireTensor(s, BlockTensor(il, "ffn_up_exps"), {d, ff, E}));
  ASSIGN_OR_RETURN(w->down_exps, RequireTensor(s, BlockTensor(il, "ffn_down_exps"), {ff, d, E}));
  const uint64_t sh = static_cast<uint64_t>(hp.n_ff_shexp);  // 0: width from the tensor
  ASSIGN_OR_RETURN(w->gate_shexp, OptionalTensor(s, BlockTensor(il, "ffn_gate_shexp"), {d, sh}));
  if (w->gate_shexp != kNoTensor) {
    const uint64_t width = s.Info(w->gate_shexp).ne[1];
    ASSIGN_OR_RETURN(w->up_shexp, RequireTensor(s, BlockTensor(il, "ffn_up_shexp"), {d, width}));
    ASSIGN_OR_RETURN(w->down_shexp,
                     RequireTensor(s, BlockTensor(il, "ffn_down_shexp"), {width, d}));
    ASSIGN_OR_RETURN(w->gate_inp_shexp,
                     OptionalTensor(s, BlockTensor(il, "ffn_gate_inp_shexp"), {d}));
  }
  return Status::Ok();
}

Expected<std::unique_ptr<Model>> Model::Create(const Metadata& md, WeightSource* source,
                                               ThreadPool* pool, MemoryLedger* ledger) {
  std::unique_ptr<Model> m(new Model());
  ASSIGN_OR_RETURN(m->hp_, ModelHParams::FromMetadata(md));
  ModelHParams& hp = m->hp_;
  m->source_ = source;
  m->pool_ = pool;
  m->scratch_ = std::make_unique<Scratch>(ledger);

  const uint64_t d = static_cast<uint64_t>(hp.n_embd);
  ASSIGN_OR_RETURN(m->token_embd_, RequireTensor(*source, "token_embd.weight", {d, 0}));
  const uint64_t n_vocab = source->Info(m->token_embd_).ne[1];
  if (hp.n_vocab == 0) hp.n_vocab = static_cast<int64_t>(n_vocab);
  ASSIGN_OR_RETURN(m->output_norm_, RequireTensor(*source, "output_norm.weight", {d}));
  ASSIGN_OR_RETURN(m->output_, OptionalTensor(*source, "output.weight", {d, 0}));
  if (m->output_ == kNoTensor) m->output_ = m->token_embd_;  // tied embeddings
  hp.n_vocab = static_cast<int64_t>(source->Info(m->output_).ne[1]);

  m->layers_.resize(static_cast<size_t>(hp.n_layer));
  for (int il = 0; il < hp.n_layer; ++il) {
    LayerWeights& w = m->layers_[il];
    switch (hp.family) {
      case ArchFamily::kLlama:
      case ArchFamily::kQwen: RETURN_IF_ERROR(ResolveLlamaLayer(*source, hp, il, &w)); break;
      case ArchFamily::kDeepseek:
        RETURN_IF_ERROR(ResolveDeepseekLayer(*source, hp, il, &w));
        break;
    }
    RETURN_IF_ERROR(ResolveFfnOrMoe(*source, hp, il, &w));
    if (w.q_norm != kNoTensor) hp.qk_norm = true;
  }
  m->ops_ = ListOps(hp, [&](const std::string& n) { return source->Resolve(n) != kNoTensor; });
  return m;
}

Status Model::Forward(const int32_t* tokens, int64_t n, KvCache& cache, bool all_logits,
                      std::vector<float>* logits) {
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
  const int64_t V = hp_.n_vocab;
  logits->resize(static_cast<size_t>((all_logits ? n : 1) * V));
  for (int64_t done = 0; done < n;) {
    const int64_t b = std::min(kMaxBatch, n - done);
    const bool last = done + b == n;
    float* out = all_logits ? logits->data() + done * V : (last ? logits->data() : nullptr);
    RETURN_IF_ERROR(ForwardBatch(tokens + done, b, cache, all_logits, out));
    done += b;
  }
  return Status::Ok();
}

Status Model::Embed(ForwardContext& c, const int32_t* tokens) {
  const int64_t d = hp_.n_embd;
  source_->BeginOp(OpIdTokenEmbd());
  auto h = source_->Acquire(token_embd_);
  if (!h.ok()) {
    source_->EndOp(OpIdTokenEmbd());
    return h.status();
  }
  const WeightView& v = h->view();
  for (int64_t t = 0; t < c.n; ++t) DequantizeWeightRow(v, tokens[t], c.x + t * d);
  h->Release();
  source_->EndOp(OpIdTokenEmbd());
  return Status::Ok();
}

Status Model::Output(ForwardContext& c, bool all_logits, float* logits_out) {
  const int64_t d = hp_.n_embd;
  source_->BeginOp(OpIdOutput());
  const int64_t rows = all_logits ? c.n : 1;
  const float* x = c.x + (c.n - rows) * d;
  Status st = [&]() -> Status {
    ASSIGN_OR_RETURN(float* xn, scratch_->Get(Scratch::kXNorm, rows * d));
    RETURN_IF_ERROR(NormRows(c, output_norm_, x, d, rows, xn));
    return Linear(c, output_, xn, rows, logits_out, d, hp_.n_vocab);
  }();
  source_->EndOp(OpIdOutput());
  return st;
}

Status Model::ForwardBatch(const int32_t* tokens, int64_t n, KvCache& cache, bool all_logits,
                           float* logits_out) {
  ForwardContext c;
  c.hp = &hp_;
  c.source = source_;
  c.pool = pool_;
  c.cache = &cache;
  c.scratch = scratch_.get();
  c.n = n;
  c.pos0 = cache.n_past();
  pos_.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) pos_[t] = static_cast<int32_t>(c.pos0 + t);
  c.pos = pos_.data();
  c.vec = &vec_;
  c.layers = layers_.data();
  ASSIGN_OR_RETURN(c.x, scratch_->Get(Scratch::kX, n * hp_.n_embd));

  RETURN_IF_ERROR(Embed(c, tokens));
  for (int il = 0; il < hp_.n_layer; ++il) {
    const LayerWeights& w = layers_[il];
    switch (hp_.family) {
      case ArchFamily::kLlama:
      case ArchFamily::kQwen: RETURN_IF_ERROR(LlamaLayer(c, il, w)); break;
      case ArchFamily::kDeepseek: RETURN_IF_ERROR(DeepseekLayer(c, il, w)); break;
    }
  }
  cache.Append(tokens, n);
  if (logits_out) RETURN_IF_ERROR(Output(c, all_logits, logits_out));
  return Status::Ok();
}

}  // namespace substrate
