// GGUF (v2 and v3, little-endian) reader. Open() reads and validates the header only: metadata,
// tensor infos, alignment and data offset, each checked against the file size before anything is
// allocated from it, so a truncated or hostile file gets a Corruption error naming the problem.
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
  static Expected<std::unique_ptr<GgufFile>> Open(const std::string& path);

  const std::string& path() const override { return path_; }
  const Metadata& metadata() const override { return metadata_; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  Status ReadTensor(const TensorInfo& info, void* dst) const override;
  Status ReadSlice(const TensorInfo& info, uint64_t index, void* dst) const override;
  const RandomAccessFile& file(int index) const override { return *file_; }
  int n_files() const override { return 1; }

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute offset of the data section

 private:
  friend class GgufParser;
  GgufFile() = default;
  std::string path_;
  std::unique_ptr<RandomAccessFile> file_;
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
