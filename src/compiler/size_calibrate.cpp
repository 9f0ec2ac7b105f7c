#include "compiler/size_calibrate.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "compiler/calibrate.h"
#include "compiler/size_plan.h"
#include "compiler/tensor_loss.h"
#include "core/file_io.h"
#include "core/progress.h"
#include "quant/mix.h"
#include "quant/quant.h"
#include "quant/quantize_model.h"

namespace substrate::compiler {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Defaults that keep an 8B model within half an hour on two cores and give small models every
// measurement they can use.
// (A forward token of an 8B model costs ~16 GFLOP: about 0.15 s on two AVX-512 cores.)
struct Auto {
  int64_t n_ctx, stats_chunks, measure_chunks;
  int max_groups;
  int64_t sample_elements;  // per tensor for the error estimate
  bool fit_plans;
};
Auto Defaults(uint64_t n_params) {
  if (n_params < 200'000'000ull) return {512, 64, 4, 256, int64_t{1} << 24, true};
  return {256, 4, 1, 24, int64_t{1} << 21, false};
}

std::string TypesKey(const std::vector<DType>& types) {
  std::string s;
  for (DType t : types) s += std::string(s.empty() ? "" : ",") + DTypeName(t);
  return s;
}

// Groups for the sensitivity measurements: each tensor alone when they fit max_groups, else
// tensors of one kind over ranges of consecutive layers, the first and the last layer alone
// (on tiny-coder a tensor's loss per unit of error is up to 36 times larger in layer 0 than in
// layer 1, and the ends differ most).
std::vector<std::pair<std::string, std::vector<size_t>>> MakeGroups(
    const std::vector<TensorProfile>& tensors, int max_groups) {
  std::vector<std::pair<std::string, std::vector<size_t>>> out;
  if (static_cast<int>(tensors.size()) <= max_groups) {
    for (size_t i = 0; i < tensors.size(); ++i) out.push_back({tensors[i].name, {i}});
    return out;
  }
  std::vector<std::string> kinds;
  std::map<std::string, std::vector<size_t>> by_kind;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!by_kind.count(tensors[i].kind)) kinds.push_back(tensors[i].kind);
    by_kind[tensors[i].kind].push_back(i);
  }
  int block_kinds = 0;
  for (const auto& k : kinds) block_kinds += by_kind[k].size() > 1;
  const int other = static_cast<int>(kinds.size()) - block_kinds;
  const int per_kind = std::max(1, (max_groups - other) / std::max(1, block_kinds));
  for (const auto& k : kinds) {
    std::vector<size_t> idx = by_kind[k];
    std::stable_sort(idx.begin(), idx.end(),
                     [&](size_t a, size_t b) { return tensors[a].layer < tensors[b].layer; });
    const size_t n = idx.size();
    // Range boundaries over positions in idx.
    std::vector<size_t> cuts = {0};
    if (per_kind >= 3 && n >= 3) {
      const size_t mid = n - 2, parts = std::min<size_t>(static_cast<size_t>(per_kind) - 2, mid);
      for (size_t r = 0; r < parts; ++r) cuts.push_back(1 + mid * r / parts);
      cuts.push_back(n - 1);
    } else {
      const size_t parts = std::min<size_t>(static_cast<size_t>(per_kind), n);
      for (size_t r = 1; r < parts; ++r) cuts.push_back(n * r / parts);
    }
    cuts.push_back(n);
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      if (cuts[c] == cuts[c + 1]) continue;
      std::vector<size_t> g(idx.begin() + static_cast<std::ptrdiff_t>(cuts[c]),
                            idx.begin() + static_cast<std::ptrdiff_t>(cuts[c + 1]));
      std::string id = k;
      if (n > 1) {
        id += ' ';
        id += std::to_string(tensors[g.front()].layer);
        if (g.size() > 1) {
          id += '-';
          id += std::to_string(tensors[g.back()].layer);
        }
      }
      out.push_back({id, std::move(g)});
    }
  }
  return out;
}

