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

// Per-column importance for the rows of one tensor (or of one expert slice of a 3-D tensor):
// what QuantizeRow's `importance` gets for every row (see quant.h). Implemented above this
// layer (the compiler's activation statistics).
class ImportanceSource {
 public:
  virtual ~ImportanceSource() = default;
  // `cols` values, or empty: quantize that tensor (slice) without importance.
  virtual std::vector<float> ColumnImportance(const std::string& tensor, int slice,
                                              int64_t cols) const = 0;
};

// Our own metadata key: the summary of the plan a mixed-precision file was quantized with.
// LayoutQuantizedFile drops it from the input's metadata (a plan file re-quantized does not
// keep its old plan); a new value comes through QuantizeOptions::extra_metadata.
inline constexpr const char* kQuantizePlanKey = "substrate.quantize.plan";

struct QuantizeOptions {
  FileType ftype = {"Q8_0", 7, DType::kQ8_0};
  // Per-tensor types that replace the mix rules (e.g. a compiler plan); may be null.
  const std::map<std::string, DType>* overrides = nullptr;
  // true: tensors the overrides do not name are copied as they are (no mix rules).
  bool copy_unlisted = false;
  uint32_t file_type_id = UINT32_MAX;  // general.file_type; UINT32_MAX: ftype.id
  // Keys added after the input's metadata (a plan's summary), in this order.
  std::vector<std::pair<std::string, MetaValue>> extra_metadata;
  const ImportanceSource* importance = nullptr;  // null: no importance
  ThreadPool* pool = nullptr;      // null: ThreadPool::Default()
  MemoryLedger* ledger = nullptr;  // if set, per-tensor scratch is charged to "scratch"
  bool progress = true;            // progress bar on stderr (when it is a terminal)
};

// The file QuantizeModel writes, before a byte of it is written: metadata, tensors in write
// order with their types, and its exact size (header, padding and data).
struct QuantizedLayout {
  Metadata metadata;
  std::vector<TensorInfo> tensors;   // write order
  std::vector<TensorChoice> choices; // per tensor of `tensors`
  std::vector<size_t> source_index;  // index into in.tensors()
  uint64_t alignment = 32;
  uint64_t header_bytes = 0;  // serialized header, before the padding to `alignment`
  uint64_t file_bytes = 0;    // what the written file's size will be
};
Expected<QuantizedLayout> LayoutQuantizedFile(const ModelFile& in, const QuantizeOptions& options);

// Bytes a tensor of `bytes` takes in the data section (padded to the alignment).
inline uint64_t AlignedTensorBytes(uint64_t bytes, uint64_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}
// Bytes one more string metadata entry (key and value) adds to a GGUF header.
uint64_t StringMetadataEntryBytes(const std::string& key, const std::string& value);

// The llama.cpp file type (of the K-quant mixes and Q8_0) whose file for this model would be
// nearest in size to `file_bytes`: what general.file_type says of a mixed-precision file.
Expected<FileType> NearestFileType(const ModelFile& in, uint64_t file_bytes);

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
// `importance` (cols values, may be null) is every row's QuantizeRow importance.
Status ConvertRows(DType src_type, const void* src, DType dst_type, void* dst, int64_t rows,
                   int64_t cols, ThreadPool& pool, const float* importance = nullptr);

// The whole pipeline; the sink decides where the bytes go.
Expected<QuantizeReport> QuantizeModel(const ModelFile& in, const QuantizeOptions& options,
                                       TensorSink& sink);

}  // namespace substrate
