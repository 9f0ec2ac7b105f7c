// CudaBackend's recorded launches: issuing them, replaying a repeated run as a CUDA graph,
// waiting, and the per-launch profile (cuda_backend_impl.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "backend/cuda/cuda_backend_impl.h"

namespace substrate::cuda {

// A launch's name in profiles: its kernel, and for products the type, path and tokens.
std::string LaunchName(const Rec& r) {
  static const std::pair<LaunchFn, const char*> kNames[] = {{&LaunchGemv, "gemv"},
                                                            {&LaunchQuantizeQ8, "quantize_q8"},
                                                            {&LaunchDequant, "dequant"},
                                                            {&LaunchToHalf, "to_half"},
                                                            {&LaunchScaleRows, "scale_rows"},
                                                            {&LaunchRmsNorm, "rms_norm"},
                                                            {&LaunchElementwise, "elementwise"},
                                                            {&LaunchCopyColumns, "copy_columns"},
                                                            {&LaunchRope, "rope"},
                                                            {&LaunchStoreKv, "store_kv"},
                                                            {&LaunchStoreMlaKv, "store_mla_kv"},
                                                            {&LaunchAttention, "attention"},
                                                            {&LaunchGather, "gather"},
                                                            {&LaunchScatterAdd, "scatter_add"},
                                                            {&LaunchGemm, "cublas_gemm"},
                                                            {&LaunchRouteTopK, "route_topk"},
                                                            {&LaunchMoeSort, "moe_sort"},
                                                            {&LaunchGemvTiles, "gemv_tiles"},
                                                            {&LaunchMoeCombine, "moe_combine"}};
  std::string name = "?";
  for (const auto& [fn, n] : kNames)
    if (fn == r.fn) name = n;
  if (r.fn == &LaunchGemv) {
    const auto* g = reinterpret_cast<const GemvParams*>(r.p);
    name += std::string(" ") + DTypeName(static_cast<DType>(g->type & ~kRepacked)) +
            (g->type & kRepacked ? " repacked" : "") + (g->fast ? " int8" : " float") + " nt" +
            std::to_string(g->nt) + " jobs" + std::to_string(g->n_jobs);
  } else if (r.fn == &LaunchElementwise) {
    static const char* kinds[] = {"add_bias", "fill", "add", "swiglu", "scale_sigmoid"};
    const auto* e = reinterpret_cast<const ElementwiseParams*>(r.p);
    name += std::string(" ") + kinds[e->kind] + (e->xq ? "+q8" : "");
  } else if (r.fn == &LaunchRmsNorm) {
    if (reinterpret_cast<const RmsNormParams*>(r.p)->xq) name += "+q8";
  } else if (r.fn == &LaunchAttention) {
    const auto* a = reinterpret_cast<const AttentionParams*>(r.p);
    name += a->n_tok <= 8 ? " decode" : " prefill";
  }
  return name;
}

// ---------------------------------------------------------------- flush and graphs

uint64_t CudaBackend::HashRecs(size_t copy_off, size_t copy_len) const {
  uint64_t h = 1469598103934665603ull ^ (copy_off * 31 + copy_len);
  auto mix = [&h](uint64_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  for (size_t i = 0; i < n_recs_; ++i) {
    const Rec& r = recs_[i];
    mix(reinterpret_cast<uintptr_t>(r.fn));
    mix(r.size);
    const uint64_t* w = reinterpret_cast<const uint64_t*>(r.p);
    for (size_t k = 0; k < r.size / 8; ++k) mix(w[k]);
  }
  return h;
}

void CudaBackend::DropGraphs() {
  for (auto& [h, g] : graphs_) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
  seen_.clear();
}

void CudaBackend::Issue(size_t copy_off, size_t copy_len) {
  if (copy_len > 0)
    CK(cudaMemcpyAsync(darena_ + copy_off, harena_ + copy_off, copy_len, cudaMemcpyHostToDevice,
                       stream_));
  if (!profile_) {
    for (size_t i = 0; i < n_recs_; ++i) recs_[i].fn(recs_[i].p, stream_);
    return;
  }
  for (size_t i = 0; i < n_recs_; ++i) {
    Timed t;
    t.name = LaunchName(recs_[i]);
    for (cudaEvent_t* e : {&t.a, &t.b}) {
      if (event_pool_.empty()) {
        CK(cudaEventCreate(e));
      } else {
        *e = event_pool_.back();
        event_pool_.pop_back();
      }
    }
    CK(cudaEventRecord(t.a, stream_));
    recs_[i].fn(recs_[i].p, stream_);
    CK(cudaEventRecord(t.b, stream_));
    timed_.push_back(t);
  }
}

void CudaBackend::ProfileCollect() {
  for (Timed& t : timed_) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, t.a, t.b));
    profile_table_[t.name].push_back(ms);
    event_pool_.push_back(t.a);
    event_pool_.push_back(t.b);
  }
  timed_.clear();
}

