#include "store/pack.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "core/file_io.h"
#include "core/progress.h"
#include "format/gguf_writer.h"
#include "format/model_file.h"
#include "kernels/interleaved.h"
#include "kernels/interleaved_q8_0.h"
#include "model/hparams.h"
#include "model/op_id.h"
#include "quant/quant.h"
#include "store/crc32c.h"

namespace substrate {
namespace {

using nlohmann::json;

// Source bytes per chunk of rows read, converted and written at once.
constexpr uint64_t kChunkBytes = 8ull << 20;

struct Unit {
  const TensorInfo* info;
  int slice;  // -1: whole tensor
};

// How one unit is stored.
struct UnitTypes {
  bool copy = false;  // tier 0 is the source bytes
  DType tier0 = DType::kF32;
  std::vector<DType> residuals;
};

bool IsMatrix(const TensorInfo& t) {
  int dims = 0;
  for (uint64_t d : t.ne) dims += d > 1;
  return t.ne.size() >= 2 && dims >= 2;
}

bool Fits(DType type, uint64_t cols) { return CanQuantize(type) && RowBytes(type, cols).has_value(); }

std::string FileName(const std::string& op, int tier) {
  return op + ".t" + std::to_string(tier) + ".bin";
}

Expected<UnitTypes> DecideTypes(const TensorInfo& t, const std::string& op,
                                const PackOptions& o) {
  UnitTypes u;
  u.copy = true;
  u.tier0 = t.type;
  // Vectors (norms, biases) stay as they are; so does any tensor of a type we cannot read.
  if (!IsMatrix(t) || !CanDequantize(t.type)) return u;
  const uint64_t cols = t.ne[0];
  const bool embd = t.name == "token_embd.weight";  // looked up by row, without residuals
  if (o.plan) {
    auto ot = o.plan->op_tiers.find(op);
    auto tt = o.plan->tensor_types.find(t.name);
    if (ot == o.plan->op_tiers.end()) {
      if (op == "misc" && tt == o.plan->tensor_types.end()) return u;  // no op acquires it
      if (op != "misc")
        return InvalidArgument("pack: the plan has no op bundle for op '" + op + "' (tensor '" +
                               t.name + "')");
    }
    const DType t0 = tt != o.plan->tensor_types.end() ? tt->second : ot->second[0];
    if (ot != o.plan->op_tiers.end() && !embd)
      u.residuals.assign(ot->second.begin() + 1, ot->second.end());
    for (size_t k = 0; k <= u.residuals.size(); ++k) {
      const DType type = k == 0 ? t0 : u.residuals[k - 1];
      if (k == 0 && type == t.type) continue;  // copied
      if (!Fits(type, cols))
        return InvalidArgument("pack: the plan's type " + std::string(DTypeName(type)) +
                               " for tensor '" + t.name + "' (op '" + op +
                               "') cannot hold rows of " + std::to_string(cols) + " elements");
    }
    u.tier0 = t0;
    u.copy = t0 == t.type;
    return u;
  }
  if (embd) return u;  // without a plan, the embedding table is stored as it is
  for (DType r : o.residuals)
    if (!Fits(r, cols)) return u;  // a shape the ladder cannot hold: stored as it is
  if (!o.keep_skeleton) {
    if (!Fits(o.skeleton, cols)) return u;
    u.copy = false;
    u.tier0 = o.skeleton;
  }
  u.residuals = o.residuals;
  return u;
}

// One file of one op at one tier; ranges are appended in pieces, each 4096-aligned.
class OpWriter {
 public:
  Status Open(const std::string& dir, const std::string& op, int tier, Env* env) {
    name_ = FileName(op, tier);
    ASSIGN_OR_RETURN(w_, AtomicFileWriter::Create(dir + "/" + name_, env));
    return Status::Ok();
  }
  Status Begin() {
    RETURN_IF_ERROR(w_->PadTo(kStoreAlignment));
    start_ = w_->offset();
    crc_ = 0;
    return Status::Ok();
  }
  Status Append(const uint8_t* data, uint64_t n) {
    crc_ = Crc32c(data, n, crc_);
    return w_->Append(data, n);
  }
  json End() const {
    return json{{"file", name_}, {"offset", start_}, {"bytes", w_->offset() - start_},
                {"crc32c", crc_}};
  }
  Status Commit() {
    RETURN_IF_ERROR(w_->PadTo(kStoreAlignment));
    return w_->Commit();
  }

