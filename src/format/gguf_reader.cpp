#include "format/gguf_reader.h"

#include "core/file_io.h"
#include "format/gguf_split.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>

namespace substrate {
namespace {

// Limits that no real model reaches; they bound memory for hostile files (a count is also always
// checked against the bytes left).
constexpr uint64_t kMaxArrayElementsTotal = 4ull << 20;  // across all metadata arrays (~200 MB)
constexpr int kMaxArrayDepth = 8;
constexpr uint64_t kMaxTensorNameBytes = 4096;
constexpr uint32_t kMaxDims = 4;

// Where header bytes come from: a file (positioned reads through a window) or memory.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  virtual Status Read(uint64_t offset, uint64_t n, void* dst) = 0;
};

class FileSource : public ByteSource {
 public:
  explicit FileSource(const RandomAccessFile& f) : f_(f) {}
  uint64_t size() const override { return f_.size(); }
  Status Read(uint64_t offset, uint64_t n, void* dst) override {
    if (n > kWindow) return f_.Read(offset, n, dst);
    if (offset < win_start_ || offset + n > win_start_ + win_.size()) {
      uint64_t len = std::min<uint64_t>(kWindow, f_.size() - offset);
      win_.resize(len);
      RETURN_IF_ERROR(f_.Read(offset, len, win_.data()));
      win_start_ = offset;
    }
    std::memcpy(dst, win_.data() + (offset - win_start_), n);
    return Status::Ok();
  }

 private:
  static constexpr uint64_t kWindow = 1 << 20;
  const RandomAccessFile& f_;
  std::string win_;
  uint64_t win_start_ = 0;
};

class MemorySource : public ByteSource {
 public:
  explicit MemorySource(const std::string& b) : b_(b) {}
  uint64_t size() const override { return b_.size(); }
  Status Read(uint64_t offset, uint64_t n, void* dst) override {
    std::memcpy(dst, b_.data() + offset, n);
    return Status::Ok();
  }

 private:
  const std::string& b_;
};

}  // namespace

// Sequential decoding of the header with every length checked against what is left.
class GgufParser {
 public:
  GgufParser(ByteSource& src, std::string name) : src_(src), name_(std::move(name)) {}

  Status Parse(Metadata* md, std::vector<TensorInfo>* tensors, uint32_t* version,
               uint32_t* alignment, uint64_t* data_offset);

 private:
  uint64_t remaining() const { return src_.size() - pos_; }
  Status Error(const std::string& what) const {
    return Corruption("gguf '" + name_ + "': " + what);
  }
  Status Bytes(void* dst, uint64_t n, const char* what) {
    if (n > remaining()) {
      return Error(std::string("truncated: ") + what + " needs " + std::to_string(n) +
                   " bytes at offset " + std::to_string(pos_) + ", file size " +
                   std::to_string(src_.size()));
    }
    RETURN_IF_ERROR(src_.Read(pos_, n, dst));
    pos_ += n;
    return Status::Ok();
  }
  template <typename T>
  Status Pod(T* v, const char* what) {
    return Bytes(v, sizeof(T), what);
  }
  Status String(std::string* s, const char* what, uint64_t max_len);
  Status Value(GgufType type, MetaValue* out, const std::string& key, int depth);

  ByteSource& src_;
  std::string name_;
  uint64_t pos_ = 0;
  uint64_t array_elements_ = 0;
};

namespace {

// Bytes of a scalar GGUF type, 0 for string/array.
uint64_t ScalarSize(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool: return 1;
    case GgufType::kUint16:
    case GgufType::kInt16: return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32: return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64: return 8;
    default: return 0;
  }
}

bool ValidType(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kFloat64); }

}  // namespace

Status GgufParser::String(std::string* s, const char* what, uint64_t max_len) {
  uint64_t len = 0;
  RETURN_IF_ERROR(Pod(&len, what));
  if (len > remaining() || len > max_len) {
    return Error(std::string(what) + " has length " + std::to_string(len) + " at offset " +
                 std::to_string(pos_ - 8) + ", but only " + std::to_string(remaining()) +
                 " bytes remain");
  }
  s->resize(len);
  return Bytes(s->data(), len, what);
}

