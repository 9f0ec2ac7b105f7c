#include "model/blocks.h"

#include "format/model_file.h"
#include "model/arch.h"
#include "model/op_id.h"

namespace substrate {
namespace {

int64_t OutDim(ForwardContext& c, TensorId id) {
  const TensorInfo& info = c.source->Info(id);
  return info.ne.size() >= 2 ? static_cast<int64_t>(info.ne[1]) : 1;
}

}  // namespace

Expected<Tensor> Scratch::Get(Slot slot, int64_t rows, int64_t cols) {
  Buffer& b = bufs_[slot];
  const size_t bytes = static_cast<size_t>(rows * cols) * sizeof(float);
  if (b.size() < bytes) {
    b.Reset();  // release the old charge first
    ASSIGN_OR_RETURN(b, backend_->Allocate(bytes, "scratch"));
  }
  return Tensor{static_cast<float*>(b.data()), rows, cols};
}

Expected<void*> Scratch::HostBytes(HostSlot slot, size_t bytes) {
  AlignedBuffer& b = host_[slot];
  if (b.size() < bytes) {
    b = AlignedBuffer();
    ASSIGN_OR_RETURN(b, AlignedBuffer::Allocate(bytes, ledger_, "scratch", 64));
  }
  return static_cast<void*>(b.data());
}

Status ForwardContext::CheckFinite(const Tensor& t, int op) const {
  if (!check_finite || be->AllFinite(t)) return Status::Ok();
  return Corruption("the forward pass produced NaN or infinite values in op '" + op_id(op) +
                  "' (position " + std::to_string(seqs[0].pos0) + ", " + std::to_string(n) +
                  " tokens): the model's weights or hyperparameters hold non-finite or "
                  "out-of-range values");
}

namespace {

// W acquired for y = W x, its shape checked against x and y.
Expected<WeightHandle> AcquireLinear(ForwardContext& c, int op, TensorId w, const Tensor& x,
                                     const Tensor& y, int slice) {
  ASSIGN_OR_RETURN(WeightHandle h, c.Acquire(w, op, slice));
  const WeightView& v = h.view();
  if (v.cols != x.cols || v.rows != y.cols || x.rows != y.rows) {
    return Corruption("tensor '" + c.source->Info(w).name + "' is [" + std::to_string(v.rows) +
                      " x " + std::to_string(v.cols) + "], expected [" +
                      std::to_string(y.cols) + " x " + std::to_string(x.cols) + "]");
  }
  // Calibration sources read the input rows (CPU backends: host memory).
  if (c.source->ObservesInputs()) c.source->ObserveInput(w, slice, x.data, x.rows, x.cols);
  return h;
}

}  // namespace

Status Linear(ForwardContext& c, int op, TensorId w, const Tensor& x, const Tensor& y,
              int slice) {
  ASSIGN_OR_RETURN(WeightHandle h, AcquireLinear(c, op, w, x, y, slice));
  c.be->MatMul(h.view(), x, y);
  return Status::Ok();
}

Status Linears(ForwardContext& c, int op, const Tensor& x, std::initializer_list<LinearTo> outs,
               int slice) {
  constexpr size_t kMax = 4;
  if (outs.size() > kMax) return Internal("Linears: more than 4 products");
  WeightHandle h[kMax];
  MatMulOp ops[kMax];
  int n = 0;
  for (const LinearTo& o : outs) {
    ASSIGN_OR_RETURN(h[n], AcquireLinear(c, op, o.w, x, o.y, slice));
    ops[n] = {&h[n].view(), x, o.y};
    ++n;
  }
  c.be->MatMulBatch(ops, n);
  return Status::Ok();
}

namespace {

// The vector weight `id` of op `op`, checked to hold `n` elements.
Expected<WeightHandle> AcquireVector(ForwardContext& c, int op, TensorId id, int64_t n) {
  ASSIGN_OR_RETURN(WeightHandle h, c.Acquire(id, op));
  if (h.view().cols * h.view().rows != n) {
    return Corruption("tensor '" + c.source->Info(id).name + "' has " +
                      std::to_string(h.view().cols * h.view().rows) + " elements, expected " +
                      std::to_string(n));
  }
  return h;
}

}  // namespace

Status NormRows(ForwardContext& c, int op, TensorId w, const Tensor& x, const Tensor& y) {
  ASSIGN_OR_RETURN(WeightHandle h, AcquireVector(c, op, w, x.cols));
  c.be->RmsNorm(x, h.view(), c.hp->norm_eps, y);
  return Status::Ok();
}

Status AddBiasFrom(ForwardContext& c, int op, TensorId b, const Tensor& y) {
  if (b == kNoTensor) return Status::Ok();
  ASSIGN_OR_RETURN(WeightHandle h, AcquireVector(c, op, b, y.cols));
  c.be->AddBias(y, h.view());
  return Status::Ok();
}

Status OutputProjection(ForwardContext& c, const LayerWeights& w, const Tensor& attn) {
  ASSIGN_OR_RETURN(Tensor out, c.scratch->Get(Scratch::kTmp, c.n, c.hp->n_embd));
  RETURN_IF_ERROR(Linear(c, w.attn_op, w.wo, attn, out));
  RETURN_IF_ERROR(AddBiasFrom(c, w.attn_op, w.bo, out));
  c.be->Add(c.x, out);
  return Status::Ok();
}

std::vector<TensorSlot> StandardAttentionTensors(const ModelHParams& hp) {
  const uint64_t d = static_cast<uint64_t>(hp.n_embd);
  const uint64_t q_dim = static_cast<uint64_t>(hp.n_head) * hp.head_dim_k;
  const uint64_t k_dim = static_cast<uint64_t>(hp.n_head_kv) * hp.head_dim_k;
  const uint64_t v_dim = static_cast<uint64_t>(hp.n_head_kv) * hp.head_dim_v;
  const uint64_t o_dim = static_cast<uint64_t>(hp.n_head) * hp.head_dim_v;
  const uint64_t hd = static_cast<uint64_t>(hp.head_dim_k);
  using W = LayerWeights;
  return {
      {"attn_norm", "weight", &W::attn_norm, true, {d}},
      {"attn_q", "weight", &W::wq, true, {d, q_dim}},
      {"attn_q", "bias", &W::bq, false, {q_dim}},
      {"attn_k", "weight", &W::wk, true, {d, k_dim}},
      {"attn_k", "bias", &W::bk, false, {k_dim}},
      {"attn_v", "weight", &W::wv, true, {d, v_dim}},
      {"attn_v", "bias", &W::bv, false, {v_dim}},
      {"attn_q_norm", "weight", &W::q_norm, false, {hd}},
      {"attn_k_norm", "weight", &W::k_norm, false, {hd}},
      {"attn_output", "weight", &W::wo, true, {o_dim, d}},
      {"attn_output", "bias", &W::bo, false, {d}},
  };
}

Status CheckRopeDims(const ModelHParams& hp) {
  if (hp.n_rot > 0 && hp.n_rot <= hp.head_dim_k && hp.n_rot % 2 == 0) return Status::Ok();
  return Corruption("model hyperparameters: rope dimension_count " + std::to_string(hp.n_rot));
}

Status AttentionBlock(ForwardContext& c, int il, const LayerWeights& w) {
  const ModelHParams& hp = *c.hp;
  Backend& be = *c.be;
  const int64_t d = hp.n_embd, n = c.n;
  const int dk = hp.head_dim_k, dv = hp.head_dim_v, op = w.attn_op;
  OpScope scope(c, op);

  ASSIGN_OR_RETURN(Tensor xn, c.scratch->Get(Scratch::kXNorm, n, d));
  RETURN_IF_ERROR(NormRows(c, op, w.attn_norm, c.x, xn));

  // q [n, n_head * dk], k [n, n_head_kv * dk], v [n, n_head_kv * dv]
  ASSIGN_OR_RETURN(Tensor q, c.scratch->Get(Scratch::kQ, n, int64_t{hp.n_head} * dk));
  ASSIGN_OR_RETURN(Tensor k, c.scratch->Get(Scratch::kK, n, int64_t{hp.n_head_kv} * dk));
  ASSIGN_OR_RETURN(Tensor v, c.scratch->Get(Scratch::kV, n, int64_t{hp.n_head_kv} * dv));
  RETURN_IF_ERROR(Linears(c, op, xn, {{w.wq, q}, {w.wk, k}, {w.wv, v}}));
  RETURN_IF_ERROR(AddBiasFrom(c, op, w.bq, q));
  RETURN_IF_ERROR(AddBiasFrom(c, op, w.bk, k));
  RETURN_IF_ERROR(AddBiasFrom(c, op, w.bv, v));

  // QK-norm (qwen3): each head's vector normed on its own.
  if (w.q_norm != kNoTensor) {
    const Tensor heads = q.Reshape(n * hp.n_head, dk);
    RETURN_IF_ERROR(NormRows(c, op, w.q_norm, heads, heads));
  }
  if (w.k_norm != kNoTensor) {
    const Tensor heads = k.Reshape(n * hp.n_head_kv, dk);
    RETURN_IF_ERROR(NormRows(c, op, w.k_norm, heads, heads));
  }
  be.Rope(q, hp.n_head, dk, 0, c.pos, hp.rope);
  be.Rope(k, hp.n_head_kv, dk, 0, c.pos, hp.rope);

  // attn [n, n_head * dv]: each sequence attends over its own cache.
  ASSIGN_OR_RETURN(Tensor attn, c.scratch->Get(Scratch::kAttnOut, n, int64_t{hp.n_head} * dv));
  for (int s = 0; s < c.n_seqs; ++s) {
    const SequenceRows& r = c.seqs[s];
    const KvLayer kv = r.cache->layer(il - c.kv_layer0);
    be.StoreKv(kv, r.pos0, k.Rows(r.row0, r.n), v.Rows(r.row0, r.n));
    be.Attention({hp.n_head, hp.n_head_kv, dk, dv, hp.attn_scale}, q.Rows(r.row0, r.n), kv,
                 r.pos0, attn.Rows(r.row0, r.n));
  }
  RETURN_IF_ERROR(OutputProjection(c, w, attn));
  return c.CheckFinite(c.x, op);
}

Status SwiGluMlp(ForwardContext& c, int op, TensorId gate, TensorId up, TensorId down,
                 const Tensor& x, const Tensor& out, int slice) {
  const int64_t m = x.rows;
  const int64_t ff = OutDim(c, gate);  // ne[1] of [d, ff] or of the expert tensor [d, ff, E]
  ASSIGN_OR_RETURN(Tensor g, c.scratch->Get(Scratch::kGate, m, ff));
  ASSIGN_OR_RETURN(Tensor u, c.scratch->Get(Scratch::kUp, m, ff));
  RETURN_IF_ERROR(Linears(c, op, x, {{gate, g}, {up, u}}, slice));
  c.be->SwiGlu(g, u, g);
  return Linear(c, op, down, g, out, slice);
}

Status FfnBlock(ForwardContext& c, int il, const LayerWeights& w) {
  const int64_t d = c.hp->n_embd, n = c.n;
  OpScope scope(c, w.ffn_op);
  ASSIGN_OR_RETURN(Tensor xn, c.scratch->Get(Scratch::kXNorm, n, d));
  RETURN_IF_ERROR(NormRows(c, w.ffn_op, w.ffn_norm, c.x, xn));
  ASSIGN_OR_RETURN(Tensor out, c.scratch->Get(Scratch::kTmp, n, d));
  RETURN_IF_ERROR(SwiGluMlp(c, w.ffn_op, w.ffn_gate, w.ffn_up, w.ffn_down, xn, out));
  c.be->Add(c.x, out);
  return c.CheckFinite(c.x, w.ffn_op);
}

}  // namespace substrate
