// StoreWeightSource: a WeightSource over a tiered store (store/pack.h). This first version is
// resident: it reads every range up to `max_tier` at open, verifies each CRC32C, and charges
// the bytes to the ledger account "weights". Acquire serves the requested tier, raised to
// `serve_tier` (the model asks for tier 0; the store's owner picks the quality), capped at what
// the unit has.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/memory_ledger.h"
#include "format/model_file.h"
#include "model/weight_source.h"

namespace substrate {

struct StoreOptions {
  int max_tier = 2;    // tiers above it are not loaded
  int serve_tier = 2;  // the least tier Acquire serves
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
  const Metadata& metadata() const { return meta_->metadata(); }

  TensorId Resolve(const std::string& name) const override;
  const TensorInfo& Info(TensorId id) const override { return tensors_[id].info; }
  Expected<WeightHandle> Acquire(TensorId id, int slice = -1, int tier = 0) override;

  void EndOp(const std::string& op_id) override;

  // Bytes read from the store so far (at open, or by streaming).
  uint64_t loaded_bytes() const { return loaded_bytes_; }
  int n_tiers() const { return n_tiers_; }

 private:
  struct Range {
    DType type = DType::kF32;
    AlignedBuffer data;  // empty while not loaded (streaming)
    uint64_t bytes = 0;
    uint64_t offset = 0;
    uint32_t crc = 0;
    int file = -1;
    std::string what;  // "FILE: tensor 'x' slice s tier k", for errors
  };
  struct Unit {
    Range tier[3];
    int n_tiers = 0;
  };
  struct Tensor {
    TensorInfo info;
    bool sliced = false;
    std::vector<Unit> units;  // one, or one per expert slice
  };

  Status LoadRange(Range& r, const char* account);
  Status ParseAndLoad(const std::string& dir, const std::string& text, MemoryLedger* ledger);

  StoreOptions options_;
  std::unique_ptr<ModelFile> meta_;
  std::string dir_;
  MemoryLedger* ledger_ = nullptr;
  std::vector<std::unique_ptr<RandomAccessFile>> files_;
  std::vector<Range*> streamed_;  // ranges read since the last EndOp
  std::mutex mu_;
  std::vector<Tensor> tensors_;
  std::unordered_map<std::string, TensorId> ids_;
  uint64_t loaded_bytes_ = 0;
  int n_tiers_ = 1;
};

}  // namespace substrate