 private:
  std::string name_;
  std::unique_ptr<AtomicFileWriter> w_;
  uint64_t start_ = 0;
  uint32_t crc_ = 0;
};

// Reads rows of a unit: straight from the file for a GGUF tensor, else (HF files: several
// parts or a layout transform) the whole unit once.
class UnitReader {
 public:
  Status Open(const ModelFile& model, const Unit& u) {
    const TensorInfo& t = *u.info;
    const uint64_t bytes = u.slice >= 0 ? t.slice_bytes() : t.bytes;
    if (t.parts.size() == 1 && t.transform == TensorTransform::kNone &&
        t.parts[0].bytes == t.bytes) {
      file_ = &model.file(t.parts[0].file);
      base_ = t.parts[0].offset + (u.slice >= 0 ? t.slice_bytes() * u.slice : 0);
      return Status::Ok();
    }
    file_ = nullptr;
    whole_.resize(bytes);
    if (u.slice >= 0) return model.ReadSlice(t, static_cast<uint64_t>(u.slice), whole_.data());
    return model.ReadTensor(t, whole_.data());
  }
  Status Read(uint64_t offset, uint64_t n, uint8_t* dst) const {
    if (file_) return file_->Read(base_ + offset, n, dst);
    std::copy(whole_.begin() + offset, whole_.begin() + offset + n, dst);
    return Status::Ok();
  }

 private:
  const RandomAccessFile* file_ = nullptr;
  uint64_t base_ = 0;
  std::vector<uint8_t> whole_;
};

// Tier k of rows [0, rows) from the source rows `raw`: tier 0 quantizes W (or is the source
// when copying), tier k quantizes what tiers 0..k-1 left: W - sum of their dequantized rows.
void ConvertRows(const TensorInfo& t, const UnitTypes& ut, const uint8_t* raw, int64_t rows,
                 std::vector<std::vector<uint8_t>>& out, ThreadPool& pool) {
  const int64_t cols = static_cast<int64_t>(t.ne[0]);
  const uint64_t src_row = *RowBytes(t.type, t.ne[0]);
  const int n_tiers = 1 + static_cast<int>(ut.residuals.size());
  std::vector<uint64_t> rb(n_tiers);
  for (int k = 0; k < n_tiers; ++k) {
    const DType type = k == 0 ? ut.tier0 : ut.residuals[k - 1];
    rb[k] = *RowBytes(type, t.ne[0]);
    out[k].resize(rb[k] * static_cast<uint64_t>(rows));
  }
  pool.ParallelFor(rows, 4, [&](int64_t r0, int64_t r1, int) {
    std::vector<float> w(cols), approx(cols), target(cols), row(cols);
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* src = raw + src_row * r;
      DequantizeRow(t.type, src, w.data(), cols);
      std::fill(approx.begin(), approx.end(), 0.0f);
      for (int k = 0; k < n_tiers; ++k) {
        uint8_t* dst = out[k].data() + rb[k] * r;
        if (k == 0 && ut.copy) {
          std::copy(src, src + src_row, dst);
          approx = w;
          continue;
        }
        const DType type = k == 0 ? ut.tier0 : ut.residuals[k - 1];
        for (int64_t c = 0; c < cols; ++c) target[c] = w[c] - approx[c];
        QuantizeRow(type, target.data(), dst, cols);
        if (k + 1 == n_tiers) break;
        DequantizeRow(type, dst, row.data(), cols);
        for (int64_t c = 0; c < cols; ++c) approx[c] += row[c];
      }
    }
  });
}

}  // namespace

bool IsExpertTensor(const TensorInfo& t) {
  return t.ne.size() == 3 && t.name.find("_exps.") != std::string::npos;
}

Expected<PackPlan> ParsePackPlan(const std::string& text) {
  PackPlan plan;
  try {
    json j = json::parse(text);
    if (!j.is_object()) return InvalidArgument("plan: the document is not a JSON object");
    if (j.contains("tensor_types")) {
      const json& tt = j.at("tensor_types");
      if (!tt.is_object()) return InvalidArgument("plan: 'tensor_types' is not an object");
      for (auto it = tt.begin(); it != tt.end(); ++it) {
        auto type = it->is_string() ? DTypeFromName(it->get<std::string>()) : std::nullopt;
        if (!type)
          return InvalidArgument("plan: tensor_types['" + it.key() + "'] is not a known type");
        plan.tensor_types[it.key()] = *type;
      }
    }
    if (!j.contains("op_bundles") || !j.at("op_bundles").is_array())
      return InvalidArgument("plan: no 'op_bundles' array");
    for (const json& ob : j.at("op_bundles")) {
      const std::string op = ob.at("op_id").get<std::string>();
      const json& tiers = ob.at("tiers");
      if (!tiers.is_array() || tiers.empty() || tiers.size() > 3)
        return InvalidArgument("plan: op '" + op + "' needs 1 to 3 tiers");
      std::vector<DType> types;
      for (const json& t : tiers) {
        const std::string p = t.at("precision").get<std::string>();
        auto type = DTypeFromName(p);
        if (!type) return InvalidArgument("plan: op '" + op + "' has unknown precision '" + p + "'");
        types.push_back(*type);
      }
      if (!plan.op_tiers.emplace(op, std::move(types)).second)
        return InvalidArgument("plan: op '" + op + "' listed twice");
    }
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("plan: malformed: ") + e.what());
  }
  return plan;
}