Status GgufParser::Value(GgufType type, MetaValue* out, const std::string& key, int depth) {
  out->type = type;
  switch (type) {
    case GgufType::kUint8: { uint8_t v; RETURN_IF_ERROR(Pod(&v, "value")); out->value = uint64_t{v}; break; }
    case GgufType::kInt8: { int8_t v; RETURN_IF_ERROR(Pod(&v, "value")); out->value = int64_t{v}; break; }
    case GgufType::kUint16: { uint16_t v; RETURN_IF_ERROR(Pod(&v, "value")); out->value = uint64_t{v}; break; }
    case GgufType::kInt16: { int16_t v; RETURN_IF_ERROR(Pod(&v, "value")); out->value = int64_t{v}; break; }
    case GgufType::kUint32: { uint32_t v; RETURN_IF_ERROR(Pod(&v, "value")); out->value = uint64_t{v}; break; }
    case GgufType::kInt32: { int32_t v; RETURN_IF_ERROR(Pod(&v, "value")); out->value = int64_t{v}; break; }
    case GgufType::kUint64: { uint64_t v; RETURN_IF_ERROR(Pod(&v, "value")); out->value = v; break; }
    case GgufType::kInt64: { int64_t v; RETURN_IF_ERROR(Pod(&v, "value")); out->value = v; break; }
    case GgufType::kFloat32: { float v; RETURN_IF_ERROR(Pod(&v, "value")); out->value = double{v}; break; }
    case GgufType::kFloat64: { double v; RETURN_IF_ERROR(Pod(&v, "value")); out->value = v; break; }
    case GgufType::kBool: {
      uint8_t v;
      RETURN_IF_ERROR(Pod(&v, "value"));
      if (v > 1) return Error("key '" + key + "': bool value " + std::to_string(v) + " is not 0 or 1");
      out->value = v != 0;
      break;
    }
    case GgufType::kString: {
      std::string s;
      RETURN_IF_ERROR(String(&s, "string value", remaining()));
      out->value = std::move(s);
      break;
    }
    case GgufType::kArray: {
      if (depth >= kMaxArrayDepth) return Error("key '" + key + "': arrays nested too deeply");
      uint32_t et = 0;
      uint64_t count = 0;
      RETURN_IF_ERROR(Pod(&et, "array type"));
      if (!ValidType(et)) {
        return Error("key '" + key + "': unknown array element type " + std::to_string(et));
      }
      RETURN_IF_ERROR(Pod(&count, "array length"));
      GgufType etype = static_cast<GgufType>(et);
      // The smallest encoding of one element: its scalar size, a string's length field, or a
      // nested array's type and length fields.
      uint64_t min_bytes = ScalarSize(etype);
      if (etype == GgufType::kString) min_bytes = 8;
      if (etype == GgufType::kArray) min_bytes = 12;
      if (count > remaining() / min_bytes) {
        return Error("key '" + key + "': array of " + std::to_string(count) + " " +
                     GgufTypeName(etype) + " needs more than the " +
                     std::to_string(remaining()) + " bytes left");
      }
      array_elements_ += count;
      if (array_elements_ > kMaxArrayElementsTotal) {
        return Error("metadata arrays hold more than " + std::to_string(kMaxArrayElementsTotal) +
                     " elements in total (key '" + key + "')");
      }
      std::vector<MetaValue> items(count);
      for (auto& item : items) RETURN_IF_ERROR(Value(etype, &item, key, depth + 1));
      out->array_type = etype;
      out->value = std::move(items);
      break;
    }
  }
  return Status::Ok();
}

