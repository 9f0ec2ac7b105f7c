// CudaBackend's memory: device buffers, adopted weights and staging, the argument arena, work
// memory and the cache of converted activations (cuda_backend_impl.h).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"

namespace substrate::cuda {

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

namespace {

// Whether the environment sets `var` to `value` (the backend's A/B switches).
bool EnvIs(const char* var, const char* value) {
  const char* v = std::getenv(var);
  return v && std::string(v) == value;
}

}  // namespace

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
  if (EnvIs("SUBSTRATE_CUDA_GRAPHS", "0")) opt_.graphs = false;
  if (EnvIs("SUBSTRATE_CUDA_PROFILE", "1")) {
    profile_ = true;
    opt_.graphs = false;
  }
  if (EnvIs("SUBSTRATE_CUDA_REPACK", "0")) repack_ = false;
  if (EnvIs("SUBSTRATE_CUDA_ROUTE", "0")) route_ = false;
  if (const char* g = std::getenv("SUBSTRATE_CUDA_GEMV_VARIANT"))
    gemv_variant_ = std::clamp(std::atoi(g), -1, kGemvVariants - 1);
  if (const char* g = std::getenv("SUBSTRATE_CUDA_EXPERT_VARIANT"))
    expert_variant_ = std::clamp(std::atoi(g), -1, kGemvVariants - 1);
  if (EnvIs("SUBSTRATE_CUDA_HOSTTIME", "1")) host_time_ = true;
  if (const char* g = std::getenv("SUBSTRATE_CUDA_CHUNK")) chunk_recs_ = std::max(0, std::atoi(g));
  recs_.reserve(4096);
  (void)PdlEnabled();  // decided now: it queries the device, which a graph capture must not
  CK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, opt_.device));
  int cc_major = 0;
  CK(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, opt_.device));
  // Prefill attention and the routed experts' prefill products on tensor cores;
  // SUBSTRATE_CUDA_ATTN_MMA=0 keeps the float attention kernel, SUBSTRATE_CUDA_MOE_MMA=0 the
  // dp4a tiles (A/B measurements).
  attn_mma_ = cc_major >= 8 && !EnvIs("SUBSTRATE_CUDA_ATTN_MMA", "0");
  if (const char* h = std::getenv("SUBSTRATE_CUDA_ATTN_HEADS"))
    attn_heads_ = std::max(0, std::atoi(h));
  if (attn_mma_) AllowAttentionMmaSmem();
  attn_early_ = !EnvIs("SUBSTRATE_CUDA_ATTN_EARLY", "0");
  moe_mma_ = cc_major >= 8 && !EnvIs("SUBSTRATE_CUDA_MOE_MMA", "0");
  if (moe_mma_) AllowGemvTilesMmaSmem();
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
  CK(cudaMalloc(&glu_counters_, kGluCounterCells * sizeof(uint32_t)));
  CK(cudaMemset(glu_counters_, 0, kGluCounterCells * sizeof(uint32_t)));
  RETURN_IF_ERROR(charge(kGluCounterCells * sizeof(uint32_t)));
  CK(cudaMalloc(&route_counter_, sizeof(uint32_t)));
  CK(cudaMemset(route_counter_, 0, sizeof(uint32_t)));
  CK(cudaMalloc(&flag_dev_, sizeof(int)));
  CK(cudaMalloc(&link_counter_, sizeof(unsigned long long)));
  CK(cudaMemset(link_counter_, 0, sizeof(unsigned long long)));
  CK(cudaHostAlloc(&flag_host_, sizeof(int), cudaHostAllocDefault));
  RETURN_IF_ERROR(charge(kCounterCells * sizeof(uint32_t) + 256));
  ASSIGN_OR_RETURN(work_charge_, ledger_->Charge("backend", kWorkBytes));
  work_size_ = kWorkBytes;
  CK(cudaMalloc(&work_, work_size_));
  if (opt_.max_vram) {
    // A budget: cuBLAS's temporaries shrink with it (they bound the rows dequantized per GEMM
    // launch, not what a product can do), the staging buffer is taken now, and weights are
    // adopted while they leave the rest of the reserve and the temporaries free.
    gemm_tmp_bytes_ = std::clamp<size_t>(opt_.max_vram / 32, 16u << 20, kGemmTmpBytes);
    const uint64_t fixed = ledger_->current() + opt_.reserve + gemm_tmp_bytes_ + kCublasWorkspace;
    if (fixed >= opt_.max_vram)
      return InvalidArgument(
          "--max-vram " + FormatBytes(opt_.max_vram) + ": the KV cache, activations and staging (" +
          FormatBytes(opt_.reserve) + ") and the backend's work memory (" +
          FormatBytes(fixed - opt_.reserve) + ") leave nothing for weights; give more");
    ledger_->set_cap(opt_.max_vram);
    // Zero-copy: kernels read the weights the device does not hold straight from pinned host
    // memory over the link (the device maps registered host pages at their host addresses), so
    // an op waits for no copy, and the routed experts of a MoE layer stay on the device's own
    // routing (Backend::RoutedExperts: every expert is then reachable by address). Host and
    // device layouts must then agree: no repacking. SUBSTRATE_CUDA_ZEROCOPY=0 copies each
    // op's weights into the staging buffer instead (A/B).
    int host_ptrs = 0;
    CK(cudaDeviceGetAttribute(&host_ptrs, cudaDevAttrCanUseHostPointerForRegisteredMem,
                              opt_.device));
    const char* zc = std::getenv("SUBSTRATE_CUDA_ZEROCOPY");
    zero_copy_ = host_ptrs != 0 && !(zc && std::string(zc) == "0");
    if (zero_copy_) repack_ = false;
    EnsureStaging(std::max<uint64_t>(opt_.staging, 1));
    adopt_limit_ = opt_.max_vram - (opt_.reserve - std::min(opt_.reserve, staging_size_)) -
                   gemm_tmp_bytes_ - kCublasWorkspace;
    InitHybrid();
  }
  return Status::Ok();
}