// KL of a tensor at an activation-weighted error E: alpha * e0 * (E / e0)^beta, e0 its error
// at the first reference type (so beta bends the line through that measured point).
struct LossLaw {
  double alpha = 0, e0 = 0, beta = 1;
  double Loss(double e) const {
    if (!std::isfinite(e) || e <= 0) return 0;
    if (e0 <= 0 || beta == 1) return alpha * e;
    return alpha * e0 * std::pow(e / e0, beta);
  }
};

// The candidate types whose blocks fit a row of `cols`; for each that does not, the 32-element
// type llama.cpp falls back to (rows of 64, as tiny MoE experts have, fit no K-quant); F16
// when nothing fits.
std::vector<DType> CandidatesFor(const std::vector<DType>& types, uint64_t cols) {
  std::vector<DType> out;
  auto add = [&](DType t) {
    if (RowBytes(t, cols) && std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  };
  for (DType t : types) {
    if (RowBytes(t, cols)) {
      add(t);
      continue;
    }
    switch (t) {
      case DType::kQ2_K: case DType::kQ3_K: add(DType::kQ4_0); break;
      case DType::kIQ4_XS: add(DType::kIQ4_NL); break;
      case DType::kQ4_K: add(DType::kQ5_0); break;
      case DType::kQ5_K: add(DType::kQ5_1); break;
      case DType::kQ6_K: add(DType::kQ8_0); break;
      default: break;
    }
  }
  if (out.empty()) add(DType::kF16);
  return out;
}

// The reference type among a tensor's candidates, or its cheapest candidate.
const PrecisionOption& ReferenceOption(const TensorProfile& t, DType ref) {
  for (const PrecisionOption& p : t.options)
    if (p.type == ref) return p;
  return t.options.front();
}

}  // namespace

std::vector<std::string> PlannedTensors(const ModelFile& file) {
  std::vector<std::string> out;
  for (const TensorInfo& t : file.tensors())
    if (TensorAllowsQuantization({t.name, t.ne, t.type}) && CanDequantize(t.type)) out.push_back(t.name);
  return out;
}

Expected<FileLayout> FileLayoutOf(const ModelFile& file, const std::vector<std::string>& planned) {
  QuantizeOptions o;
  o.copy_unlisted = true;
  std::map<std::string, DType> keep;
  for (const std::string& n : planned) {
    const TensorInfo* t = file.Find(n);
    if (!t) return NotFound("model has no tensor '" + n + "'");
    keep[n] = t->type;
  }
  o.overrides = &keep;
  ASSIGN_OR_RETURN(QuantizedLayout l, LayoutQuantizedFile(file, o));
  FileLayout f;
  f.alignment = l.alignment;
  f.header_bytes = l.header_bytes;
  std::set<std::string> p(planned.begin(), planned.end());
  for (const TensorInfo& t : l.tensors) {
    if (!p.count(t.name)) f.fixed_bytes += AlignedTensorBytes(t.bytes, l.alignment);
  }
  for (const TensorInfo& t : file.tensors()) f.n_parameters += t.n_elements();
  return f;
}

