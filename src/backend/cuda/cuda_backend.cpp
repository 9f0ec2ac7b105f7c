// CudaBackend: see cuda_backend.h for what it promises. The parts, in the order an op meets them:
//  - weights: adopted_ maps each adopted tensor's host range to its device copy; a view's parts
//    (skeleton, residuals) are found there by address, or uploaded into `staging_` for the op;
//  - host arrays an op reads (token ids, positions, row lists): copied into a pinned argument
//    arena, mirrored on the device by one copy at the next flush; kernels read them there;
//  - work memory (quantized activations, attention partials): a bump area reset at each
//    host wait; quantized activations are cached until their tensor is written again;
//  - the op itself: a record (launch function, parameter block) appended to recs_; consecutive
//    products that read the same activations are merged into one launch;
//  - Flush issues the records (or replays the graph captured for an identical run).
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cublas_loader.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "kernels/matmul.h"
#include "kernels/routing.h"

namespace substrate {
namespace cuda {

[[noreturn]] void FatalError(const std::string& what) {
  std::fprintf(stderr, "substrate: CUDA backend: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace cuda

namespace {

using namespace cuda;
#define CK SUBSTRATE_CUDA_CHECK

constexpr size_t kRecBytes = 768;
constexpr int kMinGraphRecs = 8;
constexpr int64_t kGemmMinTokens = 65;      // from this many tokens: dequantize + cuBLAS
constexpr size_t kArenaBytes = 4u << 20;
constexpr size_t kWorkBytes = 64u << 20;
constexpr size_t kGemmTmpBytes = 256u << 20;
constexpr size_t kCublasWorkspace = 32u << 20;
constexpr int kCounterCells = 1 << 16;
constexpr size_t kMaxGraphs = 512;

size_t Align(size_t v, size_t a) { return (v + a - 1) / a * a; }

// A device copy of some part of a view: its address and how its rows are laid out.
struct DevPart {
  int type = 0;
  const uint8_t* w = nullptr;
  int64_t row_bytes = 0;
};

bool Overlap(const void* a, size_t an, const void* b, size_t bn) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bn && y < x + an;
}

struct Rec {
  LaunchFn fn = nullptr;
  uint32_t size = 0;
  alignas(16) unsigned char p[kRecBytes];
};

// The ledger of each device's memory: one per device for the whole process (buffers may be
// released after their backend).
MemoryLedger* DeviceLedger(int device) {
  static std::map<int, MemoryLedger*>* ledgers = new std::map<int, MemoryLedger*>();
  MemoryLedger*& l = (*ledgers)[device];
  if (!l) l = new MemoryLedger();
  return l;
}

void SetParts(DequantParams* p, const DevPart* parts, int n) {
  p->n_parts = n;
  for (int k = 0; k < n; ++k) {  // fields one by one: padding stays zero
    p->parts[k].type = parts[k].type;
    p->parts[k].w = parts[k].w;
    p->parts[k].row_bytes = parts[k].row_bytes;
  }
}

// A launch's name in profiles: its kernel, and for products the type, path and tokens.
std::string LaunchName(const Rec& r) {
  static const std::pair<LaunchFn, const char*> kNames[] = {
      {&LaunchGemv, "gemv"}, {&LaunchQuantizeQ8, "quantize_q8"}, {&LaunchDequant, "dequant"},
      {&LaunchToHalf, "to_half"}, {&LaunchScaleRows, "scale_rows"}, {&LaunchRmsNorm, "rms_norm"},
      {&LaunchElementwise, "elementwise"}, {&LaunchCopyColumns, "copy_columns"},
      {&LaunchRope, "rope"}, {&LaunchStoreKv, "store_kv"}, {&LaunchStoreMlaKv, "store_mla_kv"},
      {&LaunchAttention, "attention"}, {&LaunchGather, "gather"},
      {&LaunchScatterAdd, "scatter_add"}, {&LaunchGemm, "cublas_gemm"}};
  std::string name = "?";
  for (const auto& [fn, n] : kNames)
    if (fn == r.fn) name = n;
  if (r.fn == &LaunchGemv) {
    const auto* g = reinterpret_cast<const GemvParams*>(r.p);
    name += std::string(" ") + DTypeName(static_cast<DType>(g->type)) + (g->fast ? " int8" : " float") +
            " nt" + std::to_string(g->nt) + " jobs" + std::to_string(g->n_jobs);
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

class CudaBackend;

// Buffer's free context: outlives the backend (a buffer freed after it goes straight to cudaFree).
struct FreeContext {
  CudaBackend* backend = nullptr;
  int device = 0;
};
void FreeDeviceBuffer(void* ctx, void* data);


class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& o) : opt_(o), ledger_(DeviceLedger(o.device)) {}
  ~CudaBackend() override;
  Status Init();

  const char* name() const override { return "cuda"; }

  Expected<Buffer> Allocate(size_t bytes, const std::string& account) override;
  void Download(const Tensor& src, float* host) override;
  void Upload(const float* host, const Tensor& dst) override;
  void Synchronize() override { Sync(); }
  WeightLayout AdoptResidentWeight(DType type, int64_t rows, int64_t cols,
                                   uint8_t* bytes) override;
  void AdoptResidentBytes(const uint8_t* bytes, uint64_t size) override { Adopt(bytes, size); }
  std::optional<double> MeasureReadBandwidth(uint64_t bytes) override;
  const MemoryLedger* device_ledger() const override { return ledger_; }

  void EmbedRows(const WeightView& table, const int32_t* ids, int64_t n,
                 const Tensor& out) override;
  void MatMul(const WeightView& w, const Tensor& x, const Tensor& y) override;
  void MatMulBatch(const MatMulOp* ops, int n_ops) override;
  void RmsNorm(const Tensor& x, const WeightView& w, float eps, const Tensor& y) override;
  void AddBias(const Tensor& y, const WeightView& b) override;

  void Fill(const Tensor& y, float value) override;
  void Add(const Tensor& y, const Tensor& x) override;
  void SwiGlu(const Tensor& gate, const Tensor& up, const Tensor& out) override;
  void ScaleRowsBySigmoid(const Tensor& y, const Tensor& g) override;
  void CopyColumns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col,
                   int64_t n_cols) override;
  void Rope(const Tensor& x, int n_heads, int head_dim, int head_offset, const int32_t* pos,
            const RopeParams& p) override;
  bool AllFinite(const Tensor& x) override;

  void StoreKv(const KvLayer& kv, int64_t pos0, const Tensor& k, const Tensor& v) override;
  void StoreMlaKv(const KvLayer& kv, int64_t pos0, const Tensor& kvb, const Tensor& latent,
                  int64_t rope_col, const MlaShape& s) override;
  void Attention(const AttentionShape& s, const Tensor& q, const KvLayer& kv, int64_t pos0,
                 const Tensor& out) override;

  void Route(const Tensor& logits, const WeightView* bias, const RoutingParams& p, int32_t* sel,
             float* weight) override;
  void GatherRows(const Tensor& src, const int32_t* rows, int64_t n, const Tensor& dst) override;
  void ScatterAddRows(const Tensor& src, const int32_t* rows, const float* weight, int64_t n,
                      const Tensor& dst) override;

  void FreeDevice(void* data);

 private:
  // ---- recording ----
  template <typename P>
  P* Add(LaunchFn fn) {
    static_assert(sizeof(P) <= kRecBytes, "parameter block too large");
    if (n_recs_ == recs_.size()) recs_.emplace_back();
    Rec& r = recs_[n_recs_++];
    r.fn = fn;
    r.size = static_cast<uint32_t>(Align(sizeof(P), 8));
    std::memset(r.p, 0, r.size);
    return reinterpret_cast<P*>(r.p);
  }
  void Flush();
  void Issue(size_t copy_off, size_t copy_len);
  void Sync();
  uint64_t HashRecs(size_t copy_off, size_t copy_len) const;
  void DropGraphs();

  // ---- argument arena (pinned host, mirrored on device) ----
  enum ArgTag { kIds, kPos, kPos0, kRows, kWeights };
  void EnsureArgs(size_t bytes);
  const void* Args(const void* host, size_t bytes, ArgTag tag);
  const int64_t* Pos0(int64_t pos0) { return static_cast<const int64_t*>(Args(&pos0, 8, kPos0)); }

  // ---- work memory ----
  void EnsureWork(size_t bytes);
  void* Carve(size_t bytes);
  struct ActEntry {
    bool half = false;
    const float* x = nullptr;
    int64_t rows = 0, cols = 0;
    void* data = nullptr;    // int8 or half
    void* scales = nullptr;  // float2 per 32 (q8) or float per row (half)
  };
  // The cached conversion of x, or false.
  bool FindAct(const Tensor& x, bool half, void** data, void** scales) const;
  // Quantizes (or converts to half) rows of x, recording the launch; work must be ensured.
  void ConvertAct(const Tensor& x, bool half, void** data, void** scales);
  void Wrote(const Tensor& t) { Wrote(t.data, static_cast<size_t>(t.size()) * 4); }
  void Wrote(const void* p, size_t bytes);

  // ---- weights ----
  void Adopt(const uint8_t* host, uint64_t size);
  const uint8_t* FindAdopted(const uint8_t* host, uint64_t bytes) const;
  uint64_t StagingBytes(const WeightView& v) const;
  // Device parts of v (skeleton, then residuals); uploads non-adopted ones (staging must be
  // ensured). Returns the count.
  int Parts(const WeightView& v, DevPart* out);
  void EnsureStaging(uint64_t bytes);
  bool FinishStaged();  // after an op that staged: issue it now (the staging buffer is reused)
  const float* VectorOf(const WeightView& w, int64_t n);  // work ensured for n floats

  void RecordGemm(const MatMulOp& op, const DevPart* parts, int n_parts);
  // Whether a product goes to cuBLAS (when it loads): enough tokens to pay for dequantizing.
  static bool UseGemm(const MatMulOp& op) { return op.x.rows >= kGemmMinTokens; }
  void AddGemvJob(int type, bool fast, const Tensor& x, const void* xq, const float2* xs,
                  const Tensor& y, const DevPart& part, bool accumulate);
  void SetDevice() const { CK(cudaSetDevice(opt_.device)); }

  CudaBackendOptions opt_;
  MemoryLedger* ledger_;
  FreeContext* free_ctx_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int sm_count_ = 0;
  std::vector<LedgerCharge> own_charges_;

  std::vector<Rec> recs_;
  size_t n_recs_ = 0;
  bool uncapturable_ = false;

  uint8_t* harena_ = nullptr;
  uint8_t* darena_ = nullptr;
  size_t arena_size_ = 0, arena_off_ = 0, arena_copied_ = 0;
  struct Memo { int tag = -1; size_t bytes = 0, off = 0; };
  Memo memo_[4];
  int memo_next_ = 0;

  uint8_t* work_ = nullptr;
  size_t work_size_ = 0, work_off_ = 0;
  LedgerCharge work_charge_;
  std::vector<ActEntry> acts_;

  struct Region {
    uint64_t size = 0;
    uint8_t* dev = nullptr;
    LedgerCharge charge;
  };
  std::map<const uint8_t*, Region> adopted_;
  bool warned_adopt_ = false;
  uint8_t* staging_ = nullptr;
  uint64_t staging_size_ = 0, staging_off_ = 0;
  LedgerCharge staging_charge_;
  bool staged_ = false;

  uint32_t* counters_ = nullptr;
  int* flag_dev_ = nullptr;
  int* flag_host_ = nullptr;
  int attn_smem_allowed_ = 48 * 1024;

  const CublasApi* cublas_ = nullptr;
  cublasHandle_t cublas_handle_ = nullptr;
  void* gemm_tmp_ = nullptr;
  LedgerCharge gemm_charge_;
  bool gemm_ready_ = false;

  // SUBSTRATE_CUDA_PROFILE=1: no graphs; each launch timed with events, a table by kernel
  // printed to stderr when the backend closes.
  void ProfileCollect();
  void ProfilePrint();
  bool profile_ = false;
  struct Timed {
    std::string name;
    cudaEvent_t a, b;
  };
  std::vector<Timed> timed_;
  std::vector<cudaEvent_t> event_pool_;
  std::map<std::string, std::vector<float>> profile_table_;  // name -> each call's ms

  struct Graph {
    std::vector<Rec> recs;
    size_t copy_off = 0, copy_len = 0;
    cudaGraphExec_t exec = nullptr;
  };
  std::unordered_map<uint64_t, Graph> graphs_;
  std::unordered_map<uint64_t, int> seen_;
  std::vector<float> host_tmp_;
};

void FreeDeviceBuffer(void* ctx, void* data) {
  auto* c = static_cast<FreeContext*>(ctx);
  if (c->backend) {
    c->backend->FreeDevice(data);
  } else {
    cudaSetDevice(c->device);
    cudaFree(data);
  }
}

Status CudaBackend::Init() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    return InvalidArgument("--device cuda: no CUDA device (driver missing or no GPU)");
  if (opt_.device < 0 || opt_.device >= count)
    return InvalidArgument("--gpu " + std::to_string(opt_.device) + ": the machine has " +
                           std::to_string(count) + " CUDA device(s)");
  SetDevice();
  // SUBSTRATE_CUDA_GRAPHS=0 issues every op run one launch at a time (A/B measurements).
  if (const char* g = std::getenv("SUBSTRATE_CUDA_GRAPHS"); g && std::string(g) == "0")
    opt_.graphs = false;
  if (const char* g = std::getenv("SUBSTRATE_CUDA_PROFILE"); g && std::string(g) == "1") {
    profile_ = true;
    opt_.graphs = false;
  }
  recs_.reserve(4096);
  (void)PdlEnabled();  // decided now: it queries the device, which a graph capture must not
  CK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, opt_.device));
  free_ctx_ = new FreeContext{this, opt_.device};  // leaked on purpose: see FreeContext
  auto charge = [&](size_t bytes) -> Status {
    ASSIGN_OR_RETURN(LedgerCharge c, ledger_->Charge("backend", bytes));
    own_charges_.push_back(std::move(c));
    return Status::Ok();
  };
  arena_size_ = kArenaBytes;
  CK(cudaHostAlloc(&harena_, arena_size_, cudaHostAllocDefault));
  CK(cudaMalloc(&darena_, arena_size_));
  RETURN_IF_ERROR(charge(arena_size_));
  CK(cudaMalloc(&counters_, kCounterCells * sizeof(uint32_t)));
  CK(cudaMemset(counters_, 0, kCounterCells * sizeof(uint32_t)));
  CK(cudaMalloc(&flag_dev_, sizeof(int)));
  CK(cudaHostAlloc(&flag_host_, sizeof(int), cudaHostAllocDefault));
  RETURN_IF_ERROR(charge(kCounterCells * sizeof(uint32_t) + 256));
  ASSIGN_OR_RETURN(work_charge_, ledger_->Charge("backend", kWorkBytes));
  work_size_ = kWorkBytes;
  CK(cudaMalloc(&work_, work_size_));
  return Status::Ok();
}

