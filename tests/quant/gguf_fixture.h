// Test helper: the tensors of a GGUF fixture (name, shape, type, raw bytes) and its integer
// metadata, read whole through ModelFile::Open.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "format/dtype.h"
#include "format/model_file.h"

namespace substrate::testing {

struct FixtureTensor {
  std::string name;
  std::vector<uint64_t> ne;
  DType type = DType::kF32;
  std::vector<uint8_t> data;
  uint64_t n_elements() const {
    uint64_t n = 1;
    for (auto d : ne) n *= d;
    return n;
  }
  uint64_t cols() const { return ne.empty() ? 1 : ne[0]; }
  uint64_t rows() const { return cols() ? n_elements() / cols() : 0; }
};

struct FixtureModel {
  std::vector<FixtureTensor> tensors;  // file order
  std::map<std::string, size_t> index;
  std::string arch;
  std::map<std::string, int64_t> ints;  // integer metadata scalars
  const FixtureTensor* Find(const std::string& n) const {
    auto it = index.find(n);
    return it == index.end() ? nullptr : &tensors[it->second];
  }
};

// Reads the whole file through the format layer's ModelFile (the reader under test elsewhere).
// Returns false when the file is missing or malformed.
inline bool LoadFixture(const std::string& path, FixtureModel* m) {
  auto file = ModelFile::Open(path);
  if (!file.ok()) return false;
  const Metadata& md = (*file)->metadata();
  m->arch = md.GetString("general.architecture", "");
  for (const auto& key : md.keys()) {
    const MetaValue* v = md.Find(key);
    if (!v || v->is_array()) continue;
    switch (v->type) {
      case GgufType::kUint8: case GgufType::kInt8: case GgufType::kUint16: case GgufType::kInt16:
      case GgufType::kUint32: case GgufType::kInt32: case GgufType::kUint64: case GgufType::kInt64:
        m->ints[key] = md.GetInt(key, 0);
        break;
      default:
        break;
    }
  }
  for (const TensorInfo& t : (*file)->tensors()) {
    FixtureTensor ft;
    ft.name = t.name;
    ft.ne = t.ne;
    ft.type = t.type;
    ft.data.resize(t.bytes);
    if (!(*file)->ReadTensor(t, ft.data.data()).ok()) return false;
    m->index[ft.name] = m->tensors.size();
    m->tensors.push_back(std::move(ft));
  }
  return true;
}

}  // namespace substrate::testing
