#include "store/store_weight_source.h"

#include <map>
#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "store/crc32c.h"
#include "store/pack.h"

namespace substrate {
namespace {

using nlohmann::json;

uint64_t Elements(const std::vector<uint64_t>& ne) {
  uint64_t n = 1;
  for (uint64_t d : ne) n *= d;
  return n;
}

}  // namespace

Expected<std::unique_ptr<StoreWeightSource>> StoreWeightSource::Open(const std::string& dir,
                                                                     MemoryLedger* ledger,
                                                                     const StoreOptions& options) {
  const std::string mpath = dir + "/manifest.json";
  if (!FileExists(mpath)) return NotFound("store '" + dir + "': no manifest.json");
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(mpath, 1ull << 31));
  auto src = std::unique_ptr<StoreWeightSource>(new StoreWeightSource());
  src->options_ = options;
  src->dir_ = dir;
  src->ledger_ = ledger;
  Status st;
  try {
    st = src->ParseAndLoad(dir, text, ledger);
  } catch (const json::exception& e) {
    st = Corruption(mpath + ": malformed manifest: " + e.what());
  }
  RETURN_IF_ERROR(st);
  return src;
}

Status StoreWeightSource::ParseAndLoad(const std::string& dir, const std::string& text,
                                       MemoryLedger* ledger) {
  const std::string mpath = dir + "/manifest.json";
  json m = json::parse(text);
  if (!m.is_object() || m.value("format", "") != "substrate-store")
    return Corruption(mpath + ": not a substrate store manifest");
  const int version = m.at("schema_version").get<int>();
  if (version != kStoreSchemaVersion)
    return Corruption(mpath + ": schema_version " + std::to_string(version) + ", this build reads " +
                      std::to_string(kStoreSchemaVersion));
  n_tiers_ = static_cast<int>(m.at("tiers").size());
  if (n_tiers_ < 1 || n_tiers_ > 3) return Corruption(mpath + ": 1 to 3 tiers expected");

  ASSIGN_OR_RETURN(meta_, ModelFile::Open(dir + "/" + m.at("model").get<std::string>()));

  for (const json& t : m.at("tensors")) {
    Tensor tensor;
    tensor.info.name = t.at("name").get<std::string>();
    tensor.info.ne = t.at("shape").get<std::vector<uint64_t>>();
    tensor.sliced = t.at("sliced").get<bool>();
    if (tensor.info.ne.empty() || tensor.info.ne.size() > 4 || Elements(tensor.info.ne) > (1ull << 40))
      return Corruption(mpath + ": tensor '" + tensor.info.name + "' has a bad shape");
    if (tensor.sliced && tensor.info.ne.back() > 65536)
      return Corruption(mpath + ": tensor '" + tensor.info.name + "' has too many slices");
    tensor.units.resize(tensor.sliced ? tensor.info.ne.back() : 1);
    if (!ids_.emplace(tensor.info.name, static_cast<TensorId>(tensors_.size())).second)
      return Corruption(mpath + ": tensor '" + tensor.info.name + "' listed twice");
    tensors_.push_back(std::move(tensor));
  }

  std::map<std::string, int> files;  // name -> 1 + index in files_
  for (const json& e : m.at("entries")) {
    const std::string name = e.at("tensor").get<std::string>();
    const std::string file = e.at("file").get<std::string>();
    const int slice = e.at("slice").get<int>();
    const int tier = e.at("tier").get<int>();
    const uint64_t offset = e.at("offset").get<uint64_t>();
    const uint64_t bytes = e.at("bytes").get<uint64_t>();
    const uint32_t crc = e.at("crc32c").get<uint32_t>();
    const std::string what = file + ": tensor '" + name + "'" +
                             (slice >= 0 ? " slice " + std::to_string(slice) : "") + " tier " +
                             std::to_string(tier);
    auto it = ids_.find(name);
    if (it == ids_.end()) return Corruption(mpath + ": entry for unknown tensor '" + name + "'");
    Tensor& t = tensors_[it->second];
    if (tier < 0 || tier >= n_tiers_) return Corruption(mpath + ": " + what + ": bad tier");
    if (t.sliced != (slice >= 0) || (slice >= 0 && static_cast<size_t>(slice) >= t.units.size()))
      return Corruption(mpath + ": " + what + ": bad slice");
    if (file.find('/') != std::string::npos || file.empty())
      return Corruption(mpath + ": " + what + ": bad file name");
    auto type = DTypeFromName(e.at("type").get<std::string>());
    if (!type) return Corruption(mpath + ": " + what + ": unknown type");
    const uint64_t n_el = Elements(t.info.ne) / t.units.size();
    auto want = RowBytes(*type, n_el);
    if (!want || *want != bytes)
      return Corruption(mpath + ": " + what + ": " + std::to_string(bytes) +
                        " bytes do not fit its shape and type " + DTypeName(*type));
    Unit& u = t.units[slice >= 0 ? slice : 0];
    if (tier != u.n_tiers) return Corruption(mpath + ": " + what + ": tiers out of order");
    u.n_tiers = tier + 1;
    if (tier == 0) {
      t.info.type = *type;
      t.info.bytes += bytes;
    }
    Range& r = u.tier[tier];
    r.type = *type;
    r.bytes = bytes;
    if (tier > options_.max_tier) continue;

    auto& fi = files[file];
    if (fi == 0) {
      ASSIGN_OR_RETURN(auto f, RandomAccessFile::Open(dir + "/" + file));
      files_.push_back(std::move(f));
      fi = static_cast<int>(files_.size());
    }
    const RandomAccessFile& f = *files_[fi - 1];
    if (offset > f.size() || bytes > f.size() - offset)
      return Corruption(dir + "/" + what + ": range [" + std::to_string(offset) + ", +" +
                        std::to_string(bytes) + ") past end of file (size " +
                        std::to_string(f.size()) + "): truncated store");
    r.file = fi - 1;
    r.offset = offset;
    r.crc = crc;
    r.what = what;
    if (!options_.streaming) RETURN_IF_ERROR(LoadRange(r, "weights"));
  }
  for (const Tensor& t : tensors_)
    for (size_t s = 0; s < t.units.size(); ++s)
      if (t.units[s].n_tiers == 0)
        return Corruption(mpath + ": tensor '" + t.info.name + "' slice " + std::to_string(s) +
                          " has no data");
  return Status::Ok();
}

