// CudaBackend's hybrid under a --max-vram budget (cuda_backend.h, CudaBackendOptions::host_pool):
// the weights the device does not hold lie in pinned host memory, where the device's kernels read
// them over the link. The host's CPU can read them too, from the same memory and at its own
// bandwidth, while the link is busy. A one-token product over such weights is therefore split by
// rows: the CPU computes the first share of the rows, the device reads and computes the rest at
// the same time, and after each split the share moves toward where both would have finished
// together. A MoE layer's routed experts are split whole instead (HybridExperts): routed on
// the host, the CPU computes a share of the chosen experts that lie in host memory while the
// device computes the rest, so the layer waits for the device once. Prompts (several tokens)
// stay on the device: there each weight byte that crosses the link serves every token of the
// batch.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "kernels/matmul.h"
#include "kernels/routing.h"

namespace substrate::cuda {

namespace {

// Rows of a split are whole multiples of this: every type's row bytes times it keeps the
// device's share 16-byte aligned, and slices this thin are not worth a split.
constexpr int64_t kSplitRows = 64;

// Rows [r0, r0 + n) of a row-major view (every part row-major: what the device reads in place).
WeightView RowSlice(const WeightView& v, int64_t r0, int64_t n) {
  WeightView s = v;
  const auto rb = [&](DType t) { return *RowBytes(t, static_cast<uint64_t>(v.cols)); };
  s.data = v.data + rb(v.type) * static_cast<uint64_t>(r0);
  s.bytes = rb(v.type) * static_cast<uint64_t>(n);
  s.rows = n;
  for (int k = 0; k < v.n_residuals; ++k)
    s.residual[k] = v.residual[k] + rb(v.residual_type[k]) * static_cast<uint64_t>(r0);
  return s;
}

uint64_t ViewBytes(const WeightView& v) {
  uint64_t total = *RowBytes(v.type, static_cast<uint64_t>(v.cols));
  for (int k = 0; k < v.n_residuals; ++k)
    total += *RowBytes(v.residual_type[k], static_cast<uint64_t>(v.cols));
  return total * static_cast<uint64_t>(v.rows);
}

}  // namespace

void CudaBackend::InitHybrid() {
  if (!zero_copy_ || !opt_.host_pool) return;
  if (const char* h = std::getenv("SUBSTRATE_CUDA_HYBRID")) {
    const double f = std::atof(h);
    if (f <= 0) return;
    hybrid_fixed_ = std::min(f, 1.0);
  }
  if (const char* m = std::getenv("SUBSTRATE_CUDA_HYBRID_MOE"); m && std::string(m) == "0")
    hybrid_moe_ = false;
  CpuBackendOptions o;
  o.decode_layout = false;  // it computes on views in the file's layout, never adopts
  host_ = std::make_unique<CpuBackend>(opt_.host_pool, opt_.host_ledger, o);
  CK(cudaEventCreateWithFlags(&hyb_x_, cudaEventDisableTiming));
  for (int k = 0; k < 2; ++k) {
    CK(cudaEventCreate(&hyb_a_[k]));
    CK(cudaEventCreate(&hyb_b_[k]));
  }
}

void CudaBackend::CloseHybrid() {
  if (host_time_ && hyb_batches_ > 0)
    std::fprintf(stderr,
                 "cuda hybrid: %lld split batches; the host waited %.1f ms for their inputs and "
                 "computed the CPU's shares in %.1f ms (share now %.2f)\n",
                 static_cast<long long>(hyb_batches_), hyb_wait_s_ * 1e3, hyb_cpu_s_ * 1e3,
                 HybridCpuShare());
  for (cudaEvent_t e : {hyb_x_, hyb_a_[0], hyb_b_[0], hyb_a_[1], hyb_b_[1]})
    if (e) cudaEventDestroy(e);
  if (hyb_host_) cudaFreeHost(hyb_host_);
  host_.reset();
}

bool CudaBackend::ReadInPlace(const WeightView& v) const {
  if (v.layout != WeightLayout::kRows) return false;
  auto in_place = [&](DType type, const uint8_t* host) {
    const auto rb = RowBytes(type, static_cast<uint64_t>(v.cols));
    if (!rb) return false;
    const uint64_t bytes = *rb * static_cast<uint64_t>(v.rows);
    DevPart part;  // (a part read in place is "found" at its host address)
    return FindAdoptedPart(host, bytes, static_cast<int>(type), static_cast<int64_t>(*rb), &part) &&
           part.w == host;
  };
  if (!in_place(v.type, v.data)) return false;
  for (int k = 0; k < v.n_residuals; ++k)
    if (!in_place(v.residual_type[k], v.residual[k])) return false;
  return true;
}

double CudaBackend::HybridCpuShare() const {
  return hybrid_fixed_ > 0 ? hybrid_fixed_ : share_;
}

void CudaBackend::BalanceShare(double cpu_s, double dev_s) {
  // A step toward the share where both sides of a split batch finish together, at most kStep
  // and in proportion to how unequal they were. (The share as the ratio of rates measured as
  // bytes over time trapped itself low: a thin share's time is mostly fixed costs, so the CPU
  // looked slow and got less; on one lease it sank to 0.09 and decode to a third.)
  constexpr double kStep = 0.05, kMinShare = 0.02;
  if (cpu_s + dev_s > 0)
    share_ = std::clamp(share_ + kStep * (dev_s - cpu_s) / (cpu_s + dev_s), kMinShare, 1.0);
}

void CudaBackend::WeighPair(int pair) {
  if (hyb_cpu_pending_[pair] <= 0) return;
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, hyb_a_[pair], hyb_b_[pair]));
  BalanceShare(hyb_cpu_pending_[pair], ms * 1e-3);
  hyb_cpu_pending_[pair] = 0;
}

