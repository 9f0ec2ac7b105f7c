#include "store/store_index.h"

#include <fcntl.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/log.h"
#include "format/model_fingerprint.h"
#include "kernels/interleaved.h"
#include "model/hparams.h"
#include "model/op_id.h"
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

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

uint64_t StoreOp::TierBytes(int tier) const {
  uint64_t n = 0;
  for (const Span& s : spans[tier]) n += RoundUp(s.bytes, kStoreAlignment);
  return n;
}

uint64_t StoreOp::SlabOffset(int tier) const {
  uint64_t off = 0;
  for (int k = 0; k < tier && k < n_tiers; ++k) off += TierBytes(k);
  return off;
}

uint64_t StoreOp::SlabBytes(int tier) const { return SlabOffset(std::min(tier, n_tiers - 1) + 1); }

Expected<std::unique_ptr<StoreIndex>> StoreIndex::Open(const std::string& dir,
                                                       const StoreIndexOptions& options) {
  const std::string mpath = dir + "/manifest.json";
  if (!FileExists(mpath)) return NotFound("store '" + dir + "': no manifest.json");
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(mpath, 1ull << 31, options.env));
  std::unique_ptr<StoreIndex> ix(new StoreIndex());
  ix->options_ = options;
  ix->options_.max_tier = std::clamp(options.max_tier, 0, 2);
  ix->dir_ = dir;
  Status st;
  try {
    st = ix->Parse(text);
  } catch (const json::exception& e) {
    st = Corruption(mpath + ": malformed manifest: " + e.what());
  }
  RETURN_IF_ERROR(st);
  return ix;
}

Status StoreIndex::Parse(const std::string& text) {
  const std::string mpath = dir_ + "/manifest.json";
  json m = json::parse(text);
  if (!m.is_object() || m.value("format", "") != "substrate-store")
    return Corruption(mpath + ": not a substrate store manifest");
  const int version = m.at("schema_version").get<int>();
  if (version < 1 || version > kStoreSchemaVersion)
    return Corruption(mpath + ": schema_version " + std::to_string(version) +
                      ", this build reads 1 to " + std::to_string(kStoreSchemaVersion));
  n_tiers_ = static_cast<int>(m.at("tiers").size());
  if (n_tiers_ < 1 || n_tiers_ > 3) return Corruption(mpath + ": 1 to 3 tiers expected");
  for (const json& t : m.at("tiers")) tier_names_.push_back(t.is_string() ? t.get<std::string>() : "?");

  const std::string model_name = m.at("model").get<std::string>();
  if (model_name.empty() || model_name.find('/') != std::string::npos)
    return Corruption(mpath + ": bad model file name '" + model_name + "'");
  if (version >= 2) {
    RETURN_IF_ERROR(VerifyModelFile(model_name, m.at("model_bytes").get<uint64_t>(),
                                    m.at("model_crc32c").get<uint32_t>()));
  }
  ASSIGN_OR_RETURN(meta_, ModelFile::Open(dir_ + "/" + model_name));

  for (const json& t : m.at("tensors")) {
    StoreTensor tensor;
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
    const std::string op = e.at("op").get<std::string>();
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
    StoreTensor& t = tensors_[it->second];
    if (tier < 0 || tier >= n_tiers_) return Corruption(mpath + ": " + what + ": bad tier");
    if (t.sliced != (slice >= 0) || (slice >= 0 && static_cast<size_t>(slice) >= t.units.size()))
      return Corruption(mpath + ": " + what + ": bad slice");
    if (file.find('/') != std::string::npos || file.empty())
      return Corruption(mpath + ": " + what + ": bad file name");
    if (offset % kStoreAlignment != 0)
      return Corruption(mpath + ": " + what + ": offset " + std::to_string(offset) +
                        " is not 4096-aligned");
    auto type = DTypeFromName(e.at("type").get<std::string>());
    if (!type) return Corruption(mpath + ": " + what + ": unknown type");
    const uint64_t n_el = Elements(t.info.ne) / t.units.size();
    auto want = RowBytes(*type, n_el);
    if (!want || *want != bytes)
      return Corruption(mpath + ": " + what + ": " + std::to_string(bytes) +
                        " bytes do not fit its shape and type " + DTypeName(*type));
    WeightLayout layout = WeightLayout::kRows;
    if (e.contains("layout")) {
      // Only a matrix's tier 0, and only the layout its type and shape take (its kernels read
      // nothing else).
      const int64_t cols = static_cast<int64_t>(t.info.ne[0]);
      if (!WeightLayoutFromName(e.at("layout").get<std::string>(), &layout) ||
          (layout != WeightLayout::kRows &&
           (tier != 0 || t.info.ne.size() < 2 ||
            DecodeLayoutFor(*type, static_cast<int64_t>(n_el) / cols, cols) != layout)))
        return Corruption(mpath + ": " + what + ": layout '" + e.at("layout").get<std::string>() +
                          "' does not fit its tier, shape and type " + DTypeName(*type));
      has_interleaved_ |= layout != WeightLayout::kRows;
    }
    StoreUnit& u = t.units[slice >= 0 ? slice : 0];
    if (tier != u.n_tiers) return Corruption(mpath + ": " + what + ": tiers out of order");
    u.n_tiers = tier + 1;
    auto [oit, added] = op_ids_.emplace(op, static_cast<int>(ops_.size()));
    if (added) {
      ops_.emplace_back();
      ops_.back().id = op;
    }
    if (tier == 0) {
      t.info.type = *type;
      t.info.bytes += bytes;
      if (u.op >= 0) return Corruption(mpath + ": " + what + ": listed twice");
      u.op = oit->second;
      ops_[u.op].units.emplace_back(it->second, slice);
    } else if (u.op != oit->second) {
      return Corruption(mpath + ": " + what + ": tiers of one unit in different ops");
    }
    StoreRange& r = u.tier[tier];
    r.type = *type;
    r.bytes = bytes;
    r.offset = offset;
    r.crc = crc;
    r.what = what;
    r.layout = layout;
    if (tier > options_.max_tier) continue;

    auto& fi = files[file];
    if (fi == 0) {
      RETURN_IF_ERROR(AddDataFile(dir_ + "/" + file));
      fi = static_cast<int>(files_.size());
    }
    const RandomAccessFile& f = *files_[fi - 1];
    if (offset > f.size() || bytes > f.size() - offset)
      return Corruption(dir_ + "/" + what + ": range [" + std::to_string(offset) + ", +" +
                        std::to_string(bytes) + ") past end of file (size " +
                        std::to_string(f.size()) + "): truncated store");
    r.file = fi - 1;
  }
  for (const StoreTensor& t : tensors_)
    for (size_t s = 0; s < t.units.size(); ++s)
      if (t.units[s].n_tiers == 0)
        return Corruption(mpath + ": tensor '" + t.info.name + "' slice " + std::to_string(s) +
                          " has no data");
  RETURN_IF_ERROR(CheckMatchesModel());
  return LayOutSpans();
}

