#include "store/pack.h"

#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/aligned_buffer.h"
#include "core/file_io.h"
#include "format/gguf_writer.h"
#include "format/model_file.h"
#include "model/hparams.h"
#include "model/op_id.h"
#include "quant/quant.h"
#include "store/crc32c.h"

namespace substrate {
namespace {

using nlohmann::json;

struct Unit {
  const TensorInfo* info;
  int slice;  // -1: whole tensor
};

bool IsExpertTensor(const TensorInfo& t) {
  return t.ne.size() == 3 && t.name.find("_exps.") != std::string::npos;
}

// Tensors that get residual tiers: matrices the model multiplies with (MatMul applies
// residuals); the embedding table and vectors are read without them.
bool Tiered(const TensorInfo& t, const PackOptions& o) {
  if (t.ne.size() < 2 || t.name == "token_embd.weight") return false;
  if (!CanDequantize(t.type) || !CanQuantize(o.skeleton)) return false;
  if (!RowBytes(o.skeleton, t.ne[0])) return false;
  for (DType r : o.residuals)
    if (!CanQuantize(r) || !RowBytes(r, t.ne[0])) return false;
  return true;
}

std::string FileName(const std::string& op, int tier) {
  return op + ".t" + std::to_string(tier) + ".bin";
}

class OpWriter {
 public:
  Status Open(const std::string& dir, const std::string& op, int tier) {
    name_ = FileName(op, tier);
    ASSIGN_OR_RETURN(w_, AtomicFileWriter::Create(dir + "/" + name_));
    return Status::Ok();
  }
  // Appends a 4096-aligned range; returns its manifest entry.
  Expected<json> Write(const uint8_t* data, uint64_t n) {
    RETURN_IF_ERROR(w_->PadTo(kStoreAlignment));
    const uint64_t off = w_->offset();
    RETURN_IF_ERROR(w_->Append(data, n));
    return json{{"file", name_}, {"offset", off}, {"bytes", n}, {"crc32c", Crc32c(data, n)}};
  }
  Status Commit() {
    RETURN_IF_ERROR(w_->PadTo(kStoreAlignment));
    return w_->Commit();
  }