Expected<EstimateResult> EstimateProfile(const EstimateOptions& o) {
  std::vector<DType> types = o.types;
  if (types.empty())
    types = {DType::kQ2_K, DType::kQ3_K, DType::kIQ4_XS, DType::kQ4_K,
             DType::kQ5_K, DType::kQ6_K, DType::kQ8_0};
  std::vector<DType> refs = o.reference_types;
  if (refs.empty()) refs = {DType::kQ3_K};
  for (DType t : types)
    if (!CanQuantize(t)) return InvalidArgument(std::string("cannot quantize to ") + DTypeName(t));

  uint64_t n_params = 0;
  {
    ASSIGN_OR_RETURN(auto header, ModelFile::Open(o.model_path));  // headers only: the size
    for (const TensorInfo& t : header->tensors()) n_params += t.n_elements();
  }
  const Auto def = Defaults(n_params);
  const int64_t n_ctx = o.n_ctx > 0 ? o.n_ctx : def.n_ctx;
  ASSIGN_OR_RETURN(auto runner, CalibrationRunner::Open(o.model_path, o.text_path, n_ctx, o.threads));
  const ModelFile& file = runner->file();
  const std::vector<std::string> planned = PlannedTensors(file);
  EstimateResult res;
  ASSIGN_OR_RETURN(res.profile.file, FileLayoutOf(file, planned));
  const int64_t available = runner->n_chunks_available();
  if (available < 1)
    return InvalidArgument("calibration text '" + o.text_path + "' is shorter than one chunk of " +
                           std::to_string(n_ctx) + " tokens");
  const int64_t stats_chunks = std::min(available, o.stats_chunks > 0 ? o.stats_chunks : def.stats_chunks);
  const int64_t measure_chunks = std::min(available, o.measure_chunks > 0 ? o.measure_chunks : def.measure_chunks);
  const int max_groups = o.max_groups > 0 ? o.max_groups : def.max_groups;

  struct stat st {};
  const uint64_t text_bytes = ::stat(o.text_path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  json settings = {{"model", o.model_path}, {"text", o.text_path},
                   {"text_bytes", text_bytes}, {"n_ctx", n_ctx},
                   {"stats_chunks", stats_chunks}, {"measure_chunks", measure_chunks},
                   {"max_groups", max_groups}, {"types", TypesKey(types)},
                   {"reference_types", TypesKey(refs)}, {"importance", o.importance}};
  const std::string partial_path = o.cache_prefix.empty() ? "" : o.cache_prefix + ".partial.json";
  const std::string stats_path = o.cache_prefix.empty() ? "" : o.cache_prefix + ".imatrix.gguf";
  json cache = {{"settings", settings}, {"errors", json::object()}, {"kl", json::object()}};
  if (!partial_path.empty() && FileExists(partial_path)) {
    auto text = ReadFileToString(partial_path, 1ull << 30);
    try {
      json j = text.ok() ? json::parse(*text) : json();
      if (j.is_object() && j.value("settings", json()) == settings) cache = j;
      else std::fprintf(stderr, "calibrate: %s is for other settings; starting over\n", partial_path.c_str());
    } catch (const json::exception&) {
      std::fprintf(stderr, "calibrate: %s is unreadable; starting over\n", partial_path.c_str());
    }
  }
  auto save = [&]() -> Status {
    return partial_path.empty() ? Status::Ok() : WriteFileAtomic(partial_path, cache.dump(1));
  };

  // 1. Statistics.
  auto t0 = Clock::now();
  bool have_stats = false;
  if (!stats_path.empty() && FileExists(stats_path) && cache.value("stats_done", false)) {
    auto s = LoadActivationStats(stats_path);
    if (s.ok()) res.stats = std::move(*s), have_stats = true;
  }
  if (!have_stats) {
    if (o.progress) std::fprintf(stderr, "calibrate: activation statistics over %lld chunks of %lld tokens\n",
                                 static_cast<long long>(stats_chunks), static_cast<long long>(n_ctx));
    ASSIGN_OR_RETURN(res.stats, runner->CollectActivationStats(0, stats_chunks));
    res.stats.text = o.text_path;
    if (!stats_path.empty()) {
      RETURN_IF_ERROR(SaveActivationStats(res.stats, stats_path));
      cache["stats_done"] = true;
      RETURN_IF_ERROR(save());
    }
  }
  res.seconds_stats = Since(t0);
  const ImportanceSource* importance = o.importance ? &res.stats : nullptr;

  // 2. Errors per tensor and type.
  t0 = Clock::now();
  std::vector<TensorProfile> tensors;
  std::map<std::string, std::vector<std::vector<double>>> slice_errors;  // name -> [slice][type]
  {
    std::optional<ProgressBar> bar;
    if (o.progress) bar.emplace("estimate", planned.size());
    size_t done = 0;
    for (const std::string& name : planned) {
      ASSIGN_OR_RETURN(CalibrationRunner::BaseTensor base, runner->Base(name));
      TensorProfile t;
      t.name = name;
      std::tie(t.kind, t.layer) = TensorKindAndLayer(name);
      t.ne = base.info->ne;
      const std::vector<DType> cand = CandidatesFor(types, t.ne[0]);
      json& e = cache["errors"][name];
      if (!e.is_object() || e.value("types", "") != TypesKey(cand)) {
        TensorErrorRequest req;
        req.name = name;
        req.type = base.info->type;
        req.ne = t.ne;
        req.data = base.handle->data;
        req.types = cand;
        req.stats = &res.stats;
        req.importance = o.importance;
        const int64_t slices = t.ne.size() == 3 ? static_cast<int64_t>(t.ne[2]) : 1;
        req.max_rows = std::max<int64_t>(8, def.sample_elements / static_cast<int64_t>(t.ne[0]) / slices);
        ASSIGN_OR_RETURN(TensorErrors te, ActivationWeightedErrors(req, runner->pool()));
        e = {{"types", TypesKey(cand)}, {"error", te.error}, {"slice_error", te.slice_error}};
        RETURN_IF_ERROR(save());
      }
      for (size_t k = 0; k < cand.size(); ++k) {
        PrecisionOption opt;
        opt.type = cand[k];
        opt.act_error = e["error"][k].get<double>();
        t.options.push_back(opt);
      }
      slice_errors[name] = e["slice_error"].get<std::vector<std::vector<double>>>();
      tensors.push_back(std::move(t));
      if (bar) bar->Update(++done, name);
    }
    if (bar) bar->Finish();
  }
  res.seconds_errors = Since(t0);

  // 3. Sensitivity: per group, KL per unit of error at the first reference type; with a second
  // reference, the exponent of KL ~ error^beta between them (a tensor's KL grows a little slower
  // than its error towards the precise types).
  t0 = Clock::now();
  const auto groups = MakeGroups(tensors, max_groups);
  std::vector<LossLaw> law(tensors.size());
  {
    std::optional<ProgressBar> bar;
    if (o.progress) bar.emplace("sensitivity", groups.size() * refs.size());
    size_t done = 0;
    for (const auto& [gid, idx] : groups) {
      std::vector<std::pair<double, double>> points;  // (group error, measured KL) per reference
      for (DType ref : refs) {
        std::map<std::string, DType> assign;
        double err = 0;
        for (size_t i : idx) {
          const PrecisionOption& pick = ReferenceOption(tensors[i], ref);
          assign[tensors[i].name] = pick.type;
          if (std::isfinite(pick.act_error)) err += pick.act_error;
        }
        const std::string key = gid + "|" + DTypeName(ref);
        json& m = cache["kl"][key];
        if (!m.is_object()) {
          ASSIGN_OR_RETURN(KlMeasurement kl, runner->Measure(assign, 0, measure_chunks, importance));
          m = {{"kld", kl.mean_kld}, {"kld_err", kl.kld_err}};
          RETURN_IF_ERROR(save());
        }
        EstimateResult::Group g;
        g.id = gid;
        g.type = ref;
        g.measured_kld = m["kld"].get<double>();
        g.kld_err = m["kld_err"].get<double>();
        g.error = err;
        g.alpha = err > 0 ? g.measured_kld / err : 0;
        for (size_t i : idx) g.tensors.push_back(tensors[i].name);
        points.emplace_back(err, g.measured_kld);
        res.groups.push_back(std::move(g));
        if (bar) bar->Update(++done, key);
      }
      double beta = 1;
      if (points.size() >= 2 && points[0].first > 0 && points[1].first > 0 && points[0].second > 0 &&
          points[1].second > 0 && std::fabs(std::log(points[1].first / points[0].first)) > 1e-3)
        beta = std::clamp(std::log(points[1].second / points[0].second) /
                              std::log(points[1].first / points[0].first), 0.5, 1.5);
      for (size_t i : idx) {
        law[i].alpha = points[0].first > 0 ? points[0].second / points[0].first : 0;
        law[i].e0 = ReferenceOption(tensors[i], refs[0]).act_error;
        law[i].beta = beta;
      }
    }
    if (bar) bar->Finish();
  }
  res.seconds_measure = Since(t0);

  // 4. Losses.
  ModelProfile& p = res.profile;
  ASSIGN_OR_RETURN(ModelProfile ops, runner->SkeletonProfile(types));
  p.model_id = ops.model_id;
  p.overhead_bytes = ops.overhead_bytes;
  p.estimate = "activation_weighted";
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < tensors.size(); ++i) {
    for (PrecisionOption& opt : tensors[i].options) opt.quality_loss = law[i].Loss(opt.act_error);
    index[tensors[i].name] = i;
  }
  for (OpProfile& op : ops.ops) {
    for (PrecisionOption& opt : op.options) {
      double loss = 0;
      for (const ProfileTensor& pt : op.tensors) {
        auto it = index.find(pt.name);
        if (it == index.end()) continue;  // not planned (a router): no loss
        const TensorProfile& t = tensors[it->second];
        for (size_t k = 0; k < t.options.size(); ++k) {
          if (t.options[k].type != opt.type) continue;
          const auto& se = slice_errors[pt.name];
          const double e = pt.slice >= 0 && static_cast<size_t>(pt.slice) < se.size()
                               ? se[static_cast<size_t>(pt.slice)][k]
                               : t.options[k].act_error;
          // The tensor's loss at this type, shared among its slices by their errors.
          const double whole = t.options[k].act_error;
          if (std::isfinite(e) && whole > 0) loss += t.options[k].quality_loss * e / whole;
        }
      }
      opt.quality_loss = loss;
    }
  }
  p.ops = std::move(ops.ops);
  p.tensors = std::move(tensors);
  RETURN_IF_ERROR(p.Normalize());

  // 5. Whole plans: the KL of plans at two sizes against the sum of their tensors' losses
  // (losses compound, so the sum runs low); KL = scale * sum^power through both points.
  if (o.fit_plans > 0 || (o.fit_plans < 0 && def.fit_plans)) {
    t0 = Clock::now();
    ASSIGN_OR_RETURN(FilePlan range, PlanFileSize(p, UINT64_MAX));
    std::vector<std::pair<double, double>> pts;  // (sum of losses, measured KL)
    for (double f : {0.25, 0.5}) {
      const uint64_t target = range.min_file_bytes +
                              static_cast<uint64_t>(f * static_cast<double>(range.max_file_bytes - range.min_file_bytes));
      ASSIGN_OR_RETURN(FilePlan plan, PlanFileSize(p, target));
      json& m = cache["fit"][std::to_string(target)];
      if (!m.is_object()) {
        ASSIGN_OR_RETURN(KlMeasurement kl, runner->Measure(plan.tensor_types, 0, measure_chunks, importance));
        m = {{"kld", kl.mean_kld}, {"additive", plan.additive_kld}};
        RETURN_IF_ERROR(save());
      }
      pts.emplace_back(plan.additive_kld, m["kld"].get<double>());
    }
    if (pts[0].first > 0 && pts[1].first > 0 && pts[0].second > 0 && pts[1].second > 0 &&
        std::fabs(std::log(pts[1].first / pts[0].first)) > 1e-3) {
      p.kld_fit.power = std::clamp(std::log(pts[1].second / pts[0].second) / std::log(pts[1].first / pts[0].first),
                                   0.8, 1.25);
      p.kld_fit.scale = pts[0].second / std::pow(pts[0].first, p.kld_fit.power);
    }
    res.seconds_measure += Since(t0);
  }
  return res;
}

}  // namespace substrate::compiler