Status GgufParser::Parse(Metadata* md, std::vector<TensorInfo>* tensors, uint32_t* version,
                         uint32_t* alignment, uint64_t* data_offset) {
  uint32_t magic = 0;
  RETURN_IF_ERROR(Pod(&magic, "magic"));
  if (magic != kGgufMagic) {
    char m[5] = {};
    std::memcpy(m, &magic, 4);
    for (char& c : m) if (c && (c < 32 || c > 126)) c = '?';
    return Error(std::string("not a GGUF file (magic '") + m + "', expected 'GGUF')");
  }
  RETURN_IF_ERROR(Pod(version, "version"));
  if (*version == 1) return Unimplemented("gguf '" + name_ + "': GGUF v1 is not supported");
  if (*version != 2 && *version != 3) {
    if ((*version & 0xffff) == 0)
      return Unimplemented("gguf '" + name_ + "': big-endian GGUF files are not supported");
    return Error("unsupported version " + std::to_string(*version));
  }
  uint64_t n_tensors = 0, n_kv = 0;
  RETURN_IF_ERROR(Pod(&n_tensors, "tensor count"));
  RETURN_IF_ERROR(Pod(&n_kv, "metadata count"));
  // A key-value pair takes at least 12 bytes (key length + type); a tensor info at least 24.
  if (n_kv > remaining() / 12)
    return Error("metadata count " + std::to_string(n_kv) + " is impossible for the file size");
  if (n_tensors > remaining() / 24)
    return Error("tensor count " + std::to_string(n_tensors) + " is impossible for the file size");

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    RETURN_IF_ERROR(String(&key, "metadata key", 1 << 16));
    if (md->Has(key)) return Error("duplicate metadata key '" + key + "'");
    uint32_t t = 0;
    RETURN_IF_ERROR(Pod(&t, "value type"));
    if (!ValidType(t))
      return Error("key '" + key + "' has unknown value type " + std::to_string(t));
    MetaValue v;
    RETURN_IF_ERROR(Value(static_cast<GgufType>(t), &v, key, 0));
    md->Set(key, std::move(v));
  }

  *alignment = kGgufDefaultAlignment;
  if (const MetaValue* a = md->Find("general.alignment")) {
    if (a->type != GgufType::kUint32) return Error("general.alignment is not a u32");
    uint64_t al = std::get<uint64_t>(a->value);
    if (al == 0 || (al & (al - 1)) != 0)
      return Error("general.alignment " + std::to_string(al) + " is not a power of two");
    *alignment = static_cast<uint32_t>(al);
  }

  std::set<std::string> names;
  tensors->reserve(n_tensors);
  std::vector<uint64_t> rel_offsets;
  rel_offsets.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo ti;
    RETURN_IF_ERROR(String(&ti.name, "tensor name", kMaxTensorNameBytes));
    if (!names.insert(ti.name).second) return Error("duplicate tensor '" + ti.name + "'");
    const std::string tn = "tensor '" + ti.name + "'";
    uint32_t n_dims = 0;
    RETURN_IF_ERROR(Pod(&n_dims, "tensor dims"));
    if (n_dims == 0 || n_dims > kMaxDims)
      return Error(tn + " has " + std::to_string(n_dims) + " dimensions (1 to 4 allowed)");
    ti.ne.resize(n_dims);
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      RETURN_IF_ERROR(Pod(&ti.ne[d], "tensor shape"));
      if (ti.ne[d] > static_cast<uint64_t>(INT64_MAX) ||
          __builtin_mul_overflow(n_el, ti.ne[d], &n_el) || n_el > static_cast<uint64_t>(INT64_MAX))
        return Error(tn + " has an absurd shape (element count overflows)");
    }
    uint32_t type_id = 0;
    uint64_t offset = 0;
    RETURN_IF_ERROR(Pod(&type_id, "tensor type"));
    RETURN_IF_ERROR(Pod(&offset, "tensor offset"));
    auto type = DTypeFromId(type_id);
    if (!type) return Error(tn + " has unknown type id " + std::to_string(type_id));
    ti.type = *type;
    auto row = RowBytes(ti.type, ti.ne[0]);
    if (!row) {
      return Error(tn + ": row of " + std::to_string(ti.ne[0]) + " elements is not a multiple of " +
                   DTypeName(ti.type) + "'s block size " +
                   std::to_string(GetDTypeTraits(ti.type).block_size));
    }
    uint64_t rows = ti.ne[0] ? n_el / ti.ne[0] : 0;
    if (__builtin_mul_overflow(*row, rows, &ti.bytes)) return Error(tn + " byte size overflows");
    if (offset % *alignment != 0) {
      return Error(tn + " offset " + std::to_string(offset) + " is not a multiple of the alignment " +
                   std::to_string(*alignment));
    }
    rel_offsets.push_back(offset);
    tensors->push_back(std::move(ti));
  }

  *data_offset = (pos_ + *alignment - 1) / *alignment * *alignment;
  const uint64_t size = src_.size();
  if (*data_offset > size && n_tensors > 0)
    return Error("data section at offset " + std::to_string(*data_offset) + " is past the end of the file (size " + std::to_string(size) + ")");
  for (size_t i = 0; i < tensors->size(); ++i) {
    TensorInfo& t = (*tensors)[i];
    uint64_t abs = 0, end = 0;
    if (__builtin_add_overflow(*data_offset, rel_offsets[i], &abs) ||
        __builtin_add_overflow(abs, t.bytes, &end) || end > size) {
      return Error("tensor '" + t.name + "' (offset " + std::to_string(rel_offsets[i]) + ", " +
                   std::to_string(t.bytes) + " bytes) runs past the end of the file (size " +
                   std::to_string(size) + ")");
    }
    t.parts = {TensorPart{0, abs, t.bytes}};
  }
  // No two tensors may share bytes.
  std::vector<size_t> order(tensors->size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return (*tensors)[a].parts[0].offset < (*tensors)[b].parts[0].offset;
  });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo& prev = (*tensors)[order[k - 1]];
    const TensorInfo& cur = (*tensors)[order[k]];
    if (prev.parts[0].offset + prev.bytes > cur.parts[0].offset)
      return Error("tensors '" + prev.name + "' and '" + cur.name + "' overlap");
  }
  return Status::Ok();
}

