// Model: one architecture's forward pass over a WeightSource, computed by a Backend.
//
//   auto model = Model::Create(file.metadata(), source, &backend);
//   auto cache = KvCache::Create(model->hparams(), n_ctx, model->backend());
//   model->Forward(tokens, n, *cache, /*all_logits=*/false, &logits);  // prefill, then decode
//
// Forward evaluates n tokens at positions cache.n_past() .. + n - 1 (a batch for prefill, one
// token for decode), appends their keys/values to the cache and writes logits: [n, n_vocab]
// when all_logits, else [1, n_vocab] for the last token. Not thread-safe: one pass at a time.
//
// Per-op tiers: every op (ops(), topological order) runs at its own tier of the weight
// source's ladder (0 = the skeleton; residual tiers above), read from a flat table in O(1) at
// each weight acquisition. The table starts at the source's default tier and may be changed
// between passes (op_tiers()); a change takes effect on the next pass, allocating nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
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
  // `source` and `backend` must outlive the model; the backend's ledger takes the scratch.
  static Expected<std::unique_ptr<Model>> Create(const Metadata& md, WeightSource* source,
                                                 Backend* backend, MemoryLedger* ledger);
  // The same over a CPU backend of its own on `pool`.
  static Expected<std::unique_ptr<Model>> Create(const Metadata& md, WeightSource* source,
                                                 ThreadPool* pool, MemoryLedger* ledger);
  ~Model();

  const ModelHParams& hparams() const { return hp_; }
  // Every op in topological order, with the tensors it acquires (for compiler and runtime).
  const std::vector<OpSpec>& ops() const { return ops_; }
  // The index of op `id` in ops(), or -1.
  int OpIndex(const std::string& id) const;
  WeightSource* source() const { return source_; }
  // Every layer's tensor ids and op indices.
  const std::vector<LayerWeights>& layers() const { return layers_; }
  Backend& backend() { return *backend_; }

  // The tier each op runs at, indexed like ops(); change it between passes.
  std::vector<uint8_t>& op_tiers() { return op_tiers_; }
  const std::vector<uint8_t>& op_tiers() const { return op_tiers_; }

  // Receives every later pass's residual stream around each block (null: none). Must outlive
  // the passes it observes.
  void set_observer(PassObserver* observer) { observer_ = observer; }
  // Cache-aware routing: experts the weight source holds in memory get `bonus` added to their
  // selection score (a probability: a near-tie within it goes to the cached expert); their
  // gating weights stay the router's. 0 (the default) routes exactly.
  void set_cache_aware_routing(float bonus) { cached_bonus_ = bonus; }

  // A pass whose result holds NaN or infinities is evaluated again op by op and fails with
  // Corruption naming the first op that produced them (the cache is left without its tokens).
  Status Forward(const int32_t* tokens, int64_t n, KvCache& cache, bool all_logits,
                 std::vector<float>* logits);

  // One sequence of a multi-sequence pass: n tokens appended to `cache` at its n_past().
  // logits (null: none) receives [n, n_vocab] when all_logits, else the last token's row.
  struct SequencePass {
    const int32_t* tokens = nullptr;
    int64_t n = 0;
    KvCache* cache = nullptr;
    bool all_logits = false;
    float* logits = nullptr;
  };
  // Continuous batching: several sequences (each its own cache, at most once) in one pass, so
  // every weight is read once for all of them; attention stays within each sequence. Each
  // row's result is the one Forward gives it alone (ExactTokenRows decides for the AMX GEMM).
  // At most kMaxBatch tokens in all; checked like Forward (CheckTokens) first.
  Status ForwardSequences(const SequencePass* seqs, int n_seqs);
  // Whether Forward would take these tokens into `cache` (ids in the vocabulary, room in the
  // context), with the error it would return.
  Status CheckTokens(const int32_t* tokens, int64_t n, const KvCache& cache) const;

  // Multi-token prediction (DeepSeek-V3's MTP, GLM-4.5's next-n layer): lists and resolves the
  // model's first next-n layer (hparams().n_nextn > 0, else NotFound), whose ops then follow
  // ops()'s others. Call before the first pass; the weight source must hold its tensors.
  Status EnableNextn();
  bool nextn_enabled() const { return nextn_.nextn_op >= 0; }
  // One next-n pass over n positions p = cache.n_past() ..: row i takes the main stack's last
  // hidden state of position p + i (hidden[i], n_embd floats, as KvCache::HiddenRow keeps it)
  // and the token that followed it (next_tokens[i]), appends the layer's keys and values to
  // `cache` (with next_tokens as its tokens) and, when asked, writes the last row's logits
  // [n_vocab] (for the token after next_tokens[n - 1]) and its output hidden state [n_embd],
  // which a chained step takes as its `hidden`.
  Status ForwardNextn(const int32_t* next_tokens, const float* hidden, int64_t n, KvCache& cache,
                      std::vector<float>* logits, std::vector<float>* hidden_out);

  // Largest batch one internal pass processes; longer inputs are split (prefill chunks).
  static constexpr int64_t kMaxBatch = 512;

 private:
  Model() = default;
  Status ResolveLayers();
  Status ResolveLayer(int il, LayerWeights* w);
  Status ForwardBatch(const SequencePass* seqs, int n_seqs, bool check_finite);
  Status Output(ForwardContext& c, const SequencePass* seqs);
  // out = rows tokens[0..n) of `table` (within op `op`, begun by the caller): the table
  // acquired whole, or only those rows read where the source keeps it on disk (ReadsRows).
  Status EmbedTokens(ForwardContext& c, TensorId table, int op, const int32_t* tokens, int64_t n,
                     const Tensor& out);

  ModelHParams hp_;
  WeightSource* source_ = nullptr;
  std::unique_ptr<Backend> own_backend_;
  Backend* backend_ = nullptr;
  std::unique_ptr<Scratch> scratch_;
  std::vector<LayerWeights> layers_;
  LayerWeights nextn_;  // the first next-n layer, when enabled (EnableNextn)
  TensorId token_embd_ = kNoTensor, output_norm_ = kNoTensor, output_ = kNoTensor;
  std::vector<OpSpec> ops_;
  std::unordered_map<std::string, int> op_index_;
  std::vector<uint8_t> op_tiers_;
  int embd_op_ = 0, output_op_ = 0;
  // Per pass, grow-only: positions and tokens of every row, and each sequence's rows.
  std::vector<int32_t> pos_;
  std::vector<int32_t> tokens_;
  std::vector<SequenceRows> seq_rows_;
  // EmbedTokens from a table read by rows: the rows' bytes and their ids within them.
  std::vector<uint8_t> embd_rows_;
  std::vector<int32_t> embd_ids_;
  // The last Output's logits and hidden state held no NaN or infinity.
  bool output_finite_ = true;
  PassObserver* observer_ = nullptr;
  float cached_bonus_ = 0;
};

}  // namespace substrate