CudaBackend::~CudaBackend() {
  if (!stream_) return;
  SetDevice();
  Sync();
  if (profile_) ProfilePrint();
  DropGraphs();
  if (free_ctx_) free_ctx_->backend = nullptr;
  for (auto& [host, r] : adopted_) cudaFree(r.dev);
  adopted_.clear();
  if (cublas_handle_) cublas_->destroy(cublas_handle_);
  cudaFree(gemm_tmp_);
  cudaFree(staging_);
  cudaFree(work_);
  cudaFree(darena_);
  cudaFreeHost(harena_);
  cudaFree(counters_);
  cudaFree(flag_dev_);
  cudaFreeHost(flag_host_);
  cudaStreamDestroy(stream_);
}

// ---------------------------------------------------------------- memory

Expected<Buffer> CudaBackend::Allocate(size_t bytes, const std::string& account) {
  SetDevice();
  ASSIGN_OR_RETURN(LedgerCharge charge, ledger_->Charge(account, bytes));
  void* p = nullptr;
  if (cudaMalloc(&p, std::max<size_t>(bytes, 256)) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free allocation error
    return OutOfMemory("cuda: allocating " + FormatBytes(bytes) + " of device memory for '" +
                       account + "'");
  }
  // Zeroed, in stream order: no op recorded before this can use the new memory.
  CK(cudaMemsetAsync(p, 0, std::max<size_t>(bytes, 256), stream_));
  return Buffer(p, bytes, std::move(charge), &FreeDeviceBuffer, free_ctx_);
}

