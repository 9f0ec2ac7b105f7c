// GGUF (v2 and v3, little-endian) reader. Open() reads and validates the header only: metadata,
// tensor infos, alignment and data offset, each checked against the file size before anything is
// allocated from it, so a truncated or hostile file gets a Corruption error naming the problem.
// A split GGUF (format/gguf_split.h) opens as one model from any of its parts' names.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "format/model_file.h"

namespace substrate {

inline constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as little-endian u32
inline constexpr uint32_t kGgufDefaultAlignment = 32;

class GgufFile : public ModelFile {
 public:
  // A file whose split.count is above 1 is one part of a split GGUF: every part is opened (named
  // from `path` by the split pattern) and checked to belong to the same split, and the model is
  // the first part's metadata (less the split.* keys) and all parts' tensors, each TensorPart
  // naming its part. NotFound naming a missing part; Corruption naming a part of another split.
  static Expected<std::unique_ptr<GgufFile>> Open(const std::string& path);

  // The first part's path for a split GGUF.
  const std::string& path() const override { return path_; }
  const Metadata& metadata() const override { return metadata_; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  Status ReadTensor(const TensorInfo& info, void* dst) const override;
  Status ReadSlice(const TensorInfo& info, uint64_t index, void* dst) const override;
  const RandomAccessFile& file(int index) const override { return *files_[index]; }
  int n_files() const override { return static_cast<int>(files_.size()); }

  // Of the first part.
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute offset of the data section

 private:
  friend class GgufParser;
  GgufFile() = default;
  std::string path_;
  std::vector<std::unique_ptr<RandomAccessFile>> files_;  // one per part
  Metadata metadata_;
  std::vector<TensorInfo> tensors_;
  uint32_t version_ = 3;
  uint32_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
};

// Parses GGUF bytes already in memory (the fuzz target uses this; it shares every check with
// Open). The tensors' parts refer to file 0 with absolute offsets into `bytes`.
Status ParseGgufHeader(const std::string& bytes, Metadata* metadata,
                       std::vector<TensorInfo>* tensors);

}  // namespace substrate
