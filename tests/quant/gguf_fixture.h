// Test helper: the tensors of a GGUF fixture (name, shape, type, raw bytes), read whole.
// A minimal stand-alone reader used until the format layer's ModelFile lands; it trusts the
// fixture files in ../shared (they are known-good) and only guards against reading past the end.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "format/dtype.h"

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

class FixtureReader {
 public:
  explicit FixtureReader(std::vector<uint8_t> b) : b_(std::move(b)) {}
  bool ok() const { return ok_; }
  template <typename T>
  T Get() {
    T v{};
    if (pos_ + sizeof(T) > b_.size()) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string Str() {
    const auto n = Get<uint64_t>();
    if (!ok_ || n > b_.size() - pos_) {
      ok_ = false;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  // Skips (or reads as string, for string values) one metadata value of GGUF type t.
  std::string Value(uint32_t t) {
    static const int kSize[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (t == 8) return Str();
    if (t == 9) {
      const auto at = Get<uint32_t>();
      const auto n = Get<uint64_t>();
      for (uint64_t i = 0; ok_ && i < n; ++i) Value(at);
      return {};
    }
    if (t > 12) {
      ok_ = false;
      return {};
    }
    pos_ += static_cast<size_t>(kSize[t]);
    if (pos_ > b_.size()) ok_ = false;
    return {};
  }
  size_t pos() const { return pos_; }
  const std::vector<uint8_t>& bytes() const { return b_; }

 private:
  std::vector<uint8_t> b_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// Returns false when the file is missing or malformed.
inline bool LoadFixture(const std::string& path, FixtureModel* m) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  FixtureReader r(std::vector<uint8_t>((std::istreambuf_iterator<char>(f)),
                                       std::istreambuf_iterator<char>()));
  if (r.Get<uint32_t>() != 0x46554747u) return false;
  r.Get<uint32_t>();  // version
  const auto n_tensors = r.Get<uint64_t>();
  const auto n_kv = r.Get<uint64_t>();
  uint64_t alignment = 32;
  for (uint64_t i = 0; r.ok() && i < n_kv; ++i) {
    const std::string key = r.Str();
    const auto t = r.Get<uint32_t>();
    if (key == "general.alignment" && t == 4) {
      alignment = r.Get<uint32_t>();
      continue;
    }
    if (t == 4 || t == 5) {  // u32 / i32
      m->ints[key] = t == 4 ? static_cast<int64_t>(r.Get<uint32_t>()) : r.Get<int32_t>();
      continue;
    }
    std::string v = r.Value(t);
    if (key == "general.architecture") m->arch = v;
  }
  std::vector<uint64_t> offsets;
  for (uint64_t i = 0; r.ok() && i < n_tensors; ++i) {
    FixtureTensor t;
    t.name = r.Str();
    const auto nd = r.Get<uint32_t>();
    for (uint32_t d = 0; d < nd && d < 8; ++d) t.ne.push_back(r.Get<uint64_t>());
    t.type = static_cast<DType>(r.Get<uint32_t>());
    offsets.push_back(r.Get<uint64_t>());
    m->tensors.push_back(std::move(t));
  }
  if (!r.ok()) return false;
  const uint64_t data = (r.pos() + alignment - 1) / alignment * alignment;
  for (size_t i = 0; i < m->tensors.size(); ++i) {
    auto& t = m->tensors[i];
    auto bytes = RowBytes(t.type, t.n_elements());
    if (!bytes || data + offsets[i] + *bytes > r.bytes().size()) return false;
    const auto* p = r.bytes().data() + data + offsets[i];
    t.data.assign(p, p + *bytes);
    m->index[t.name] = i;
  }
  return true;
}

}  // namespace substrate::testing
