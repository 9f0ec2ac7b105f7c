// The compute backend: the ops a forward pass needs and the memory they work on. model/ says
// what to compute, in the order it wants it; a Backend computes it. CpuBackend (backend/cpu/)
// runs the SIMD kernels of kernels/; a GPU backend implements the same interface over device
// memory and a stream, so adding one changes nothing in model/.
//
// Contract, for every implementation:
//  - Activations are Tensors: dense float32 matrices [rows, cols], row-major, in memory the
//    backend allocated (Allocate). The host never reads or writes a Tensor's bytes; results
//    reach it only through Download and Route, which wait for the ops issued before them.
//  - Ops run in issue order on one stream and may be asynchronous. Host arrays passed to an op
//    (token ids, positions, row lists, weights of a routing) may be reused once it returns.
//  - Weights arrive as WeightViews from the WeightSource, at the tier the op runs at (residual
//    tiers included): host memory valid for the duration of the call. A backend whose memory is
//    not the host's uploads (or finds its own copy of) the bytes before returning.
//  - Errors are programmer errors only (shapes are validated by the model before it calls):
//    ops do not fail, except Allocate, which reports OutOfMemory from the ledger.
//  - Not thread-safe: one forward pass issues ops at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "backend/buffer.h"
#include "backend/types.h"
#include "core/status.h"
#include "quant/weight_view.h"

namespace substrate {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // ---- memory ----
  // `bytes` of backend memory (zeroed), charged to `account` of the backend's ledger.
  virtual Expected<Buffer> Allocate(size_t bytes, const std::string& account) = 0;
  // Copies the tensor's values to host memory (waits for the ops before it).
  virtual void Download(const Tensor& src, float* host) = 0;
  // Copies host values into the tensor.
  virtual void Upload(const float* host, const Tensor& dst) = 0;
  // Waits for every op issued so far.
  virtual void Synchronize() {}
  // A resident matrix's bytes (a 2-D tensor, or one expert's slice of a 3-D one), once, before
  // any op reads them: the backend may rearrange them in place into the layout its kernels read
  // fastest (the same bytes: no second copy) and returns the layout the views of this tensor
  // must carry. Default: kept as they are. The bytes must lie on whole pages that hold nothing
  // else (AlignedBuffer's): a GPU under a budget pins those pages to read them in place, and
  // memory sharing a page with them would be pinned too.
  virtual WeightLayout AdoptResidentWeight(DType type, int64_t rows, int64_t cols,
                                           uint8_t* bytes) {
    return WeightLayout::kRows;
  }
  // The same for a matrix just read into a host buffer that is reused (an expert cache's slot),
  // each time it is read. On a reading thread (`reading_thread`) it runs while ops run and must
  // not use the backend's compute threads or memory; otherwise the thread that runs the ops
  // calls it between them, before the matrix's first product, and it may. Default: kept as
  // they are.
  virtual WeightLayout AdoptStreamedWeight(DType type, int64_t rows, int64_t cols, uint8_t* bytes,
                                           bool reading_thread) {
    return WeightLayout::kRows;
  }
  // The layout the two calls above give a matrix of this type and shape: one stored in it
  // already (a store packed in the CPU's layout) is handed over as it is, any other layout is
  // put back into rows first. Default: kRows.
  virtual WeightLayout AdoptedLayout(DType type, int64_t rows, int64_t cols) const {
    return WeightLayout::kRows;
  }
  // A resident tensor's bytes that stay as they are (vectors: whatever is neither a matrix nor
  // a stack of expert matrices), once: a backend with memory of its own may keep a copy, so
  // that views into them need no upload per op. The bytes must stay valid and unchanged while
  // the backend lives.
  virtual void AdoptResidentBytes(const uint8_t* bytes, uint64_t size) {}

  // ---- device information (benchmarks) ----
  // Read bandwidth of the backend's own memory measured now over a `bytes` buffer (bytes/s);
  // nullopt when its memory is the host's (kernels/membw.h measures that).
  virtual std::optional<double> MeasureReadBandwidth(uint64_t bytes) { return std::nullopt; }
  // The ledger the backend's own memory is charged to when it is not the host's, else null.
  virtual const MemoryLedger* device_ledger() const { return nullptr; }
  // Host-to-device copy bandwidth measured now (bytes/s) over up to `bytes` from pinned host
  // memory; nullopt for a backend that computes in host memory.
  virtual std::optional<double> MeasureUploadBandwidth(uint64_t bytes) { return std::nullopt; }
  // Weight bytes ops have read from host memory over the link to the backend's device so far
  // (views it does not hold: a device memory budget, streamed residuals), copied to it or read
  // in place; 0 for a backend that computes in host memory. Waits for the ops issued so far.
  virtual uint64_t host_link_bytes() { return 0; }
  // Weight bytes of views the device does not hold that the backend computed on the host's CPU,
  // where they lie, instead of reading them over the link (a GPU's hybrid); not in
  // host_link_bytes. 0 for a backend that computes in host memory.
  virtual uint64_t host_compute_bytes() { return 0; }