void CudaBackend::FreeDevice(void* data) {
  SetDevice();
  Sync();  // recorded ops may still read it
  // Graphs and cached conversions name addresses that a later allocation may reuse.
  DropGraphs();
  acts_.clear();
  CK(cudaFree(data));
}

void CudaBackend::Download(const Tensor& src, float* host) {
  Flush();
  CK(cudaMemcpyAsync(host, src.data, static_cast<size_t>(src.size()) * 4, cudaMemcpyDeviceToHost,
                     stream_));
  Sync();
}

void CudaBackend::Upload(const float* host, const Tensor& dst) {
  Flush();  // ops recorded before may read dst's old values
  SetDevice();
  CK(cudaMemcpyAsync(dst.data, host, static_cast<size_t>(dst.size()) * 4, cudaMemcpyHostToDevice,
                     stream_));
  Wrote(dst);
}

WeightLayout CudaBackend::AdoptResidentWeight(DType type, int64_t rows, int64_t cols,
                                              uint8_t* bytes) {
  const auto rb = RowBytes(type, static_cast<uint64_t>(cols));
  if (rb) Adopt(bytes, *rb * static_cast<uint64_t>(rows));
  return WeightLayout::kRows;
}

void CudaBackend::Adopt(const uint8_t* host, uint64_t size) {
  if (size == 0 || adopted_.count(host)) return;
  SetDevice();
  auto charge = ledger_->Charge("weights", size);
  uint8_t* dev = nullptr;
  if (!charge.ok() || cudaMalloc(&dev, size) != cudaSuccess) {
    cudaGetLastError();
    if (!warned_adopt_)
      std::fprintf(stderr,
                   "substrate: cuda: device memory full; weights past this point are uploaded "
                   "for each op that reads them\n");
    warned_adopt_ = true;
    return;
  }
  CK(cudaMemcpy(dev, host, size, cudaMemcpyHostToDevice));
  Region& r = adopted_[host];
  r.size = size;
  r.dev = dev;
  r.charge = std::move(charge).value();
}

const uint8_t* CudaBackend::FindAdopted(const uint8_t* host, uint64_t bytes) const {
  auto it = adopted_.upper_bound(host);
  if (it == adopted_.begin()) return nullptr;
  --it;
  const uint8_t* begin = it->first;
  if (host >= begin && host + bytes <= begin + it->second.size) return it->second.dev + (host - begin);
  return nullptr;
}

uint64_t CudaBackend::StagingBytes(const WeightView& v) const {
  uint64_t total = 0;
  const auto rb = RowBytes(v.type, static_cast<uint64_t>(v.cols));
  const uint64_t sk = rb ? *rb * static_cast<uint64_t>(v.rows) : v.bytes;
  if (!FindAdopted(v.data, sk)) total += Align(sk, 256);
  for (int k = 0; k < v.n_residuals; ++k) {
    const auto r = RowBytes(v.residual_type[k], static_cast<uint64_t>(v.cols));
    const uint64_t b = r ? *r * static_cast<uint64_t>(v.rows) : 0;
    if (!FindAdopted(v.residual[k], b)) total += Align(b, 256);
  }
  return total;
}

