// substrate info FILE_OR_DIR [--json]: what a model file holds — architecture, metadata,
// tensor table and totals — for GGUF files and HF folders alike.
#include <cinttypes>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "format/gguf_reader.h"
#include "format/hf_model_file.h"
#include "format/model_file.h"

namespace substrate::cli {
namespace {

using nlohmann::json;

std::string Shape(const std::vector<uint64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

std::string HumanBytes(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ull << 30));
  else if (b >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(1ull << 20));
  else if (b >= 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%" PRIu64 " B", b);
  return buf;
}

json ValueJson(const MetaValue& v, size_t max_items) {
  switch (v.type) {
    case GgufType::kString: return std::get<std::string>(v.value);
    case GgufType::kBool: return std::get<bool>(v.value);
    case GgufType::kFloat32:
    case GgufType::kFloat64: return std::get<double>(v.value);
    case GgufType::kArray: {
      const auto& a = v.array();
      if (a.size() > max_items)
        return json{{"type", GgufTypeName(v.array_type)}, {"count", a.size()}};
      json out = json::array();
      for (const auto& e : a) out.push_back(ValueJson(e, max_items));
      return out;
    }
    case GgufType::kUint8: case GgufType::kUint16: case GgufType::kUint32: case GgufType::kUint64:
      return std::get<uint64_t>(v.value);
    default: return std::get<int64_t>(v.value);
  }
}

std::string FormatLine(const ModelFile& m) {
  if (auto* g = dynamic_cast<const GgufFile*>(&m)) {
    std::string s = "GGUF v" + std::to_string(g->version()) + " (alignment " +
                    std::to_string(g->alignment()) + ", data at offset " +
                    std::to_string(g->data_offset()) + ")";
    if (g->n_files() > 1) s += ", split in " + std::to_string(g->n_files()) + " files";
    return s;
  }
  if (auto* h = dynamic_cast<const HfModelFile*>(&m)) {
    return "Hugging Face folder (" + std::to_string(h->n_files()) + " safetensors file" +
           (h->n_files() == 1 ? "" : "s") + ", stored as " + DTypeName(h->source_type()) + ")";
  }
  return "?";
}

int RunInfo(const std::vector<std::string>& args) {
  constexpr const char* kUsage =
      "usage: substrate info FILE.gguf|HF_DIR [--json] [--max-items N]\n"
      "  prints architecture, metadata, the tensor table and totals; a split GGUF\n"
      "  (NAME-00001-of-0000N.gguf, any part named) as one model\n";
  Flags flags(args, {{"--max-items"}, {"--json"}, 1});
  if (!flags.status().ok()) return UsageError("info", flags.status(), kUsage);
  if (flags.help()) return std::fputs(kUsage, stdout), 0;
  if (flags.positional().size() != 1)
    return UsageError("info", InvalidArgument("one FILE.gguf or HF_DIR expected"), kUsage);
  auto max_items = flags.GetInt({"--max-items"}, 8);
  if (!max_items.ok()) return PrintError("info", max_items.status());
  auto opened = ModelFile::Open(flags.positional()[0]);
  if (!opened.ok()) return PrintError("info", opened.status());
  const ModelFile& m = **opened;
  const Metadata& md = m.metadata();

  uint64_t total_bytes = 0, total_params = 0;
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_type;  // type -> (count, bytes)
  for (const auto& t : m.tensors()) {
    total_bytes += t.bytes;
    total_params += t.n_elements();
    auto& e = by_type[DTypeName(t.type)];
    e.first++;
    e.second += t.bytes;
  }

  if (flags.Has("--json")) {
    json j;
    j["path"] = m.path();
    j["format"] = FormatLine(m);
    if (m.n_files() > 1 && dynamic_cast<const GgufFile*>(&m)) {
      json parts = json::array();
      for (int i = 0; i < m.n_files(); ++i) parts.push_back(m.file(i).path());
      j["split_parts"] = parts;
    }
    j["architecture"] = md.GetString("general.architecture", "");
    json meta = json::object();
    for (const auto& k : md.keys()) meta[k] = ValueJson(*md.Find(k), static_cast<size_t>(*max_items));
    j["metadata"] = meta;
    json ts = json::array();
    for (const auto& t : m.tensors())
      ts.push_back({{"name", t.name}, {"shape", t.ne}, {"type", DTypeName(t.type)}, {"bytes", t.bytes}});
    j["tensors"] = ts;
    j["n_tensors"] = m.tensors().size();
    j["n_params"] = total_params;
    j["bytes"] = total_bytes;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  std::printf("file:          %s\n", m.path().c_str());
  std::printf("format:        %s\n", FormatLine(m).c_str());
  if (dynamic_cast<const GgufFile*>(&m))
    for (int i = 1; i < m.n_files(); ++i)
      std::printf("               part %d: %s\n", i + 1, m.file(i).path().c_str());
  std::printf("architecture:  %s\n", md.GetString("general.architecture", "?").c_str());
  std::printf("\nmetadata (%zu keys):\n", md.keys().size());
  size_t w = 0;
  for (const auto& k : md.keys()) w = std::max(w, k.size());
  for (const auto& k : md.keys()) {
    const MetaValue& v = *md.Find(k);
    std::string type = GgufTypeName(v.type);
    if (v.is_array()) type = std::string("arr[") + GgufTypeName(v.array_type) + "]";
    std::printf("  %-*s  %-11s %s\n", static_cast<int>(w), k.c_str(), type.c_str(),
                MetaValueToString(v, static_cast<size_t>(*max_items)).c_str());
  }
  std::printf("\ntensors (%zu):\n", m.tensors().size());
  size_t nw = 4;
  for (const auto& t : m.tensors()) nw = std::max(nw, t.name.size());
  std::printf("  %-*s  %-22s %-7s %12s\n", static_cast<int>(nw), "name", "shape", "type", "bytes");
  for (const auto& t : m.tensors()) {
    std::string shape = Shape(t.ne);
    if (t.parts.size() > 1) shape += " (" + std::to_string(t.parts.size()) + " parts)";
    std::printf("  %-*s  %-22s %-7s %12" PRIu64 "%s\n", static_cast<int>(nw), t.name.c_str(),
                shape.c_str(), DTypeName(t.type), t.bytes,
                t.transform == TensorTransform::kPermuteRopeHeads ? "  rope-permuted on read" : "");
  }
  std::printf("\ntotals: %zu tensors, %" PRIu64 " parameters, %" PRIu64 " bytes (%s)\n",
              m.tensors().size(), total_params, total_bytes, HumanBytes(total_bytes).c_str());
  for (const auto& [type, e] : by_type)
    std::printf("  %-6s %5" PRIu64 " tensors %14" PRIu64 " bytes\n", type.c_str(), e.first, e.second);
  return 0;
}

CommandRegistrar reg("info", "print a model's architecture, metadata and tensors (GGUF or HF folder)",
                     &RunInfo);

}  // namespace
}  // namespace substrate::cli