void CudaBackend::ProfilePrint() {
  struct Row {
    std::string name;
    size_t calls;
    double ms, median_us;
  };
  std::vector<Row> rows;
  double total = 0;
  for (auto& [name, v] : profile_table_) {
    double ms = 0;
    for (float x : v) ms += x;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    rows.push_back({name, v.size(), ms, 1000.0 * v[v.size() / 2]});
    total += ms;
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.ms > b.ms; });
  std::fprintf(stderr, "cuda profile (kernel time with events, graphs off): %.3f ms total\n",
               total);
  for (const Row& r : rows)
    std::fprintf(stderr, "  %-36s %7zu calls %9.3f ms %5.1f %% median %8.2f us\n", r.name.c_str(),
                 r.calls, r.ms, 100.0 * r.ms / std::max(total, 1e-9), r.median_us);
}

void CudaBackend::Flush() {
  const size_t copy_off = arena_copied_, copy_len = arena_off_ - arena_copied_;
  if (n_recs_ == 0 && copy_len == 0) return;
  SetDevice();
  bool done = false;
  if (opt_.graphs && !uncapturable_ && n_recs_ >= static_cast<size_t>(kMinGraphRecs)) {
    const uint64_t h = HashRecs(copy_off, copy_len);
    auto it = graphs_.find(h);
    if (it != graphs_.end()) {
      const Graph& g = it->second;
      bool same = g.recs.size() == n_recs_ && g.copy_off == copy_off && g.copy_len == copy_len;
      for (size_t i = 0; same && i < n_recs_; ++i)
        same = g.recs[i].fn == recs_[i].fn && g.recs[i].size == recs_[i].size &&
               std::memcmp(g.recs[i].p, recs_[i].p, recs_[i].size) == 0;
      if (same) {
        CK(cudaGraphLaunch(g.exec, stream_));
        done = true;
      }
    } else if (++seen_[h] >= 2) {
      // The second time this exact run comes: capture it, replay it from now on.
      if (graphs_.size() >= kMaxGraphs) DropGraphs();
      cudaGraph_t graph = nullptr;
      CK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      Issue(copy_off, copy_len);
      CK(cudaStreamEndCapture(stream_, &graph));
      Graph g;
      CK(cudaGraphInstantiate(&g.exec, graph, 0));
      CK(cudaGraphDestroy(graph));
      g.recs.assign(recs_.begin(), recs_.begin() + static_cast<std::ptrdiff_t>(n_recs_));
      g.copy_off = copy_off;
      g.copy_len = copy_len;
      CK(cudaGraphLaunch(g.exec, stream_));
      graphs_.emplace(h, std::move(g));
      done = true;
    }
    if (seen_.size() > 65536) seen_.clear();
  }
  if (!done) Issue(copy_off, copy_len);
  CK(cudaGetLastError());
  arena_copied_ = arena_off_;
  launches_ += static_cast<int64_t>(n_recs_);
  n_recs_ = 0;
  uncapturable_ = false;
}

void CudaBackend::Sync() {
  Flush();
  SetDevice();
  if (host_time_) {
    const auto now = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
    const double t0 = now();
    CK(cudaStreamSynchronize(stream_));
    host_last_s_ = now();
    if (host_first_s_ < 0) {
      host_first_s_ = host_last_s_;  // from the end of the first wait
    } else {
      host_wait_s_ += host_last_s_ - t0;
    }
    ++host_syncs_;
  } else {
    CK(cudaStreamSynchronize(stream_));
  }
  if (profile_) ProfileCollect();
  arena_off_ = arena_copied_ = 0;
  for (Memo& m : memo_) m = Memo();
  work_off_ = 0;
  acts_.clear();
}

}  // namespace substrate::cuda
