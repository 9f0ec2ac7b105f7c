#include "compiler/size_plan.h"

#include <algorithm>
#include <cstdio>
#include <queue>

#include <nlohmann/json.hpp>

#include "compiler/json_read.h"
#include "quant/quantize_model.h"

namespace substrate::compiler {
namespace {

using nlohmann::json;
constexpr const char* kSchema = "substrate.file_plan";
constexpr double kGrowTolerance = 0.01;

std::string G(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

// The mix as "kind: TYPE a-b, TYPE c" groups, kinds in the order they first appear.
std::vector<std::pair<std::string, std::string>> MixGroups(
    const std::vector<std::pair<std::string, DType>>& ordered) {
  std::vector<std::string> kinds;
  std::map<std::string, std::vector<std::pair<int, DType>>> by_kind;
  for (const auto& [name, type] : ordered) {
    auto [kind, layer] = TensorKindAndLayer(name);
    if (!by_kind.count(kind)) kinds.push_back(kind);
    by_kind[kind].emplace_back(layer, type);
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& k : kinds) {
    auto& v = by_kind[k];
    std::stable_sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.first < b.first; });
    std::string s;
    for (size_t i = 0; i < v.size();) {
      size_t j = i;
      while (j + 1 < v.size() && v[j + 1].second == v[i].second && v[j + 1].first == v[j].first + 1) ++j;
      if (!s.empty()) s += ", ";
      s += DTypeName(v[i].second);
      if (v[i].first >= 0) {
        s += ' ';
        s += std::to_string(v[i].first);
        if (j > i) {
          s += '-';
          s += std::to_string(v[j].first);
        }
      }
      i = j + 1;
    }
    out.emplace_back(k, s);
  }
  return out;
}

std::vector<std::pair<std::string, DType>> Ordered(const ModelProfile& p, const std::vector<DType>& type_of) {
  std::vector<std::pair<std::string, DType>> out;
  for (size_t i = 0; i < p.tensors.size(); ++i) out.emplace_back(p.tensors[i].name, type_of[i]);
  return out;
}

std::string Summary(const ModelProfile& p, const std::vector<DType>& type_of, double additive) {
  return MixSummary(Ordered(p, type_of), p.FittedKld(additive));
}

uint64_t FileBytes(const ModelProfile& p, uint64_t data_bytes, const std::string& summary) {
  const uint64_t al = p.file.alignment;
  const uint64_t header = p.file.header_bytes + StringMetadataEntryBytes(kPlanSummaryKey, summary);
  return AlignedTensorBytes(header, al) + p.file.fixed_bytes + data_bytes;
}

struct Candidate {
  double ratio;
  size_t unit;
  int target;
  uint64_t version;
  bool operator<(const Candidate& o) const {
    return ratio != o.ratio ? ratio < o.ratio : unit > o.unit;  // ties: earlier tensor first
  }
};

// The planner's state: a type index per tensor, with its padded data bytes and loss. While
// searching, the summary key is counted at an upper bound of its length (checks in O(1)); the
// last step counts the real summary and fills what the bound held back.
class SizeSearch {
 public:
  SizeSearch(const ModelProfile& p, uint64_t target) : p_(p), target_(target), n_(p.tensors.size()) {
    choice_.assign(n_, 0);
    type_of_.resize(n_);
    for (size_t u = 0; u < n_; ++u) {
      data_ += Bytes(u, 0);
      loss_ += Loss(u, 0);
      type_of_[u] = p_.tensors[u].options[0].type;
    }
  }
  uint64_t Bytes(size_t u, int c) const {
    return AlignedTensorBytes(p_.tensors[u].options[c].bytes, p_.file.alignment);
  }
  double Loss(size_t u, int c) const { return p_.tensors[u].options[c].quality_loss; }
  int Last(size_t u) const { return static_cast<int>(p_.tensors[u].options.size()) - 1; }
  void Set(size_t u, int c) {
    data_ = data_ - Bytes(u, choice_[u]) + Bytes(u, c);
    loss_ += Loss(u, c) - Loss(u, choice_[u]);
    choice_[u] = c;
    type_of_[u] = p_.tensors[u].options[c].type;
  }
  void SetAll(const std::vector<int>& c) {
    for (size_t u = 0; u < n_; ++u) Set(u, c[u]);
    Recompute();
  }
  void Recompute() {  // the running loss, from scratch (no drift)
    loss_ = 0;
    for (size_t u = 0; u < n_; ++u) loss_ += Loss(u, choice_[u]);
  }
  double TotalLoss() const { return loss_; }
  std::string Summary() const { return compiler::Summary(p_, type_of_, loss_); }
  // 0: count the real summary; else count a summary of this many bytes.
  void CountSummaryAs(uint64_t bytes) { summary_bound_ = bytes; }
  uint64_t SummaryBound() const {
    // Every tensor its own run ("; kind: TYPE_XX 12345-12345"), the longest loss text.
    uint64_t b = 32;
    for (const TensorProfile& t : p_.tensors) b += t.kind.size() + 24;
    return b;
  }
  uint64_t Exact() const {
    if (summary_bound_ == 0) return FileBytes(p_, data_, Summary());
    const uint64_t header = p_.file.header_bytes + 8 + std::string(kPlanSummaryKey).size() + 12 + summary_bound_;
    return AlignedTensorBytes(header, p_.file.alignment) + p_.file.fixed_bytes + data_;
  }
  bool Fits() const { return Exact() <= target_; }
  const std::vector<int>& choice() const { return choice_; }
  const std::vector<DType>& types() const { return type_of_; }
  uint64_t data() const { return data_; }

