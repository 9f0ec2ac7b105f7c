#include "store/store_weight_source.h"

#include <algorithm>

namespace substrate {

Expected<std::unique_ptr<StoreWeightSource>> StoreWeightSource::Open(const std::string& dir,
                                                                     MemoryLedger* ledger,
                                                                     const StoreOptions& options) {
  auto src = std::unique_ptr<StoreWeightSource>(new StoreWeightSource());
  src->options_ = options;
  src->ledger_ = ledger;
  StoreIndexOptions io;
  io.max_tier = options.max_tier;
  ASSIGN_OR_RETURN(src->index_, StoreIndex::Open(dir, io));
  const auto& tensors = src->index_->tensors();
  src->data_.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    src->data_[i].resize(tensors[i].units.size());
    if (options.streaming) continue;
    for (size_t s = 0; s < tensors[i].units.size(); ++s) {
      const StoreUnit& u = tensors[i].units[s];
      for (int k = 0; k < std::min(u.n_tiers, options.max_tier + 1); ++k)
        RETURN_IF_ERROR(src->LoadRange(u.tier[k], src->data_[i][s].tier[k], "weights"));
    }
  }
  return src;
}

Status StoreWeightSource::LoadRange(const StoreRange& r, AlignedBuffer& dst, const char* account) {
  auto buf = AlignedBuffer::Allocate(r.bytes ? r.bytes : 1, ledger_, account, 64);
  if (!buf.ok()) return buf.status().WithContext("loading " + r.what);
  RETURN_IF_ERROR(index_->ReadVerified(r, buf->data()));
  dst = std::move(buf).value();
  loaded_bytes_ += r.bytes;
  return Status::Ok();
}

void StoreWeightSource::EndOp(const std::string& op_id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (AlignedBuffer* b : streamed_) *b = AlignedBuffer();
  streamed_.clear();
}

Expected<WeightHandle> StoreWeightSource::Acquire(TensorId id, int slice, int tier) {
  uint64_t offset_el = 0;
  ASSIGN_OR_RETURN(const StoreUnit* u, index_->FindUnit(id, slice, &offset_el));
  const StoreTensor& t = index_->tensors()[id];
  UnitData& d = data_[id][t.sliced ? slice : 0];
  const int loaded = std::min(u->n_tiers, options_.max_tier + 1);
  const int use = std::min(tier < 0 ? options_.serve_tier : tier, loaded - 1);
  if (options_.streaming) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int k = 0; k <= use; ++k) {
      if (d.tier[k].data()) continue;
      RETURN_IF_ERROR(LoadRange(u->tier[k], d.tier[k], "stream"));
      streamed_.push_back(&d.tier[k]);
    }
  }
  const uint8_t* ptr[3] = {d.tier[0].data(), d.tier[1].data(), d.tier[2].data()};
  return WeightHandle(this, index_->MakeView(id, slice, *u, offset_el, use, ptr), 0);
}

}  // namespace substrate
