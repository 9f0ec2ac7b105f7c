// Routed experts. Prefill (many tokens per expert) runs expert after expert, each product a GEMM
// split over the pool. Decode (a few tokens) runs all selected experts of the layer together:
// one ParallelFor over (expert, gate|up, row chunk) and one over (expert, row chunk) of down,
// instead of three pool dispatches and three activation quantizations per expert; activations
// are quantized once for every expert. The arithmetic is MatMul's (same dot kernels, same
// activation formats, same token blocking), so both paths give the same bits.
//
// Ops: every selected expert's op is begun, in increasing expert order, and its tensors
// acquired inside it, before any expert computes; the ops end, in the same order, after all
// have computed. So a streaming source sees every read of the layer's experts up front (it can
// issue them together) and may free them at the first EndOp.
#include "model/expert_batch.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "format/model_file.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/profile.h"
#include "kernels/vec_dot.h"
#include "model/op_id.h"

namespace substrate {
namespace {

// Passes with at most this many tokens run the experts together (decode, short verify
// windows); larger ones are GEMMs that each fill the pool on their own.
// SUBSTRATE_MOE_BATCH_TOKENS overrides it (0: never batch), for A/B benchmarks.
int64_t InitialBatchedMaxTokens() {
  const char* v = std::getenv("SUBSTRATE_MOE_BATCH_TOKENS");
  return v ? std::strtoll(v, nullptr, 10) : 4;
}
int64_t g_batched_max_tokens = InitialBatchedMaxTokens();
// Rows per work item of the batched ParallelFors.
constexpr int64_t kRowsPerItem = 32;
constexpr int kMaxParts = 3;   // skeleton + 2 residuals
constexpr int kTokenBlock = 64;  // as MatMul's

struct Part {
  const DotKernel* kernel = nullptr;
  const uint8_t* data = nullptr;
  size_t row_bytes = 0;
  int act = -1;  // index into the activation formats table
};

// Activations quantized to up to kMaxActs formats (one set of rows each).
constexpr int kMaxActs = 6;
struct ActSet {
  DType type[kMaxActs];
  size_t stride[kMaxActs];
  size_t offset[kMaxActs];
  int n = 0;
  int Find(DType t) {
    for (int i = 0; i < n; ++i)
      if (type[i] == t) return i;
    if (n == kMaxActs) return -1;
    type[n] = t;
    return n++;
  }
};

// One weight product of the batch: y [m, rows] = W x, x one of the activation sets.
struct Product {
  const WeightView* w = nullptr;
  Part parts[kMaxParts];
  int n_parts = 0;
  int token_block = kTokenBlock;
  int64_t m = 0;
  int64_t act_row0 = 0;  // first activation row (of the quantized set) this product reads
  float* y = nullptr;
  int64_t items = 0;     // row chunks
  const ActSet* acts = nullptr;          // its activation formats
  const uint8_t* act_buf = nullptr;     // and their quantized rows (set once quantized)
};

bool PrepareProduct(const WeightView& w, Isa isa, ActSet& acts, Product* p) {
  if (w.layout != WeightLayout::kRows) return false;  // MatMul's interleaved kernels instead
  p->w = &w;
  p->acts = &acts;
  p->n_parts = 1 + std::clamp(w.n_residuals, 0, 2);
  p->token_block = kTokenBlock;
  for (int k = 0; k < p->n_parts; ++k) {
    const DType type = k == 0 ? w.type : w.residual_type[k - 1];
    auto rb = RowBytes(type, static_cast<uint64_t>(w.cols));
    const DotKernel* kern = FindDotKernel(type, isa);
    if (!rb || !kern || !FindQuantizeAct(kern->act_type, isa) ||
        ActRowBytes(kern->act_type, w.cols) == 0)
      return false;
    const int a = acts.Find(kern->act_type);
    if (a < 0) return false;
    p->parts[k] = {kern, k == 0 ? w.data : w.residual[k - 1], static_cast<size_t>(*rb), a};
    p->token_block = std::min(p->token_block, std::max(1, kern->max_nt));
  }
  p->items = (w.rows + kRowsPerItem - 1) / kRowsPerItem;
  return true;
}

// Quantizes `rows` rows of x [rows, cols] into every format of `acts`, in `buf`.
Expected<uint8_t*> QuantizeActs(ForwardContext& c, Scratch::Slot slot, const float* x,
                                int64_t rows, int64_t cols, Isa isa, ActSet& acts) {
  size_t total = 0;
  for (int i = 0; i < acts.n; ++i) {
    acts.stride[i] = ActRowBytes(acts.type[i], cols);
    acts.offset[i] = total;
    total += (acts.stride[i] * static_cast<size_t>(rows) + 63) & ~size_t{63};
  }
  ASSIGN_OR_RETURN(void* p, c.scratch->GetBytes(slot, std::max<size_t>(total, 64)));
  uint8_t* buf = static_cast<uint8_t*>(p);
  for (int i = 0; i < acts.n; ++i) {
    QuantizeActFn q = FindQuantizeAct(acts.type[i], isa);
    for (int64_t r = 0; r < rows; ++r)
      q(x + r * cols, buf + acts.offset[i] + static_cast<size_t>(r) * acts.stride[i], cols);
  }
  return buf;
}

// Rows [r0, r1) of one product, computed as MatMul's row loop computes them.
void ProductRows(const Product& p, int64_t r0, int64_t r1) {
  float tmp[kTokenBlock], res[kTokenBlock];
  const WeightView& w = *p.w;
  const ActSet& acts = *p.acts;
  const uint8_t* act_buf = p.act_buf;
  for (int64_t t0 = 0; t0 < p.m; t0 += p.token_block) {
    const int nt = static_cast<int>(std::min<int64_t>(p.token_block, p.m - t0));
    for (int64_t r = r0; r < r1; ++r) {
      for (int k = 0; k < p.n_parts; ++k) {
        const Part& part = p.parts[k];
        const size_t stride = acts.stride[part.act];
        const uint8_t* act = act_buf + acts.offset[part.act] +
                             static_cast<size_t>(p.act_row0 + t0) * stride;
        part.kernel->dot(w.cols, part.data + r * part.row_bytes, act, stride, nt,
                         k == 0 ? tmp : res);
        if (k > 0)
          for (int t = 0; t < nt; ++t) tmp[t] += res[t];
      }
      for (int t = 0; t < nt; ++t) p.y[(t0 + t) * w.rows + r] = tmp[t];
    }
  }
}

// Every product's rows over the pool: items in product order, so a thread's contiguous range
// of items reads contiguous weight rows.
void RunProducts(ForwardContext& c, const Product* prods, int n_prods) {
  int64_t n_items = 0;
  for (int i = 0; i < n_prods; ++i) n_items += prods[i].items;
  c.pool->ParallelFor(n_items, 1, [&](int64_t i0, int64_t i1, int) {
    int p = 0;
    int64_t base = 0;
    while (base + prods[p].items <= i0) base += prods[p++].items;
    for (int64_t i = i0; i < i1;) {
      const Product& pr = prods[p];
      const int64_t last = std::min(i1, base + pr.items);
      const int64_t r0 = (i - base) * kRowsPerItem;
      const int64_t r1 = std::min(pr.w->rows, (last - base) * kRowsPerItem);
      ProductRows(pr, r0, r1);
      i = last;
      base += pr.items;
      ++p;
    }
  });
}

Status CheckShape(ForwardContext& c, TensorId id, const WeightView& v, int64_t in, int64_t out) {
  if (v.cols == in && v.rows == out) return Status::Ok();
  return Corruption("tensor '" + c.source->Info(id).name + "' expert slice is [" +
                    std::to_string(v.rows) + " x " + std::to_string(v.cols) + "], expected [" +
                    std::to_string(out) + " x " + std::to_string(in) + "]");
}

// The selected experts' ops stay open, and their handles held, until the batch is done; the
// destructor releases the handles, then ends the ops in the order they began (also on errors).
// Storage is per thread and grows once (a forward pass runs on one thread).
class OpenExperts {
 public:
  OpenExperts(WeightSource* s, int il) : s_(s), il_(il) {
    handles.clear();
    begun.clear();
  }
  ~OpenExperts() {
    handles.clear();
    for (int e : begun) s_->EndOp(e >= 0 ? OpIdMoeExpert(il_, e) : OpIdMoeShared(il_));
    begun.clear();
  }
  OpenExperts(const OpenExperts&) = delete;
  OpenExperts& operator=(const OpenExperts&) = delete;
  void Begin(int e) {  // e < 0: the shared expert
    s_->BeginOp(e >= 0 ? OpIdMoeExpert(il_, e) : OpIdMoeShared(il_));
    begun.push_back(e);
  }