void CudaBackend::SettleSplit(int pair, double wait_s, double cpu_s, bool cpu_part,
                              bool device_part) {
  hyb_wait_s_ += wait_s;
  hyb_cpu_s_ += cpu_s;
  ++hyb_batches_;
  if (!cpu_part) return;  // nothing to learn the share from
  if (device_part) {
    hyb_cpu_pending_[pair] = std::max(cpu_s, 1e-9);  // weighed once the device's time is known
  } else {
    BalanceShare(cpu_s, 0);
  }
}

void CudaBackend::EnsureHybridHost(size_t floats) {
  if (floats <= hyb_host_floats_) return;
  Sync();  // the copies from the old buffer
  if (hyb_host_) CK(cudaFreeHost(hyb_host_));
  hyb_host_floats_ = std::max(floats, hyb_host_floats_ * 2);
  CK(cudaHostAlloc(reinterpret_cast<void**>(&hyb_host_), hyb_host_floats_ * 4,
                   cudaHostAllocDefault));
}

size_t CudaBackend::LayOut(std::vector<Span>& spans, size_t host_off) const {
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.dev < b.dev; });
  size_t n = 0;
  for (const Span& sp : spans) {
    Span& last = spans[n > 0 ? n - 1 : 0];
    // One copy may not cross from one allocation into the next, however close they lie.
    if (n > 0 && sp.dev <= last.dev + last.floats && SameAllocation(last.dev, sp.dev)) {
      last.floats = std::max(last.floats, static_cast<size_t>(sp.dev - last.dev) + sp.floats);
    } else {
      spans[n++] = sp;
    }
  }
  spans.resize(n);
  for (Span& sp : spans) {
    sp.host_off = host_off;
    host_off += sp.floats;
  }
  return host_off;
}