Status StoreIndex::AddDataFile(const std::string& path) {
  Env* env = options_.env ? options_.env : Env::Default();
  ASSIGN_OR_RETURN(auto f, env->NewRandomAccessFile(path, options_.direct_io));
  if (options_.direct_io && !f->direct()) {
    if (f->fd() >= 0) ::posix_fadvise(f->fd(), 0, 0, POSIX_FADV_RANDOM);
    if (!warned_buffered_)
      LOG_WARN("%s: the file system refuses O_DIRECT; reading through the page cache, without "
               "read-ahead, dropping each range once read (posix_fadvise) to keep the cache "
               "inside the budget", path.c_str());
    warned_buffered_ = true;
  }
  files_.push_back(std::move(f));
  return Status::Ok();
}

Status StoreIndex::LayOutSpans() {
  for (StoreOp& o : ops_) {
    o.n_tiers = 0;
    for (int k = 0; k <= options_.max_tier && k < 3; ++k) {
      std::vector<StoreRange*> rs;
      for (const auto& [id, slice] : o.units) {
        StoreUnit& u = tensors_[id].units[slice >= 0 ? slice : 0];
        if (k < u.n_tiers && u.tier[k].file >= 0) rs.push_back(&u.tier[k]);
      }
      o.spans[k].clear();
      if (rs.empty()) continue;
      std::sort(rs.begin(), rs.end(), [](const StoreRange* a, const StoreRange* b) {
        return a->file != b->file ? a->file < b->file : a->offset < b->offset;
      });
      uint64_t pos = 0;
      for (StoreRange* r : rs) {
        const uint64_t size = files_[r->file]->size();
        if (r->offset > size || r->bytes > size - r->offset)
          return Corruption(r->what + ": range [" + std::to_string(r->offset) + ", +" +
                            std::to_string(r->bytes) + ") past end of file (size " +
                            std::to_string(size) + "): truncated");
        const uint64_t begin = r->offset / kStoreAlignment * kStoreAlignment;
        const uint64_t end = std::min(RoundUp(r->offset + r->bytes, kStoreAlignment), size);
        std::vector<StoreOp::Span>& sp = o.spans[k];
        // Ranges whose aligned extents meet share a span: one read, no byte read twice.
        if (sp.empty() || sp.back().file != r->file || begin > sp.back().offset + sp.back().bytes) {
          if (!sp.empty()) pos += RoundUp(sp.back().bytes, kStoreAlignment);
          sp.push_back({r->file, begin, 0, pos});
        }
        StoreOp::Span& s = sp.back();
        s.bytes = std::max(s.bytes, end - s.offset);
        r->slab_pos = s.slab_pos + (r->offset - s.offset);
      }
      o.n_tiers = k + 1;
    }
  }
  return Status::Ok();
}