Expected<PackStats> PackStore(const ModelFile& model, const std::string& out_dir,
                              const PackOptions& options) {
  if (!options.plan && options.residuals.size() > 2)
    return InvalidArgument("pack: at most 2 residual tiers");
  ASSIGN_OR_RETURN(ModelHParams hp, ModelHParams::FromMetadata(model.metadata()));
  // A next-n layer gets ops of its own (not "misc", which the runtime keeps resident): used only
  // by --draft-mtp.
  hp.list_nextn = true;
  auto has = [&](const std::string& n) { return model.Find(n) != nullptr; };
  std::vector<OpSpec> ops = ListOps(hp, has);

  // Each unit goes to the first op that acquires it; tensors no op names go to "misc".
  std::map<std::pair<std::string, int>, bool> placed;
  std::vector<std::pair<std::string, std::vector<Unit>>> layout;
  for (const OpSpec& op : ops) {
    std::vector<Unit> units;
    for (const OpTensorRef& r : op.tensors) {
      const TensorInfo* t = model.Find(r.name);
      if (!t) continue;
      const int slice = IsExpertTensor(*t) ? r.slice : -1;
      if (IsExpertTensor(*t) && slice < 0) continue;
      if (placed.emplace(std::make_pair(r.name, slice), true).second) units.push_back({t, slice});
    }
    if (!units.empty()) layout.emplace_back(op.id, std::move(units));
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
  if (!misc.empty()) layout.emplace_back("misc", std::move(misc));

  if (options.plan) {
    // A plan for another model (or a typo) must not silently pack with defaults.
    std::set<std::string> known;
    for (const OpSpec& op : ops) known.insert(op.id);
    for (const auto& [op, tiers] : options.plan->op_tiers)
      if (!known.count(op))
        return InvalidArgument("pack: the plan names op '" + op + "', which this model does not have");
    for (const auto& [name, type] : options.plan->tensor_types)
      if (!model.Find(name))
        return InvalidArgument("pack: the plan's tensor_types names tensor '" + name +
                               "', which this model does not have");
  }
  // Every type is decided (and every plan error found) before anything is written.
  std::vector<std::vector<UnitTypes>> types(layout.size());
  uint64_t total_bytes = 0;
  int max_tiers = 1;
  for (size_t i = 0; i < layout.size(); ++i) {
    for (const Unit& u : layout[i].second) {
      ASSIGN_OR_RETURN(UnitTypes ut, DecideTypes(*u.info, layout[i].first, options));
      max_tiers = std::max(max_tiers, 1 + static_cast<int>(ut.residuals.size()));
      types[i].push_back(std::move(ut));
      total_bytes += u.slice >= 0 ? u.info->slice_bytes() : u.info->bytes;
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return IOError("pack: cannot create '" + out_dir + "': " + ec.message());
  // Packing over a store replaces its files one by one: without its manifest, a store that
  // fails half-way (a full disk) reads as incomplete rather than as checksum errors.
  Env* env = options.env ? options.env : Env::Default();
  const std::string manifest_path = out_dir + "/manifest.json";
  if (env->FileExists(manifest_path)) RETURN_IF_ERROR(env->RemoveFile(manifest_path));

  PackStats stats;
  json entries = json::array();
  json tensors = json::array();
  for (const TensorInfo& t : model.tensors())
    tensors.push_back({{"name", t.name}, {"shape", t.ne}, {"source_type", DTypeName(t.type)},
                       {"sliced", IsExpertTensor(t)}});

  ThreadPool& pool = options.pool ? *options.pool : ThreadPool::Default();
  std::optional<ProgressBar> bar;
  if (options.progress) bar.emplace("pack", total_bytes);
  uint64_t done_bytes = 0;
  std::vector<uint8_t> raw;
  std::vector<std::vector<uint8_t>> out(3);
  for (size_t i = 0; i < layout.size(); ++i) {
    const std::string& op = layout[i].first;
    int op_tiers = 1;
    for (const UnitTypes& ut : types[i])
      op_tiers = std::max(op_tiers, 1 + static_cast<int>(ut.residuals.size()));
    std::vector<OpWriter> writers(op_tiers);
    for (int k = 0; k < op_tiers; ++k) RETURN_IF_ERROR(writers[k].Open(out_dir, op, k, env));
    stats.n_files += op_tiers;

    for (size_t j = 0; j < layout[i].second.size(); ++j) {
      const Unit& u = layout[i].second[j];
      const UnitTypes& ut = types[i][j];
      const TensorInfo& t = *u.info;
      const int n_tiers = 1 + static_cast<int>(ut.residuals.size());
      const uint64_t n_bytes = u.slice >= 0 ? t.slice_bytes() : t.bytes;
      UnitReader reader;
      RETURN_IF_ERROR(reader.Open(model, u).WithContext("pack: reading tensor '" + t.name + "'"));
      for (int k = 0; k < n_tiers; ++k) RETURN_IF_ERROR(writers[k].Begin());

      // An expert's tier 0 in the CPU kernels' layout (groups of 16 rows: chunks of whole groups
      // give the bytes of the whole matrix rearranged).
      const auto cols = static_cast<int64_t>(t.ne[0]);
      const uint64_t src_row = *RowBytes(t.type, t.ne[0]);
      const WeightLayout stored =
          options.cpu_layout && u.slice >= 0 && IsMatrix(t)
              ? DecodeLayoutFor(ut.tier0, static_cast<int64_t>(n_bytes / src_row), cols)
              : WeightLayout::kRows;
      // Chunks of whole rows when converting or rearranging; of bytes when only copying.
      const bool convert = !(ut.copy && ut.residuals.empty());
      const uint64_t row_bytes = convert || stored != WeightLayout::kRows ? src_row : 1;
      const uint64_t rows = n_bytes / row_bytes;
      uint64_t chunk_rows = std::max<uint64_t>(1, kChunkBytes / row_bytes);
      if (stored != WeightLayout::kRows)
        chunk_rows = std::max<uint64_t>(kInterleavedRows,
                                        chunk_rows / kInterleavedRows * kInterleavedRows);
      for (uint64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
        const uint64_t nr = std::min(chunk_rows, rows - r0);
        raw.resize(nr * row_bytes);
        RETURN_IF_ERROR(reader.Read(r0 * row_bytes, nr * row_bytes, raw.data()));
        uint8_t* tier0 = raw.data();
        if (convert) {
          ConvertRows(t, ut, raw.data(), static_cast<int64_t>(nr), out, pool);
          tier0 = out[0].data();
        }
        if (stored != WeightLayout::kRows)
          InterleaveForDecode(ut.tier0, static_cast<int64_t>(nr), cols, tier0, &pool);
        if (!convert) {
          RETURN_IF_ERROR(writers[0].Append(raw.data(), raw.size()));
        } else {
          for (int k = 0; k < n_tiers; ++k)
            RETURN_IF_ERROR(writers[k].Append(out[k].data(), out[k].size()));
        }
        done_bytes += nr * row_bytes;
        if (bar) bar->Update(done_bytes, t.name);
      }
      for (int k = 0; k < n_tiers; ++k) {
        json e = writers[k].End();
        stats.tier_bytes[k] += e["bytes"].get<uint64_t>();
        e["tensor"] = t.name;
        e["slice"] = u.slice;
        e["op"] = op;
        e["tier"] = k;
        e["type"] = DTypeName(k == 0 ? ut.tier0 : ut.residuals[k - 1]);
        if (k == 0 && stored != WeightLayout::kRows) e["layout"] = WeightLayoutName(stored);
        entries.push_back(std::move(e));
      }
      ++stats.n_units;
      stats.copied_units += ut.copy;
    }
    for (auto& wr : writers) RETURN_IF_ERROR(wr.Commit());
  }
  if (bar) bar->Finish();

  // The metadata travels as a tensorless GGUF, so the runtime opens it with ModelFile.
  GgufWriter meta(out_dir + "/model.gguf", env);
  meta.SetMetadata(model.metadata());
  RETURN_IF_ERROR(meta.Finish());
  // Its checksum as written, so that an edit of it (block_count, rope.freq_base: a different
  // model over the same data) is found at open.
  ASSIGN_OR_RETURN(std::string meta_bytes,
                   ReadFileToString(out_dir + "/model.gguf", 1ull << 32, env));

  json tiers = json::array();
  if (options.plan) {
    for (int k = 0; k < max_tiers; ++k) tiers.push_back("plan");
  } else {
    tiers.push_back(options.keep_skeleton ? "keep" : DTypeName(options.skeleton));
    for (int k = 1; k < max_tiers; ++k) tiers.push_back(DTypeName(options.residuals[k - 1]));
  }
  json manifest = {{"format", "substrate-store"},
                   {"schema_version", kStoreSchemaVersion},
                   {"alignment", kStoreAlignment},
                   {"model", "model.gguf"},
                   {"model_bytes", meta_bytes.size()},
                   {"model_crc32c", Crc32c(meta_bytes.data(), meta_bytes.size())},
                   {"tiers", tiers},
                   {"tensors", tensors},
                   {"entries", entries}};
  RETURN_IF_ERROR(WriteFileAtomic(manifest_path, manifest.dump(1), env));
  return stats;
}

}  // namespace substrate
