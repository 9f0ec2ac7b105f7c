// ModelFile: one model, opened from a GGUF file or a Hugging Face checkpoint folder, seen the
// same way: GGUF-style metadata (key -> value) and a catalog of tensors with GGUF canonical names.
//
// A HF folder is presented as the GGUF that `substrate convert` would write from it: metadata
// synthesized from config.json / tokenizer.json / tokenizer_config.json, tensor names mapped
// ("model.layers.5.self_attn.q_proj.weight" -> "blk.5.attn_q.weight"), per-expert tensors
// gathered into one 3-D tensor ("blk.N.ffn_gate_exps.weight", one part per expert) and any
// layout transform the GGUF convention needs (e.g. llama's q/k rope permutation) applied on
// read. So the model code and the tokenizer never care where a model came from.
//
// Nothing is read until asked: opening reads headers only; tensor bytes are read through
// positioned reads of exactly the requested range.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "core/file_io.h"
#include "core/status.h"
#include "format/dtype.h"

namespace substrate {

// GGUF metadata value types (the numeric values are GGUF's).
enum class GgufType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6,
  kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};

// A metadata value: a scalar, a string, or an array of values (arrays may nest).
struct MetaValue {
  GgufType type = GgufType::kUint32;
  GgufType array_type = GgufType::kUint32;  // element type when type == kArray
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<MetaValue>> value;

  // Conversions that accept any numeric type; nullopt-like failures are reported by Metadata.
  bool is_array() const { return type == GgufType::kArray; }
  const std::vector<MetaValue>& array() const { return std::get<std::vector<MetaValue>>(value); }

  // Builders with the exact GGUF type (what a writer will store). Unsigned GGUF types hold a
  // uint64_t, signed ones an int64_t, float32/float64 a double.
  static MetaValue U8(uint8_t v) { return Make(GgufType::kUint8, uint64_t{v}); }
  static MetaValue U16(uint16_t v) { return Make(GgufType::kUint16, uint64_t{v}); }
  static MetaValue U32(uint32_t v) { return Make(GgufType::kUint32, uint64_t{v}); }
  static MetaValue U64(uint64_t v) { return Make(GgufType::kUint64, v); }
  static MetaValue I32(int32_t v) { return Make(GgufType::kInt32, int64_t{v}); }
  static MetaValue I64(int64_t v) { return Make(GgufType::kInt64, v); }
  static MetaValue F32(float v) { return Make(GgufType::kFloat32, double{v}); }
  static MetaValue F64(double v) { return Make(GgufType::kFloat64, v); }
  static MetaValue Bool(bool v) { return Make(GgufType::kBool, v); }
  static MetaValue Str(std::string v) { return Make(GgufType::kString, std::move(v)); }
  static MetaValue Array(GgufType element_type, std::vector<MetaValue> items) {
    MetaValue m = Make(GgufType::kArray, std::move(items));
    m.array_type = element_type;
    return m;
  }
  static MetaValue StrArray(const std::vector<std::string>& items);
  static MetaValue I32Array(const std::vector<int32_t>& items);
  static MetaValue F32Array(const std::vector<float>& items);

  bool operator==(const MetaValue& o) const {
    return type == o.type && (type != GgufType::kArray || array_type == o.array_type) &&
           value == o.value;
  }

 private:
  template <typename V>
  static MetaValue Make(GgufType t, V v) {
    MetaValue m;
    m.type = t;
    m.value = std::move(v);
    return m;
  }
};

// "u32", "string", "array" — for messages and `substrate info`.
const char* GgufTypeName(GgufType t);
// A value as short text: numbers, quoted strings, arrays as "[string x 8192]" (or the items
// themselves when there are at most `max_items`).
std::string MetaValueToString(const MetaValue& v, size_t max_items = 8);

class Metadata {
 public:
  bool Has(const std::string& key) const { return kv_.count(key) != 0; }
  const MetaValue* Find(const std::string& key) const;
  // Typed getters; a missing key or a wrong type is an error naming the key.
  Expected<std::string> GetString(const std::string& key) const;
  Expected<int64_t> GetInt(const std::string& key) const;
  Expected<double> GetFloat(const std::string& key) const;
  Expected<bool> GetBool(const std::string& key) const;
  Expected<std::vector<std::string>> GetStringArray(const std::string& key) const;
  Expected<std::vector<int64_t>> GetIntArray(const std::string& key) const;
  Expected<std::vector<double>> GetFloatArray(const std::string& key) const;
  // With defaults, for optional keys.
  std::string GetString(const std::string& key, const std::string& fallback) const;
  int64_t GetInt(const std::string& key, int64_t fallback) const;
  double GetFloat(const std::string& key, double fallback) const;

  void Set(const std::string& key, MetaValue v);
  void Erase(const std::string& key);
  // Keys in insertion order (GGUF files keep their order on rewrite).
  const std::vector<std::string>& keys() const { return order_; }

 private:
  std::map<std::string, MetaValue> kv_;
  std::vector<std::string> order_;
};

// One contiguous byte range of a tensor in a file.
struct TensorPart {
  int file = 0;         // index into ModelFile::files()
  uint64_t offset = 0;  // absolute offset in that file
  uint64_t bytes = 0;
};

enum class TensorTransform : uint8_t {
  kNone = 0,
  kPermuteRopeHeads,  // llama q/k: HF rotate-half layout -> GGUF interleaved layout
};

struct TensorInfo {
  std::string name;          // GGUF canonical name
  std::vector<uint64_t> ne;  // ggml order: ne[0] is the contiguous (innermost) dimension
  DType type = DType::kF32;  // type as stored in the file
  uint64_t bytes = 0;        // total bytes of the tensor
  // One part for a GGUF tensor; one per outermost index for HF per-expert tensors.
  std::vector<TensorPart> parts;
  TensorTransform transform = TensorTransform::kNone;
  int64_t transform_arg = 0;  // n_head (or n_head_kv) for kPermuteRopeHeads

  uint64_t n_elements() const;
  uint64_t outer() const { return ne.empty() ? 1 : ne.back(); }  // size of outermost dim
  uint64_t slice_bytes() const { return outer() ? bytes / outer() : 0; }
};

class ModelFile {
 public:
  virtual ~ModelFile() = default;

  // Opens a .gguf file or a HF folder (config.json + *.safetensors). Reads headers only.
  static Expected<std::unique_ptr<ModelFile>> Open(const std::string& path);

  virtual const std::string& path() const = 0;
  virtual const Metadata& metadata() const = 0;
  virtual const std::vector<TensorInfo>& tensors() const = 0;
  const TensorInfo* Find(const std::string& name) const;

  // Reads the whole tensor (transform applied) into dst (info.bytes bytes).
  virtual Status ReadTensor(const TensorInfo& info, void* dst) const = 0;
  // Reads one index of the outermost dimension (an expert): info.slice_bytes() bytes.
  virtual Status ReadSlice(const TensorInfo& info, uint64_t index, void* dst) const = 0;

  // The file holding part.file, for readers that schedule their own I/O (runtime).
  virtual const RandomAccessFile& file(int index) const = 0;
  virtual int n_files() const = 0;
};

}  // namespace substrate
