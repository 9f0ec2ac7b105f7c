// Model: one architecture's forward pass over a WeightSource.
//
//   auto model = Model::Create(file.metadata(), source, &pool, &ledger);
//   auto cache = KvCache::Create(model->hparams(), n_ctx, &ledger);
//   model->Forward(tokens, n, *cache, /*all_logits=*/false, &logits);  // prefill, then decode
//
// Forward evaluates n tokens at positions cache.n_past() .. + n - 1 (a batch for prefill, one
// token for decode), appends their keys/values to the cache and writes logits: [n, n_vocab]
// when all_logits, else [1, n_vocab] for the last token. Not thread-safe: one pass at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/memory_ledger.h"
#include "core/thread_pool.h"
#include "model/blocks.h"
#include "model/hparams.h"
#include "model/kv_cache.h"
#include "model/layer_weights.h"
#include "model/op_id.h"
#include "model/weight_source.h"

namespace substrate {

class Metadata;

class Model {
 public:
  // Resolves and validates every tensor the architecture needs (names, shapes, types).
  // `source`, `pool` and `ledger` must outlive the model.
  static Expected<std::unique_ptr<Model>> Create(const Metadata& md, WeightSource* source,
                                                 ThreadPool* pool, MemoryLedger* ledger);

  const ModelHParams& hparams() const { return hp_; }
  // Every op in topological order, with the tensors it acquires (for compiler and runtime).
  const std::vector<OpSpec>& ops() const { return ops_; }
  WeightSource* source() const { return source_; }

  Status Forward(const int32_t* tokens, int64_t n, KvCache& cache, bool all_logits,
                 std::vector<float>* logits);

  // Largest batch one internal pass processes; longer inputs are split (prefill chunks).
  static constexpr int64_t kMaxBatch = 512;

 private:
  Model() = default;
  Status ForwardBatch(const int32_t* tokens, int64_t n, KvCache& cache, bool all_logits,
                      float* logits_out);
  Status Embed(ForwardContext& c, const int32_t* tokens);
  Status Output(ForwardContext& c, bool all_logits, float* logits_out);

  ModelHParams hp_;
  WeightSource* source_ = nullptr;
  ThreadPool* pool_ = nullptr;
  std::unique_ptr<Scratch> scratch_;
  std::vector<LayerWeights> layers_;
  TensorId token_embd_ = kNoTensor, output_norm_ = kNoTensor, output_ = kNoTensor;
  std::vector<OpSpec> ops_;
  std::vector<int32_t> pos_;
  std::vector<float> vec_;
};

// Per-family layer functions (arch_*.cpp): resolve a layer's attention tensors, run a layer.
// The llama family covers llama, mixtral, qwen2, qwen3, qwen2moe and qwen3moe: the same layer
// with data-driven differences (biases, QK-norm, experts, shared expert, RoPE style).
Status ResolveLlamaLayer(const WeightSource& s, const ModelHParams& hp, int il, LayerWeights* w);
Status ResolveDeepseekLayer(const WeightSource& s, const ModelHParams& hp, int il,
                            LayerWeights* w);
Status LlamaLayer(ForwardContext& c, int il, const LayerWeights& w);
Status DeepseekLayer(ForwardContext& c, int il, const LayerWeights& w);

// Shared by the Resolve* functions: the id of `name` or an error naming it; and the shape
// check that keeps a malformed file from reading out of bounds.
Expected<TensorId> RequireTensor(const WeightSource& s, const std::string& name,
                                 std::vector<uint64_t> ne);
Expected<TensorId> OptionalTensor(const WeightSource& s, const std::string& name,
                                  std::vector<uint64_t> ne);
// Resolves the FFN or MoE tensors of layer il (all families use the same names).
Status ResolveFfnOrMoe(const WeightSource& s, const ModelHParams& hp, int il, LayerWeights* w);

}  // namespace substrate