  static thread_local std::vector<WeightHandle> handles;

 private:
  static thread_local std::vector<int> begun;
  WeightSource* s_;
  int il_;
};
thread_local std::vector<WeightHandle> OpenExperts::handles;
thread_local std::vector<int> OpenExperts::begun;

Status RunBatched(ForwardContext& c, int il, const LayerWeights& w, const float* xn,
                  const ExpertRouting& r, float* acc, float* shared_out) {
  const int64_t d = c.hp->n_embd, n = c.n;
  const int ne = r.n_experts;
  const int64_t ff = static_cast<int64_t>(c.source->Info(w.gate_exps).ne[1]);
  const bool shared = shared_out != nullptr;
  const bool shared_gate = shared && w.gate_inp_shexp != kNoTensor;
  const int64_t ffs = shared ? static_cast<int64_t>(c.source->Info(w.gate_shexp).ne[1]) : 0;
  OpenExperts open(c.source, il);
  std::vector<WeightHandle>& h = OpenExperts::handles;
  h.reserve(static_cast<size_t>(3 * c.hp->n_expert + 4));
  for (int i = 0; i < ne; ++i) {
    const int e = r.experts[i];
    open.Begin(e);
    for (TensorId id : {w.gate_exps, w.up_exps, w.down_exps}) {
      ASSIGN_OR_RETURN(WeightHandle hd, c.source->Acquire(id, e));
      h.push_back(std::move(hd));
    }
    RETURN_IF_ERROR(CheckShape(c, w.gate_exps, h[3 * i].view(), d, ff));
    RETURN_IF_ERROR(CheckShape(c, w.up_exps, h[3 * i + 1].view(), d, ff));
    RETURN_IF_ERROR(CheckShape(c, w.down_exps, h[3 * i + 2].view(), ff, d));
  }
  // The shared expert joins the batch in its own op, after the routed ones (topological order).
  const size_t hs = h.size();  // its handles: gate, up, down, [sigmoid gate]
  if (shared) {
    open.Begin(-1);
    for (TensorId id : {w.gate_shexp, w.up_shexp, w.down_shexp, w.gate_inp_shexp}) {
      if (id == kNoTensor) continue;
      ASSIGN_OR_RETURN(WeightHandle hd, c.source->Acquire(id));
      h.push_back(std::move(hd));
    }
    RETURN_IF_ERROR(CheckShape(c, w.gate_shexp, h[hs].view(), d, ffs));
    RETURN_IF_ERROR(CheckShape(c, w.up_shexp, h[hs + 1].view(), d, ffs));
    RETURN_IF_ERROR(CheckShape(c, w.down_shexp, h[hs + 2].view(), ffs, d));
    if (shared_gate) RETURN_IF_ERROR(CheckShape(c, w.gate_inp_shexp, h[hs + 3].view(), d, 1));
  }

  // Rows p of the gathered input / hidden / output belong to expert slot p's token
  // (tokens[p]); expert i's rows start at offset[experts[i]].
  const int64_t total = r.offset[r.experts[ne - 1] + 1] - r.offset[r.experts[0]];
  const int64_t p0 = r.offset[r.experts[0]];
  // The shared expert reads rows [total, total + n) of xg: the tokens themselves.
  ASSIGN_OR_RETURN(float* xg, c.scratch->Get(Scratch::kGathered, (total + n) * d));
  ASSIGN_OR_RETURN(float* gs, c.scratch->Get(Scratch::kSharedGate, std::max<int64_t>(1, n * ffs)));
  ASSIGN_OR_RETURN(float* us, c.scratch->Get(Scratch::kSharedUp, std::max<int64_t>(1, n * ffs)));
  ASSIGN_OR_RETURN(float* sg, c.scratch->Get(Scratch::kVec, n));
  ASSIGN_OR_RETURN(float* g, c.scratch->Get(Scratch::kGate, total * ff));
  ASSIGN_OR_RETURN(float* u, c.scratch->Get(Scratch::kUp, total * ff));
  ASSIGN_OR_RETURN(float* out, c.scratch->Get(Scratch::kExpertHidden, total * d));
  thread_local std::vector<Product> up_prods, down_prods;  // grow-once bookkeeping
  const int n_up = 2 * ne + (shared ? 2 + shared_gate : 0), n_down = ne + shared;
  up_prods.resize(static_cast<size_t>(n_up));
  down_prods.resize(static_cast<size_t>(n_down));
  for (int64_t p = 0; p < total; ++p)
    std::memcpy(xg + p * d, xn + static_cast<int64_t>(r.tokens[p0 + p]) * d,
                static_cast<size_t>(d) * 4);
  std::memcpy(xg + total * d, xn, static_cast<size_t>(n * d) * 4);

  const Isa isa = ActiveIsa();
  ActSet in_acts, hid_acts, shared_acts;
  bool fast = true;
  for (int i = 0; i < ne && fast; ++i) {
    const int e = r.experts[i];
    const int64_t row0 = r.offset[e] - p0, m = r.offset[e + 1] - r.offset[e];
    for (int k = 0; k < 2 && fast; ++k) {
      Product& pr = up_prods[2 * i + k];
      fast = PrepareProduct(h[3 * i + k].view(), isa, in_acts, &pr);
      pr.m = m;
      pr.act_row0 = row0;
      pr.y = (k == 0 ? g : u) + row0 * ff;
    }
    Product& dp = down_prods[i];
    fast = fast && PrepareProduct(h[3 * i + 2].view(), isa, hid_acts, &dp);
    dp.m = m;
    dp.act_row0 = row0;
    dp.y = out + row0 * d;
  }
  if (shared && fast) {
    float* ys[3] = {gs, us, sg};
    for (int k = 0; k < 2 + shared_gate && fast; ++k) {
      Product& pr = up_prods[2 * ne + k];
      fast = PrepareProduct(h[hs + (k < 2 ? k : 3)].view(), isa, in_acts, &pr);
      pr.m = n;
      pr.act_row0 = total;
      pr.y = ys[k];
    }
    Product& dp = down_prods[ne];
    fast = fast && PrepareProduct(h[hs + 2].view(), isa, shared_acts, &dp);
    dp.m = n;
    dp.act_row0 = 0;
    dp.y = shared_out;
  }

  if (fast) {
    const bool profile = KernelProfilingEnabled();
    auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(uint8_t* in_buf,
                     QuantizeActs(c, Scratch::kExpertAct, xg, total + n, d, isa, in_acts));
    for (int i = 0; i < n_up; ++i) up_prods[i].act_buf = in_buf;
    auto t1 = std::chrono::steady_clock::now();
    RunProducts(c, up_prods.data(), n_up);
    auto t2 = std::chrono::steady_clock::now();
    SwiGlu(g, u, total * ff, g);
    ASSIGN_OR_RETURN(uint8_t* hid_buf,
                     QuantizeActs(c, Scratch::kExpertHiddenAct, g, total, ff, isa, hid_acts));
    for (int i = 0; i < ne; ++i) down_prods[i].act_buf = hid_buf;
    if (shared) {
      SwiGlu(gs, us, n * ffs, gs);
      ASSIGN_OR_RETURN(uint8_t* sh_buf,
                       QuantizeActs(c, Scratch::kSharedAct, gs, n, ffs, isa, shared_acts));
      down_prods[ne].act_buf = sh_buf;
    }
    auto t3 = std::chrono::steady_clock::now();
    RunProducts(c, down_prods.data(), n_down);
    if (profile) {
      auto t4 = std::chrono::steady_clock::now();
      uint64_t bytes = 0;
      for (const WeightHandle& hd : h) bytes += hd.view().bytes;
      auto sec = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
      AddKernelProfile(kProfileQuantizeAct, sec(t0, t1) + sec(t2, t3), 0);
      AddKernelProfile(static_cast<int>(h[0].view().type), sec(t1, t2) + sec(t3, t4), bytes);
    }
  } else {
    // A type without a dot kernel: MatMul's own fallback, expert by expert.
    for (int i = 0; i < ne; ++i) {
      const int e = r.experts[i];
      const int64_t row0 = r.offset[e] - p0, m = r.offset[e + 1] - r.offset[e];
      MatMul(h[3 * i].view(), xg + row0 * d, m, g + row0 * ff, *c.pool);
      MatMul(h[3 * i + 1].view(), xg + row0 * d, m, u + row0 * ff, *c.pool);
      SwiGlu(g + row0 * ff, u + row0 * ff, m * ff, g + row0 * ff);
      MatMul(h[3 * i + 2].view(), g + row0 * ff, m, out + row0 * d, *c.pool);
    }
    if (shared) {
      MatMul(h[hs].view(), xn, n, gs, *c.pool);
      MatMul(h[hs + 1].view(), xn, n, us, *c.pool);
      SwiGlu(gs, us, n * ffs, gs);
      MatMul(h[hs + 2].view(), gs, n, shared_out, *c.pool);
      if (shared_gate) MatMul(h[hs + 3].view(), xn, n, sg, *c.pool);
    }
  }
  if (shared_gate) {
    // qwen2moe: the shared expert's output is scaled by sigmoid(w . x) per token.
    for (int64_t t = 0; t < n; ++t) {
      const float s = Sigmoid(sg[t]);
      for (int64_t i = 0; i < d; ++i) shared_out[t * d + i] *= s;
    }
  }

  // Weighted sum in expert order, as the expert-by-expert path adds.
  for (int64_t p = 0; p < total; ++p) {
    float* a = acc + static_cast<int64_t>(r.tokens[p0 + p]) * d;
    const float wt = r.weights[p0 + p];
    const float* o = out + p * d;
    for (int64_t k = 0; k < d; ++k) a[k] += wt * o[k];
  }
  return Status::Ok();
}

Status RunOneByOne(ForwardContext& c, int il, const LayerWeights& w, const float* xn,
                   const ExpertRouting& r, float* acc) {
  const int64_t d = c.hp->n_embd, n = c.n;
  ASSIGN_OR_RETURN(float* xg, c.scratch->Get(Scratch::kGathered, n * d));
  ASSIGN_OR_RETURN(float* out, c.scratch->Get(Scratch::kExpertOut, n * d));
  for (int i = 0; i < r.n_experts; ++i) {
    const int e = r.experts[i];
    const int32_t* toks = r.tokens + r.offset[e];
    const float* wts = r.weights + r.offset[e];
    const int64_t m = r.offset[e + 1] - r.offset[e];
    OpScope op(c.source, OpIdMoeExpert(il, e));
    for (int64_t j = 0; j < m; ++j)
      std::memcpy(xg + j * d, xn + static_cast<int64_t>(toks[j]) * d, static_cast<size_t>(d) * 4);
    RETURN_IF_ERROR(SwiGluMlp(c, w.gate_exps, w.up_exps, w.down_exps, xg, m, out, e));
    for (int64_t j = 0; j < m; ++j) {
      float* a = acc + static_cast<int64_t>(toks[j]) * d;
      const float wt = wts[j];
      for (int64_t k = 0; k < d; ++k) a[k] += wt * out[j * d + k];
    }
  }
  return Status::Ok();
}

}  // namespace

int64_t SetBatchedExpertMaxTokens(int64_t n) { return std::exchange(g_batched_max_tokens, n); }

Status RunExperts(ForwardContext& c, int il, const LayerWeights& w, const float* xn,
                  const ExpertRouting& r, float* acc, float* shared_out, bool* shared_done) {
  *shared_done = false;
  if (r.n_experts > 0 && c.n <= g_batched_max_tokens) {
    const bool shared = w.gate_shexp != kNoTensor;
    RETURN_IF_ERROR(RunBatched(c, il, w, xn, r, acc, shared ? shared_out : nullptr));
    *shared_done = shared;
    return Status::Ok();
  }
  return RunOneByOne(c, il, w, xn, r, acc);
}

}  // namespace substrate
