// ResidentWeightSource: every tensor of a ModelFile read into memory once, charged to the
// ledger account "weights". Acquire is a lookup; nothing is read or freed while the model runs.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/memory_ledger.h"
#include "backend/backend.h"
#include "format/model_file.h"
#include "model/weight_source.h"

namespace substrate {

class ResidentWeightSource : public WeightSource {
 public:
  struct Options {
    // The backend that will compute with the weights: each 2-D tensor, and each expert's slice
    // of a 3-D one, is handed to its AdoptResidentWeight once loaded (the CPU backend rearranges
    // quantized matrices in place for its decode kernels; a GPU backend keeps a device copy),
    // and views carry the layout it returns; every other tensor goes to its
    // AdoptResidentBytes. For engines; tools that read raw tensor bytes through the source
    // leave it null (plain rows).
    Backend* backend = nullptr;
    // Whether a next-n (MTP) layer's tensors are loaded (Model::EnableNextn needs them); plain
    // decoding never reads them.
    bool load_nextn = false;
  };

  // Reads the tensors of `file` (kept open only during the call): all but a next-n layer's,
  // unless Options::load_nextn. Fails with OutOfMemory when
  // the ledger's cap is exceeded, naming the tensor.
  static Expected<std::unique_ptr<ResidentWeightSource>> Load(const ModelFile& file,
                                                              MemoryLedger* ledger);
  static Expected<std::unique_ptr<ResidentWeightSource>> Load(const ModelFile& file,
                                                              MemoryLedger* ledger,
                                                              const Options& options);

  TensorId Resolve(const std::string& name) const override;
  const TensorInfo& Info(TensorId id) const override { return infos_[id]; }
  Expected<WeightHandle> Acquire(TensorId id, int slice = -1,
                                 int tier = kDefaultTier) override;
  bool ExpertsResident() const override { return true; }

  uint64_t total_bytes() const { return total_bytes_; }

 private:
  std::vector<TensorInfo> infos_;
  std::vector<AlignedBuffer> data_;
  std::vector<WeightLayout> layouts_;
  std::unordered_map<std::string, TensorId> ids_;
  uint64_t total_bytes_ = 0;
};

// A view of tensor `info` whose bytes start at `data` (slice >= 0: that outermost index).
// Shared by weight sources: rows/cols from the shape, bytes from the type.
Expected<WeightView> MakeWeightView(const TensorInfo& info, const uint8_t* data, int slice);

}  // namespace substrate
