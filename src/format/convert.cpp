#include "format/convert.h"

#include <map>

#include "core/progress.h"
#include "format/float_convert.h"
#include "format/gguf_writer.h"

namespace substrate {
namespace {

bool EndsWith(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// The type most bytes of 2-D (and larger) tensors are stored in.
DType DominantType(const ModelFile& in) {
  std::map<DType, uint64_t> bytes;
  for (const auto& t : in.tensors())
    if (t.ne.size() >= 2) bytes[t.type] += t.bytes;
  DType best = DType::kF32;
  uint64_t most = 0;
  for (auto [t, b] : bytes)
    if (b > most) best = t, most = b;
  return best;
}

}  // namespace

DType ConvertedType(const TensorInfo& t, DType out) {
  if (t.ne.size() <= 1 || EndsWith(t.name, "_norm.weight") || !EndsWith(t.name, ".weight"))
    return DType::kF32;
  if (EndsWith(t.name, ".ffn_gate_inp.weight")) return DType::kF32;  // routers stay exact
  return out;
}

uint32_t GgufFileType(DType t) {
  switch (t) {
    case DType::kF16: return 1;
    case DType::kBF16: return 32;
    default: return 0;
  }
}

Status ConvertToGguf(const ModelFile& in, const std::string& out_path,
                     std::optional<DType> out_type, bool progress) {
  DType out = out_type ? *out_type : DominantType(in);
  if (!IsPlainFloat(out))
    return InvalidArgument(std::string("convert: output type ") + DTypeName(out) + " is not f32, f16 or bf16");
  for (const auto& t : in.tensors()) {
    if (!IsPlainFloat(t.type)) {
      return Unimplemented("convert: tensor '" + t.name + "' is " + DTypeName(t.type) +
                           "; only F32/F16/BF16 inputs can be converted (use quantize)");
    }
  }
  GgufWriter w(out_path);
  Metadata md = in.metadata();
  md.Set("general.file_type", MetaValue::U32(GgufFileType(out)));
  w.SetMetadata(md);
  uint64_t total = 0;
  for (const auto& t : in.tensors()) {
    RETURN_IF_ERROR(w.AddTensor(t.name, t.ne, ConvertedType(t, out)));
    total += t.bytes;
  }

  std::optional<ProgressBar> bar;
  if (progress) bar.emplace("convert", total);
  uint64_t done = 0;
  std::string src, dst;
  for (const auto& t : in.tensors()) {
    DType to = ConvertedType(t, out);
    // 3-D tensors (experts) go one slice at a time; others whole.
    const bool sliced = t.ne.size() >= 3;
    const uint64_t pieces = sliced ? t.outer() : 1;
    const uint64_t piece_bytes = sliced ? t.slice_bytes() : t.bytes;
    const uint64_t piece_elems = sliced ? t.n_elements() / t.outer() : t.n_elements();
    for (uint64_t i = 0; i < pieces; ++i) {
      src.resize(piece_bytes);
      if (sliced) RETURN_IF_ERROR(in.ReadSlice(t, i, src.data()));
      else RETURN_IF_ERROR(in.ReadTensor(t, src.data()));
      if (to == t.type) {
        RETURN_IF_ERROR(w.WriteTensorData(src.data(), src.size()));
      } else {
        dst.resize(piece_elems * GetDTypeTraits(to).block_bytes);
        RETURN_IF_ERROR(ConvertFloats(t.type, src.data(), to, dst.data(), piece_elems));
        RETURN_IF_ERROR(w.WriteTensorData(dst.data(), dst.size()));
      }
      done += piece_bytes;
      if (bar) bar->Update(done, t.name);
    }
  }
  if (bar) bar->Finish();
  return w.Finish();
}

}  // namespace substrate