  // Greedy rate-distortion fill: the upgrade with the most loss removed per byte that fits; a
  // jump that does not fit is retried one type lower. `curve` gets (bytes, loss) per step.
  void Fill(std::vector<std::pair<uint64_t, double>>* curve) {
    std::vector<int> max_index(n_);
    std::vector<uint64_t> version(n_, 0);
    std::priority_queue<Candidate> heap;
    auto push_best = [&](size_t u) {
      double best = -1;
      int best_target = -1;
      for (int t = choice_[u] + 1; t <= max_index[u]; ++t) {
        const double gain = Loss(u, choice_[u]) - Loss(u, t);
        const double cost = static_cast<double>(Bytes(u, t) - Bytes(u, choice_[u]));
        const double ratio = gain / std::max(cost, 1.0);
        if (ratio > best) best = ratio, best_target = t;
      }
      if (best_target >= 0) heap.push({best, u, best_target, ++version[u]});
    };
    for (size_t u = 0; u < n_; ++u) {
      max_index[u] = Last(u);
      push_best(u);
    }
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      if (c.version != version[c.unit]) continue;  // superseded
      const size_t u = c.unit;
      const int from = choice_[u];
      Set(u, c.target);
      const uint64_t size = Exact();
      if (size > target_) {
        // Files only grow along the path, so this jump never fits again; a smaller one may.
        Set(u, from);
        max_index[u] = c.target - 1;
      } else if (curve) {
        curve->emplace_back(size, loss_);
      }
      push_best(u);
    }
    Recompute();
  }

  // Moves tensors other than `u` down one type at a time, the least loss added per byte freed
  // first, until the file fits; false when nothing is left to move down.
  bool MakeRoom(size_t u) {
    while (!Fits()) {
      double best = 0;
      size_t pick = n_;
      for (size_t v = 0; v < n_; ++v) {
        if (v == u || choice_[v] == 0) continue;
        const double cost = Loss(v, choice_[v] - 1) - Loss(v, choice_[v]);
        const double freed = static_cast<double>(Bytes(v, choice_[v]) - Bytes(v, choice_[v] - 1));
        const double r = cost / std::max(freed, 1.0);
        if (pick == n_ || r < best) best = r, pick = v;
      }
      if (pick == n_) return false;
      Set(pick, choice_[pick] - 1);
    }
    return true;
  }

