#include "format/hf_model_file.h"

#include <dirent.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "format/hf_internal.h"
#include "format/safetensors.h"

namespace substrate {
namespace {

using nlohmann::json;

std::string Join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

Expected<json> ReadJsonFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 256ull << 20));
  try {
    return json::parse(text);
  } catch (const std::exception& e) {
    return Corruption("'" + path + "' is not valid JSON: " + e.what());
  }
}

// The safetensors files of a checkpoint, in the order the converter reads them.
Expected<std::vector<std::string>> ListShards(const std::string& dir) {
  std::string index = Join(dir, "model.safetensors.index.json");
  if (FileExists(index)) {
    ASSIGN_OR_RETURN(json j, ReadJsonFile(index));
    auto wm = j.find("weight_map");
    if (!j.is_object() || wm == j.end() || !wm->is_object())
      return Corruption("'" + index + "' has no 'weight_map' object");
    std::set<std::string> files;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it->is_string()) return Corruption("'" + index + "': weight_map entry '" + it.key() + "' is not a file name");
      std::string f = it->get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        return Corruption("'" + index + "': weight_map names an invalid file '" + f + "'");
      files.insert(f);
    }
    if (files.empty()) return Corruption("'" + index + "' lists no files");
    return std::vector<std::string>(files.begin(), files.end());
  }
  if (FileExists(Join(dir, "model.safetensors"))) return std::vector<std::string>{"model.safetensors"};
  // Shards without an index: model-00001-of-0000N.safetensors.
  std::vector<std::string> shards;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.rfind("model-", 0) == 0 && n.size() > 12 && n.substr(n.size() - 12) == ".safetensors")
        shards.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(shards.begin(), shards.end());
  if (shards.empty())
    return NotFound("'" + dir + "' has no model.safetensors, shards or model.safetensors.index.json");
  return shards;
}

struct SourceTensor {
  SafetensorsEntry entry;
  int file = 0;
};

// One layer's per-expert tensors, gathered until all have been seen.
struct ExpertGroup {
  std::map<std::string, std::map<int64_t, SourceTensor>> by_kind;  // kind -> expert -> tensor
  size_t count = 0;
};

std::vector<uint64_t> GgufShape(const std::vector<uint64_t>& shape) {
  return std::vector<uint64_t>(shape.rbegin(), shape.rend());
}

uint32_t FileTypeFor(DType t) {
  switch (t) {
    case DType::kF16: return 1;
    case DType::kBF16: return 32;
    default: return 0;
  }
}

}  // namespace

Status PermuteRopeRows(const void* src, void* dst, uint64_t rows, uint64_t row_bytes,
                       int64_t n_head) {
  if (n_head <= 0 || rows % (2 * static_cast<uint64_t>(n_head)) != 0) {
    return InvalidArgument("rope permutation: " + std::to_string(rows) + " rows do not split into " +
                           std::to_string(n_head) + " heads of pairs");
  }
  const uint64_t head_rows = rows / n_head, half = head_rows / 2;
  auto* out = static_cast<uint8_t*>(dst);
  const auto* in = static_cast<const uint8_t*>(src);
  // Output row (h, i, j) of shape [n_head, half, 2] is input row (h, j, i) of [n_head, 2, half].
  for (uint64_t h = 0; h < static_cast<uint64_t>(n_head); ++h)
    for (uint64_t i = 0; i < half; ++i)
      for (uint64_t j = 0; j < 2; ++j)
        std::memcpy(out + (h * head_rows + i * 2 + j) * row_bytes,
                    in + (h * head_rows + j * half + i) * row_bytes, row_bytes);
  return Status::Ok();
}