  // ---- weights ----
  // out[t] = row ids[t] of `table` (an embedding lookup), for t < n.
  virtual void EmbedRows(const WeightView& table, const int32_t* ids, int64_t n,
                         const Tensor& out) = 0;
  // y [n, w.rows] = x [n, w.cols] . W^T, with W the skeleton plus the view's residuals.
  virtual void MatMul(const WeightView& w, const Tensor& x, const Tensor& y) = 0;
  // Several independent products in one dispatch; each y gets exactly MatMul's values.
  virtual void MatMulBatch(const MatMulOp* ops, int n_ops) = 0;
  // y = x / rms(x) * w per row of width x.cols (w: a vector of x.cols elements, any type);
  // x and y may be the same tensor.
  virtual void RmsNorm(const Tensor& x, const WeightView& w, float eps, const Tensor& y) = 0;
  // y[t, :] += b for every row (b: a vector of y.cols elements, any type).
  virtual void AddBias(const Tensor& y, const WeightView& b) = 0;

  // ---- elementwise ----
  virtual void Fill(const Tensor& y, float value) = 0;
  // y += x (same shape).
  virtual void Add(const Tensor& y, const Tensor& x) = 0;
  // out = silu(gate) * up (same shapes; out may be gate or up).
  virtual void SwiGlu(const Tensor& gate, const Tensor& up, const Tensor& out) = 0;
  // y[t, :] *= sigmoid(g[t, 0]) (g: [y.rows, 1]).
  virtual void ScaleRowsBySigmoid(const Tensor& y, const Tensor& g) = 0;
  // dst[t, dst_col + i] = src[t, src_col + i] for i < n_cols, every row.
  virtual void CopyColumns(const Tensor& src, int64_t src_col, const Tensor& dst,
                           int64_t dst_col, int64_t n_cols) = 0;
  // Rotates dims [head_offset, head_offset + p.n_rot) of each of n_heads heads (head_dim
  // apart) of every row t, at position pos[t] (host array of x.rows positions).
  virtual void Rope(const Tensor& x, int n_heads, int head_dim, int head_offset,
                    const int32_t* pos, const RopeParams& p) = 0;
  // False when any element of x, or of `also` when given, is NaN or infinite (waits for the ops
  // before it; both tensors in one wait: a device backend's round trip is what a check costs).
  virtual bool AllFinite(const Tensor& x, const Tensor* also = nullptr) = 0;

  // ---- attention ----
  // Stores key rows k [n, k_stride] and value rows v [n, v_stride] at positions pos0.. of one
  // layer of the cache (converting to the cache's element type).
  virtual void StoreKv(const KvLayer& kv, int64_t pos0, const Tensor& k, const Tensor& v) = 0;
  // MLA: for every token, per head h, key = [kvb[h][0, nope), rope_key] and value =
  // kvb[h][nope, nope + dv), with kvb [n, n_head * (nope + dv)] and the shared rope key at
  // columns [rope_col, rope_col + rot) of `latent`; stored like StoreKv.
  virtual void StoreMlaKv(const KvLayer& kv, int64_t pos0, const Tensor& kvb,
                          const Tensor& latent, int64_t rope_col, const MlaShape& s) = 0;
  // Causal attention of q [n, n_head * dk] (token t at position pos0 + t) over cache rows
  // [0, pos0 + t]; out [n, n_head * dv].
  virtual void Attention(const AttentionShape& s, const Tensor& q, const KvLayer& kv,
                         int64_t pos0, const Tensor& out) = 0;

  // ---- mixture of experts ----
  // Top-k routing of every row of router logits [n, E]: expert ids sel [n, k] and weights
  // [n, k] in host memory (waits for the ops before it). bias: the selection bias (deepseek-v3)
  // or nullptr.
  virtual void Route(const Tensor& logits, const WeightView* bias, const RoutingParams& p,
                     int32_t* sel, float* weight) = 0;
  // The routed experts of a MoE layer without the host: routing (as Route chooses, weights
  // within float rounding) and every chosen expert's SwiGLU MLP, summed into op.acc. Returns
  // false, having issued nothing, when the backend does not do this for these weights (the
  // caller then routes with Route and runs the experts itself). A backend whose memory is not
  // the host's does it when every expert is adopted (AdoptResidentWeight): a decode step then
  // never waits for the host between layers.
  virtual bool RoutedExperts(const RoutedExpertsOp& op) { return false; }
  // dst[i] = src[rows[i]] for i < n (rows: host array).
  virtual void GatherRows(const Tensor& src, const int32_t* rows, int64_t n,
                          const Tensor& dst) = 0;
  // dst[rows[i]] += weight[i] * src[i], for i = 0, 1, ... n - 1 in that order.
  virtual void ScatterAddRows(const Tensor& src, const int32_t* rows, const float* weight,
                              int64_t n, const Tensor& dst) = 0;
};

}  // namespace substrate