void CudaBackend::EnsureStaging(uint64_t bytes) {
  if (bytes == 0) return;
  if (staging_off_ + bytes <= staging_size_) return;
  Sync();  // the ops that read the old staging buffer
  staging_off_ = 0;
  if (bytes <= staging_size_) return;
  cudaFree(staging_);
  staging_charge_.Reset();
  staging_size_ = Align(std::max<uint64_t>(bytes, 64u << 20), 1u << 20);
  auto c = ledger_->Charge("staging", staging_size_);
  if (!c.ok()) FatalError(c.status().ToString());
  staging_charge_ = std::move(c).value();
  CK(cudaMalloc(&staging_, staging_size_));
}

int CudaBackend::Parts(const WeightView& v, DevPart* out) {
  if (v.layout != WeightLayout::kRows) FatalError("a weight layout this backend does not read");
  auto part = [&](DType type, const uint8_t* host, DevPart* p) {
    const auto rb = RowBytes(type, static_cast<uint64_t>(v.cols));
    if (!rb) FatalError(std::string("weight type ") + DTypeName(type) + " with rows of " +
                        std::to_string(v.cols));
    const uint64_t bytes = *rb * static_cast<uint64_t>(v.rows);
    p->type = static_cast<int>(type);
    p->row_bytes = static_cast<int64_t>(*rb);
    p->w = FindAdopted(host, bytes);
    if (!p->w) {
      if (staging_off_ + bytes > staging_size_) FatalError("staging not reserved");
      uint8_t* dst = staging_ + staging_off_;
      CK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
      staging_off_ += Align(bytes, 256);
      staged_ = true;
      p->w = dst;
    }
  };
  part(v.type, v.data, &out[0]);
  for (int k = 0; k < v.n_residuals; ++k) part(v.residual_type[k], v.residual[k], &out[k + 1]);
  return 1 + v.n_residuals;
}

bool CudaBackend::FinishStaged() {
  if (!staged_) return false;
  uncapturable_ = true;
  Flush();
  staging_off_ = 0;
  staged_ = false;
  return true;
}

// ---------------------------------------------------------------- arena and work memory

void CudaBackend::EnsureArgs(size_t bytes) {
  if (Align(arena_off_, 16) + bytes <= arena_size_) return;
  Sync();
  if (bytes <= arena_size_) return;
  DropGraphs();  // they copy from the old arena
  cudaFreeHost(harena_);
  cudaFree(darena_);
  arena_size_ = Align(bytes, 1u << 20);
  CK(cudaHostAlloc(&harena_, arena_size_, cudaHostAllocDefault));
  CK(cudaMalloc(&darena_, arena_size_));
}

const void* CudaBackend::Args(const void* host, size_t bytes, ArgTag tag) {
  for (const Memo& m : memo_) {
    if (m.tag == tag && m.bytes == bytes && std::memcmp(harena_ + m.off, host, bytes) == 0)
      return darena_ + m.off;
  }
  const size_t off = Align(arena_off_, 16);
  if (off + bytes > arena_size_) FatalError("argument arena not reserved");
  std::memcpy(harena_ + off, host, bytes);
  arena_off_ = off + bytes;
  memo_[memo_next_++ % 4] = {tag, bytes, off};
  return darena_ + off;
}

void CudaBackend::EnsureWork(size_t bytes) {
  bytes += 512;  // alignment of the pieces
  if (work_off_ + bytes <= work_size_) return;
  if (bytes <= work_size_) {
    // Wrap: ops recorded before read the old contents first (one stream), but cached
    // conversions there are gone.
    work_off_ = 0;
    acts_.clear();
    return;
  }
  Sync();
  DropGraphs();
  cudaFree(work_);
  work_charge_.Reset();
  work_size_ = Align(bytes * 2, 1u << 20);
  auto c = ledger_->Charge("backend", work_size_);
  if (!c.ok()) FatalError(c.status().ToString());
  work_charge_ = std::move(c).value();
  CK(cudaMalloc(&work_, work_size_));
  work_off_ = 0;
  acts_.clear();
}

void* CudaBackend::Carve(size_t bytes) {
  const size_t off = Align(work_off_, 256);
  if (off + bytes > work_size_) FatalError("work memory not reserved");
  work_off_ = off + bytes;
  return work_ + off;
}

bool CudaBackend::FindAct(const Tensor& x, bool half, void** data, void** scales) const {
  for (const ActEntry& e : acts_) {
    if (e.half != half || e.cols != x.cols || x.data < e.x ||
        x.data + x.size() > e.x + e.rows * e.cols || (x.data - e.x) % e.cols != 0)
      continue;
    const int64_t r = (x.data - e.x) / e.cols;
    if (half) {
      *data = static_cast<uint16_t*>(e.data) + r * e.cols;
      *scales = static_cast<float*>(e.scales) + r;
    } else {
      *data = static_cast<int8_t*>(e.data) + r * e.cols;
      *scales = static_cast<float2*>(e.scales) + r * (e.cols / 32);
    }
    return true;
  }
  return false;
}

void CudaBackend::ConvertAct(const Tensor& x, bool half, void** data, void** scales) {
  if (FindAct(x, half, data, scales)) return;
  ActEntry e;
  e.half = half;
  e.x = x.data;
  e.rows = x.rows;
  e.cols = x.cols;
  if (half) {
    e.data = Carve(static_cast<size_t>(x.size()) * 2);
    e.scales = Carve(static_cast<size_t>(x.rows) * 4);
    auto* p = Add<ToHalfParams>(&LaunchToHalf);
    *p = {x.data, x.rows, x.cols, e.data, static_cast<float*>(e.scales)};
  } else {
    e.data = Carve(static_cast<size_t>(x.size()));
    e.scales = Carve(static_cast<size_t>(x.size() / 32) * sizeof(float2));
    auto* q = static_cast<int8_t*>(e.data);
    auto* qs = static_cast<float2*>(e.scales);
    // The op that just wrote exactly x (a norm, SwiGLU) quantizes it as it writes it: one
    // launch less.
    Rec* last = n_recs_ > 0 ? &recs_[n_recs_ - 1] : nullptr;
    if (last && last->fn == &LaunchRmsNorm) {
      auto* n = reinterpret_cast<RmsNormParams*>(last->p);
      if (n->y == x.data && n->rows == x.rows && n->cols == x.cols && !n->xq) {
        n->xq = q;
        n->xs = qs;
        last = nullptr;
      }
    } else if (last && last->fn == &LaunchElementwise) {
      auto* el = reinterpret_cast<ElementwiseParams*>(last->p);
      if (el->kind == kSwiGlu && el->y == x.data && el->rows * el->cols == x.size() && !el->xq) {
        el->xq = q;
        el->xs = qs;
        last = nullptr;
      }
    }
    if (last || n_recs_ == 0) {
      auto* p = Add<QuantizeQ8Params>(&LaunchQuantizeQ8);
      *p = {x.data, x.rows, x.cols, q, qs};
    }
  }
  if (acts_.size() >= 16) acts_.erase(acts_.begin());
  acts_.push_back(e);
  *data = e.data;
  *scales = e.scales;
}