  // Exchanges the greedy cannot make: a tensor moves up by a jump larger than the room left,
  // paid for by moving others down, then the room refilled; kept when the loss falls.
  bool Exchange() {
    bool changed = false;
    for (size_t u = 0; u < n_; ++u) {
      for (int t = Last(u); t > choice_[u]; --t) {
        const std::vector<int> saved = choice_;
        const double before = loss_;
        Set(u, t);
        if (MakeRoom(u)) Fill(nullptr);
        if (Fits() && loss_ < before - 1e-12 * std::max(before, 1e-30)) {
          changed = true;
          break;
        }
        SetAll(saved);
      }
    }
    return changed;
  }

  // When the least-loss plan stops short of `floor` (its next steps are all too big for the
  // room left), the move into [floor, target] that costs the least loss: a tensor up, others
  // down as little as needed, the room refilled. Returns whether it found one.
  bool Grow(uint64_t floor, double max_loss) {
    if (Exact() >= floor) return false;
    const std::vector<int> saved = choice_;
    double best_loss = max_loss;
    std::vector<int> best;
    for (size_t u = 0; u < n_; ++u) {
      for (int t = choice_[u] + 1; t <= Last(u); ++t) {
        Set(u, t);
        if (MakeRoom(u)) Fill(nullptr);
        const uint64_t size = Exact();
        if (size <= target_ && size >= floor && loss_ <= best_loss) best_loss = loss_, best = choice_;
        SetAll(saved);
      }
    }
    if (best.empty()) return false;
    SetAll(best);
    return true;
  }

  // Last resort below `floor`: one tensor up and another down (any number of types each), the
  // pair that lands in [floor, target] at the least loss.
  bool PairMove(uint64_t floor, double max_loss) {
    const uint64_t size = Exact();
    if (size >= floor) return false;
    double best_loss = max_loss;
    size_t ba = n_, bb = n_;
    int ta = 0, tb = 0;
    for (size_t a = 0; a < n_; ++a) {
      for (int x = choice_[a] + 1; x <= Last(a); ++x) {
        const uint64_t up = Bytes(a, x) - Bytes(a, choice_[a]);
        const double gain = Loss(a, choice_[a]) - Loss(a, x);
        for (size_t b = 0; b < n_; ++b) {
          if (b == a) continue;
          for (int y = choice_[b] - 1; y >= 0; --y) {
            const uint64_t down = Bytes(b, choice_[b]) - Bytes(b, y);
            if (up <= down) break;  // further down only frees more
            const uint64_t next = size + up - down;  // exact up to the summary's length
            if (next > target_) continue;
            if (next < floor) break;
            const double l = loss_ - gain + (Loss(b, y) - Loss(b, choice_[b]));
            if (l <= best_loss) best_loss = l, ba = a, bb = b, ta = x, tb = y;
          }
        }
      }
    }
    if (ba == n_) return false;
    Set(ba, ta);
    Set(bb, tb);
    Recompute();
    return true;
  }

 private:
  const ModelProfile& p_;
  uint64_t target_;
  size_t n_;
  std::vector<int> choice_;
  std::vector<DType> type_of_;
  uint64_t data_ = 0;
  double loss_ = 0;
  uint64_t summary_bound_ = 0;
};

}  // namespace