CudaBackend::~CudaBackend() {
  if (!stream_) return;
  SetDevice();
  Sync();
  if (profile_) ProfilePrint();
  if (host_time_ && host_syncs_ > 1)
    std::fprintf(stderr,
                 "cuda host time: %lld waits for the device, %.1f ms of %.1f ms between the first "
                 "and the last (%.1f %%): the rest the host recorded ops or the device idled\n",
                 static_cast<long long>(host_syncs_), host_wait_s_ * 1e3,
                 (host_last_s_ - host_first_s_) * 1e3,
                 100.0 * host_wait_s_ / std::max(1e-9, host_last_s_ - host_first_s_));
  DropGraphs();
  CloseHybrid();
  if (free_ctx_) free_ctx_->backend = nullptr;
  // (the host memory may be gone already: an error here is harmless)
  for (auto& [begin, end] : pinned_) cudaHostUnregister(reinterpret_cast<void*>(begin));
  cudaGetLastError();
  if (opt_.max_vram) ledger_->set_cap(0);  // the device's ledger outlives this backend's budget
  for (auto& [host, r] : adopted_) cudaFree(r.dev);
  adopted_.clear();
  for (auto& [host, t] : expert_tables_) cudaFree(const_cast<const uint8_t**>(t.dev));
  expert_tables_.clear();
  if (cublas_handle_) cublas_->destroy(cublas_handle_);
  cudaFree(gemm_tmp_);
  cudaFree(staging_);
  cudaFree(work_);
  cudaFree(darena_);
  cudaFreeHost(harena_);
  cudaFree(counters_);
  cudaFree(glu_counters_);
  cudaFree(route_counter_);
  cudaFree(flag_dev_);
  cudaFree(link_counter_);
  for (auto& [gate, link] : expert_link_) cudaFree(link.first);
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
  allocations_[reinterpret_cast<uintptr_t>(p)] = reinterpret_cast<uintptr_t>(p) + bytes;
  return Buffer(p, bytes, std::move(charge), &FreeDeviceBuffer, free_ctx_);
}

void CudaBackend::FreeDevice(void* data) {
  SetDevice();
  Sync();  // recorded ops may still read it
  // Graphs and cached conversions name addresses that a later allocation may reuse.
  DropGraphs();
  acts_.clear();
  allocations_.erase(reinterpret_cast<uintptr_t>(data));
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
  if (rb) Adopt(bytes, *rb * static_cast<uint64_t>(rows), static_cast<int>(type), cols);
  // The host's rows stay as they are: the repacked layout is the device copy's alone.
  return WeightLayout::kRows;
}