Status StoreWeightSource::LoadRange(Range& r, const char* account) {
  auto buf = AlignedBuffer::Allocate(r.bytes ? r.bytes : 1, ledger_, account, 64);
  if (!buf.ok()) return buf.status().WithContext("loading " + r.what);
  RETURN_IF_ERROR(files_[r.file]->Read(r.offset, r.bytes, buf->data()));
  const uint32_t got = Crc32c(buf->data(), r.bytes);
  if (got != r.crc)
    return Corruption(dir_ + "/" + r.what + ": checksum mismatch (crc32c " + std::to_string(got) +
                      ", manifest says " + std::to_string(r.crc) + ")");
  r.data = std::move(buf).value();
  loaded_bytes_ += r.bytes;
  return Status::Ok();
}

void StoreWeightSource::EndOp(const std::string& op_id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Range* r : streamed_) r->data = AlignedBuffer();
  streamed_.clear();
}

TensorId StoreWeightSource::Resolve(const std::string& name) const {
  auto it = ids_.find(name);
  return it == ids_.end() ? kNoTensor : it->second;
}

Expected<WeightHandle> StoreWeightSource::Acquire(TensorId id, int slice, int tier) {
  if (id < 0 || static_cast<size_t>(id) >= tensors_.size())
    return InvalidArgument("store: no tensor with id " + std::to_string(id));
  const Tensor& t = tensors_[id];
  if (t.sliced && slice < 0)
    return Unimplemented("store: tensor '" + t.info.name + "' is stored per expert; acquire a slice");
  const int64_t cols = static_cast<int64_t>(t.info.ne[0]);
  int64_t rows = 1;
  for (size_t i = 1; i < t.info.ne.size(); ++i) rows *= static_cast<int64_t>(t.info.ne[i]);
  Unit* u = &tensors_[id].units[0];
  uint64_t offset_el = 0;  // for a slice of an unsliced tensor
  if (slice >= 0) {
    if (static_cast<uint64_t>(slice) >= t.info.outer() || t.info.ne.size() < 2)
      return InvalidArgument("store: tensor '" + t.info.name + "': slice " +
                             std::to_string(slice) + " out of range");
    rows /= static_cast<int64_t>(t.info.outer());
    if (t.sliced) u = &tensors_[id].units[slice];
    else offset_el = static_cast<uint64_t>(slice) * static_cast<uint64_t>(rows * cols);
  }
  const int loaded = std::min(u->n_tiers, options_.max_tier + 1);
  const int use = std::min(std::max(tier, options_.serve_tier), loaded - 1);
  if (options_.streaming) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int k = 0; k <= use; ++k) {
      Range& r = u->tier[k];
      if (r.data.data()) continue;
      RETURN_IF_ERROR(LoadRange(r, "stream"));
      streamed_.push_back(&r);
    }
  }
  WeightView v;
  v.cols = cols;
  v.rows = rows;
  auto range = [&](int k, const uint8_t** data, uint64_t* bytes) {
    const Range& r = u->tier[k];
    const uint64_t n = static_cast<uint64_t>(rows * cols);
    *data = r.data.data() + (offset_el ? *RowBytes(r.type, offset_el) : 0);
    *bytes = *RowBytes(r.type, n);
  };
  v.type = u->tier[0].type;
  range(0, &v.data, &v.bytes);
  v.n_residuals = use;
  for (int k = 1; k <= use; ++k) {
    uint64_t b = 0;
    v.residual_type[k - 1] = u->tier[k].type;
    range(k, &v.residual[k - 1], &b);
  }
  return WeightHandle(this, v, 0);
}

}  // namespace substrate
