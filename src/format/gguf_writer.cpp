#include "format/gguf_writer.h"

#include <cstring>
#include <set>

#include "format/gguf_reader.h"

namespace substrate {
namespace {

template <typename T>
void Put(T v, std::string* out) {
  out->append(reinterpret_cast<const char*>(&v), sizeof v);
}

void PutString(const std::string& s, std::string* out) {
  Put<uint64_t>(s.size(), out);
  out->append(s);
}

}  // namespace

void AppendGgufValue(const MetaValue& v, std::string* out) {
  switch (v.type) {
    case GgufType::kUint8: Put<uint8_t>(static_cast<uint8_t>(std::get<uint64_t>(v.value)), out); break;
    case GgufType::kInt8: Put<int8_t>(static_cast<int8_t>(std::get<int64_t>(v.value)), out); break;
    case GgufType::kUint16: Put<uint16_t>(static_cast<uint16_t>(std::get<uint64_t>(v.value)), out); break;
    case GgufType::kInt16: Put<int16_t>(static_cast<int16_t>(std::get<int64_t>(v.value)), out); break;
    case GgufType::kUint32: Put<uint32_t>(static_cast<uint32_t>(std::get<uint64_t>(v.value)), out); break;
    case GgufType::kInt32: Put<int32_t>(static_cast<int32_t>(std::get<int64_t>(v.value)), out); break;
    case GgufType::kUint64: Put<uint64_t>(std::get<uint64_t>(v.value), out); break;
    case GgufType::kInt64: Put<int64_t>(std::get<int64_t>(v.value), out); break;
    case GgufType::kFloat32: Put<float>(static_cast<float>(std::get<double>(v.value)), out); break;
    case GgufType::kFloat64: Put<double>(std::get<double>(v.value), out); break;
    case GgufType::kBool: Put<uint8_t>(std::get<bool>(v.value) ? 1 : 0, out); break;
    case GgufType::kString: PutString(std::get<std::string>(v.value), out); break;
    case GgufType::kArray: {
      const auto& items = v.array();
      Put<uint32_t>(static_cast<uint32_t>(v.array_type), out);
      Put<uint64_t>(items.size(), out);
      for (const auto& e : items) AppendGgufValue(e, out);
      break;
    }
  }
}

uint64_t GgufWriter::alignment() const {
  const MetaValue* a = metadata_.Find("general.alignment");
  if (a && a->type == GgufType::kUint32) {
    uint64_t al = std::get<uint64_t>(a->value);
    if (al && (al & (al - 1)) == 0) return al;
  }
  return kGgufDefaultAlignment;
}

Status GgufWriter::AddTensor(const std::string& name, const std::vector<uint64_t>& ne, DType type) {
  if (out_) return Internal("gguf writer: AddTensor('" + name + "') after data was written");
  if (ne.empty() || ne.size() > 4)
    return InvalidArgument("gguf writer: tensor '" + name + "' has " + std::to_string(ne.size()) + " dimensions");
  for (const auto& t : tensors_)
    if (t.name == name) return InvalidArgument("gguf writer: duplicate tensor '" + name + "'");
  auto row = RowBytes(type, ne[0]);
  if (!row) {
    return InvalidArgument("gguf writer: tensor '" + name + "': " + std::to_string(ne[0]) +
                           " elements per row do not fit " + DTypeName(type) + " blocks");
  }
  uint64_t bytes = *row;
  for (size_t i = 1; i < ne.size(); ++i) bytes *= ne[i];
  uint64_t al = alignment();
  tensors_.push_back({name, ne, type, bytes, data_size_});
  data_size_ += (bytes + al - 1) / al * al;
  return Status::Ok();
}

Expected<std::string> GgufWriter::HeaderBytes() const {
  const MetaValue* a = metadata_.Find("general.alignment");
  if (a && (a->type != GgufType::kUint32 || alignment() != std::get<uint64_t>(a->value)))
    return InvalidArgument("gguf writer: general.alignment must be a u32 power of two");
  std::string h;
  Put<uint32_t>(kGgufMagic, &h);
  Put<uint32_t>(3, &h);
  Put<uint64_t>(tensors_.size(), &h);
  Put<uint64_t>(metadata_.keys().size(), &h);
  for (const auto& k : metadata_.keys()) {
    const MetaValue& v = *metadata_.Find(k);
    PutString(k, &h);
    Put<uint32_t>(static_cast<uint32_t>(v.type), &h);
    AppendGgufValue(v, &h);
  }
  for (const auto& t : tensors_) {
    PutString(t.name, &h);
    Put<uint32_t>(static_cast<uint32_t>(t.ne.size()), &h);
    for (uint64_t d : t.ne) Put<uint64_t>(d, &h);
    Put<uint32_t>(static_cast<uint32_t>(t.type), &h);
    Put<uint64_t>(t.offset, &h);
  }
  return h;
}

Status GgufWriter::Start() {
  ASSIGN_OR_RETURN(std::string header, HeaderBytes());
  ASSIGN_OR_RETURN(out_, AtomicFileWriter::Create(path_, env_));
  RETURN_IF_ERROR(out_->Append(header));
  RETURN_IF_ERROR(out_->PadTo(alignment()));
  data_start_ = out_->offset();
  return Status::Ok();
}

Status GgufWriter::WriteTensorData(const void* data, uint64_t n) {
  if (!out_) RETURN_IF_ERROR(Start());
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    if (current_ >= tensors_.size())
      return InvalidArgument("gguf writer: more data than the tensors declared");
    Pending& t = tensors_[current_];
    uint64_t take = std::min(n, t.bytes - current_done_);
    RETURN_IF_ERROR(out_->Append(p, take));
    p += take;
    n -= take;
    current_done_ += take;
    if (current_done_ == t.bytes) {
      RETURN_IF_ERROR(out_->PadTo(alignment()));
      ++current_;
      current_done_ = 0;
    }
  }
  // Zero-byte tensors complete without data.
  while (current_ < tensors_.size() && tensors_[current_].bytes == 0) ++current_;
  return Status::Ok();
}

Status GgufWriter::Finish() {
  if (!out_) RETURN_IF_ERROR(Start());
  RETURN_IF_ERROR(WriteTensorData(nullptr, 0));
  if (current_ != tensors_.size()) {
    return InvalidArgument("gguf writer: tensor '" + tensors_[current_].name + "' got " +
                           std::to_string(current_done_) + " of " +
                           std::to_string(tensors_[current_].bytes) + " bytes");
  }
  if (out_->offset() != data_start_ + data_size_)
    return Internal("gguf writer: data section size mismatch");
  return out_->Commit();
}

}  // namespace substrate