Expected<FilePlan> PlanFileSize(const ModelProfile& p, uint64_t target) {
  if (p.tensors.empty())
    return InvalidArgument("file-size plans need a per-tensor profile (made by `substrate quantize "
                           "--size` or `substrate calibrate --estimate`); '" + p.model_id +
                           "' has per-op losses only");
  if (p.file.alignment == 0)
    return InvalidArgument("profile '" + p.model_id + "' does not record the file layout");
  const size_t n = p.tensors.size();
  SizeSearch top(p, target);
  for (size_t u = 0; u < n; ++u) top.Set(u, top.Last(u));
  top.Recompute();
  SizeSearch s(p, target);
  FilePlan plan;
  plan.model_id = p.model_id;
  plan.target_file_bytes = target;
  plan.min_file_bytes = s.Exact();
  plan.max_file_bytes = top.Exact();
  if (plan.min_file_bytes > target)
    return InvalidArgument("target of " + std::to_string(target) + " bytes is below the smallest file "
                           "the candidate types allow: " + std::to_string(plan.min_file_bytes) +
                           " bytes (every tensor at its cheapest type)");
  std::vector<std::pair<uint64_t, double>> curve = {{plan.min_file_bytes, s.TotalLoss()}};
  s.CountSummaryAs(s.SummaryBound());
  if (s.Fits()) {
    s.Fill(&curve);
    for (int round = 0; round < 8 && s.Exchange(); ++round) {
    }
    // The least-loss plan may stop short of the target by more than the next steps of the
    // tensors left (near the top, where most tensors are at their most precise type). A file of
    // the asked size is the point, so move into the last 0.05 % when that costs at most 1 % of
    // the predicted loss; otherwise the better plan stays, short of the target.
    const uint64_t floor = target - target / 2000;
    const double max_loss = s.TotalLoss() * (1 + kGrowTolerance);
    s.Grow(floor, max_loss);
    for (int round = 0; round < 4 && s.PairMove(floor, max_loss); ++round) s.Fill(nullptr);
  }
  // The real summary (never longer than the bound): fill what the bound held back.
  s.CountSummaryAs(0);
  s.Fill(nullptr);
  for (size_t u = 0; u < n; ++u) plan.tensor_types[p.tensors[u].name] = s.types()[u];
  plan.additive_kld = s.TotalLoss();
  plan.predicted_kld = p.FittedKld(plan.additive_kld);
  plan.summary = s.Summary();
  plan.predicted_file_bytes = FileBytes(p, s.data(), plan.summary);
  for (auto& point : curve) point.second = p.FittedKld(point.second);
  curve.emplace_back(plan.predicted_file_bytes, plan.predicted_kld);
  std::sort(curve.begin(), curve.end());
  const size_t step = std::max<size_t>(1, curve.size() / 256);
  for (size_t i = 0; i < curve.size(); i += step) plan.curve.push_back(curve[i]);
  if (plan.curve.back() != curve.back()) plan.curve.push_back(curve.back());
  return plan;
}

FilePrediction PredictFile(const ModelProfile& p, const std::map<std::string, DType>& types,
                           const std::string& summary) {
  FilePrediction out;
  uint64_t data = 0;
  const uint64_t al = std::max<uint64_t>(1, p.file.alignment);
  for (const TensorProfile& t : p.tensors) {
    auto it = types.find(t.name);
    if (it == types.end()) {
      ++out.unmatched;
      data += AlignedTensorBytes(t.options.front().bytes, al);
      out.additive_kld += t.options.front().quality_loss;
      continue;
    }
    auto b = TensorBytesAt({ProfileTensor{t.name, -1, t.ne}}, it->second);
    data += AlignedTensorBytes(b.value_or(0), al);
    // The calibrated option of that type; else (dominated, or no candidate) the most precise
    // option no larger, which is at least as good.
    const PrecisionOption* best = nullptr;
    for (const PrecisionOption& o : t.options) {
      if (o.type == it->second) {
        best = &o;
        break;
      }
      if (b && o.bytes <= *b && (!best || o.bytes > best->bytes)) best = &o;
    }
    if (!best || best->type != it->second) ++out.unmatched;
    out.additive_kld += best ? best->quality_loss : t.options.front().quality_loss;
  }
  out.kld = p.FittedKld(out.additive_kld);
  out.file_bytes = p.file.alignment ? FileBytes(p, data, summary) : data;
  return out;
}