void CudaBackend::Wrote(const void* p, size_t bytes) {
  for (size_t i = 0; i < acts_.size();) {
    const ActEntry& e = acts_[i];
    if (Overlap(p, bytes, e.x, static_cast<size_t>(e.rows * e.cols) * 4)) {
      acts_.erase(acts_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

const float* CudaBackend::VectorOf(const WeightView& w, int64_t n) {
  if (w.type == DType::kF32 && w.n_residuals == 0) {
    if (const uint8_t* d = FindAdopted(w.data, static_cast<uint64_t>(n) * 4))
      return reinterpret_cast<const float*>(d);
  }
  DevPart parts[3];
  const int np = Parts(w, parts);
  float* out = static_cast<float*>(Carve(static_cast<size_t>(n) * 4));
  auto* p = Add<DequantParams>(&LaunchDequant);
  SetParts(p, parts, np);
  p->cols = w.cols;
  p->r0 = 0;
  p->n = w.rows;
  p->out = out;
  p->ldo = w.cols;
  return out;
}

// ---------------------------------------------------------------- flush and graphs

uint64_t CudaBackend::HashRecs(size_t copy_off, size_t copy_len) const {
  uint64_t h = 1469598103934665603ull ^ (copy_off * 31 + copy_len);
  auto mix = [&h](uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  };
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
  std::fprintf(stderr, "cuda profile (kernel time with events, graphs off): %.3f ms total\n", total);
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
  n_recs_ = 0;
  uncapturable_ = false;
}

void CudaBackend::Sync() {
  Flush();
  SetDevice();
  CK(cudaStreamSynchronize(stream_));
  if (profile_) ProfileCollect();
  arena_off_ = arena_copied_ = 0;
  for (Memo& m : memo_) m = Memo();
  work_off_ = 0;
  acts_.clear();
}

// ---------------------------------------------------------------- weights ops

void CudaBackend::EmbedRows(const WeightView& table, const int32_t* ids, int64_t n,
                            const Tensor& out) {
  EnsureStaging(StagingBytes(table));
  EnsureArgs(static_cast<size_t>(n) * 4 + 16);
  DevPart parts[3];
  const int np = Parts(table, parts);
  auto* p = Add<DequantParams>(&LaunchDequant);
  SetParts(p, parts, np);
  p->cols = table.cols;
  p->ids = static_cast<const int32_t*>(Args(ids, static_cast<size_t>(n) * 4, kIds));
  p->n = n;
  p->out = out.data;
  p->ldo = out.cols;
  Wrote(out);
  FinishStaged();
}

void CudaBackend::MatMul(const WeightView& w, const Tensor& x, const Tensor& y) {
  const MatMulOp op{&w, x, y};
  MatMulBatch(&op, 1);
}

void CudaBackend::AddGemvJob(int type, bool fast, const Tensor& x, const void* xq,
                             const float2* xs, const Tensor& y, const DevPart& part,
                             bool accumulate) {
  const int ntok = static_cast<int>(x.rows);
  const int nt = ntok == 1 ? 1 : ntok == 2 ? 2 : ntok <= 4 ? 4 : 8;
  GemvJob job;
  job.w = part.w;
  job.row_bytes = part.row_bytes;
  job.x = fast ? xq : static_cast<const void*>(x.data);
  job.xs = fast ? xs : nullptr;
  job.y = y.data;
  job.ldy = y.cols;
  job.rows = static_cast<int32_t>(y.cols);
  job.accumulate = accumulate ? 1 : 0;
  const size_t y_bytes = static_cast<size_t>(y.size()) * 4;
  const size_t x_bytes = static_cast<size_t>(x.size()) * 4;
  const int per_block = fast ? kGemvFastRowsPerBlock : kGemvRowsPerBlock;
  const int blocks = static_cast<int>((y.cols + per_block - 1) / per_block);
  // Join the previous launch when it is a product of the same kind and neither reads what the
  // other writes.
  if (n_recs_ > 0 && recs_[n_recs_ - 1].fn == &LaunchGemv) {
    auto* p = reinterpret_cast<GemvParams*>(recs_[n_recs_ - 1].p);
    bool ok = p->type == type && p->fast == (fast ? 1 : 0) && p->cols == x.cols &&
              p->ntok == ntok && p->n_jobs < kGemvMaxJobs;
    for (int j = 0; ok && j < p->n_jobs; ++j) {
      // Write after write, read after write, and (float inputs) write after read.
      const GemvJob& e = p->jobs[j];
      const size_t ey = static_cast<size_t>(ntok) * e.ldy * 4;
      ok = !Overlap(e.y, ey, y.data, y_bytes) && !Overlap(e.y, ey, x.data, x_bytes) &&
           (fast || !Overlap(e.x, x_bytes, y.data, y_bytes));
    }
    if (ok) {
      p->jobs[p->n_jobs] = job;
      p->block_start[p->n_jobs + 1] = p->block_start[p->n_jobs] + blocks;
      ++p->n_jobs;
      return;
    }
  }
  auto* p = Add<GemvParams>(&LaunchGemv);
  p->type = type;
  p->fast = fast ? 1 : 0;
  p->nt = nt;
  p->ntok = ntok;
  p->cols = x.cols;
  p->n_jobs = 1;
  p->block_start[0] = 0;
  p->block_start[1] = blocks;
  p->jobs[0] = job;
}

void CudaBackend::RecordGemm(const MatMulOp& op, const DevPart* parts, int n_parts) {
  const Tensor& x = op.x;
  const Tensor& y = op.y;
  const bool exact = parts[0].type == kTypeF32 || parts[0].type == kTypeF16 ||
                     parts[0].type == kTypeBF16;
  void* xh = nullptr;
  void* scales = nullptr;
  if (!exact) ConvertAct(x, true, &xh, &scales);
  const int64_t elem = exact ? 4 : 2;
  const int64_t rows = y.cols;
  // Rows per dequantized chunk: the temporary's size, and a launch's grid height.
  const int64_t chunk = std::max<int64_t>(
      1, std::min<int64_t>({rows, static_cast<int64_t>(kGemmTmpBytes) / (x.cols * elem), 65535}));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t m = std::min(chunk, rows - r0);
    auto* d = Add<DequantParams>(&LaunchDequant);
    d->out_half = exact ? 0 : 1;
    SetParts(d, parts, n_parts);
    d->cols = x.cols;
    d->r0 = r0;
    d->n = m;
    d->out = gemm_tmp_;
    d->ldo = x.cols;
    auto* g = Add<GemmParams>(&LaunchGemm);
    g->api = cublas_;
    g->handle = cublas_handle_;
    g->m = static_cast<int32_t>(m);
    g->n = static_cast<int32_t>(x.rows);
    g->k = static_cast<int32_t>(x.cols);
    g->half = exact ? 0 : 1;
    g->a = gemm_tmp_;
    g->b = exact ? static_cast<const void*>(x.data) : xh;
    g->c = y.data + r0;
    g->ldc = rows;
  }
  if (!exact) {
    auto* s = Add<ScaleRowsParams>(&LaunchScaleRows);
    *s = {y.data, y.rows, y.cols, y.cols, static_cast<const float*>(scales)};
  }
  uncapturable_ = true;  // cuBLAS picks its kernels per call
}

void CudaBackend::MatMulBatch(const MatMulOp* ops, int n_ops) {
  uint64_t stage = 0;
  size_t work = 0;
  bool any_gemm = false;
  for (int i = 0; i < n_ops; ++i) {
    const MatMulOp& op = ops[i];
    stage += StagingBytes(*op.w);
    const bool gemm = UseGemm(op) && LoadCublas();
    any_gemm |= gemm;
    // Worst case: the activations converted (int8 + scales, or half + row scales).
    work += gemm ? static_cast<size_t>(op.x.size()) * 2 + static_cast<size_t>(op.x.rows) * 4 + 512
                 : static_cast<size_t>(op.x.size()) + static_cast<size_t>(op.x.size() / 32 + 1) * 8 + 512;
  }
  if (any_gemm && !gemm_ready_) {
    SetDevice();
    cublas_ = LoadCublas();
    if (cublas_->create(&cublas_handle_) != CUBLAS_STATUS_SUCCESS) FatalError("cublasCreate failed");
    void* ws = nullptr;
    auto c = ledger_->Charge("scratch", kGemmTmpBytes + kCublasWorkspace);
    if (!c.ok()) FatalError(c.status().ToString());
    gemm_charge_ = std::move(c).value();
    CK(cudaMalloc(&gemm_tmp_, kGemmTmpBytes));
    CK(cudaMalloc(&ws, kCublasWorkspace));
    cublas_->set_workspace(cublas_handle_, ws, kCublasWorkspace);
    gemm_ready_ = true;
  }
  EnsureStaging(stage);
  EnsureWork(work);
  constexpr int kMaxParts = 3;
  thread_local std::vector<DevPart> parts;
  thread_local std::vector<int> n_parts;
  parts.resize(static_cast<size_t>(n_ops) * kMaxParts);
  n_parts.resize(static_cast<size_t>(n_ops));
  for (int i = 0; i < n_ops; ++i) n_parts[i] = Parts(*ops[i].w, &parts[static_cast<size_t>(i) * kMaxParts]);
  // Activations of the int8 products, quantized once per run of adjacent rows (the batched
  // experts' inputs are consecutive rows of one gathered tensor): one launch, not one per op.
  thread_local std::vector<Tensor> spans;
  spans.clear();
  for (int i = 0; i < n_ops; ++i) {
    const MatMulOp& op = ops[i];
    if (op.x.rows == 0 || (UseGemm(op) && cublas_)) continue;
    bool fast = false;
    for (int k = 0; k < n_parts[i]; ++k) {
      const DevPart& pt = parts[static_cast<size_t>(i) * kMaxParts + k];
      fast = fast || GemvFastType(pt.type, op.x.cols, pt.row_bytes, pt.w);
    }
    if (fast) spans.push_back(op.x);
  }
  std::sort(spans.begin(), spans.end(), [](const Tensor& a, const Tensor& b) {
    return a.data < b.data || (a.data == b.data && a.size() > b.size());
  });
  size_t n_spans = 0;
  for (const Tensor& t : spans) {
    Tensor& last = spans[n_spans > 0 ? n_spans - 1 : 0];
    if (n_spans > 0 && t.cols == last.cols && t.data >= last.data &&
        t.data <= last.data + last.size() && (t.data - last.data) % t.cols == 0) {
      const int64_t end = std::max<int64_t>((t.data - last.data) / t.cols + t.rows, last.rows);
      last.rows = end;
    } else {
      spans[n_spans++] = t;
    }
  }
  for (size_t i = 0; i < n_spans; ++i) {
    void* q = nullptr;
    void* qs = nullptr;
    ConvertAct(spans[i], false, &q, &qs);
  }
  // Skeletons first, then each residual tier (they add to what the skeleton wrote).
  for (int k = 0; k < kMaxParts; ++k) {
    for (int i = 0; i < n_ops; ++i) {
      const MatMulOp& op = ops[i];
      if (op.x.rows == 0 || k >= n_parts[i]) continue;
      const DevPart* pp = &parts[static_cast<size_t>(i) * kMaxParts];
      if (UseGemm(op) && cublas_) {
        if (k == 0) RecordGemm(op, pp, n_parts[i]);
        continue;
      }
      const DevPart& part = pp[k];
      const bool fast = GemvFastType(part.type, op.x.cols, part.row_bytes, part.w);
      void* xq = nullptr;
      void* xs = nullptr;
      if (fast) ConvertAct(op.x, false, &xq, &xs);
      AddGemvJob(part.type, fast, op.x, xq, static_cast<const float2*>(xs), op.y, part, k > 0);
    }
  }
  for (int i = 0; i < n_ops; ++i) Wrote(ops[i].y);
  FinishStaged();
}

void CudaBackend::RmsNorm(const Tensor& x, const WeightView& w, float eps, const Tensor& y) {
  EnsureStaging(StagingBytes(w));
  EnsureWork(static_cast<size_t>(x.cols) * 4);
  const float* v = VectorOf(w, x.cols);
  auto* p = Add<RmsNormParams>(&LaunchRmsNorm);  // fields one by one: padding stays zero
  p->x = x.data;
  p->y = y.data;
  p->w = v;
  p->rows = x.rows;
  p->cols = x.cols;
  p->eps = eps;
  Wrote(y);
  FinishStaged();
}

void CudaBackend::AddBias(const Tensor& y, const WeightView& b) {
  EnsureStaging(StagingBytes(b));
  EnsureWork(static_cast<size_t>(y.cols) * 4);
  const float* v = VectorOf(b, y.cols);
  auto* p = Add<ElementwiseParams>(&LaunchElementwise);
  p->kind = kAddBias;
  p->y = y.data;
  p->a = v;
  p->rows = y.rows;
  p->cols = y.cols;
  Wrote(y);
  FinishStaged();
}

// ---------------------------------------------------------------- elementwise

void CudaBackend::Fill(const Tensor& y, float value) {
  auto* p = Add<ElementwiseParams>(&LaunchElementwise);
  p->kind = kFill;
  p->value = value;
  p->y = y.data;
  p->rows = y.rows;
  p->cols = y.cols;
  Wrote(y);
}

void CudaBackend::Add(const Tensor& y, const Tensor& x) {
  // y += x right after the product that wrote x (an output projection, a down projection):
  // the product adds its result to y as it writes x.
  if (n_recs_ > 0 && recs_[n_recs_ - 1].fn == &LaunchGemv) {
    auto* g = reinterpret_cast<GemvParams*>(recs_[n_recs_ - 1].p);
    const size_t y_bytes = static_cast<size_t>(y.size()) * 4;
    int hit = -1;
    bool clear = true;
    for (int j = 0; j < g->n_jobs; ++j) {
      const GemvJob& e = g->jobs[j];
      const size_t ey = static_cast<size_t>(g->ntok) * e.ldy * 4;
      if (e.y == x.data && e.ldy == x.cols && g->ntok == x.rows && e.rows == x.cols &&
          !e.accumulate && !e.add_to)
        hit = j;
      clear = clear && !Overlap(e.y, ey, y.data, y_bytes) &&
              (g->fast || !Overlap(e.x, static_cast<size_t>(g->ntok * g->cols) * 4, y.data, y_bytes));
    }
    if (hit >= 0 && clear && y.rows == x.rows && y.cols == x.cols) {
      g->jobs[hit].add_to = y.data;
      Wrote(y);
      return;
    }
  }
  auto* p = Add<ElementwiseParams>(&LaunchElementwise);
  p->kind = kAdd;
  p->y = y.data;
  p->a = x.data;
  p->rows = y.rows;
  p->cols = y.cols;
  Wrote(y);
}

void CudaBackend::SwiGlu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  auto* p = Add<ElementwiseParams>(&LaunchElementwise);
  p->kind = kSwiGlu;
  p->y = out.data;
  p->a = gate.data;
  p->b = up.data;
  p->rows = out.rows;
  p->cols = out.cols;
  Wrote(out);
}

void CudaBackend::ScaleRowsBySigmoid(const Tensor& y, const Tensor& g) {
  auto* p = Add<ElementwiseParams>(&LaunchElementwise);
  p->kind = kScaleSigmoid;
  p->y = y.data;
  p->a = g.data;
  p->a_stride = g.cols;
  p->rows = y.rows;
  p->cols = y.cols;
  Wrote(y);
}

void CudaBackend::CopyColumns(const Tensor& src, int64_t src_col, const Tensor& dst,
                              int64_t dst_col, int64_t n_cols) {
  auto* p = Add<CopyColumnsParams>(&LaunchCopyColumns);
  *p = {src.data, dst.data, src.rows, src.cols, src_col, dst.cols, dst_col, n_cols};
  Wrote(dst);
}

namespace {

// YaRN's ramp bounds, in float as kernels/ops.cpp computes them.
float YarnCorrDim(int n_rot, int orig_ctx, float n_rotations, float base) {
  return n_rot * std::log(orig_ctx / (n_rotations * 2.0f * static_cast<float>(M_PI))) /
         (2.0f * std::log(base));
}

}  // namespace

void CudaBackend::Rope(const Tensor& x, int n_heads, int head_dim, int head_offset,
                       const int32_t* pos, const RopeParams& p) {
  EnsureArgs(static_cast<size_t>(x.rows) * 4 + 16);
  const auto* dpos = static_cast<const int32_t*>(Args(pos, static_cast<size_t>(x.rows) * 4, kPos));
  // q then k of one layer, alike: the second joins the first's launch.
  if (n_recs_ > 0 && recs_[n_recs_ - 1].fn == &LaunchRope) {
    auto* r = reinterpret_cast<RopeParamsDev*>(recs_[n_recs_ - 1].p);
    const bool yarn = p.yarn_factor > 0 && p.yarn_orig_ctx > 0;
    if (!r->x2 && r->pos == dpos && r->rows == x.rows && r->head_dim == head_dim &&
        r->n_rot == p.n_rot && r->neox == (p.style == RopeStyle::kNeox ? 1 : 0) &&
        r->freq_base == p.freq_base && r->freq_scale == p.freq_scale &&
        r->attn_factor == p.attn_factor && !r->yarn && !yarn && head_dim * n_heads == x.cols &&
        !Overlap(r->x, static_cast<size_t>(r->rows * r->n_heads * r->head_dim) * 4, x.data,
                 static_cast<size_t>(x.size()) * 4)) {
      r->x2 = x.data + head_offset;
      r->n_heads2 = n_heads;
      Wrote(x);
      return;
    }
  }
  auto* r = Add<RopeParamsDev>(&LaunchRope);
  r->x = x.data + head_offset;
  r->rows = x.rows;
  r->n_heads = n_heads;
  r->head_dim = head_dim;
  r->n_rot = p.n_rot;
  r->neox = p.style == RopeStyle::kNeox ? 1 : 0;
  r->pos = dpos;
  r->freq_base = p.freq_base;
  r->freq_scale = p.freq_scale;
  r->attn_factor = p.attn_factor;
  if (p.yarn_factor > 0 && p.yarn_orig_ctx > 0) {
    r->yarn = 1;
    r->yarn_factor = p.yarn_factor;
    r->corr_lo = std::max(0.0f, std::floor(YarnCorrDim(p.n_rot, p.yarn_orig_ctx, p.yarn_beta_fast,
                                                       p.freq_base)));
    r->corr_hi = std::min(static_cast<float>(p.n_rot - 1),
                          std::ceil(YarnCorrDim(p.n_rot, p.yarn_orig_ctx, p.yarn_beta_slow,
                                                p.freq_base)));
  }
  Wrote(x);
}

bool CudaBackend::AllFinite(const Tensor& x) {
  Flush();
  AllFiniteAsync(x.data, x.size(), flag_dev_, stream_);
  CK(cudaMemcpyAsync(flag_host_, flag_dev_, sizeof(int), cudaMemcpyDeviceToHost, stream_));
  Sync();
  return *flag_host_ == 0;
}

// ---------------------------------------------------------------- attention

void CudaBackend::StoreKv(const KvLayer& kv, int64_t pos0, const Tensor& k, const Tensor& v) {
  EnsureArgs(32);
  auto* p = Add<StoreKvParams>(&LaunchStoreKv);
  p->k = k.data;
  p->v = v.data;
  p->rows = k.rows;
  p->k_cols = k.cols;
  p->v_cols = v.cols;
  p->kc = kv.k;
  p->vc = kv.v;
  p->k_stride = kv.k_stride;
  p->v_stride = kv.v_stride;
  p->f16 = kv.type == DType::kF16 ? 1 : 0;
  p->pos0 = Pos0(pos0);
}

void CudaBackend::StoreMlaKv(const KvLayer& kv, int64_t pos0, const Tensor& kvb,
                             const Tensor& latent, int64_t rope_col, const MlaShape& s) {
  EnsureArgs(32);
  auto* p = Add<StoreMlaKvParams>(&LaunchStoreMlaKv);
  p->kvb = kvb.data;
  p->latent = latent.data;
  p->rows = kvb.rows;
  p->kvb_cols = kvb.cols;
  p->lat_cols = latent.cols;
  p->rope_col = rope_col;
  p->n_head = s.n_head;
  p->nope = s.nope;
  p->rot = s.rot;
  p->dv = s.dv;
  p->kc = kv.k;
  p->vc = kv.v;
  p->k_stride = kv.k_stride;
  p->v_stride = kv.v_stride;
  p->f16 = kv.type == DType::kF16 ? 1 : 0;
  p->pos0 = Pos0(pos0);
}

void CudaBackend::Attention(const AttentionShape& s, const Tensor& q, const KvLayer& kv,
                            int64_t pos0, const Tensor& out) {
  const int group = s.n_head / s.n_head_kv;
  if (s.dv > 128 * kAttentionMaxAcc) FatalError("attention value heads over 2048");
  const int hb = std::max(1, std::min(group, 128 * kAttentionMaxAcc / s.dv));
  const int chunks = (group + hb - 1) / hb;
  const int64_t cells = q.rows * s.n_head_kv * chunks;
  int splits = 1, qb = 1;
  if (q.rows <= 8 && cells <= kCounterCells) {
    // Decode: few tokens, so each one's positions are split over blocks.
    splits = static_cast<int>(std::clamp<int64_t>(sm_count_ / std::max<int64_t>(cells, 1), 1, 8));
  } else {
    // Prefill: several tokens per block share each K/V tile it loads.
    qb = std::max(1, std::min(8, 128 * kAttentionMaxAcc / s.dv / hb));
  }
  const int smem = AttentionSmemBytes(qb * hb, s.dk, s.dv);
  if (smem > attn_smem_allowed_) {
    AllowAttentionSmem(smem);
    attn_smem_allowed_ = smem;
  }
  const size_t partial = splits > 1 ? static_cast<size_t>(cells * splits * hb * (s.dv + 2)) * 4 : 0;
  EnsureArgs(32);
  EnsureWork(partial);
  auto* p = Add<AttentionParams>(&LaunchAttention);
  p->q = q.data;
  p->out = out.data;
  p->k = kv.k;
  p->v = kv.v;
  p->k_stride = kv.k_stride;
  p->v_stride = kv.v_stride;
  p->f16 = kv.type == DType::kF16 ? 1 : 0;
  p->n_tok = static_cast<int32_t>(q.rows);
  p->n_head = s.n_head;
  p->n_head_kv = s.n_head_kv;
  p->dk = s.dk;
  p->dv = s.dv;
  p->heads_per_block = hb;
  p->q_per_block = qb;
  p->splits = splits;
  p->scale = s.scale;
  p->pos0 = Pos0(pos0);
  p->partial = splits > 1 ? static_cast<float*>(Carve(partial)) : nullptr;
  p->counters = counters_;
  p->smem_bytes = smem;
  p->vec = s.dk % 8 == 0 && s.dv % 8 == 0 && kv.k_stride % 8 == 0 && kv.v_stride % 8 == 0 ? 1 : 0;
  Wrote(out);
}

// ---------------------------------------------------------------- mixture of experts

void CudaBackend::Route(const Tensor& logits, const WeightView* bias, const RoutingParams& p,
                        int32_t* sel, float* weight) {
  // The choice is the host's business (it fetches the experts): read the logits back and route
  // them with the CPU's own routine, so every backend picks the same experts.
  host_tmp_.resize(static_cast<size_t>(logits.size() + p.n_expert));
  Download(logits, host_tmp_.data());
  const float* b = nullptr;
  if (bias) {
    float* bv = host_tmp_.data() + logits.size();
    DequantizeWeightRow(*bias, 0, bv);
    b = bv;
  }
  for (int64_t t = 0; t < logits.rows; ++t)
    RouteRow(p, host_tmp_.data() + t * logits.cols, b, sel + t * p.k, weight + t * p.k);
}

void CudaBackend::GatherRows(const Tensor& src, const int32_t* rows, int64_t n,
                             const Tensor& dst) {
  if (n == 0) return;
  EnsureArgs(static_cast<size_t>(n) * 4 + 16);
  auto* p = Add<GatherParams>(&LaunchGather);
  p->src = src.data;
  p->dst = dst.data;
  p->rows = static_cast<const int32_t*>(Args(rows, static_cast<size_t>(n) * 4, kRows));
  p->n = n;
  p->cols = src.cols;
  Wrote(dst.data, static_cast<size_t>(n * dst.cols) * 4);
}

void CudaBackend::ScatterAddRows(const Tensor& src, const int32_t* rows, const float* weight,
                                 int64_t n, const Tensor& dst) {
  if (n == 0) return;
  EnsureArgs(static_cast<size_t>(n) * 8 + 32);
  auto* p = Add<ScatterAddParams>(&LaunchScatterAdd);
  p->src = src.data;
  p->dst = dst.data;
  p->rows = static_cast<const int32_t*>(Args(rows, static_cast<size_t>(n) * 4, kRows));
  p->weight = static_cast<const float*>(Args(weight, static_cast<size_t>(n) * 4, kWeights));
  p->n = n;
  p->cols = dst.cols;
  Wrote(dst);
}

std::optional<double> CudaBackend::MeasureReadBandwidth(uint64_t bytes) {
  Sync();
  return cuda::MeasureReadBandwidth(bytes, 5, stream_);
}

}  // namespace

Expected<std::unique_ptr<Backend>> NewCudaBackend(const CudaBackendOptions& options) {
  auto b = std::make_unique<CudaBackend>(options);
  RETURN_IF_ERROR(b->Init());
  return std::unique_ptr<Backend>(std::move(b));
}

int CudaDeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

}  // namespace substrate