// model.gguf holds only metadata (a few MB of vocabulary at most): read whole and checksummed.
Status StoreIndex::VerifyModelFile(const std::string& name, uint64_t bytes, uint32_t crc) const {
  const std::string path = dir_ + "/" + name;
  Env* env = options_.env ? options_.env : Env::Default();
  ASSIGN_OR_RETURN(auto f, env->NewRandomAccessFile(path, false));
  if (f->size() != bytes)
    return Corruption("store '" + dir_ + "': " + name + " is " + std::to_string(f->size()) +
                      " bytes, the manifest says " + std::to_string(bytes) +
                      ": it was changed after pack (repack the store)");
  if (bytes > (1ull << 32)) return Corruption("store '" + dir_ + "': " + name + " is too large");
  std::string data(bytes, '\0');
  RETURN_IF_ERROR(f->Read(0, bytes, data.data()));
  const uint32_t got = Crc32c(data.data(), data.size());
  if (got != crc)
    return Corruption("store '" + dir_ + "': " + name + ": checksum mismatch (crc32c " +
                      std::to_string(got) + ", manifest says " + std::to_string(crc) +
                      "): it was changed after pack (repack the store)");
  return Status::Ok();
}

// model.gguf says which ops the model runs (architecture, layers, experts); the manifest says
// which ops the store holds. A model.gguf copied from another model (or edited) would otherwise
// surface later as a missing tensor or, worse, as a budget the wrong hparams cannot meet.
Status StoreIndex::CheckMatchesModel() const {
  const std::string what = "store '" + dir_ + "': manifest.json and model.gguf do not match: ";
  auto hp = ModelHParams::FromMetadata(meta_->metadata());
  if (!hp.ok()) return hp.status().WithContext("store '" + dir_ + "': model.gguf");
  hp->list_nextn = true;
  const std::string model =
      hp->arch + " with " + std::to_string(hp->n_layer) + " layers" +
      (hp->n_expert > 0 ? " and " + std::to_string(hp->n_expert) + " experts" : "");
  std::set<std::string> model_ops;
  for (const OpSpec& op :
       ListOps(*hp, [&](const std::string& n) { return Resolve(n) != kNoTensor; })) {
    model_ops.insert(op.id);
    for (const OpTensorRef& t : op.tensors) {
      const TensorId id = Resolve(t.name);
      if (id == kNoTensor)
        return Corruption(what + "model.gguf describes " + model + ", whose op '" + op.id +
                          "' needs tensor '" + t.name + "', which the manifest does not have");
      if (t.slice >= 0 && (tensors_[id].info.ne.size() < 2 ||
                           static_cast<uint64_t>(t.slice) >= tensors_[id].info.outer()))
        return Corruption(what + "model.gguf describes " + model + ", whose op '" + op.id +
                          "' needs slice " + std::to_string(t.slice) + " of '" + t.name +
                          "', which the manifest's shape does not have");
    }
  }
  for (const StoreOp& o : ops_)
    if (o.id != "misc" && !model_ops.count(o.id))
      return Corruption(what + "the manifest holds op '" + o.id + "', which " + model +
                        " (model.gguf) does not have");
  return Status::Ok();
}

Expected<uint64_t> StoreFingerprint(const std::string& dir, int tier, Env* env) {
  const std::string mpath = dir + "/manifest.json";
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(mpath, 1ull << 31, env));
  try {
    const json m = json::parse(text);
    uint64_t h = Fnv1a(kFnvOffset, &tier, sizeof tier);
    const uint64_t model_crc = m.value("model_crc32c", uint64_t{0});
    h = Fnv1a(h, &model_crc, sizeof model_crc);
    for (const json& e : m.at("entries")) {
      if (e.at("tier").get<int>() > tier) continue;
      const std::string key =
          e.at("tensor").get<std::string>() + "/" + std::to_string(e.at("slice").get<int>()) + "/" +
          std::to_string(e.at("tier").get<int>()) + "/" + e.at("type").get<std::string>() + "/" +
          std::to_string(e.at("bytes").get<uint64_t>()) + "/" +
          std::to_string(e.at("crc32c").get<uint32_t>());
      h = Fnv1a(h, key.data(), key.size());
    }
    return h;
  } catch (const json::exception& e) {
    return Corruption(mpath + ": malformed manifest: " + e.what());
  }
}

