// A Hugging Face checkpoint folder seen as the GGUF that `substrate convert` would write from it:
// config.json (+ tokenizer files) become GGUF metadata, safetensors tensors get GGUF names, and
// per-expert tensors are gathered into 3-D tensors (one TensorPart per expert). Tensor types are
// the stored ones (F32/F16/BF16); the q/k rope permutation of llama-family models is applied when
// a tensor is read.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "format/model_file.h"

namespace substrate {

class HfModelFile : public ModelFile {
 public:
  // `dir` holds config.json and model.safetensors, or shards listed in
  // model.safetensors.index.json.
  static Expected<std::unique_ptr<HfModelFile>> Open(const std::string& dir);

  const std::string& path() const override { return dir_; }
  const Metadata& metadata() const override { return metadata_; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  Status ReadTensor(const TensorInfo& info, void* dst) const override;
  Status ReadSlice(const TensorInfo& info, uint64_t index, void* dst) const override;
  const RandomAccessFile& file(int index) const override { return *files_[index]; }
  int n_files() const override { return static_cast<int>(files_.size()); }

  // The type most 2-D tensors are stored in (what `convert --type auto` keeps).
  DType source_type() const { return source_type_; }

 private:
  HfModelFile() = default;
  // Reads `n` bytes starting `begin` bytes into the tensor's (untransformed) parts.
  Status ReadRaw(const TensorInfo& info, uint64_t begin, uint64_t n, void* dst) const;

  std::string dir_;
  std::vector<std::unique_ptr<RandomAccessFile>> files_;
  Metadata metadata_;
  std::vector<TensorInfo> tensors_;
  DType source_type_ = DType::kF32;
};

// Applies the llama q/k permutation to `rows` rows of `row_bytes` bytes: within each of n_head
// heads, HF's rotate-half row order (all first halves, then all second halves) becomes GGUF's
// interleaved pairs. Exposed for tests.
Status PermuteRopeRows(const void* src, void* dst, uint64_t rows, uint64_t row_bytes,
                       int64_t n_head);

}  // namespace substrate