void CudaBackend::Adopt(const uint8_t* host, uint64_t size, int rtype, int64_t cols) {
  if (size == 0 || adopted_.count(host)) return;
  SetDevice();
  const int64_t dev_rb = repack_ && rtype ? RepackedRowBytes(rtype, cols) : 0;
  const auto host_rb = RowBytes(static_cast<DType>(rtype), static_cast<uint64_t>(cols));
  const uint64_t rows = dev_rb && host_rb ? size / *host_rb : 0;
  const uint64_t dev_size = rows ? rows * static_cast<uint64_t>(dev_rb) : size;
  if (adopt_limit_ && ledger_->current() + dev_size > adopt_limit_) {
    PinHost(host, size);  // past the budget: read from host memory by each op (Mapped)
    return;
  }
  auto charge = ledger_->Charge("weights", dev_size);
  uint8_t* dev = nullptr;
  if (!charge.ok() || cudaMalloc(&dev, dev_size) != cudaSuccess) {
    cudaGetLastError();
    if (!warned_adopt_)
      std::fprintf(stderr,
                   "substrate: cuda: device memory full; weights past this point are uploaded "
                   "for each op that reads them\n");
    warned_adopt_ = true;
    return;
  }
  Region& r = adopted_[host];
  if (rows) {
    std::vector<uint8_t> packed(dev_size);
    RepackRows(rtype, static_cast<int64_t>(rows), cols, host, packed.data());
    CK(cudaMemcpy(dev, packed.data(), dev_size, cudaMemcpyHostToDevice));
    r.rtype = rtype | kRepacked;
    r.row_bytes = static_cast<int64_t>(*host_rb);
    r.dev_row_bytes = dev_rb;
  } else {
    CK(cudaMemcpy(dev, host, size, cudaMemcpyHostToDevice));
  }
  r.size = size;
  r.dev = dev;
  r.charge = std::move(charge).value();
}

bool CudaBackend::FindAdoptedPart(const uint8_t* host, uint64_t bytes, int type, int64_t row_bytes,
                                  DevPart* out) const {
  auto it = adopted_.upper_bound(host);
  if (it == adopted_.begin() || std::prev(it)->first + std::prev(it)->second.size <= host) {
    if (!Mapped(host, bytes)) return false;
    *out = {type, host, row_bytes};  // read in place, over the link
    return true;
  }
  --it;
  const uint8_t* begin = it->first;
  const Region& r = it->second;
  if (host < begin || host + bytes > begin + r.size) return false;
  const uint64_t off = static_cast<uint64_t>(host - begin);
  if (r.rtype && (r.rtype & ~kRepacked) == type && row_bytes == r.row_bytes &&
      off % static_cast<uint64_t>(row_bytes) == 0) {
    // Whole rows of a repacked matrix (an expert's slice): the same rows there.
    out->type = r.rtype;
    out->row_bytes = r.dev_row_bytes;
    out->w =
        r.dev + off / static_cast<uint64_t>(row_bytes) * static_cast<uint64_t>(r.dev_row_bytes);
    return true;
  }
  if (r.rtype) return false;  // bytes of a repacked matrix read another way: upload them
  out->type = type;
  out->row_bytes = row_bytes;
  out->w = r.dev + off;
  return true;
}

bool CudaBackend::SameAllocation(const void* a, const void* b) const {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  auto it = allocations_.upper_bound(x);
  if (it == allocations_.begin()) return false;
  --it;
  return x < it->second && y >= it->first && y < it->second;
}

uint64_t CudaBackend::host_link_bytes() {
  Sync();
  unsigned long long on_device = 0;
  CK(cudaMemcpy(&on_device, link_counter_, sizeof(on_device), cudaMemcpyDeviceToHost));
  return link_bytes_ + on_device;
}

bool CudaBackend::Mapped(const uint8_t* host, uint64_t bytes) const {
  if (!zero_copy_) return false;
  auto a = reinterpret_cast<uintptr_t>(host);
  const uintptr_t end = a + bytes;
  auto it = pinned_.upper_bound(a);
  if (it == pinned_.begin()) return false;
  --it;
  // Registered ranges that meet end to end (a tensor pinned in pieces) cover it together.
  for (; it != pinned_.end() && it->first <= a; ++it) {
    if (it->second <= a) return false;
    a = it->second;
    if (a >= end) return true;
  }
  return false;
}

const uint8_t* CudaBackend::FindAdopted(const uint8_t* host, uint64_t bytes) const {
  auto it = adopted_.upper_bound(host);
  if (it == adopted_.begin() || std::prev(it)->first + std::prev(it)->second.size <= host)
    return Mapped(host, bytes) ? host : nullptr;
  --it;
  const uint8_t* begin = it->first;
  if (it->second.rtype) return nullptr;  // not a byte-for-byte copy
  if (host >= begin && host + bytes <= begin + it->second.size)
    return it->second.dev + (host - begin);
  return nullptr;
}

