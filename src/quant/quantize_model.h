// Quantizing a whole model: choose each tensor's type (mix.h), convert it tensor by tensor
// (expert by expert for 3-D tensors, so peak memory is one slice, not the model), rows in
// parallel on a ThreadPool, and hand the results in llama.cpp's tensor order to a TensorSink
// (the format layer's GGUF writer in `substrate quantize`; an in-memory sink in tests).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "format/model_file.h"
#include "quant/mix.h"

namespace substrate {

class GgufWriter;
class MemoryLedger;
class ThreadPool;

// Receives the quantized model. Begin() gets the output metadata and tensor infos (name, ne,
// type, bytes; parts empty) in write order; WriteTensor() then gets each tensor's bytes in that
// order, possibly in several consecutive chunks (one per expert slice).
class TensorSink {
 public:
  virtual ~TensorSink() = default;
  virtual Status Begin(const Metadata& metadata, const std::vector<TensorInfo>& tensors) = 0;
  virtual Status WriteTensorData(size_t index, const void* data, uint64_t bytes) = 0;
  virtual Status Finish() = 0;
};

// Writes the quantized model to a GGUF file through the format layer's GgufWriter (streamed;
// the file appears under its name only when Finish() succeeds).
class GgufFileSink : public TensorSink {
 public:
  // Writes the quantized model to `path` through env (nullptr: Env::Default()).
  explicit GgufFileSink(std::string path, Env* env = nullptr);
  ~GgufFileSink() override;
  Status Begin(const Metadata& metadata, const std::vector<TensorInfo>& tensors) override;
  Status WriteTensorData(size_t index, const void* data, uint64_t bytes) override;
  Status Finish() override;

 private:
  std::unique_ptr<GgufWriter> writer_;
};

struct QuantizeOptions {
  FileType ftype = {"Q8_0", 7, DType::kQ8_0};
  // Per-tensor types that replace the mix rules (e.g. a compiler plan); may be null.
  const std::map<std::string, DType>* overrides = nullptr;
  ThreadPool* pool = nullptr;      // null: ThreadPool::Default()
  MemoryLedger* ledger = nullptr;  // if set, per-tensor scratch is charged to "scratch"
  bool progress = true;            // progress bar on stderr (when it is a terminal)
};

struct QuantizedTensorReport {
  std::string name;
  DType from = DType::kF32, to = DType::kF32;
  uint64_t bytes_in = 0, bytes_out = 0;
  uint64_t cols = 0;      // row length (ne[0])
  bool fallback = false;  // the mix's type did not fit the row length
};

struct QuantizeReport {
  std::vector<QuantizedTensorReport> tensors;  // write order
  uint64_t bytes_in = 0, bytes_out = 0;
  double seconds = 0;
};

// What the mix rules need, from GGUF metadata (general.architecture and <arch>.* keys).
Expected<MixModelInfo> MixModelInfoFromMetadata(const Metadata& metadata);

// The output catalog: tensors in llama.cpp's order with their new types and sizes.
Expected<std::vector<TensorInfo>> PlanQuantizedTensors(const ModelFile& in,
                                                       const QuantizeOptions& options,
                                                       std::vector<TensorChoice>* choices,
                                                       std::vector<size_t>* source_index);

// Converts `rows` rows of `cols` elements from src_type bytes to dst_type bytes (via F32 when
// the types differ), rows split across the pool. Fails if a row length does not fit a type.
Status ConvertRows(DType src_type, const void* src, DType dst_type, void* dst, int64_t rows,
                   int64_t cols, ThreadPool& pool);

// The whole pipeline; the sink decides where the bytes go.
Expected<QuantizeReport> QuantizeModel(const ModelFile& in, const QuantizeOptions& options,
                                       TensorSink& sink);

}  // namespace substrate