Expected<std::unique_ptr<HfModelFile>> HfModelFile::Open(const std::string& dir) {
  std::string config_path = Join(dir, "config.json");
  if (!FileExists(config_path))
    return NotFound("'" + dir + "' is not a model folder: it has no config.json");
  ASSIGN_OR_RETURN(json config, ReadJsonFile(config_path));
  if (!config.is_object()) return Corruption("'" + config_path + "' is not a JSON object");
  // Multimodal wrappers keep the language model's settings in text_config.
  if (auto tc = config.find("text_config"); tc != config.end() && tc->is_object() &&
                                            !config.contains("num_hidden_layers")) {
    json merged = *tc;
    for (auto it = config.begin(); it != config.end(); ++it)
      if (!merged.contains(it.key())) merged[it.key()] = it.value();
    config = merged;
  }
  ASSIGN_OR_RETURN(hf::ArchSpec arch, hf::FindArch(config));
  for (const char* key : {"num_hidden_layers", "hidden_size", "num_attention_heads"}) {
    auto v = hf::ConfigInt(config, key);
    if (!v || *v <= 0 || *v > (1 << 24))
      return Corruption("'" + config_path + "': '" + key + "' is missing or not a positive integer");
  }

  std::unique_ptr<HfModelFile> m(new HfModelFile());
  m->dir_ = dir;
  ASSIGN_OR_RETURN(auto shards, ListShards(dir));
  std::vector<SourceTensor> sources;
  for (size_t i = 0; i < shards.size(); ++i) {
    ASSIGN_OR_RETURN(auto f, RandomAccessFile::Open(Join(dir, shards[i])));
    ASSIGN_OR_RETURN(auto entries, ReadSafetensorsHeader(*f));
    for (auto& e : entries) sources.push_back({std::move(e), static_cast<int>(i)});
    m->files_.push_back(std::move(f));
  }

  // Most common type among 2-D tensors: what the checkpoint "is".
  std::map<DType, uint64_t> type_bytes;
  for (const auto& s : sources)
    if (s.entry.shape.size() >= 2) type_bytes[s.entry.type] += s.entry.bytes;
  if (!type_bytes.empty()) {
    m->source_type_ = std::max_element(type_bytes.begin(), type_bytes.end(),
                                       [](auto& a, auto& b) { return a.second < b.second; })->first;
  }

  int64_t n_expert = hf::ConfigInt(config, "num_local_experts")
                         .value_or(hf::ConfigInt(config, "num_experts")
                                       .value_or(hf::ConfigInt(config, "n_routed_experts").value_or(0)));
  std::map<int64_t, ExpertGroup> groups;
  std::set<std::string> names;
  auto add = [&](TensorInfo t) -> Status {
    if (!names.insert(t.name).second)
      return Corruption("'" + dir + "': two tensors map to '" + t.name + "'");
    m->tensors_.push_back(std::move(t));
    return Status::Ok();
  };

  for (auto& s : sources) {
    ASSIGN_OR_RETURN(hf::MappedName mn, hf::MapTensorName(s.entry.name, arch, config));
    if (mn.skip) continue;
    if (mn.expert < 0) {
      TensorInfo t;
      t.name = mn.name;
      t.ne = GgufShape(s.entry.shape);
      if (t.ne.empty()) t.ne = {1};
      t.type = s.entry.type;
      t.bytes = s.entry.bytes;
      t.parts = {TensorPart{s.file, s.entry.offset, s.entry.bytes}};
      if (mn.permute_heads > 0) {
        if (t.outer() % (2 * static_cast<uint64_t>(mn.permute_heads)) != 0) {
          return Corruption("tensor '" + s.entry.name + "': " + std::to_string(t.outer()) +
                            " rows do not split into " + std::to_string(mn.permute_heads) +
                            " rope heads");
        }
        t.transform = TensorTransform::kPermuteRopeHeads;
        t.transform_arg = mn.permute_heads;
      }
      RETURN_IF_ERROR(add(std::move(t)));
      continue;
    }
    if (n_expert <= 0 || mn.expert >= n_expert) {
      return Corruption("tensor '" + s.entry.name + "': expert " + std::to_string(mn.expert) +
                        " but config.json declares " + std::to_string(n_expert) + " experts");
    }
    ExpertGroup& g = groups[mn.block];
    auto& slot = g.by_kind[mn.expert_kind];
    if (slot.count(mn.expert)) return Corruption("tensor '" + s.entry.name + "' appears twice");
    slot[mn.expert] = s;
    ++g.count;
    if (g.count < static_cast<size_t>(3 * n_expert)) continue;
    // All experts of the layer are in: emit the merged tensors in the converter's order.
    for (const std::string& kind : arch.expert_order) {
      auto& experts = g.by_kind[kind];
      if (experts.size() != static_cast<size_t>(n_expert))
        return Corruption("layer " + std::to_string(mn.block) + ": ffn_" + kind + " has " +
                          std::to_string(experts.size()) + " of " + std::to_string(n_expert) +
                          " experts");
      const SafetensorsEntry& first = experts.begin()->second.entry;
      TensorInfo t;
      t.name = "blk." + std::to_string(mn.block) + ".ffn_" + kind + "_exps.weight";
      t.ne = GgufShape(first.shape);
      t.ne.push_back(static_cast<uint64_t>(n_expert));
      t.type = first.type;
      for (auto& [e, src] : experts) {
        if (src.entry.shape != first.shape || src.entry.type != first.type)
          return Corruption("tensor '" + src.entry.name + "' differs in shape or type from expert 0");
        t.parts.push_back(TensorPart{src.file, src.entry.offset, src.entry.bytes});
        t.bytes += src.entry.bytes;
      }
      if (t.ne.size() > 4) return Corruption("tensor '" + first.name + "' has too many dimensions");
      RETURN_IF_ERROR(add(std::move(t)));
    }
    groups.erase(mn.block);
  }
  if (!groups.empty()) {
    auto& [block, g] = *groups.begin();
    return Corruption("'" + dir + "': layer " + std::to_string(block) + " has only " +
                      std::to_string(g.count) + " of " + std::to_string(3 * n_expert) +
                      " expert tensors");
  }
  if (!m->Find("token_embd.weight"))
    return Corruption("'" + dir + "': no model.embed_tokens.weight tensor");

  RETURN_IF_ERROR(hf::BuildMetadata(dir, config, arch, m->tensors_, FileTypeFor(m->source_type_),
                                    &m->metadata_));
  if (arch.duplicate_tied_output && !m->Find("output.weight")) {
    TensorInfo out = *m->Find("token_embd.weight");
    out.name = "output.weight";
    m->tensors_.push_back(std::move(out));
  }
  return m;
}