uint64_t CudaBackend::StagingBytes(const WeightView& v) const {
  uint64_t total = 0;
  auto add = [&](DType type, const uint8_t* host, uint64_t fallback) {
    const auto rb = RowBytes(type, static_cast<uint64_t>(v.cols));
    const uint64_t bytes = rb ? *rb * static_cast<uint64_t>(v.rows) : fallback;
    DevPart part;
    if (!FindAdoptedPart(host, bytes, static_cast<int>(type), rb ? static_cast<int64_t>(*rb) : 0,
                         &part))
      total += Align(bytes, 256);
  };
  add(v.type, v.data, v.bytes);
  for (int k = 0; k < v.n_residuals; ++k) add(v.residual_type[k], v.residual[k], 0);
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
  staging_size_ = Align(std::max<uint64_t>(bytes, opt_.max_vram ? 1 : 64u << 20), 1u << 20);
  auto c = ledger_->Charge("staging", staging_size_);
  if (!c.ok())
    FatalError(c.status().ToString() + " (an op needs " + FormatBytes(bytes) +
               " of staging for weights the device does not hold)");
  staging_charge_ = std::move(c).value();
  CK(cudaMalloc(&staging_, staging_size_));
}

// Bytes of a row of `type` and `cols` (a weight the kernels read row by row), or a fatal error.
static std::optional<uint64_t> DeviceRowBytes(DType type, int64_t cols) {
  const auto rb = RowBytes(type, static_cast<uint64_t>(cols));
  if (!rb)
    FatalError(std::string("weight type ") + DTypeName(type) + " with rows of " +
               std::to_string(cols));
  return rb;
}

int CudaBackend::Parts(const WeightView& v, DevPart* out, bool count_link) {
  if (v.layout != WeightLayout::kRows) FatalError("a weight layout this backend does not read");
  auto part = [&](DType type, const uint8_t* host, DevPart* p) {
    const std::optional<uint64_t> rb = DeviceRowBytes(type, v.cols);
    const uint64_t bytes = *rb * static_cast<uint64_t>(v.rows);
    if (!FindAdoptedPart(host, bytes, static_cast<int>(type), static_cast<int64_t>(*rb), p)) {
      p->type = static_cast<int>(type);
      p->row_bytes = static_cast<int64_t>(*rb);
      if (staging_off_ + bytes > staging_size_) FatalError("staging not reserved");
      uint8_t* dst = staging_ + staging_off_;
      CopyToDevice(dst, host, bytes);
      staging_off_ += Align(bytes, 256);
      staged_ = true;
      link_bytes_ += bytes;
      p->w = dst;
    } else if (p->w == host && count_link) {
      link_bytes_ += bytes;  // read in place over the link
    }
  };
  part(v.type, v.data, &out[0]);
  for (int k = 0; k < v.n_residuals; ++k) part(v.residual_type[k], v.residual[k], &out[k + 1]);
  return 1 + v.n_residuals;
}

int CudaBackend::StageRows(const WeightView& v, const int32_t* ids, int64_t n, DevPart* out) {
  if (v.layout != WeightLayout::kRows) FatalError("a weight layout this backend does not read");
  auto part = [&](DType type, const uint8_t* host, DevPart* p) {
    const std::optional<uint64_t> rb = DeviceRowBytes(type, v.cols);
    const uint64_t bytes = *rb * static_cast<uint64_t>(n);
    if (staging_off_ + bytes > staging_size_) FatalError("staging not reserved");
    uint8_t* dst = staging_ + staging_off_;
    for (int64_t t = 0; t < n; ++t)
      CopyToDevice(dst + *rb * static_cast<uint64_t>(t), host + *rb * static_cast<uint64_t>(ids[t]),
                   *rb);
    staging_off_ += Align(bytes, 256);
    staged_ = true;
    link_bytes_ += bytes;
    *p = {static_cast<int>(type), dst, static_cast<int64_t>(*rb)};
  };
  part(v.type, v.data, &out[0]);
  for (int k = 0; k < v.n_residuals; ++k) part(v.residual_type[k], v.residual[k], &out[k + 1]);
  return 1 + v.n_residuals;
}

void CudaBackend::CopyToDevice(uint8_t* dst, const uint8_t* src, uint64_t n) {
  // CUDA refuses a copy whose source is partly pinned (a neighbour of a pinned tensor sharing
  // its first or last page): pieces split where pinned ranges begin and end.
  const auto base = reinterpret_cast<uintptr_t>(src);
  uintptr_t a = base;
  const uintptr_t end = base + n;
  while (a < end) {
    uintptr_t b = end;
    auto it = pinned_.upper_bound(a);
    if (it != pinned_.begin() && std::prev(it)->second > a)
      b = std::min(b, std::prev(it)->second);  // inside a pinned range: to its end
    else if (it != pinned_.end())
      b = std::min(b, it->first);  // pageable: up to the next pinned range
    CK(cudaMemcpyAsync(dst + (a - base), reinterpret_cast<const void*>(a), b - a,
                       cudaMemcpyHostToDevice, stream_));
    a = b;
  }
}