namespace {

// One GGUF file's header, parsed.
struct GgufPart {
  std::unique_ptr<RandomAccessFile> file;
  Metadata metadata;
  std::vector<TensorInfo> tensors;
  uint32_t version = 3, alignment = kGgufDefaultAlignment;
  uint64_t data_offset = 0;
};

Expected<GgufPart> ParsePart(const std::string& path) {
  GgufPart p;
  ASSIGN_OR_RETURN(p.file, RandomAccessFile::Open(path));
  FileSource src(*p.file);
  GgufParser parser(src, path);
  RETURN_IF_ERROR(parser.Parse(&p.metadata, &p.tensors, &p.version, &p.alignment, &p.data_offset));
  return p;
}

// split.count of a part (0 when absent).
int64_t SplitCount(const GgufPart& p) { return p.metadata.GetInt(kGgufSplitCount, 0); }

// The paths of all parts of the split `given` belongs to (it says it is part `index` of `count`),
// from its name.
Expected<std::vector<std::string>> SplitPaths(const std::string& given, const GgufPart& part) {
  const int64_t count = SplitCount(part), index = part.metadata.GetInt(kGgufSplitNo, -1);
  if (index < 0 || index >= count || count > 99999)
    return Corruption("gguf '" + given + "': split.count " + std::to_string(count) + " with " +
                      (index < 0 ? "no split.no" : "split.no " + std::to_string(index)) +
                      ": not a part of a split GGUF");
  const auto name = ParseGgufSplitPath(given);
  if (!name || name->count != count || name->index != index)
    return InvalidArgument("'" + given + "' is part " + std::to_string(index + 1) + " of a split GGUF of " +
                           std::to_string(count) + " files, but its name does not end in " +
                           GgufSplitPath("", static_cast<int>(index), static_cast<int>(count)) +
                           ", so its other parts cannot be found (rename it as gguf-split named it)");
  std::vector<std::string> paths;
  for (int i = 0; i < name->count; ++i) paths.push_back(GgufSplitPath(name->prefix, i, name->count));
  return paths;
}

}  // namespace

