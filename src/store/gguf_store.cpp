// StoreIndex::OpenGguf: a GGUF file as a one-tier store, read in place. Each unit (a tensor, or
// one expert slice of a 3-D expert tensor) is its own bytes in the file; units go to the op that
// first acquires them, as pack groups them, so the runtime streams an op with one aligned read
// per run of adjacent tensors and trims the unaligned head and tail through the ranges' slab
// positions (StoreIndex::LayOutSpans). A split GGUF is one store of several files: a unit's
// range names the part that holds it.
#include <set>

#include "core/log.h"
#include "format/gguf_reader.h"
#include "model/hparams.h"
#include "model/op_id.h"
#include "store/gguf_checksums.h"
#include "store/pack.h"
#include "store/store_index.h"

namespace substrate {

Expected<std::unique_ptr<StoreIndex>> StoreIndex::OpenGguf(const std::string& path,
                                                           const StoreIndexOptions& options) {
  std::unique_ptr<StoreIndex> ix(new StoreIndex());
  ix->options_ = options;
  ix->options_.max_tier = 0;
  ix->dir_ = path;
  ix->gguf_path_ = path;
  ix->n_tiers_ = 1;
  ASSIGN_OR_RETURN(ix->meta_, ModelFile::Open(path));
  const ModelFile& m = *ix->meta_;
  if (dynamic_cast<const GgufFile*>(&m) == nullptr)
    return InvalidArgument("'" + path + "': reading a model out of core in place needs a GGUF "
                           "file (pack a folder of safetensors into a store: substrate pack)");
  for (const TensorInfo& t : m.tensors())
    if (t.parts.size() != 1 || t.transform != TensorTransform::kNone || t.parts[0].bytes != t.bytes)
      return InvalidArgument("'" + path + "': tensor '" + t.name +
                             "' is not stored as one range; pack the model (substrate pack)");
  for (int i = 0; i < m.n_files(); ++i) RETURN_IF_ERROR(ix->AddDataFile(m.file(i).path()));

  std::set<std::string> types;
  for (const TensorInfo& t : m.tensors()) {
    StoreTensor st;
    st.info = t;
    st.sliced = IsExpertTensor(t);
    st.units.resize(st.sliced ? t.outer() : 1);
    for (size_t s = 0; s < st.units.size(); ++s) {
      StoreRange& r = st.units[s].tier[0];
      r.type = t.type;
      r.bytes = st.sliced ? t.slice_bytes() : t.bytes;
      r.offset = t.parts[0].offset + (st.sliced ? t.slice_bytes() * s : 0);
      r.file = t.parts[0].file;
      r.what = "tensor '" + t.name + "'" + (st.sliced ? " slice " + std::to_string(s) : "");
      st.units[s].n_tiers = 1;
    }
    types.insert(DTypeName(t.type));
    if (!ix->ids_.emplace(t.name, static_cast<TensorId>(ix->tensors_.size())).second)
      return Corruption("'" + path + "': tensor '" + t.name + "' listed twice");
    ix->tensors_.push_back(std::move(st));
  }
  std::string names;
  for (const std::string& t : types) names += (names.empty() ? "" : "/") + t;
  ix->tier_names_ = {"GGUF " + names};

  // Each unit goes to the first op that acquires it; units no op names go to "misc", but a
  // next-n layer's, which without options.with_nextn are in no op (never planned or read).
  auto hp = ModelHParams::FromMetadata(m.metadata());
  if (!hp.ok()) return hp.status().WithContext(path);
  hp->list_nextn = options.with_nextn;
  auto place = [&](const std::string& op, TensorId id, int slice) {
    StoreUnit& u = ix->tensors_[id].units[slice >= 0 ? slice : 0];
    if (u.op >= 0) return;
    auto [it, added] = ix->op_ids_.emplace(op, static_cast<int>(ix->ops_.size()));
    if (added) {
      ix->ops_.emplace_back();
      ix->ops_.back().id = op;
    }
    u.op = it->second;
    ix->ops_[u.op].units.emplace_back(id, slice);
  };
  for (const OpSpec& op : ListOps(*hp, [&](const std::string& n) { return ix->Resolve(n) != kNoTensor; }))
    for (const OpTensorRef& r : op.tensors) {
      const TensorId id = ix->Resolve(r.name);
      if (id == kNoTensor) continue;
      const StoreTensor& t = ix->tensors_[id];
      if (t.sliced && (r.slice < 0 || static_cast<uint64_t>(r.slice) >= t.units.size())) continue;
      place(op.id, id, t.sliced ? r.slice : -1);
    }
  const int nextn = FirstNextnLayer(m.metadata());
  for (size_t i = 0; i < ix->tensors_.size(); ++i)
    for (size_t s = 0; s < ix->tensors_[i].units.size(); ++s)
      if (!IsNextnTensor(ix->tensors_[i].info.name, nextn))
        place("misc", static_cast<TensorId>(i), ix->tensors_[i].sliced ? static_cast<int>(s) : -1);

  // Checksums (the file has none): from the record, or taken once now.
  std::vector<GgufChecksumRange> sums;
  for (const StoreTensor& t : ix->tensors_)
    for (const StoreUnit& u : t.units)
      sums.push_back({u.tier[0].file, u.tier[0].offset, u.tier[0].bytes, 0});
  for (const GgufChecksumRange& g : sums) {
    const RandomAccessFile& f = *ix->files_[g.file];
    if (g.offset > f.size() || g.bytes > f.size() - g.offset)
      return Corruption("'" + f.path() + "': a tensor's range [" + std::to_string(g.offset) +
                        ", +" + std::to_string(g.bytes) + ") is past the end of the file (size " +
                        std::to_string(f.size()) + "): truncated");
  }
  if (!options.checksums) {
    RETURN_IF_ERROR(ix->LayOutSpans());
    return ix;
  }
  std::vector<const RandomAccessFile*> files;
  for (const auto& f : ix->files_) files.push_back(f.get());
  ASSIGN_OR_RETURN(GgufChecksumResult res,
                   LoadOrComputeGgufChecksums(m, files, &sums, options.env));
  if (res.computed)
    LOG_INFO("%s: checksums taken in %.1f s, kept in %s", path.c_str(), res.seconds,
             res.record.empty() ? "(nowhere)" : res.record.c_str());
  size_t i = 0;
  for (StoreTensor& t : ix->tensors_)
    for (StoreUnit& u : t.units) u.tier[0].crc = sums[i++].crc;
  ix->checksum_record_ = res.record;
  RETURN_IF_ERROR(ix->LayOutSpans());
  return ix;
}

}  // namespace substrate