void CudaBackend::PinHost(const uint8_t* host, uint64_t size) {
  constexpr uintptr_t kPage = 4096;
  uintptr_t s = reinterpret_cast<uintptr_t>(host) / kPage * kPage;
  const uintptr_t e = (reinterpret_cast<uintptr_t>(host) + size + kPage - 1) / kPage * kPage;
  auto it = pinned_.upper_bound(s);
  if (it != pinned_.begin()) s = std::max(s, std::prev(it)->second);
  while (s < e) {
    const uintptr_t gap_end = it != pinned_.end() ? std::min(e, it->first) : e;
    if (gap_end > s) {
      if (cudaHostRegister(reinterpret_cast<void*>(s), gap_end - s, cudaHostRegisterMapped) ==
          cudaSuccess) {
        pinned_.emplace(s, gap_end);
      } else {
        cudaGetLastError();  // pageable: slower uploads that block the host, still correct
      }
    }
    if (it == pinned_.end()) break;
    s = std::max(s, it->second);
    ++it;
  }
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
    // The op that wrote exactly x (a norm, attention, SwiGLU) quantizes it as it writes it: one
    // launch less. It is the last one recorded, or before a MoE layer's router product and top-k,
    // which only read x.
    Rec* last = n_recs_ > 0 ? &recs_[n_recs_ - 1] : nullptr;
    for (size_t back = 1; last && back < 3 && back < n_recs_ && ReadsOnly(*last, x); ++back)
      last = &recs_[n_recs_ - 1 - back];
    if (last && last->fn == &LaunchRmsNorm) {
      auto* n = reinterpret_cast<RmsNormParams*>(last->p);
      if (n->y == x.data && n->rows == x.rows && n->cols == x.cols && !n->xq && n->rows2 == 0) {
        n->xq = q;
        n->xs = qs;
        last = nullptr;
      }
    } else if (last && last->fn == &LaunchGemv) {
      auto* g = reinterpret_cast<GemvParams*>(last->p);
      if (g->glu_out == x.data && x.rows == 1 && x.cols == g->jobs[0].rows && !g->glu_xq) {
        g->glu_xq = q;
        g->glu_xs = qs;
        last = nullptr;
      } else if (g->norm_y == x.data && x.rows == 1 && x.cols == g->cols && !g->norm_xq) {
        g->norm_xq = q;
        g->norm_xs = qs;
        last = nullptr;
      }
    } else if (last && last->fn == &LaunchAttention) {
      auto* a = reinterpret_cast<AttentionParams*>(last->p);
      if (a->out == x.data && int64_t{a->n_tok} * a->n_head * a->dv == x.size() &&
          a->dv % 32 == 0 && !a->xq) {
        a->xq = q;
        a->xs = qs;
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

bool CudaBackend::ReadsOnly(const Rec& r, const Tensor& x) {
  const size_t bytes = static_cast<size_t>(x.size()) * 4;
  if (r.fn == &LaunchRouteTopK) {
    const auto* t = reinterpret_cast<const RouteTopKParams*>(r.p);
    return !Overlap(t->weight, static_cast<size_t>(t->n) * t->k * 4, x.data, bytes) &&
           !Overlap(t->sel, static_cast<size_t>(t->n) * t->k * 4, x.data, bytes);
  }
  if (r.fn != &LaunchGemv) return false;
  const auto* g = reinterpret_cast<const GemvParams*>(r.p);
  if (g->glu_out || g->norm_y) return false;
  if (g->route.logits &&
      (Overlap(g->route.sel, static_cast<size_t>(g->route.n) * g->route.k * 4, x.data, bytes) ||
       Overlap(g->route.weight, static_cast<size_t>(g->route.n) * g->route.k * 4, x.data, bytes)))
    return false;
  for (int j = 0; j < g->n_jobs; ++j) {
    const GemvJob& job = g->jobs[j];
    const size_t span = static_cast<size_t>((g->ntok - 1) * job.ldy + job.rows) * 4;
    if (job.add_to || job.slot_expert || Overlap(job.y, span, x.data, bytes)) return false;
  }
  return true;
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

}  // namespace substrate::cuda