bool CudaBackend::HybridBatch(const MatMulOp* ops, int n_ops) {
  if (!host_) return false;
  // The CPU takes a prefix of the batch's one-token products over weights read in place: whole
  // products while they fit its share of their bytes, then the first rows of the product where
  // the share ends. Whole products keep the copies few: a batch of experts' inputs and outputs
  // lie side by side, so the CPU's part of them travels in one copy each way.
  thread_local std::vector<int64_t> cpu_rows;   // of each product (0: all on the device)
  thread_local std::vector<uint64_t> in_place;  // each product's weight bytes read in place
  cpu_rows.assign(static_cast<size_t>(n_ops), 0);
  in_place.assign(static_cast<size_t>(n_ops), 0);
  uint64_t eligible = 0;
  for (int i = 0; i < n_ops; ++i)
    if (ops[i].x.rows == 1 && ReadInPlace(*ops[i].w))
      eligible += in_place[static_cast<size_t>(i)] = ViewBytes(*ops[i].w);
  double left = HybridCpuShare() * static_cast<double>(eligible);
  uint64_t cpu_bytes = 0;
  for (int i = 0; i < n_ops && left > 0; ++i) {
    if (in_place[static_cast<size_t>(i)] == 0) continue;
    const int64_t rows = ops[i].w->rows;
    const uint64_t row_bytes = in_place[static_cast<size_t>(i)] / static_cast<uint64_t>(rows);
    const double rb = static_cast<double>(row_bytes);
    int64_t r = rows;
    if (left < rb * static_cast<double>(rows))
      r = std::min(rows, static_cast<int64_t>(left / rb / kSplitRows + 0.5) * kSplitRows);
    cpu_rows[static_cast<size_t>(i)] = r;
    cpu_bytes += row_bytes * static_cast<uint64_t>(r);
    left -= rb * static_cast<double>(r);
    if (r < rows) break;
  }
  if (std::all_of(cpu_rows.begin(), cpu_rows.end(), [](int64_t r) { return r == 0; })) return false;

  // Host memory: the CPU products' inputs (each once), then their outputs, each side as spans
  // of device memory laid out in address order, so that neighbours travel in one copy.
  thread_local std::vector<Span> xs, ys;
  xs.clear();
  ys.clear();
  for (int i = 0; i < n_ops; ++i) {
    const int64_t r = cpu_rows[static_cast<size_t>(i)];
    if (r == 0) continue;
    xs.push_back({ops[i].x.data, static_cast<size_t>(ops[i].x.cols), 0});
    ys.push_back({ops[i].y.data, static_cast<size_t>(r), 0});
  }
  EnsureHybridHost(LayOut(ys, LayOut(xs, 0)));
  const auto host = [&](const std::vector<Span>& spans, const float* dev) {
    auto it = std::upper_bound(spans.begin(), spans.end(), dev,
                               [](const float* d, const Span& sp) { return d < sp.dev; });
    --it;
    return hyb_host_ + it->host_off + (dev - it->dev);
  };

  // The products the CPU has no part of, and the device's rows of the split one, go first, so
  // the device works while the CPU does.
  thread_local std::vector<MatMulOp> dev_ops, cpu_ops;
  thread_local std::vector<WeightView> views;
  dev_ops.clear();
  cpu_ops.clear();
  views.clear();
  views.reserve(static_cast<size_t>(n_ops) + 1);  // never moves: ops point into it
  for (int i = 0; i < n_ops; ++i) {
    const MatMulOp& op = ops[i];
    const int64_t r = cpu_rows[static_cast<size_t>(i)], rows = op.w->rows;
    if (r == 0) {
      dev_ops.push_back(op);
      continue;
    }
    if (r < rows) {
      views.push_back(RowSlice(*op.w, r, rows - r));
      dev_ops.push_back({&views.back(), op.x, {op.y.data + r, 1, rows - r}});
      views.push_back(RowSlice(*op.w, 0, r));
    }
    cpu_ops.push_back({r < rows ? &views.back() : op.w,
                       {host(xs, op.x.data), 1, op.x.cols},
                       {host(ys, op.y.data), 1, r}});
  }
  Flush();
  SetDevice();
  for (const Span& sp : xs)
    CK(cudaMemcpyAsync(hyb_host_ + sp.host_off, sp.dev, sp.floats * 4, cudaMemcpyDeviceToHost,
                       stream_));
  CK(cudaEventRecord(hyb_x_, stream_));
  // The device's share between a pair of events; pairs alternate, so the last batch's pair is
  // read once this batch's inputs have arrived (it came before them on the stream).
  const int pair = hyb_pair_;
  hyb_pair_ ^= 1;
  if (!dev_ops.empty()) {
    CK(cudaEventRecord(hyb_a_[pair], stream_));
    DeviceMatMulBatch(dev_ops.data(), static_cast<int>(dev_ops.size()));
    Flush();
    CK(cudaEventRecord(hyb_b_[pair], stream_));
  }

  // The CPU's share, from the inputs the device sent.
  const auto w0 = std::chrono::steady_clock::now();
  CK(cudaEventSynchronize(hyb_x_));
  WeighPair(pair ^ 1);
  const auto t0 = std::chrono::steady_clock::now();
  host_->MatMulBatch(cpu_ops.data(), static_cast<int>(cpu_ops.size()));
  const double cpu_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  host_compute_bytes_ += cpu_bytes;
  SettleSplit(pair, std::chrono::duration<double>(t0 - w0).count(), cpu_s, true, !dev_ops.empty());
  for (const Span& sp : ys)
    CK(cudaMemcpyAsync(const_cast<float*>(sp.dev), hyb_host_ + sp.host_off, sp.floats * 4,
                       cudaMemcpyHostToDevice, stream_));
  for (int i = 0; i < n_ops; ++i)
    if (cpu_rows[static_cast<size_t>(i)] > 0) Wrote(ops[i].y);
  return true;
}