std::vector<std::string> MixLines(const std::vector<std::pair<std::string, DType>>& ordered) {
  std::vector<std::string> out;
  for (const auto& [kind, mix] : MixGroups(ordered)) {
    char b[64];
    std::snprintf(b, sizeof b, "%-16s ", kind.c_str());
    out.push_back(b + mix);
  }
  return out;
}

std::string MixSummary(const std::vector<std::pair<std::string, DType>>& ordered, double kld) {
  std::string s = kld >= 0 ? "predicted_kld=" + G(kld) : std::string("predicted_kld=unknown");
  for (const auto& [kind, mix] : MixGroups(ordered)) s += "; " + kind + ": " + mix;
  return s;
}

std::string FilePlanToJson(const FilePlan& plan) {
  json types = json::object();
  for (const auto& [name, t] : plan.tensor_types) types[name] = DTypeName(t);
  json curve = json::array();
  for (const auto& [b, k] : plan.curve) curve.push_back({b, k});
  json j = {{"schema", kSchema},
            {"version", 1},
            {"model_id", plan.model_id},
            {"target_file_bytes", plan.target_file_bytes},
            {"predicted_file_bytes", plan.predicted_file_bytes},
            {"min_file_bytes", plan.min_file_bytes},
            {"max_file_bytes", plan.max_file_bytes},
            {"predicted_kld", plan.predicted_kld},
            {"additive_kld", plan.additive_kld},
            {"summary", plan.summary},
            {"curve", std::move(curve)},
            {"tensor_types", std::move(types)}};
  return j.dump(1, ' ', false, json::error_handler_t::replace) + "\n";
}

Expected<FilePlan> FilePlanFromJson(const std::string& text) {
  using namespace jsonr;
  const std::string doc = "file plan";
  ASSIGN_OR_RETURN(json j, Parse(doc, text));
  try {
    FilePlan p;
    ASSIGN_OR_RETURN(std::string schema, Str(doc, j, "$", "schema"));
    if (schema != kSchema) return Corruption("file plan: schema is '" + schema + "', expected '" + kSchema + "'");
    ASSIGN_OR_RETURN(p.model_id, Str(doc, j, "$", "model_id"));
    ASSIGN_OR_RETURN(p.target_file_bytes, U64(doc, j, "$", "target_file_bytes"));
    ASSIGN_OR_RETURN(p.predicted_file_bytes, U64(doc, j, "$", "predicted_file_bytes"));
    ASSIGN_OR_RETURN(p.min_file_bytes, U64(doc, j, "$", "min_file_bytes"));
    ASSIGN_OR_RETURN(p.max_file_bytes, U64(doc, j, "$", "max_file_bytes"));
    ASSIGN_OR_RETURN(p.predicted_kld, F64(doc, j, "$", "predicted_kld"));
    ASSIGN_OR_RETURN(p.summary, Str(doc, j, "$", "summary"));
    ASSIGN_OR_RETURN(const json* types, Field(doc, j, "$", "tensor_types"));
    if (!types->is_object()) return Corruption("file plan: tensor_types is not an object");
    for (auto it = types->begin(); it != types->end(); ++it) {
      if (!it.value().is_string()) return Corruption("file plan: type of '" + it.key() + "' is not a string");
      auto t = DTypeFromName(it.value().get<std::string>());
      if (!t) return Corruption("file plan: unknown type of '" + it.key() + "'");
      p.tensor_types[it.key()] = *t;
    }
    if (j.contains("curve") && j["curve"].is_array())
      for (const json& c : j["curve"])
        if (c.is_array() && c.size() == 2 && c[0].is_number_unsigned() && c[1].is_number())
          p.curve.emplace_back(c[0].get<uint64_t>(), c[1].get<double>());
    return p;
  } catch (const json::exception& e) {
    return Corruption(std::string("file plan: malformed field: ") + e.what());
  }
}

}  // namespace substrate::compiler