Expected<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(GgufPart given, ParsePart(path));
  std::unique_ptr<GgufFile> g(new GgufFile());
  auto take_first = [&](GgufPart& p, const std::string& p_path) {
    g->path_ = p_path;
    g->metadata_ = std::move(p.metadata);
    g->version_ = p.version;
    g->alignment_ = p.alignment;
    g->data_offset_ = p.data_offset;
  };
  if (SplitCount(given) <= 1) {
    take_first(given, path);
    g->tensors_ = std::move(given.tensors);
    g->files_.push_back(std::move(given.file));
    return g;
  }

  ASSIGN_OR_RETURN(const std::vector<std::string> paths, SplitPaths(path, given));
  const int64_t count = static_cast<int64_t>(paths.size());
  const std::string what = "split GGUF '" + paths[0] + "'";
  int64_t total = -1;  // split.tensors.count, as the first part says
  std::set<std::string> names;
  for (int64_t i = 0; i < count; ++i) {
    GgufPart p;
    if (paths[i] == path) {
      p = std::move(given);
    } else {
      if (!FileExists(paths[i]))
        return NotFound(what + ": part " + std::to_string(i + 1) + " of " + std::to_string(count) +
                        ", '" + paths[i] + "', is missing");
      ASSIGN_OR_RETURN(p, ParsePart(paths[i]));
    }
    // A part of another split (another model, or the same one split otherwise) must not mix in.
    const int64_t no = p.metadata.GetInt(kGgufSplitNo, -1);
    const int64_t tensors_count = p.metadata.GetInt(kGgufSplitTensorsCount, -1);
    if (i == 0) total = tensors_count;
    if (no != i || SplitCount(p) != count || tensors_count != total)
      return Corruption(what + ": '" + paths[i] + "' is not part " + std::to_string(i + 1) +
                        " of this split: it says part " + std::to_string(no + 1) + " of " +
                        std::to_string(SplitCount(p)) + ", of a model of " +
                        std::to_string(tensors_count) + " tensors (part 1 says " +
                        std::to_string(total) + "); it belongs to another split");
    for (TensorInfo& t : p.tensors) {
      if (!names.insert(t.name).second)
        return Corruption(what + ": tensor '" + t.name + "' is in two parts (again in '" +
                          paths[i] + "'): a part of another split is mixed in");
      t.parts[0].file = static_cast<int>(i);
      g->tensors_.push_back(std::move(t));
    }
    if (i == 0) take_first(p, paths[0]);
    g->files_.push_back(std::move(p.file));
  }
  if (total >= 0 && static_cast<int64_t>(g->tensors_.size()) != total)
    return Corruption(what + ": its parts hold " + std::to_string(g->tensors_.size()) +
                      " tensors, the split says " + std::to_string(total));
  // One model now: its metadata no longer describes a split (what a writer copies from it).
  for (const char* k : {kGgufSplitNo, kGgufSplitCount, kGgufSplitTensorsCount}) g->metadata_.Erase(k);
  return g;
}

Status ParseGgufHeader(const std::string& bytes, Metadata* metadata,
                       std::vector<TensorInfo>* tensors) {
  MemorySource src(bytes);
  GgufParser parser(src, "<memory>");
  uint32_t version = 0, alignment = 0;
  uint64_t data_offset = 0;
  return parser.Parse(metadata, tensors, &version, &alignment, &data_offset);
}

Status GgufFile::ReadTensor(const TensorInfo& info, void* dst) const {
  if (info.parts.size() != 1) return Internal("gguf: tensor '" + info.name + "' is not from this file");
  return files_[info.parts[0].file]->Read(info.parts[0].offset, info.bytes, dst);
}

Status GgufFile::ReadSlice(const TensorInfo& info, uint64_t index, void* dst) const {
  if (info.parts.size() != 1) return Internal("gguf: tensor '" + info.name + "' is not from this file");
  if (index >= info.outer()) {
    return InvalidArgument("tensor '" + info.name + "': slice " + std::to_string(index) +
                           " out of range (outer dimension " + std::to_string(info.outer()) + ")");
  }
  uint64_t sb = info.slice_bytes();
  return files_[info.parts[0].file]->Read(info.parts[0].offset + index * sb, sb, dst);
}

}  // namespace substrate
