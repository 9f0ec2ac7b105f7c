#include "format/gguf_split.h"

#include <algorithm>
#include <cstdio>

#include "format/gguf_reader.h"
#include "format/gguf_writer.h"

namespace substrate {

std::string GgufSplitPath(const std::string& prefix, int index, int count) {
  char tail[40];
  std::snprintf(tail, sizeof tail, "-%05d-of-%05d.gguf", index + 1, count);
  return prefix + tail;
}

std::optional<GgufSplitName> ParseGgufSplitPath(const std::string& path) {
  // "-NNNNN-of-NNNNN.gguf": 20 characters after the prefix.
  constexpr size_t kTail = 20;
  if (path.size() <= kTail) return std::nullopt;
  const std::string tail = path.substr(path.size() - kTail);
  auto digits = [&](size_t at) {
    int v = 0;
    for (size_t i = at; i < at + 5; ++i) {
      if (tail[i] < '0' || tail[i] > '9') return -1;
      v = v * 10 + (tail[i] - '0');
    }
    return v;
  };
  const int no = digits(1), count = digits(10);
  if (tail[0] != '-' || tail.compare(6, 4, "-of-") != 0 || tail.compare(15, 5, ".gguf") != 0 ||
      no < 1 || count < no)
    return std::nullopt;
  return GgufSplitName{path.substr(0, path.size() - kTail), no - 1, count};
}

namespace {

constexpr uint64_t kCopyChunk = 64ull << 20;

// Which tensors go to which part: by count, or by padded data size as llama.cpp's gguf-split
// counts it (a part closes before the tensor that would take it past max_bytes).
std::vector<std::vector<const TensorInfo*>> Assign(const ModelFile& in, uint64_t alignment,
                                                   const GgufSplitOptions& o) {
  std::vector<std::vector<const TensorInfo*>> parts(1);
  uint64_t size = 0;
  for (const TensorInfo& t : in.tensors()) {
    const uint64_t padded = (t.bytes + alignment - 1) / alignment * alignment;
    const bool full = o.max_tensors > 0
                          ? static_cast<int>(parts.back().size()) >= o.max_tensors
                          : !parts.back().empty() && size + padded > o.max_bytes;
    if (full) {
      parts.emplace_back();
      size = 0;
    }
    parts.back().push_back(&t);
    size += padded;
  }
  return parts;
}

Status WritePart(const ModelFile& in, const std::string& path, const Metadata& md,
                 const std::vector<const TensorInfo*>& tensors, Env* env) {
  GgufWriter w(path, env);
  w.SetMetadata(md);
  for (const TensorInfo* t : tensors) RETURN_IF_ERROR(w.AddTensor(t->name, t->ne, t->type));
  std::string buf;
  for (const TensorInfo* t : tensors) {
    if (t->parts.size() != 1 || t->transform != TensorTransform::kNone)
      return InvalidArgument("'" + in.path() + "': tensor '" + t->name +
                             "' is not one range of a GGUF (split takes GGUF files)");
    // Copied in chunks: a tensor may be larger than memory.
    const TensorPart& p = t->parts[0];
    for (uint64_t done = 0; done < p.bytes;) {
      const uint64_t n = std::min(kCopyChunk, p.bytes - done);
      buf.resize(n);
      RETURN_IF_ERROR(in.file(p.file).Read(p.offset + done, n, buf.data()));
      RETURN_IF_ERROR(w.WriteTensorData(buf.data(), n));
      done += n;
    }
  }
  return w.Finish();
}

}  // namespace

Expected<std::vector<std::string>> WriteGgufSplit(const ModelFile& in, const std::string& prefix,
                                                  const GgufSplitOptions& o) {
  if ((o.max_bytes > 0) == (o.max_tensors > 0))
    return InvalidArgument("split: give a largest part size or a number of tensors per part");
  if (in.tensors().empty()) return InvalidArgument("split: '" + in.path() + "' has no tensors");
  Env* env = o.env ? o.env : Env::Default();
  GgufWriter probe("", env);
  probe.SetMetadata(in.metadata());
  const auto parts = Assign(in, probe.alignment(), o);
  if (parts.size() > 99999)
    return InvalidArgument("split: " + std::to_string(parts.size()) +
                           " parts; a split GGUF has at most 99999");
  const int n = static_cast<int>(parts.size());
  const auto n_tensors = static_cast<int32_t>(in.tensors().size());
  std::vector<std::string> paths;
  for (int i = 0; i < n; ++i) paths.push_back(GgufSplitPath(prefix, i, n));
  // Parts 2..N first, the first one (which names the model) last.
  std::vector<std::string> written;
  for (int k = 1; k <= n; ++k) {
    const int i = k % n;
    Metadata md;
    if (i == 0) {
      md = in.metadata();
    } else if (const MetaValue* a = in.metadata().Find("general.alignment")) {
      md.Set("general.alignment", *a);  // every part's data keeps the model's alignment
    }
    md.Set(kGgufSplitNo, MetaValue::U16(static_cast<uint16_t>(i)));
    md.Set(kGgufSplitCount, MetaValue::U16(static_cast<uint16_t>(n)));
    md.Set(kGgufSplitTensorsCount, MetaValue::I32(n_tensors));
    Status st = WritePart(in, paths[i], md, parts[i], env);
    if (!st.ok()) {
      for (const std::string& p : written) (void)env->RemoveFile(p);  // no partial set left
      return st.WithContext("writing '" + paths[i] + "'");
    }
    written.push_back(paths[i]);
  }
  return paths;
}

}  // namespace substrate
