// The CUDA backend's class (cuda_backend.h has the public face): shared by its three parts,
// cuda_backend.cpp (the ops), cuda_memory.cpp (device memory, adopted weights, staging, the
// argument arena and work memory) and cuda_runs.cpp (recorded launches, flush, graphs,
// profile). Internal to backend/cuda/.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cublas_loader.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"

#define CK SUBSTRATE_CUDA_CHECK

namespace substrate::cuda {

constexpr size_t kRecBytes = 1024;
constexpr int kMinGraphRecs = 8;
constexpr int64_t kGemmMinTokens = 65;  // from this many tokens: dequantize + cuBLAS
constexpr size_t kArenaBytes = 4u << 20;
constexpr size_t kWorkBytes = 64u << 20;
constexpr size_t kGemmTmpBytes = 256u << 20;
constexpr size_t kCublasWorkspace = 32u << 20;
constexpr int kCounterCells = 1 << 16;
constexpr int kGluCounterCells = 1 << 15;  // SwiGLU joined to products of up to 1M rows
constexpr size_t kMaxGraphs = 512;

inline size_t Align(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

// A device copy of some part of a view: its address and how its rows are laid out.
struct DevPart {
  int type = 0;
  const uint8_t* w = nullptr;
  int64_t row_bytes = 0;
};

inline bool Overlap(const void* a, size_t an, const void* b, size_t bn) {
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
MemoryLedger* DeviceLedger(int device);
// Dequantization parts of a record, field by field (padding stays zero).
void SetParts(DequantParams* p, const DevPart* parts, int n);
// A launch's name in profiles: its kernel, and for products the type, path and tokens.
std::string LaunchName(const Rec& r);

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
  int64_t launches() const { return launches_ + static_cast<int64_t>(n_recs_); }  // CudaLaunches

  Expected<Buffer> Allocate(size_t bytes, const std::string& account) override;
  void Download(const Tensor& src, float* host) override;
  void Upload(const float* host, const Tensor& dst) override;
  void Synchronize() override { Sync(); }
  WeightLayout AdoptResidentWeight(DType type, int64_t rows, int64_t cols, uint8_t* bytes) override;
  void AdoptResidentBytes(const uint8_t* bytes, uint64_t size) override { Adopt(bytes, size); }
  std::optional<double> MeasureReadBandwidth(uint64_t bytes) override;
  std::optional<double> MeasureUploadBandwidth(uint64_t bytes) override;
  const MemoryLedger* device_ledger() const override { return ledger_; }
  uint64_t host_link_bytes() override;
  uint64_t host_compute_bytes() override { return host_compute_bytes_; }

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
  bool AllFinite(const Tensor& x, const Tensor* also = nullptr) override;

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
  bool RoutedExperts(const RoutedExpertsOp& op) override;

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
  // Whether a recorded launch leaves x as it was (the kinds recorded between a MoE layer's norm
  // and its experts' quantization; false for any other kind).
  static bool ReadsOnly(const Rec& r, const Tensor& x);
  void JoinHeadNorms(RopeParamsDev* r);  // Rope: the q and k head norms recorded before
  // RoutedExperts: the one-row norm recorded before the router's product that joined its
  // top-k, taken into that launch; returns the router's parameters, moved.
  GemvParams* JoinNormToRouter(GemvParams* router, const Tensor& xn);
  // Drops the record before the last (an op the last one has taken in); returns the last's
  // parameters, now one place earlier.
  void* DropRecordBeforeLast() {
    recs_[n_recs_ - 2] = recs_[n_recs_ - 1];
    --n_recs_;
    return recs_[n_recs_ - 1].p;
  }
  void Wrote(const Tensor& t) { Wrote(t.data, static_cast<size_t>(t.size()) * 4); }
  void Wrote(const void* p, size_t bytes);

  // ---- weights ----
  // `rtype`: a type with a repacked device layout (kRepacked) for rows of `cols`, else 0.
  void Adopt(const uint8_t* host, uint64_t size, int rtype = 0, int64_t cols = 0);
  const uint8_t* FindAdopted(const uint8_t* host, uint64_t bytes) const;
  // The device copy of a part (rows of `type`, `row_bytes` apart on the host): its address, and
  // its layout (type id and row bytes) there; false when it was not adopted.
  bool FindAdoptedPart(const uint8_t* host, uint64_t bytes, int type, int64_t row_bytes,
                       DevPart* out) const;
  uint64_t StagingBytes(const WeightView& v) const;
  // Device parts of v (skeleton, then residuals); uploads non-adopted ones (staging must be
  // ensured). Returns the count.
  int Parts(const WeightView& v, DevPart* out, bool count_link = true);
  // Like Parts for the n rows ids[] of a table the device does not hold whole: only those rows
  // are uploaded, row t at row t of each part (staging must be ensured for n rows per part).
  int StageRows(const WeightView& v, const int32_t* ids, int64_t n, DevPart* out);
  // Pins host weight bytes the device will not hold (--max-vram), so that their uploads run
  // at the link's speed and do not stall the host; pages already pinned are skipped.
  void PinHost(const uint8_t* host, uint64_t size);
  // Whether kernels may read these host bytes in place (zero-copy: pinned and mapped).
  bool Mapped(const uint8_t* host, uint64_t bytes) const;
  // cudaMemcpyAsync of host bytes to the device, in pieces that are each pinned or pageable.
  void CopyToDevice(uint8_t* dst, const uint8_t* src, uint64_t n);
  void EnsureStaging(uint64_t bytes);
  bool FinishStaged();  // after an op that staged: issue it now (the staging buffer is reused)
  const float* VectorOf(const WeightView& w, int64_t n);  // work ensured for n floats

  // Every product on the device (MatMulBatch, once the hybrid has taken its share).
  void DeviceMatMulBatch(const MatMulOp* ops, int n_ops);
  void RecordGemm(const MatMulOp& op, const DevPart* parts, int n_parts);
  // Whether a product goes to cuBLAS (when it loads): enough tokens to pay for dequantizing.
  static bool UseGemm(const MatMulOp& op) { return op.x.rows >= kGemmMinTokens; }
  void AddGemvJob(int type, bool fast, const Tensor& x, const void* xq, const float2* xs,
                  const Tensor& y, const DevPart& part, bool accumulate);
  void SetDevice() const { CK(cudaSetDevice(opt_.device)); }

  // The device copies of a stacked expert tensor's E matrices, for the products of routed
  // experts: a table of their addresses on the device, and their layout.
  struct ExpertTable {
    const uint8_t* const* dev = nullptr;  // [E], null: some expert is not adopted
    DevPart part;                         // expert 0's (every expert's layout is the same)
    int64_t rows = 0;                     // of one expert
    LedgerCharge charge;
    // Each expert's host and device addresses (equal where it is read in place).
    std::vector<const uint8_t*> host, dev_ptrs;
    bool some_in_place = false;  // some expert is read from host memory over the link
    // Expert e's matrix is read in place: from host memory, over the link.
    bool InPlace(int e) const {
      return host[static_cast<size_t>(e)] == dev_ptrs[static_cast<size_t>(e)];
    }
    uint64_t MatrixBytes() const {  // one expert's matrix
      return static_cast<uint64_t>(part.row_bytes) * static_cast<uint64_t>(rows);
    }
  };
  // v's table (built once per tensor), or null when its experts are not all adopted alike.
  const ExpertTable* Experts(const WeightView& v, int n_expert);
  // The routing kernel's RouteTopKParams::link_bytes for a layer (built once), or null.
  const unsigned long long* ExpertLinkBytes(const RoutedExpertsOp& op, const ExpertTable& g,
                                            const ExpertTable& u, const ExpertTable& dn,
                                            int n_expert);
  // Records one launch of n_jobs (1 or 2) products of routed experts, one token.
  void AddExpertGemv(const DevPart& part, bool fast, int64_t cols, const GemvJob* jobs, int n_jobs);
  // Work memory of one launch's routed-expert products: gate and up [slots, ff] (SwiGLU in place
  // in gate), the hidden state quantized for the down product, out [slots, d].
  struct ExpertWork {
    float* gate = nullptr;
    float* up = nullptr;
    int8_t* hq = nullptr;
    float2* hs = nullptr;
    float* out = nullptr;
  };
  static size_t ExpertWorkBytes(int64_t slots, int64_t ff, int64_t d);
  ExpertWork CarveExpertWork(int64_t slots, int64_t ff, int64_t d);
  // gate = silu(gate) * up, quantized into hq/hs too when `quantize`.
  void AddSwiGlu(const ExpertWork& w, int64_t slots, int64_t ff, bool quantize);
  // The decode products of `slots` slots of routed experts: slot s is expert sel[s] (device)
  // applied to row s / x_div of op.xn; the results in w.out.
  void AddExpertSlots(const RoutedExpertsOp& op, const ExpertTable& g, const ExpertTable& u,
                      const ExpertTable& dn, const int32_t* sel, int64_t slots, int x_div,
                      const ExpertWork& w);
  // acc = plus + the weighted sum of each row's k slots of out (pos: where slot s lies; null:
  // at s).
  void AddMoeCombine(const float* out, const float* weight, const int32_t* pos, const Tensor& acc,
                     int k, const float* plus);

  // ---- the hybrid (cuda_hybrid.cpp) ----
  void InitHybrid();  // after zero_copy_ is known
  void CloseHybrid();
  // Whether the device reads every row of v in place from host memory (the hybrid's case).
  bool ReadInPlace(const WeightView& v) const;
  // Splits the batch's one-token products over weights read in place between the host's CPU
  // and the device and runs the batch; false, having done nothing, when no product qualifies.
  bool HybridBatch(const MatMulOp* ops, int n_ops);
  // One token's routed experts of a layer whose experts are partly read in place: routed on the
  // host (the one wait of the layer); the CPU computes a share of the chosen experts read in
  // place, whole, while the device computes the others; the device adds the CPU's sum in.
  bool HybridExperts(const RoutedExpertsOp& op, const ExpertTable& g, const ExpertTable& u,
                     const ExpertTable& dn);
  // Pinned host memory for at least `floats` floats in hyb_host_ (waits for the device first
  // when it must grow).
  void EnsureHybridHost(size_t floats);
  // Weighs a split's pair of device events against its CPU seconds, once.
  void WeighPair(int pair);
  // After a split's CPU part: its host time counted, and its CPU seconds (when the CPU had a
  // part) weighed against the device's: at once when the device had none, else by WeighPair
  // once the device's events are read.
  void SettleSplit(int pair, double wait_s, double cpu_s, bool cpu_part, bool device_part);
  // The CPU's share of a split product's rows now (balanced, or fixed).
  double HybridCpuShare() const;
  // Moves the share after a batch whose CPU part took cpu_s and device part dev_s.
  void BalanceShare(double cpu_s, double dev_s);
  // Ranges of device floats and where they lie in hyb_host_.
  struct Span {
    const float* dev;
    size_t floats, host_off;
  };
  // Sorts spans by address, merges those that overlap or meet within one allocation, and lays
  // them out in host memory from host_off; returns the end.
  size_t LayOut(std::vector<Span>& spans, size_t host_off) const;
  // Whether two device addresses lie in one Allocate'd buffer.
  bool SameAllocation(const void* a, const void* b) const;
  std::unique_ptr<CpuBackend> host_;           // null: no hybrid
  double hybrid_fixed_ = -1;                   // SUBSTRATE_CUDA_HYBRID=F
  bool hybrid_moe_ = true;                     // RoutedExperts declines experts read in place
  double share_ = 0.5;                         // the CPU's share (BalanceShare)
  cudaEvent_t hyb_x_ = nullptr;                // the CPU's inputs are in host memory
  cudaEvent_t hyb_a_[2] = {}, hyb_b_[2] = {};  // around the device's share, two batches' pairs
  double hyb_cpu_pending_[2] = {};  // the CPU's seconds of each pair's batch, 0 once weighed
  double hyb_expert_carry_ = 0;     // the CPU's share of experts not yet given (whole experts)
  int hyb_pair_ = 0;
  float* hyb_host_ = nullptr;  // pinned: the split products' inputs and the CPU's outputs
  size_t hyb_host_floats_ = 0;
  uint64_t host_compute_bytes_ = 0;
  // SUBSTRATE_CUDA_HOSTTIME=1: where the split batches' host time went, printed at close.
  double hyb_wait_s_ = 0, hyb_cpu_s_ = 0;
  int64_t hyb_batches_ = 0;

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
  struct Memo {
    int tag = -1;
    size_t bytes = 0, off = 0;
  };
  Memo memo_[4];
  int memo_next_ = 0;

  uint8_t* work_ = nullptr;
  size_t work_size_ = 0, work_off_ = 0;
  LedgerCharge work_charge_;
  std::vector<ActEntry> acts_;
  std::map<uintptr_t, uintptr_t> allocations_;  // Allocate'd device buffers: start -> end

  struct Region {
    uint64_t size = 0;
    uint8_t* dev = nullptr;
    LedgerCharge charge;
    int rtype = 0;              // repacked: the device type id (kRepacked set)
    int64_t row_bytes = 0;      // repacked: host row bytes
    int64_t dev_row_bytes = 0;  // repacked: device row bytes
  };
  std::map<const uint8_t*, Region> adopted_;
  std::map<const uint8_t*, ExpertTable> expert_tables_;
  bool warned_adopt_ = false;
  bool repack_ = true;     // SUBSTRATE_CUDA_REPACK=0 keeps the GGUF layout on the device (A/B)
  bool route_ = true;      // SUBSTRATE_CUDA_ROUTE=0: MoE routing on the host, as before (A/B)
  int gemv_variant_ = -1;  // SUBSTRATE_CUDA_GEMV_VARIANT: the repacked products' kernel shape
  // The routed experts' (SUBSTRATE_CUDA_EXPERT_VARIANT; -1: by type and size as the others).
  int expert_variant_ = 2;
  int64_t launches_ = 0;  // recorded launches issued so far (CudaLaunches)
  // SUBSTRATE_CUDA_HOSTTIME=1: how much of the wall time the host waited for the device (the
  // rest it spent recording, or the device idled), printed when the backend closes.
  bool host_time_ = false;
  double host_wait_s_ = 0, host_first_s_ = -1, host_last_s_ = 0;
  int64_t host_syncs_ = 0;
  uint8_t* staging_ = nullptr;
  uint64_t staging_size_ = 0, staging_off_ = 0;
  LedgerCharge staging_charge_;
  bool staged_ = false;
  // host_link_bytes: what the host saw (copies, products over weights read in place), and
  // what the device counts (routed experts read in place: RouteTopKParams::link_bytes).
  uint64_t link_bytes_ = 0;
  unsigned long long* link_counter_ = nullptr;
  // Per MoE layer (by its gate stack): each expert's bytes read in place, [E] on the device;
  // null where every expert is in device memory.
  std::map<const uint8_t*, std::pair<unsigned long long*, LedgerCharge>> expert_link_;
  // --max-vram: weights are adopted while the ledger stays under this (0: no budget).
  uint64_t adopt_limit_ = 0;
  size_t gemm_tmp_bytes_ = kGemmTmpBytes;  // smaller under a budget
  std::map<uintptr_t, uintptr_t> pinned_;  // page ranges registered by PinHost: start -> end
  bool zero_copy_ = false;  // kernels read pinned host weights in place (Init says when)

  uint32_t* counters_ = nullptr;
  uint32_t* glu_counters_ = nullptr;   // GemvParams::glu_counters, kGluCounterCells
  uint32_t* route_counter_ = nullptr;  // GemvParams::route_counter
  int* flag_dev_ = nullptr;
  int* flag_host_ = nullptr;
  int attn_smem_allowed_ = 48 * 1024;
  bool attn_mma_ = false;  // prefill attention on tensor cores where the shape allows
  int attn_heads_ = 0;     // SUBSTRATE_CUDA_ATTN_HEADS: decode's query heads a block (0: auto)
  // One token's decode attention reads its history before its wait (AttentionParams::early;
  // SUBSTRATE_CUDA_ATTN_EARLY=0 turns it off for A/B measurements).
  bool attn_early_ = true;
  bool moe_mma_ = false;   // the routed experts' prefill tiles on int8 tensor cores

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
  // Launches recorded before a norm flushes them (0: one flush per pass). In decode the host
  // records a token's ~330 launches in about a fifth of the token's time; unpipelined, the
  // device idles for it. SUBSTRATE_CUDA_CHUNK=N sets it.
  int chunk_recs_ = 48;
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

}  // namespace substrate::cuda
