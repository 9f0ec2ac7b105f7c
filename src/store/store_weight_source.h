// StoreWeightSource: a WeightSource over a tiered store (store/pack.h), resident: it reads every
// range up to `max_tier` at open, verifies each CRC32C, and charges the bytes to the ledger
// account "weights". Acquire serves the requested tier (kDefaultTier: `serve_tier`, the store
// owner's pick), capped at what the unit has. The streaming
// source with a byte budget is runtime/ResidencyManager; both read the store through StoreIndex.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/memory_ledger.h"
#include "format/model_file.h"
#include "model/weight_source.h"
#include "store/store_index.h"

namespace substrate {

struct StoreOptions {
  int max_tier = 2;    // tiers above it are not loaded
  int serve_tier = 2;  // the tier served by default (DefaultTier)
  // Streaming: nothing is read at open (file sizes are checked); a range is read and verified
  // on Acquire, charged to "stream", and freed at the EndOp of the op that read it. Peak memory
  // is then about one op's weights.
  bool streaming = false;
};

class StoreWeightSource : public WeightSource {
 public:
  // Opens STORE/ (manifest.json, model.gguf, data files). Errors: NotFound for a missing
  // manifest, Corruption naming the file (and tensor) for a malformed manifest, a truncated
  // data file or a checksum mismatch; OutOfMemory when the ledger's cap is exceeded.
  static Expected<std::unique_ptr<StoreWeightSource>> Open(const std::string& dir,
                                                           MemoryLedger* ledger,
                                                           const StoreOptions& options = {});

  // The model's metadata (hparams, tokenizer), for Model::Create.
  const Metadata& metadata() const { return index_->meta().metadata(); }

  TensorId Resolve(const std::string& name) const override { return index_->Resolve(name); }
  const TensorInfo& Info(TensorId id) const override { return index_->tensors()[id].info; }
  Expected<WeightHandle> Acquire(TensorId id, int slice = -1,
                                 int tier = kDefaultTier) override;

  int DefaultTier() const override { return options_.serve_tier; }
  uint64_t OpBytes(const std::string& op_id, int tier) const override {
    const int o = index_->FindOp(op_id);
    return o < 0 ? 0 : index_->ops()[o].SlabBytes(tier);
  }
  void EndOp(const std::string& op_id) override;

  // Bytes read from the store so far (at open, or by streaming).
  uint64_t loaded_bytes() const { return loaded_bytes_; }
  int n_tiers() const { return index_->n_tiers(); }

 private:
  // Bytes of one StoreRange (same indexing as the index's tensors/units/tiers).
  struct UnitData {
    AlignedBuffer tier[3];
  };

  Status LoadRange(const StoreRange& r, AlignedBuffer& dst, const char* account);

  StoreOptions options_;
  std::unique_ptr<StoreIndex> index_;
  MemoryLedger* ledger_ = nullptr;
  std::vector<std::vector<UnitData>> data_;  // [tensor][unit]
  std::vector<AlignedBuffer*> streamed_;     // buffers read since the last EndOp
  std::mutex mu_;
  uint64_t loaded_bytes_ = 0;
};

}  // namespace substrate