bool CudaBackend::HybridExperts(const RoutedExpertsOp& op, const ExpertTable& g,
                                const ExpertTable& u, const ExpertTable& dn) {
  const RoutingParams& rp = op.routing;
  const int E = rp.n_expert, K = rp.k;
  const int64_t d = op.xn.cols, ff = g.rows;

  // The router's logits and the normed input to the host: the layer's one wait.
  EnsureHybridHost(static_cast<size_t>(E + 2 * d));
  float* logits = hyb_host_;
  float* x = logits + E;
  float* cpu_sum = x + d;  // the CPU's experts' weighted sum, uploaded
  Flush();
  SetDevice();
  CK(cudaMemcpyAsync(logits, op.logits.data, static_cast<size_t>(E) * 4, cudaMemcpyDeviceToHost,
                     stream_));
  CK(cudaMemcpyAsync(x, op.xn.data, static_cast<size_t>(d) * 4, cudaMemcpyDeviceToHost, stream_));
  CK(cudaEventRecord(hyb_x_, stream_));
  const int pair = hyb_pair_;
  hyb_pair_ ^= 1;
  const auto w0 = std::chrono::steady_clock::now();
  CK(cudaEventSynchronize(hyb_x_));
  const auto t0 = std::chrono::steady_clock::now();
  WeighPair(pair ^ 1);

  // The choice, by the CPU's own routine (every backend picks the same experts).
  thread_local std::vector<float> bias, weight;
  thread_local std::vector<int32_t> sel;
  const float* b = nullptr;
  if (op.bias) {
    bias.resize(static_cast<size_t>(E));
    DequantizeWeightRow(*op.bias, 0, bias.data());
    b = bias.data();
  }
  sel.resize(static_cast<size_t>(K));
  weight.resize(static_cast<size_t>(K));
  RouteRow(rp, logits, b, sel.data(), weight.data());

  // The CPU takes whole experts read in place (all three matrices in host memory), the first
  // of them in the choice's order, as many as its share of them (the remainder carried to the
  // next layer); the device takes the rest, from its memory or over the link.
  const auto whole_on_host = [&](int e) { return g.InPlace(e) && u.InPlace(e) && dn.InPlace(e); };
  int n_in_place = 0;
  for (int j = 0; j < K; ++j) n_in_place += whole_on_host(sel[j]);
  hyb_expert_carry_ += HybridCpuShare() * n_in_place;
  const int n_cpu = std::min(n_in_place, static_cast<int>(hyb_expert_carry_));
  hyb_expert_carry_ -= n_cpu;
  thread_local std::vector<int> cpu_slots;
  thread_local std::vector<int32_t> dev_sel;
  thread_local std::vector<float> dev_weight;
  cpu_slots.clear();
  dev_sel.clear();
  dev_weight.clear();
  for (int j = 0; j < K; ++j) {
    const int e = sel[j];
    if (static_cast<int>(cpu_slots.size()) < n_cpu && whole_on_host(e)) {
      cpu_slots.push_back(j);
    } else {
      dev_sel.push_back(e);
      dev_weight.push_back(weight[j]);
    }
  }
  const int n_dev = static_cast<int>(dev_sel.size());

  // The device's experts first, so that it computes while the CPU does.
  EnsureArgs(static_cast<size_t>(K) * 8 + 32);
  EnsureWork(ExpertWorkBytes(K, ff, d) + static_cast<size_t>(d) * 6 + 4 * 256);
  auto* plus = static_cast<float*>(Carve(static_cast<size_t>(d) * 4));
  const float* out = nullptr;
  const float* dev_w = nullptr;
  if (n_dev > 0) {
    const auto* dsel = static_cast<const int32_t*>(Args(dev_sel.data(), dev_sel.size() * 4, kRows));
    dev_w = static_cast<const float*>(Args(dev_weight.data(), dev_weight.size() * 4, kWeights));
    const ExpertWork w = CarveExpertWork(n_dev, ff, d);
    CK(cudaEventRecord(hyb_a_[pair], stream_));
    AddExpertSlots(op, g, u, dn, dsel, n_dev, n_dev, w);
    Flush();
    CK(cudaEventRecord(hyb_b_[pair], stream_));
    out = w.out;
    for (int e : dev_sel)
      for (const ExpertTable* t : {&g, &u, &dn})
        if (t->InPlace(e)) link_bytes_ += t->MatrixBytes();
  }

  // The CPU's experts, from host memory where the device would have read them.
  const auto c0 = std::chrono::steady_clock::now();
  std::fill(cpu_sum, cpu_sum + d, 0.0f);
  if (n_cpu > 0) {
    thread_local std::vector<float> gate, up, hidden_out;
    thread_local std::vector<WeightView> views;
    thread_local std::vector<MatMulOp> up_ops, down_ops;
    gate.resize(static_cast<size_t>(n_cpu * ff));
    up.resize(gate.size());
    hidden_out.resize(static_cast<size_t>(n_cpu * d));
    views.clear();
    views.reserve(static_cast<size_t>(3 * n_cpu));  // never moves: ops point into it
    up_ops.clear();
    down_ops.clear();
    const Tensor xt{x, 1, d};
    for (int i = 0; i < n_cpu; ++i) {
      const int e = sel[cpu_slots[static_cast<size_t>(i)]];
      views.push_back(RowSlice(*op.gate, e * ff, ff));
      up_ops.push_back({&views.back(), xt, {gate.data() + i * ff, 1, ff}});
      views.push_back(RowSlice(*op.up, e * ff, ff));
      up_ops.push_back({&views.back(), xt, {up.data() + i * ff, 1, ff}});
      views.push_back(RowSlice(*op.down, e * d, d));
      down_ops.push_back(
          {&views.back(), {gate.data() + i * ff, 1, ff}, {hidden_out.data() + i * d, 1, d}});
    }
    host_->MatMulBatch(up_ops.data(), static_cast<int>(up_ops.size()));
    const Tensor gt{gate.data(), n_cpu, ff}, ut{up.data(), n_cpu, ff};
    host_->SwiGlu(gt, ut, gt);
    host_->MatMulBatch(down_ops.data(), static_cast<int>(down_ops.size()));
    // In the choice's order, as the device sums its slots.
    for (int i = 0; i < n_cpu; ++i) {
      const float wj = weight[static_cast<size_t>(cpu_slots[static_cast<size_t>(i)])];
      const float* o = hidden_out.data() + i * d;
      for (int64_t c = 0; c < d; ++c) cpu_sum[c] = std::fma(wj, o[c], cpu_sum[c]);
    }
    host_compute_bytes_ +=
        static_cast<uint64_t>(n_cpu) * (g.MatrixBytes() + u.MatrixBytes() + dn.MatrixBytes());
  }
  const auto c1 = std::chrono::steady_clock::now();
  const double cpu_s = std::chrono::duration<double>(c1 - c0).count();
  SettleSplit(pair, std::chrono::duration<double>(t0 - w0).count(), cpu_s, n_cpu > 0, n_dev > 0);

  // The device adds the CPU's sum to its own as it combines.
  CK(cudaMemcpyAsync(plus, cpu_sum, static_cast<size_t>(d) * 4, cudaMemcpyHostToDevice, stream_));
  AddMoeCombine(out, dev_w, nullptr, op.acc, n_dev, plus);
  return true;
}

}  // namespace substrate::cuda