 private:
  std::string name_;
  std::unique_ptr<AtomicFileWriter> w_;
};

}  // namespace

Expected<PackStats> PackStore(const ModelFile& model, const std::string& out_dir,
                              const PackOptions& options) {
  if (options.residuals.size() > 2) return InvalidArgument("pack: at most 2 residual tiers");
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return IOError("pack: cannot create '" + out_dir + "': " + ec.message());

  ASSIGN_OR_RETURN(ModelHParams hp, ModelHParams::FromMetadata(model.metadata()));
  auto has = [&](const std::string& n) { return model.Find(n) != nullptr; };
  std::vector<OpSpec> ops = ListOps(hp, has);

  // Each unit goes to the first op that acquires it; tensors no op names go to "misc".
  std::map<std::pair<std::string, int>, bool> placed;
  std::vector<std::pair<std::string, std::vector<Unit>>> plan;
  for (const OpSpec& op : ops) {
    std::vector<Unit> units;
    for (const OpTensorRef& r : op.tensors) {
      const TensorInfo* t = model.Find(r.name);
      if (!t) continue;
      const int slice = IsExpertTensor(*t) ? r.slice : -1;
      if (IsExpertTensor(*t) && slice < 0) continue;
      if (placed.emplace(std::make_pair(r.name, slice), true).second) units.push_back({t, slice});
    }
    if (!units.empty()) plan.emplace_back(op.id, std::move(units));
  }
  std::vector<Unit> misc;
  for (const TensorInfo& t : model.tensors()) {
    if (IsExpertTensor(t)) {
      for (uint64_t e = 0; e < t.outer(); ++e)
        if (!placed.count({t.name, static_cast<int>(e)})) misc.push_back({&t, static_cast<int>(e)});
    } else if (!placed.count({t.name, -1})) {
      misc.push_back({&t, -1});
    }
  }
  if (!misc.empty()) plan.emplace_back("misc", std::move(misc));

  PackStats stats;
  json entries = json::array();
  json tensors = json::array();
  for (const TensorInfo& t : model.tensors())
    tensors.push_back({{"name", t.name}, {"shape", t.ne}, {"source_type", DTypeName(t.type)},
                       {"sliced", IsExpertTensor(t)}});

  const int n_tiers = 1 + static_cast<int>(options.residuals.size());
  std::vector<uint8_t> raw, q;
  std::vector<float> w, approx, row;
  for (const auto& [op, units] : plan) {
    bool any_tiered = false;
    for (const Unit& u : units) any_tiered |= Tiered(*u.info, options);
    std::vector<OpWriter> writers(any_tiered ? n_tiers : 1);
    for (size_t k = 0; k < writers.size(); ++k)
      RETURN_IF_ERROR(writers[k].Open(out_dir, op, static_cast<int>(k)));
    stats.n_files += static_cast<int>(writers.size());

    for (const Unit& u : units) {
      const TensorInfo& t = *u.info;
      const uint64_t n_bytes = u.slice >= 0 ? t.slice_bytes() : t.bytes;
      raw.resize(n_bytes);
      if (u.slice >= 0) RETURN_IF_ERROR(model.ReadSlice(t, static_cast<uint64_t>(u.slice), raw.data()));
      else RETURN_IF_ERROR(model.ReadTensor(t, raw.data()));
      auto add = [&](int tier, DType type, const uint8_t* d, uint64_t n) -> Status {
        ASSIGN_OR_RETURN(json e, writers[tier].Write(d, n));
        e["tensor"] = t.name;
        e["slice"] = u.slice;
        e["op"] = op;
        e["tier"] = tier;
        e["type"] = DTypeName(type);
        entries.push_back(std::move(e));
        stats.tier_bytes[tier] += n;
        return Status::Ok();
      };
      ++stats.n_units;
      if (!Tiered(t, options)) {
        RETURN_IF_ERROR(add(0, t.type, raw.data(), n_bytes));
        continue;
      }
      const int64_t cols = static_cast<int64_t>(t.ne[0]);
      const uint64_t src_row = *RowBytes(t.type, t.ne[0]);
      const int64_t rows = static_cast<int64_t>(n_bytes / src_row);
      w.resize(static_cast<size_t>(rows * cols));
      for (int64_t r = 0; r < rows; ++r)
        DequantizeRow(t.type, raw.data() + r * src_row, w.data() + r * cols, cols);
      approx.assign(w.size(), 0.0f);
      row.resize(static_cast<size_t>(cols));
      std::vector<float> target(static_cast<size_t>(cols));
      for (int tier = 0; tier < n_tiers; ++tier) {
        const DType type = tier == 0 ? options.skeleton : options.residuals[tier - 1];
        const uint64_t rb = *RowBytes(type, t.ne[0]);
        q.assign(rb * static_cast<uint64_t>(rows), 0);
        for (int64_t r = 0; r < rows; ++r) {
          // Tier k quantizes what tiers 0..k-1 left: W - sum of their dequantized rows.
          float* a = approx.data() + r * cols;
          const float* wr = w.data() + r * cols;
          for (int64_t c = 0; c < cols; ++c) target[c] = wr[c] - a[c];
          QuantizeRow(type, target.data(), q.data() + r * rb, cols);
          DequantizeRow(type, q.data() + r * rb, row.data(), cols);
          for (int64_t c = 0; c < cols; ++c) a[c] += row[c];
        }
        RETURN_IF_ERROR(add(tier, type, q.data(), q.size()));
      }
    }
    for (auto& wr : writers) RETURN_IF_ERROR(wr.Commit());
  }

  // The metadata travels as a tensorless GGUF, so the runtime opens it with ModelFile.
  GgufWriter meta(out_dir + "/model.gguf");
  meta.SetMetadata(model.metadata());
  RETURN_IF_ERROR(meta.Finish());

  json tiers = json::array({DTypeName(options.skeleton)});
  for (DType r : options.residuals) tiers.push_back(DTypeName(r));
  json manifest = {{"format", "substrate-store"}, {"schema_version", kStoreSchemaVersion},
                   {"alignment", kStoreAlignment}, {"model", "model.gguf"},
                   {"tiers", tiers}, {"tensors", tensors}, {"entries", entries}};
  RETURN_IF_ERROR(WriteFileAtomic(out_dir + "/manifest.json", manifest.dump(1)));
  return stats;
}

}  // namespace substrate
