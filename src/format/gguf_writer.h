// GGUF v3 writer: metadata in the given order, tensor infos, aligned data — streamed, so a model
// larger than memory can be written one tensor (or one slice of one) at a time. The file appears
// under its final name only after Finish() (AtomicFileWriter: temp name, fsync, rename).
//
//   GgufWriter w(path);
//   w.SetMetadata(md);
//   w.AddTensor("token_embd.weight", {256, 8192}, DType::kBF16);  ... every tensor, in order
//   w.WriteTensorData(bytes, n);  ... the tensors' bytes in the same order, in any chunks
//   w.Finish();
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "format/model_file.h"

namespace substrate {

class GgufWriter {
 public:
  // The file is written through env (nullptr: Env::Default()).
  explicit GgufWriter(std::string path, Env* env = nullptr) : path_(std::move(path)), env_(env) {}

  // general.alignment in `md` (u32, a power of two) sets the data alignment; 32 otherwise.
  void SetMetadata(const Metadata& md) { metadata_ = md; }
  Status AddTensor(const std::string& name, const std::vector<uint64_t>& ne, DType type);

  // The data alignment in effect (from general.alignment, default 32).
  uint64_t alignment() const;

  // Streams data for the tensors in AddTensor order; the header is written on the first call.
  Status WriteTensorData(const void* data, uint64_t n);
  // Checks every tensor got all its bytes, pads, fsyncs and renames into place.
  Status Finish();

  // The serialized header (magic .. tensor infos, without the padding before the data).
  Expected<std::string> HeaderBytes() const;

 private:
  struct Pending {
    std::string name;
    std::vector<uint64_t> ne;
    DType type;
    uint64_t bytes;
    uint64_t offset;  // relative to the data section
  };
  Status Start();

  std::string path_;
  Env* env_ = nullptr;
  Metadata metadata_;
  std::vector<Pending> tensors_;
  uint64_t data_size_ = 0;
  std::unique_ptr<AtomicFileWriter> out_;
  uint64_t data_start_ = 0;
  size_t current_ = 0;          // tensor being written
  uint64_t current_done_ = 0;   // bytes of it written
};

// Appends the GGUF encoding of a metadata value (without its type tag) to `out`.
void AppendGgufValue(const MetaValue& v, std::string* out);

}  // namespace substrate
