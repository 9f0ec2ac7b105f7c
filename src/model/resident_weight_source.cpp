#include "model/resident_weight_source.h"

#include <algorithm>

#include "model/hparams.h"

namespace substrate {

Expected<WeightView> MakeWeightView(const TensorInfo& info, const uint8_t* data, int slice) {
  WeightView v;
  v.type = info.type;
  v.cols = info.ne.empty() ? 1 : static_cast<int64_t>(info.ne[0]);
  int64_t rows = 1;
  for (size_t i = 1; i < info.ne.size(); ++i) rows *= static_cast<int64_t>(info.ne[i]);
  if (slice >= 0) {
    if (static_cast<uint64_t>(slice) >= info.outer() || info.ne.size() < 2) {
      return InvalidArgument("tensor '" + info.name + "': slice " + std::to_string(slice) +
                             " out of range (outer dimension " + std::to_string(info.outer()) +
                             ")");
    }
    rows /= static_cast<int64_t>(info.outer());
    v.data = data + info.slice_bytes() * static_cast<uint64_t>(slice);
    v.bytes = info.slice_bytes();
  } else {
    v.data = data;
    v.bytes = info.bytes;
  }
  v.rows = rows;
  return v;
}

Expected<std::unique_ptr<ResidentWeightSource>> ResidentWeightSource::Load(const ModelFile& file,
                                                                           MemoryLedger* ledger) {
  return Load(file, ledger, Options());
}

Expected<std::unique_ptr<ResidentWeightSource>> ResidentWeightSource::Load(
    const ModelFile& file, MemoryLedger* ledger, const Options& options) {
  auto src = std::make_unique<ResidentWeightSource>();
  const auto& tensors = file.tensors();
  src->infos_ = tensors;
  src->data_.reserve(tensors.size());
  src->layouts_.assign(tensors.size(), WeightLayout::kRows);
  // Tensors left out keep their index (an empty buffer) but no name: nothing resolves them.
  const int nextn = options.load_nextn ? -1 : FirstNextnLayer(file.metadata());
  std::vector<bool> loaded(tensors.size(), false);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = tensors[i];
    if (IsNextnTensor(t.name, nextn)) {
      src->data_.emplace_back();
      continue;
    }
    loaded[i] = true;
    // Whole pages of its own (AlignedBuffer pads to the alignment): a GPU backend may pin a
    // tensor's pages to read them in place, and must not pin a neighbour's with them (CUDA
    // refuses copies to or from memory that is partly pinned).
    auto buf = AlignedBuffer::Allocate(t.bytes ? t.bytes : 1, ledger, "weights");
    if (!buf.ok()) return buf.status().WithContext("loading tensor '" + t.name + "'");
    RETURN_IF_ERROR(file.ReadTensor(t, buf->data()));
    src->total_bytes_ += t.bytes;
    src->ids_[t.name] = static_cast<TensorId>(i);
    src->data_.push_back(std::move(buf).value());
  }
  if (options.backend) {
    // Handed over in the order a backend with less memory than the model (a GPU under
    // --max-vram) should keep them: the matrix every token's logits read whole, then what every
    // layer reads (per token, each byte of it), then routed experts (k of E per token), then an
    // embedding table that is only read by rows.
    const bool tied = !src->ids_.count("output.weight");
    auto rank = [&](const TensorInfo& t) {
      if (t.name == "output.weight" || (tied && t.name == "token_embd.weight")) return 0;
      if (t.name == "token_embd.weight") return 3;
      return t.ne.size() == 3 ? 2 : 1;
    };
    std::vector<size_t> order(tensors.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return rank(tensors[a]) < rank(tensors[b]); });
    for (size_t i : order) {
      if (!loaded[i]) continue;
      const TensorInfo& t = tensors[i];
      uint8_t* bytes = src->data_[i].data();
      if (t.ne.size() == 2 || t.ne.size() == 3) {
        // A matrix, or stacked experts: each expert's matrix is adopted on its own, so that a
        // slice is a whole matrix in the backend's layout (experts are most of a MoE's bytes
        // per token).
        const uint64_t n_matrices = t.ne.size() == 3 ? t.ne[2] : 1;
        for (uint64_t e = 0; e < n_matrices; ++e)
          src->layouts_[i] = options.backend->AdoptResidentWeight(
              t.type, static_cast<int64_t>(t.ne[1]), static_cast<int64_t>(t.ne[0]),
              bytes + e * (t.bytes / n_matrices));
      } else {
        options.backend->AdoptResidentBytes(bytes, t.bytes);
      }
    }
  }
  return src;
}

TensorId ResidentWeightSource::Resolve(const std::string& name) const {
  auto it = ids_.find(name);
  return it == ids_.end() ? kNoTensor : it->second;
}

Expected<WeightHandle> ResidentWeightSource::Acquire(TensorId id, int slice, int tier) {
  if (id < 0 || static_cast<size_t>(id) >= infos_.size())
    return InvalidArgument("weight source: no tensor with id " + std::to_string(id));
  if (slice >= 0 && layouts_[id] != WeightLayout::kRows && infos_[id].ne.size() != 3)
    return InvalidArgument("tensor '" + infos_[id].name +
                           "': rows of an interleaved matrix cannot be sliced");
  ASSIGN_OR_RETURN(WeightView v, MakeWeightView(infos_[id], data_[id].data(), slice));
  v.layout = layouts_[id];
  return WeightHandle(this, v, 0);
}

}  // namespace substrate