std::string StoreIndex::LadderText() const {
  std::string s = n_tiers_ == 1 ? "tier 0 only (" : "tiers 0.." + std::to_string(n_tiers_ - 1) + " (";
  for (int k = 0; k < n_tiers_; ++k)
    s += (k ? ", + " : "") + (k < static_cast<int>(tier_names_.size()) ? tier_names_[k] : "?");
  return s + ")";
}

TensorId StoreIndex::Resolve(const std::string& name) const {
  auto it = ids_.find(name);
  return it == ids_.end() ? kNoTensor : it->second;
}

int StoreIndex::FindOp(const std::string& id) const {
  auto it = op_ids_.find(id);
  return it == op_ids_.end() ? -1 : it->second;
}

Expected<const StoreUnit*> StoreIndex::FindUnit(TensorId id, int slice, uint64_t* offset_el) const {
  *offset_el = 0;
  if (id < 0 || static_cast<size_t>(id) >= tensors_.size())
    return InvalidArgument("store: no tensor with id " + std::to_string(id));
  const StoreTensor& t = tensors_[id];
  if (t.sliced && slice < 0)
    return Unimplemented("store: tensor '" + t.info.name + "' is stored per expert; acquire a slice");
  if (slice < 0) return &t.units[0];
  if (static_cast<uint64_t>(slice) >= t.info.outer() || t.info.ne.size() < 2)
    return InvalidArgument("store: tensor '" + t.info.name + "': slice " + std::to_string(slice) +
                           " out of range");
  if (t.sliced) return &t.units[slice];
  *offset_el = static_cast<uint64_t>(slice) * (Elements(t.info.ne) / t.info.outer());
  return &t.units[0];
}

WeightView StoreIndex::MakeView(TensorId id, int slice, const StoreUnit& u, uint64_t offset_el,
                                int use, const uint8_t* const tier_data[3]) const {
  const StoreTensor& t = tensors_[id];
  const int64_t cols = static_cast<int64_t>(t.info.ne[0]);
  int64_t rows = 1;
  for (size_t i = 1; i < t.info.ne.size(); ++i) rows *= static_cast<int64_t>(t.info.ne[i]);
  if (slice >= 0) rows /= static_cast<int64_t>(t.info.outer());
  const uint64_t n = static_cast<uint64_t>(rows * cols);
  WeightView v;
  v.cols = cols;
  v.rows = rows;
  v.type = u.tier[0].type;
  v.data = tier_data[0] + (offset_el ? *RowBytes(u.tier[0].type, offset_el) : 0);
  v.layout = u.tier[0].layout;
  v.bytes = *RowBytes(u.tier[0].type, n);
  v.n_residuals = use;
  for (int k = 1; k <= use; ++k) {
    v.residual_type[k - 1] = u.tier[k].type;
    v.residual[k - 1] = tier_data[k] + (offset_el ? *RowBytes(u.tier[k].type, offset_el) : 0);
  }
  return v;
}

Status StoreIndex::Verify(const StoreRange& r, const uint8_t* data) const {
  return CheckCrc(r, Crc32c(data, r.bytes));
}

Status StoreIndex::CheckCrc(const StoreRange& r, uint32_t got) const {
  if (got == r.crc) return Status::Ok();
  if (!gguf_path_.empty())
    return Corruption("'" + files_[r.file]->path() + "': " + r.what + " at offset " + std::to_string(r.offset) +
                      ": checksum mismatch (crc32c " + std::to_string(got) + ", " +
                      std::to_string(r.crc) + " when its checksums were taken): the file changed "
                      "under the running session; stopping rather than computing with mixed bytes");
  return Corruption(dir_ + "/" + r.what + " at offset " + std::to_string(r.offset) +
                    ": checksum mismatch (crc32c " + std::to_string(got) + ", manifest says " +
                    std::to_string(r.crc) + ")");
}

Status StoreIndex::ReadVerified(const StoreRange& r, uint8_t* dst) const {
  if (r.file < 0) return InvalidArgument("store: " + r.what + " is above the opened tiers");
  RETURN_IF_ERROR(files_[r.file]->Read(r.offset, r.bytes, dst));
  return Verify(r, dst);
}

}  // namespace substrate