Status HfModelFile::ReadRaw(const TensorInfo& info, uint64_t begin, uint64_t n, void* dst) const {
  auto* out = static_cast<uint8_t*>(dst);
  uint64_t at = 0;  // start of the current part within the tensor
  for (const TensorPart& p : info.parts) {
    if (n == 0) break;
    if (begin < at + p.bytes) {
      uint64_t skip = begin > at ? begin - at : 0;
      uint64_t take = std::min(p.bytes - skip, n);
      if (p.file < 0 || p.file >= n_files()) return Internal("tensor '" + info.name + "': bad file index");
      RETURN_IF_ERROR(files_[p.file]->Read(p.offset + skip, take, out));
      out += take;
      begin += take;
      n -= take;
    }
    at += p.bytes;
  }
  if (n != 0) return Internal("tensor '" + info.name + "': read past its parts");
  return Status::Ok();
}

Status HfModelFile::ReadTensor(const TensorInfo& info, void* dst) const {
  if (info.transform == TensorTransform::kNone) return ReadRaw(info, 0, info.bytes, dst);
  std::string tmp(info.bytes, '\0');
  RETURN_IF_ERROR(ReadRaw(info, 0, info.bytes, tmp.data()));
  uint64_t rows = info.outer();
  return PermuteRopeRows(tmp.data(), dst, rows, rows ? info.bytes / rows : 0, info.transform_arg);
}

Status HfModelFile::ReadSlice(const TensorInfo& info, uint64_t index, void* dst) const {
  if (index >= info.outer()) {
    return InvalidArgument("tensor '" + info.name + "': slice " + std::to_string(index) +
                           " out of range (outer dimension " + std::to_string(info.outer()) + ")");
  }
  uint64_t sb = info.slice_bytes();
  if (info.transform == TensorTransform::kNone) return ReadRaw(info, index * sb, sb, dst);
  std::string all(info.bytes, '\0');
  RETURN_IF_ERROR(ReadTensor(info, all.data()));
  std::memcpy(dst, all.data() + index * sb, sb);
  return Status::Ok();
}

}  // namespace substrate
