#include "model/blocks.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "format/model_file.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/op_id.h"
#include "quant/quant.h"

namespace substrate {
namespace {

int64_t OutDim(ForwardContext& c, TensorId id) {
  const TensorInfo& info = c.source->Info(id);
  return info.ne.size() >= 2 ? static_cast<int64_t>(info.ne[1]) : 1;
}

}  // namespace

Expected<void*> Scratch::GetBytes(Slot slot, size_t bytes) {
  AlignedBuffer& b = bufs_[slot];
  if (b.size() < bytes) {
    b = AlignedBuffer();  // release the old charge first
    ASSIGN_OR_RETURN(b, AlignedBuffer::Allocate(bytes, ledger_, "scratch", 64));
  }
  return static_cast<void*>(b.data());
}

Status Linear(ForwardContext& c, TensorId w, const float* x, int64_t n, float* y,
              int64_t expect_in, int64_t expect_out, int slice) {
  ASSIGN_OR_RETURN(WeightHandle h, c.source->Acquire(w, slice));
  const WeightView& v = h.view();
  if (v.cols != expect_in || (expect_out >= 0 && v.rows != expect_out)) {
    return Corruption("tensor '" + c.source->Info(w).name + "' is [" + std::to_string(v.rows) +
                      " x " + std::to_string(v.cols) + "], expected [" +
                      std::to_string(expect_out) + " x " + std::to_string(expect_in) + "]");
  }
  if (c.source->ObservesInputs()) c.source->ObserveInput(w, slice, x, n, v.cols);
  MatMul(v, x, n, y, *c.pool);
  return Status::Ok();
}

Status LoadVector(ForwardContext& c, TensorId id, int64_t n, float* dst) {
  ASSIGN_OR_RETURN(WeightHandle h, c.source->Acquire(id));
  const WeightView& v = h.view();
  if (v.cols * v.rows != n) {
    return Corruption("tensor '" + c.source->Info(id).name + "' has " +
                      std::to_string(v.cols * v.rows) + " elements, expected " +
                      std::to_string(n));
  }
  DequantizeRow(v.type, v.data, dst, n);
  return Status::Ok();
}

Status NormRows(ForwardContext& c, TensorId w, const float* x, int64_t width, int64_t rows,
                float* y) {
  c.vec->resize(static_cast<size_t>(width));
  RETURN_IF_ERROR(LoadVector(c, w, width, c.vec->data()));
  RmsNorm(x, c.vec->data(), c.hp->norm_eps, width, rows, y);
  return Status::Ok();
}

namespace {

Status AddBiasFrom(ForwardContext& c, TensorId b, float* y, int64_t width, int64_t rows) {
  if (b == kNoTensor) return Status::Ok();
  c.vec->resize(static_cast<size_t>(width));
  RETURN_IF_ERROR(LoadVector(c, b, width, c.vec->data()));
  AddBias(y, c.vec->data(), width, rows);
  return Status::Ok();
}

// out = W_o attn (+ b_o); x += out.
Status OutputProjection(ForwardContext& c, const LayerWeights& w, const float* attn,
                        int64_t in_dim) {
  const int64_t d = c.hp->n_embd;
  ASSIGN_OR_RETURN(float* tmp, c.scratch->Get(Scratch::kTmp, c.n * d));
  RETURN_IF_ERROR(Linear(c, w.wo, attn, c.n, tmp, in_dim, d));
  RETURN_IF_ERROR(AddBiasFrom(c, w.bo, tmp, d, c.n));
  AddInPlace(c.x, tmp, c.n * d);
  return Status::Ok();
}

}  // namespace

Status AttentionBlock(ForwardContext& c, int il, const LayerWeights& w) {
  const ModelHParams& hp = *c.hp;
  const int64_t d = hp.n_embd, n = c.n;
  const int dk = hp.head_dim_k, dv = hp.head_dim_v;
  OpScope op(c.source, OpIdAttention(il));

  ASSIGN_OR_RETURN(float* xn, c.scratch->Get(Scratch::kXNorm, n * d));
  RETURN_IF_ERROR(NormRows(c, w.attn_norm, c.x, d, n, xn));

  // q [n, n_head*dk]; k, v written into the cache rows of positions pos0..pos0+n-1 (float
  // rows: the cache's own for an F32 cache, staged and converted for F16).
  ASSIGN_OR_RETURN(float* q, c.scratch->Get(Scratch::kQ, n * hp.n_head * dk));
  ASSIGN_OR_RETURN(KvCache::WriteRows rows, c.cache->BeginWrite(il, c.pos0, n));
  float* kc = rows.k;
  float* vc = rows.v;
  RETURN_IF_ERROR(Linear(c, w.wq, xn, n, q, d, int64_t{hp.n_head} * dk));
  RETURN_IF_ERROR(AddBiasFrom(c, w.bq, q, int64_t{hp.n_head} * dk, n));
  RETURN_IF_ERROR(Linear(c, w.wk, xn, n, kc, d, int64_t{hp.n_head_kv} * dk));
  RETURN_IF_ERROR(AddBiasFrom(c, w.bk, kc, int64_t{hp.n_head_kv} * dk, n));
  RETURN_IF_ERROR(Linear(c, w.wv, xn, n, vc, d, int64_t{hp.n_head_kv} * dv));
  RETURN_IF_ERROR(AddBiasFrom(c, w.bv, vc, int64_t{hp.n_head_kv} * dv, n));

  if (w.q_norm != kNoTensor) RETURN_IF_ERROR(NormRows(c, w.q_norm, q, dk, n * hp.n_head, q));
  if (w.k_norm != kNoTensor)
    RETURN_IF_ERROR(NormRows(c, w.k_norm, kc, dk, n * hp.n_head_kv, kc));
  Rope(q, n, hp.n_head, dk, c.pos, hp.rope);
  Rope(kc, n, hp.n_head_kv, dk, c.pos, hp.rope);
  c.cache->CommitWrite(il, c.pos0, n);

  // attn [n, n_head*dv]
  ASSIGN_OR_RETURN(float* attn, c.scratch->Get(Scratch::kAttnOut, n * hp.n_head * dv));
  AttentionShape shape{hp.n_head, hp.n_head_kv, dk, dv, hp.attn_scale};
  Attention(shape, q, n, c.pos0, c.cache->rows(il), attn, *c.pool);
  return OutputProjection(c, w, attn, int64_t{hp.n_head} * dv);
}

Status MlaBlock(ForwardContext& c, int il, const LayerWeights& w) {
  const ModelHParams& hp = *c.hp;
  const int64_t d = hp.n_embd, n = c.n;
  const int dk = hp.head_dim_k, dv = hp.head_dim_v, nope = hp.nope_dim(), rot = hp.n_rot;
  const int64_t lora = hp.kv_lora_rank;
  OpScope op(c.source, OpIdAttention(il));

  ASSIGN_OR_RETURN(float* xn, c.scratch->Get(Scratch::kXNorm, n * d));
  RETURN_IF_ERROR(NormRows(c, w.attn_norm, c.x, d, n, xn));

  // q [n, n_head, nope + rot], through the low-rank q_a -> norm -> q_b when the model has it.
  ASSIGN_OR_RETURN(float* q, c.scratch->Get(Scratch::kQ, n * hp.n_head * dk));
  if (w.wq_a != kNoTensor) {
    ASSIGN_OR_RETURN(float* qa, c.scratch->Get(Scratch::kLatentQ, n * hp.q_lora_rank));
    RETURN_IF_ERROR(Linear(c, w.wq_a, xn, n, qa, d, hp.q_lora_rank));
    RETURN_IF_ERROR(NormRows(c, w.q_a_norm, qa, hp.q_lora_rank, n, qa));
    RETURN_IF_ERROR(Linear(c, w.wq_b, qa, n, q, hp.q_lora_rank, int64_t{hp.n_head} * dk));
  } else {
    RETURN_IF_ERROR(Linear(c, w.wq, xn, n, q, d, int64_t{hp.n_head} * dk));
  }

  // kv_a [n, lora + rot]: the compressed latent, then one shared rope key per token.
  ASSIGN_OR_RETURN(float* kva, c.scratch->Get(Scratch::kLatentKv, n * (lora + rot)));
  RETURN_IF_ERROR(Linear(c, w.wkv_a, xn, n, kva, d, lora + rot));
  ASSIGN_OR_RETURN(float* kvn, c.scratch->Get(Scratch::kLatentNorm, n * lora));
  for (int64_t t = 0; t < n; ++t)
    std::memcpy(kvn + t * lora, kva + t * (lora + rot), static_cast<size_t>(lora) * 4);
  RETURN_IF_ERROR(NormRows(c, w.kv_a_norm, kvn, lora, n, kvn));
  // kv_b [n, n_head, nope + dv]
  const int64_t kvb_w = int64_t{hp.n_head} * (nope + dv);
  ASSIGN_OR_RETURN(float* kvb, c.scratch->Get(Scratch::kKvB, n * kvb_w));
  RETURN_IF_ERROR(Linear(c, w.wkv_b, kvn, n, kvb, lora, kvb_w));

  Rope(q + nope, n, hp.n_head, dk, c.pos, hp.rope);
  Rope(kva + lora, n, 1, static_cast<int>(lora + rot), c.pos, hp.rope);

  // Cache rows: k = [k_nope_h, k_rope] per head, v = v_h per head.
  ASSIGN_OR_RETURN(KvCache::WriteRows rows, c.cache->BeginWrite(il, c.pos0, n));
  for (int64_t t = 0; t < n; ++t) {
    float* kr = rows.k + t * c.cache->k_stride();
    float* vr = rows.v + t * c.cache->v_stride();
    const float* src = kvb + t * kvb_w;
    const float* kpe = kva + t * (lora + rot) + lora;
    for (int h = 0; h < hp.n_head; ++h) {
      std::memcpy(kr + h * dk, src + h * (nope + dv), static_cast<size_t>(nope) * 4);
      std::memcpy(kr + h * dk + nope, kpe, static_cast<size_t>(rot) * 4);
      std::memcpy(vr + h * dv, src + h * (nope + dv) + nope, static_cast<size_t>(dv) * 4);
    }
  }

  c.cache->CommitWrite(il, c.pos0, n);

  ASSIGN_OR_RETURN(float* attn, c.scratch->Get(Scratch::kAttnOut, n * hp.n_head * dv));
  AttentionShape shape{hp.n_head, hp.n_head, dk, dv, hp.attn_scale};
  Attention(shape, q, n, c.pos0, c.cache->rows(il), attn, *c.pool);
  return OutputProjection(c, w, attn, int64_t{hp.n_head} * dv);
}

Status SwiGluMlp(ForwardContext& c, TensorId gate, TensorId up, TensorId down, const float* x,
                 int64_t m, float* out, int slice) {
  const int64_t d = c.hp->n_embd;
  const int64_t ff = OutDim(c, gate);  // ne[1] of [d, ff] or of the expert tensor [d, ff, E]
  ASSIGN_OR_RETURN(float* g, c.scratch->Get(Scratch::kGate, m * ff));
  ASSIGN_OR_RETURN(float* u, c.scratch->Get(Scratch::kUp, m * ff));
  RETURN_IF_ERROR(Linear(c, gate, x, m, g, d, ff, slice));
  RETURN_IF_ERROR(Linear(c, up, x, m, u, d, ff, slice));
  SwiGlu(g, u, m * ff, g);
  return Linear(c, down, g, m, out, ff, d, slice);
}

Status FfnBlock(ForwardContext& c, int il, const LayerWeights& w) {
  const int64_t d = c.hp->n_embd, n = c.n;
  OpScope op(c.source, OpIdFfn(il));
  ASSIGN_OR_RETURN(float* xn, c.scratch->Get(Scratch::kXNorm, n * d));
  RETURN_IF_ERROR(NormRows(c, w.ffn_norm, c.x, d, n, xn));
  ASSIGN_OR_RETURN(float* tmp, c.scratch->Get(Scratch::kTmp, n * d));
  RETURN_IF_ERROR(SwiGluMlp(c, w.ffn_gate, w.ffn_up, w.ffn_down, xn, n, tmp));
  AddInPlace(c.x, tmp, n * d);
  return Status::Ok();
}

}  // namespace substrate
