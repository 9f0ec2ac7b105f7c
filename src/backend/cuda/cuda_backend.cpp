// CudaBackend's ops (cuda_backend.h says what it promises). The parts, in the order an op meets
// them (memory and runs in cuda_memory.cpp and cuda_runs.cpp):
//  - weights: adopted_ maps each adopted tensor's host range to its device copy; a view's parts
//    (skeleton, residuals) are found there by address, or uploaded into `staging_` for the op;
//  - host arrays an op reads (token ids, positions, row lists): copied into a pinned argument
//    arena, mirrored on the device by one copy at the next flush; kernels read them there;
//  - work memory (quantized activations, attention partials): a bump area reset at each
//    host wait; quantized activations are cached until their tensor is written again;
//  - the op itself: a record (launch function, parameter block) appended to recs_; consecutive
//    products that read the same activations are merged into one launch;
//  - Flush issues the records (or replays the graph captured for an identical run).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_backend_impl.h"
#include "kernels/matmul.h"
#include "kernels/routing.h"

namespace substrate {
namespace cuda {

[[noreturn]] void FatalError(const std::string& what) {
  std::fprintf(stderr, "substrate: CUDA backend: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// ---------------------------------------------------------------- weights ops

void CudaBackend::EmbedRows(const WeightView& table, const int32_t* ids, int64_t n,
                            const Tensor& out) {
  // A table the device does not hold whole: only the looked-up rows travel, to rows 0..n-1.
  thread_local std::vector<int32_t> iota;
  const bool rows_only = StagingBytes(table) > 0;
  uint64_t stage = 0;
  if (rows_only) {
    stage += Align(*RowBytes(table.type, static_cast<uint64_t>(table.cols)) * n, 256);
    for (int k = 0; k < table.n_residuals; ++k)
      stage += Align(*RowBytes(table.residual_type[k], static_cast<uint64_t>(table.cols)) * n, 256);
    iota.resize(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) iota[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  }
  EnsureStaging(stage);
  EnsureArgs(static_cast<size_t>(n) * 4 + 16);
  DevPart parts[3];
  const int np = rows_only ? StageRows(table, ids, n, parts) : Parts(table, parts, false);
  if (!rows_only) {  // a table read in place: the rows looked up crossed the link
    const uint8_t* host[3] = {table.data, table.residual[0], table.residual[1]};
    for (int k = 0; k < np; ++k)
      if (parts[k].w == host[k]) link_bytes_ += static_cast<uint64_t>(parts[k].row_bytes * n);
  }
  auto* p = Add<DequantParams>(&LaunchDequant);
  SetParts(p, parts, np);
  p->cols = table.cols;
  p->ids = static_cast<const int32_t*>(
      Args(rows_only ? iota.data() : ids, static_cast<size_t>(n) * 4, kIds));
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

void CudaBackend::AddGemvJob(int type, bool fast, const Tensor& x, const void* xq, const float2* xs,
                             const Tensor& y, const DevPart& part, bool accumulate) {
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
  // Repacked, one token: the kernel shape measured best for the type and size (or the one
  // SUBSTRATE_CUDA_GEMV_VARIANT names); other token counts take shape 0.
  const int variant = !(type & kRepacked) || ntok != 1 ? 0
                      : gemv_variant_ >= 0             ? gemv_variant_
                                                       : GemvDefaultVariant(type, y.cols);
  const int per_block = GemvRowsPerBlock(type, fast, variant);
  const int blocks = static_cast<int>((y.cols + per_block - 1) / per_block);
  // Join the previous launch when it is a product of the same kind and neither reads what the
  // other writes.
  if (n_recs_ > 0 && recs_[n_recs_ - 1].fn == &LaunchGemv) {
    auto* p = reinterpret_cast<GemvParams*>(recs_[n_recs_ - 1].p);
    // (Not a router's launch: its kernel computes one job, and may write activations.)
    bool ok = p->type == type && p->fast == (fast ? 1 : 0) && p->cols == x.cols &&
              p->ntok == ntok && p->variant == variant && p->n_jobs < kGemvMaxJobs &&
              !p->route.logits;
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
  p->variant = variant;
  p->n_jobs = 1;
  p->block_start[0] = 0;
  p->block_start[1] = blocks;
  p->jobs[0] = job;
}

void CudaBackend::RecordGemm(const MatMulOp& op, const DevPart* parts, int n_parts) {
  const Tensor& x = op.x;
  const Tensor& y = op.y;
  const bool exact =
      parts[0].type == kTypeF32 || parts[0].type == kTypeF16 || parts[0].type == kTypeBF16;
  void* xh = nullptr;
  void* scales = nullptr;
  if (!exact) ConvertAct(x, true, &xh, &scales);
  const int64_t elem = exact ? 4 : 2;
  const int64_t rows = y.cols;
  // Rows per dequantized chunk: the temporary's size, and a launch's grid height.
  const int64_t chunk = std::max<int64_t>(
      1, std::min<int64_t>({rows, static_cast<int64_t>(gemm_tmp_bytes_) / (x.cols * elem), 65535}));
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
  if (!HybridBatch(ops, n_ops)) DeviceMatMulBatch(ops, n_ops);
}

void CudaBackend::DeviceMatMulBatch(const MatMulOp* ops, int n_ops) {
  uint64_t stage = 0;
  for (int i = 0; i < n_ops; ++i) stage += StagingBytes(*ops[i].w);
  if (opt_.max_vram && stage > staging_size_ && n_ops > 1) {
    // Under a budget the staging buffer does not grow for a batch (a prompt's experts): its
    // halves, one after the other, give the same results (each product is MatMul's).
    DeviceMatMulBatch(ops, n_ops / 2);
    DeviceMatMulBatch(ops + n_ops / 2, n_ops - n_ops / 2);
    return;
  }
  size_t work = 0;
  bool any_gemm = false;
  for (int i = 0; i < n_ops; ++i) {
    const MatMulOp& op = ops[i];
    const bool gemm = UseGemm(op) && LoadCublas();
    any_gemm |= gemm;
    // Worst case: the activations converted (int8 + scales, or half + row scales).
    work += gemm ? static_cast<size_t>(op.x.size()) * 2 + static_cast<size_t>(op.x.rows) * 4 + 512
                 : static_cast<size_t>(op.x.size()) +
                       static_cast<size_t>(op.x.size() / 32 + 1) * 8 + 512;
  }
  if (any_gemm && !gemm_ready_) {
    SetDevice();
    cublas_ = LoadCublas();
    if (cublas_->create(&cublas_handle_) != CUBLAS_STATUS_SUCCESS)
      FatalError("cublasCreate failed");
    void* ws = nullptr;
    auto c = ledger_->Charge("scratch", gemm_tmp_bytes_ + kCublasWorkspace);
    if (!c.ok()) FatalError(c.status().ToString());
    gemm_charge_ = std::move(c).value();
    CK(cudaMalloc(&gemm_tmp_, gemm_tmp_bytes_));
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
  for (int i = 0; i < n_ops; ++i)
    n_parts[i] = Parts(*ops[i].w, &parts[static_cast<size_t>(i) * kMaxParts]);
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
  // A norm starts each block of a layer, where no recorded launch waits for a later op to
  // join it (at worst the join of two norms below is missed): a long pass goes to the device
  // from here in pieces, so the device computes the first layers while the host records the
  // rest.
  if (chunk_recs_ > 0 && n_recs_ >= static_cast<size_t>(chunk_recs_)) Flush();
  EnsureStaging(StagingBytes(w));
  EnsureWork(static_cast<size_t>(x.cols) * 4);
  const float* v = VectorOf(w, x.cols);
  if (n_recs_ > 0 && recs_[n_recs_ - 1].fn == &LaunchRmsNorm) {
    // Two independent norms of one width back to back (the query and key head norms): one
    // launch.
    auto* prev = reinterpret_cast<RmsNormParams*>(recs_[n_recs_ - 1].p);
    const size_t pb = static_cast<size_t>(prev->rows * prev->cols) * 4;
    const size_t b = static_cast<size_t>(x.size()) * 4;
    if (prev->rows2 == 0 && !prev->xq && prev->cols == x.cols && prev->eps == eps &&
        !Overlap(x.data, b, prev->y, pb) && !Overlap(y.data, b, prev->x, pb) &&
        !Overlap(y.data, b, prev->y, pb)) {
      prev->x2 = x.data;
      prev->y2 = y.data;
      prev->w2 = v;
      prev->rows2 = x.rows;
      Wrote(y);
      FinishStaged();
      return;
    }
  }
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
  // y += x right after the routed experts' weighted sum wrote x (a MoE layer without a shared
  // expert): that launch adds it as it writes x.
  if (n_recs_ > 0 && recs_[n_recs_ - 1].fn == &LaunchMoeCombine) {
    auto* c = reinterpret_cast<MoeCombineParams*>(recs_[n_recs_ - 1].p);
    if (c->acc == x.data && !c->add_to && c->n == x.rows && c->cols == x.cols && y.rows == x.rows &&
        y.cols == x.cols &&
        !Overlap(y.data, static_cast<size_t>(y.size()) * 4, x.data,
                 static_cast<size_t>(x.size()) * 4)) {
      c->add_to = y.data;
      Wrote(y);
      return;
    }
  }
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
      clear =
          clear && !Overlap(e.y, ey, y.data, y_bytes) &&
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
  // Right after the one-token product that wrote gate and up (a dense FFN): that launch computes
  // it as its last rows land, one kernel less per layer.
  if (n_recs_ > 0 && recs_[n_recs_ - 1].fn == &LaunchGemv && gate.rows == 1 && up.rows == 1 &&
      out.rows == 1) {
    auto* g = reinterpret_cast<GemvParams*>(recs_[n_recs_ - 1].p);
    const GemvJob* j = g->jobs;
    if ((g->type & kRepacked) && g->ntok == 1 && g->n_jobs == 2 && !g->glu_out &&
        j[0].y == gate.data && j[1].y == up.data && j[0].rows == gate.cols &&
        j[1].rows == up.cols && gate.cols == up.cols && out.cols == gate.cols &&
        gate.cols % 32 == 0 && gate.cols / 32 <= kGluCounterCells && !j[0].add_to && !j[1].add_to &&
        (out.data == gate.data || (!Overlap(out.data, static_cast<size_t>(out.cols) * 4, gate.data,
                                            static_cast<size_t>(gate.cols) * 4) &&
                                   !Overlap(out.data, static_cast<size_t>(out.cols) * 4, up.data,
                                            static_cast<size_t>(up.cols) * 4)))) {
      g->glu_out = out.data;
      g->glu_counters = glu_counters_;
      Wrote(out);
      return;
    }
  }
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

// qwen3's head norms of q and k (one launch, in place) right before the rotation of both: the
// rotation norms each head first, one launch less a layer.
void CudaBackend::JoinHeadNorms(RopeParamsDev* r) {
  if (n_recs_ < 2 || recs_[n_recs_ - 2].fn != &LaunchRmsNorm) return;
  const auto* n = reinterpret_cast<const RmsNormParams*>(recs_[n_recs_ - 2].p);
  const int half = r->n_rot / 2;
  if (n->xq || n->x != r->x || n->y != r->x || n->x2 != r->x2 || n->y2 != r->x2 ||
      n->cols != r->head_dim || r->n_rot != r->head_dim || n->rows != r->rows * r->n_heads ||
      n->rows2 != r->rows * r->n_heads2 || half > kRopeThreads || (half & (half - 1)) != 0)
    return;
  r->norm_w = n->w;
  r->norm_w2 = n->w2;
  r->norm_eps = n->eps;
  DropRecordBeforeLast();
}

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
      JoinHeadNorms(r);
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
    r->corr_lo = std::max(
        0.0f, std::floor(YarnCorrDim(p.n_rot, p.yarn_orig_ctx, p.yarn_beta_fast, p.freq_base)));
    r->corr_hi =
        std::min(static_cast<float>(p.n_rot - 1),
                 std::ceil(YarnCorrDim(p.n_rot, p.yarn_orig_ctx, p.yarn_beta_slow, p.freq_base)));
  }
  Wrote(x);
}

bool CudaBackend::AllFinite(const Tensor& x, const Tensor* also) {
  Flush();
  CK(cudaMemsetAsync(flag_dev_, 0, sizeof(int), stream_));
  AllFiniteAsync(x.data, x.size(), flag_dev_, stream_);
  if (also) AllFiniteAsync(also->data, also->size(), flag_dev_, stream_);
  CK(cudaMemcpyAsync(flag_host_, flag_dev_, sizeof(int), cudaMemcpyDeviceToHost, stream_));
  Sync();
  return *flag_host_ == 0;
}

// ---------------------------------------------------------------- attention

void CudaBackend::StoreKv(const KvLayer& kv, int64_t pos0, const Tensor& k, const Tensor& v) {
  EnsureArgs(32);
  // Right after k's rotation (q and k in one launch): that launch stores k's rotated rows and
  // copies v as well, one kernel less per layer.
  if (n_recs_ > 0 && recs_[n_recs_ - 1].fn == &LaunchRope) {
    auto* r = reinterpret_cast<RopeParamsDev*>(recs_[n_recs_ - 1].p);
    if (r->x2 == k.data && !r->kc && r->rows == k.rows && r->n_rot == r->head_dim &&
        static_cast<int64_t>(r->n_heads2) * r->head_dim == k.cols && v.rows == k.rows &&
        !Overlap(v.data, static_cast<size_t>(v.size()) * 4, r->x,
                 static_cast<size_t>(r->rows * r->n_heads * r->head_dim) * 4) &&
        !Overlap(v.data, static_cast<size_t>(v.size()) * 4, k.data,
                 static_cast<size_t>(k.size()) * 4)) {
      r->kc = kv.k;
      r->vc = kv.v;
      r->v = v.data;
      r->v_cols = v.cols;
      r->k_stride = kv.k_stride;
      r->v_stride = kv.v_stride;
      r->f16 = kv.type == DType::kF16 ? 1 : 0;
      r->pos0 = Pos0(pos0);
      return;
    }
  }
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
  const bool vec = s.dk % 8 == 0 && s.dv % 8 == 0 && kv.k_stride % 8 == 0 && kv.v_stride % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(q.data) % 16 == 0;
  // Prefill runs on tensor cores where the shape allows and the history is over one tile
  // (H200, 16 tokens from an empty cache: 14 us on the float kernel, 20 us there).
  const bool mma = attn_mma_ && q.rows > 8 && pos0 + q.rows > kAttentionMmaTile && vec &&
                   AttentionMmaFits(s.dk, s.dv, group);
  int hb = std::max(1, std::min(group, 128 * kAttentionMaxAcc / s.dv));
  int splits = 1, qb = 1;
  int64_t cells = q.rows * s.n_head_kv * ((group + hb - 1) / hb);
  if (mma) {
    hb = group;
    qb = kAttentionMmaRows / group;
    cells = (q.rows + qb - 1) / qb * s.n_head_kv;
    // (It splits only launches of fewer cells than half the multiprocessors: far fewer than
    // kCounterCells.)
    splits = AttentionMmaSplits(cells, sm_count_, pos0 + q.rows);
  } else if (q.rows <= 8 && cells * (1 + kMergeGroups) <= kCounterCells) {
    // Decode: few tokens, so each one's positions are split over blocks (a counter a cell and
    // one a cell's group of splits). A short history has few tiles to split, and a model of
    // few KV heads then few blocks: its query heads go to more blocks (each reads its KV
    // head's tiles again, from L2) while a launch would not reach half the multiprocessors
    // (SUBSTRATE_CUDA_ATTN_HEADS=N: at most N query heads a block instead).
    const int64_t tiles = (pos0 + q.rows + kAttentionTile - 1) / kAttentionTile;
    const auto cells_of = [&](int h) { return q.rows * s.n_head_kv * ((group + h - 1) / h); };
    const auto fits = [&](int h) { return cells_of(h) * (1 + kMergeGroups) <= kCounterCells; };
    if (attn_heads_ > 0) {
      while (hb > attn_heads_ && fits((hb + 1) / 2)) hb = (hb + 1) / 2;
    } else {
      while (hb > 1 && cells_of(hb) * tiles < sm_count_ / 2 && fits((hb + 1) / 2))
        hb = (hb + 1) / 2;
    }
    cells = cells_of(hb);
    splits = DecodeAttentionSplits(cells, sm_count_, tiles);
  } else {
    // Prefill: several tokens per block share each K/V tile it loads.
    qb = std::max(1, std::min(8, 128 * kAttentionMaxAcc / s.dv / hb));
  }
  const int smem = mma ? 0 : AttentionSmemBytes(qb * hb, s.dk, s.dv);
  if (smem > attn_smem_allowed_) {
    AllowAttentionSmem(smem);
    attn_smem_allowed_ = smem;
  }
  const int cell_rows = mma ? kAttentionMmaRows : hb;  // (q_per_block is 1 where decode splits)
  const int64_t partials = mma ? splits : AttentionPartials(splits);  // a cell's
  const size_t partial =
      splits > 1 ? static_cast<size_t>(cells * partials * cell_rows * (s.dv + 2)) * 4 : 0;
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
  p->vec = vec ? 1 : 0;
  p->mma = mma ? 1 : 0;
  p->early = attn_early_ && !mma && vec && q.rows == 1 && qb == 1 ? 1 : 0;
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

void CudaBackend::GatherRows(const Tensor& src, const int32_t* rows, int64_t n, const Tensor& dst) {
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

const CudaBackend::ExpertTable* CudaBackend::Experts(const WeightView& v, int n_expert) {
  auto it = expert_tables_.find(v.data);
  if (it != expert_tables_.end()) return it->second.dev ? &it->second : nullptr;
  ExpertTable& t = expert_tables_[v.data];  // stays empty (null) if the checks below fail
  const auto rb = RowBytes(v.type, static_cast<uint64_t>(v.cols));
  if (v.layout != WeightLayout::kRows || v.n_residuals != 0 || !rb || n_expert <= 0 ||
      v.rows % n_expert != 0)
    return nullptr;
  const int64_t rows = v.rows / n_expert;
  const uint64_t slice = *rb * static_cast<uint64_t>(rows);
  std::vector<const uint8_t*> ptrs(static_cast<size_t>(n_expert)), host(ptrs.size());
  DevPart first;
  for (int e = 0; e < n_expert; ++e) {
    DevPart part;
    host[static_cast<size_t>(e)] = v.data + slice * static_cast<uint64_t>(e);
    if (!FindAdoptedPart(host[static_cast<size_t>(e)], slice, static_cast<int>(v.type),
                         static_cast<int64_t>(*rb), &part))
      return nullptr;
    if (e == 0) first = part;
    if (part.type != first.type || part.row_bytes != first.row_bytes) return nullptr;
    ptrs[static_cast<size_t>(e)] = part.w;
  }
  const size_t bytes = ptrs.size() * sizeof(ptrs[0]);
  auto charge = ledger_->Charge("weights", bytes);
  void* dev = nullptr;
  if (!charge.ok() || cudaMalloc(&dev, bytes) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  CK(cudaMemcpy(dev, ptrs.data(), bytes, cudaMemcpyHostToDevice));
  t.dev = static_cast<const uint8_t* const*>(dev);
  t.part = first;
  t.rows = rows;
  t.charge = std::move(charge).value();
  t.host = std::move(host);
  t.dev_ptrs = std::move(ptrs);
  for (int e = 0; e < n_expert; ++e) t.some_in_place |= t.InPlace(e);
  return &t;
}

const unsigned long long* CudaBackend::ExpertLinkBytes(const RoutedExpertsOp& op,
                                                       const ExpertTable& g, const ExpertTable& u,
                                                       const ExpertTable& dn, int n_expert) {
  auto it = expert_link_.find(op.gate->data);
  if (it != expert_link_.end()) return it->second.first;
  auto& link = expert_link_[op.gate->data];  // stays null when every expert is on the device
  std::vector<unsigned long long> bytes(static_cast<size_t>(n_expert), 0);
  bool any = false;
  for (const ExpertTable* t : {&g, &u, &dn}) {
    for (int e = 0; e < n_expert; ++e) {
      if (!t->InPlace(e)) continue;  // in device memory
      bytes[static_cast<size_t>(e)] += t->MatrixBytes();
      any = true;
    }
  }
  if (!any) return nullptr;
  auto charge = ledger_->Charge("weights", bytes.size() * 8);
  if (!charge.ok() || cudaMalloc(&link.first, bytes.size() * 8) != cudaSuccess) {
    cudaGetLastError();
    link.first = nullptr;
    return nullptr;  // not counted, still correct
  }
  link.second = std::move(charge).value();
  CK(cudaMemcpy(link.first, bytes.data(), bytes.size() * 8, cudaMemcpyHostToDevice));
  return link.first;
}

void CudaBackend::AddExpertGemv(const DevPart& part, bool fast, int64_t cols, const GemvJob* jobs,
                                int n_jobs) {
  auto* p = Add<GemvParams>(&LaunchGemv);
  p->type = part.type;
  p->fast = fast ? 1 : 0;
  p->nt = 1;
  p->ntok = 1;
  p->cols = cols;
  p->variant = !(part.type & kRepacked) ? 0
               : gemv_variant_ >= 0     ? gemv_variant_
               : expert_variant_ >= 0   ? expert_variant_
                                        : GemvDefaultVariant(part.type, jobs[0].rows);
  const int per_block = GemvRowsPerBlock(part.type, fast, p->variant);
  p->n_jobs = n_jobs;
  for (int j = 0; j < n_jobs; ++j) {
    p->jobs[j] = jobs[j];
    p->block_start[j + 1] = p->block_start[j] + (jobs[j].rows + per_block - 1) / per_block;
  }
}

CudaBackend::ExpertWork CudaBackend::CarveExpertWork(int64_t slots, int64_t ff, int64_t d) {
  ExpertWork w;
  w.gate = static_cast<float*>(Carve(static_cast<size_t>(slots * ff) * 4));
  w.up = static_cast<float*>(Carve(static_cast<size_t>(slots * ff) * 4));
  w.hq = static_cast<int8_t*>(Carve(static_cast<size_t>(slots * ff)));
  w.hs = static_cast<float2*>(Carve(static_cast<size_t>(slots * ff / 32) * sizeof(float2)));
  w.out = static_cast<float*>(Carve(static_cast<size_t>(slots * d) * 4));
  return w;
}

size_t CudaBackend::ExpertWorkBytes(int64_t slots, int64_t ff, int64_t d) {
  return static_cast<size_t>(slots * ff) * 10 + static_cast<size_t>(slots * d) * 4 + 5 * 256;
}

void CudaBackend::AddSwiGlu(const ExpertWork& w, int64_t slots, int64_t ff, bool quantize) {
  // hidden = silu(gate) * up in place of gate, quantized for the down product when it takes
  // int8 activations.
  auto* e = Add<ElementwiseParams>(&LaunchElementwise);
  e->kind = kSwiGlu;
  e->y = w.gate;
  e->a = w.gate;
  e->b = w.up;
  e->rows = slots;
  e->cols = ff;
  e->xq = quantize ? w.hq : nullptr;
  e->xs = quantize ? w.hs : nullptr;
}

void CudaBackend::AddExpertSlots(const RoutedExpertsOp& op, const ExpertTable& g,
                                 const ExpertTable& u, const ExpertTable& dn, const int32_t* sel,
                                 int64_t slots, int x_div, const ExpertWork& w) {
  const int64_t d = op.xn.cols, ff = g.rows;
  const bool fast_g = GemvFastType(g.part.type, d, g.part.row_bytes, g.part.w);
  const bool fast_u = GemvFastType(u.part.type, d, u.part.row_bytes, u.part.w);
  const bool fast_d = GemvFastType(dn.part.type, ff, dn.part.row_bytes, dn.part.w);
  void* xq = nullptr;
  void* xs = nullptr;
  if (fast_g || fast_u) ConvertAct(op.xn, false, &xq, &xs);
  auto job = [&](const ExpertTable& t, bool fast, const void* x_fast, const void* x_float,
                 const void* x_scales, float* y, int64_t slot_rows, int div) {
    GemvJob j;
    j.row_bytes = t.part.row_bytes;
    j.x = fast ? x_fast : x_float;
    j.xs = fast ? static_cast<const float2*>(x_scales) : nullptr;
    j.y = y;
    j.ldy = slots * slot_rows;
    j.rows = static_cast<int32_t>(slots * slot_rows);
    j.slot_expert = sel;
    j.expert_w = t.dev;
    j.slot_rows = static_cast<int32_t>(slot_rows);
    j.x_div = div;
    return j;
  };
  const GemvJob gu[2] = {job(g, fast_g, xq, op.xn.data, xs, w.gate, ff, x_div),
                         job(u, fast_u, xq, op.xn.data, xs, w.up, ff, x_div)};
  if (g.part.type == u.part.type && fast_g == fast_u) {
    AddExpertGemv(g.part, fast_g, d, gu, 2);
  } else {
    AddExpertGemv(g.part, fast_g, d, &gu[0], 1);
    AddExpertGemv(u.part, fast_u, d, &gu[1], 1);
  }
  auto* last = reinterpret_cast<GemvParams*>(recs_[n_recs_ - 1].p);
  if (last->n_jobs == 2 && (last->type & kRepacked) && slots * ff / 32 <= kGluCounterCells) {
    // SwiGLU (and the down product's quantization) in the gate and up launch's epilogue.
    last->glu_out = w.gate;
    last->glu_counters = glu_counters_;
    last->glu_xq = fast_d ? w.hq : nullptr;
    last->glu_xs = fast_d ? w.hs : nullptr;
  } else {
    AddSwiGlu(w, slots, ff, fast_d);
  }
  const GemvJob down = job(dn, fast_d, w.hq, w.gate, w.hs, w.out, d, 1);
  AddExpertGemv(dn.part, fast_d, ff, &down, 1);
}

void CudaBackend::AddMoeCombine(const float* out, const float* weight, const int32_t* pos,
                                const Tensor& acc, int k, const float* plus) {
  auto* c = Add<MoeCombineParams>(&LaunchMoeCombine);
  c->out = out;
  c->weight = weight;
  c->pos = pos;
  c->plus = plus;
  c->acc = acc.data;
  c->n = acc.rows;
  c->cols = acc.cols;
  c->k = k;
  Wrote(acc);
}

// The norm that wrote the router's input xn, recorded just before the router: the router's
// launch does its work too, one launch less (the experts' activations are quantized there).
GemvParams* CudaBackend::JoinNormToRouter(GemvParams* router, const Tensor& xn) {
  if (n_recs_ < 2 || recs_[n_recs_ - 2].fn != &LaunchRmsNorm) return router;
  const RmsNormParams n = *reinterpret_cast<const RmsNormParams*>(recs_[n_recs_ - 2].p);
  const int64_t d = xn.cols;
  const size_t bytes = static_cast<size_t>(d) * 4;
  if (xn.rows != 1 || n.rows != 1 || n.rows2 != 0 || n.xq || n.cols != d || d % 32 != 0 ||
      n.y != xn.data || router->jobs[0].x != xn.data || router->cols != d ||
      Overlap(n.x, bytes, n.y, bytes))
    return router;
  router = static_cast<GemvParams*>(DropRecordBeforeLast());
  router->jobs[0].x = n.x;
  router->norm_w = n.w;
  router->norm_y = n.y;
  router->norm_eps = n.eps;
  return router;
}

bool CudaBackend::RoutedExperts(const RoutedExpertsOp& op) {
  const RoutingParams& rp = op.routing;
  const int E = rp.n_expert, K = rp.k;
  const int64_t n = op.xn.rows, d = op.xn.cols;
  const bool grouped = rp.n_groups > 1 && rp.n_groups_used < rp.n_groups;
  if (!route_ || rp.cached || grouped || E > kRouteMaxExperts || K <= 0 || K > E || n < 1 ||
      op.logits.cols != E || op.logits.rows != n)
    return false;
  const ExpertTable* g = Experts(*op.gate, E);
  const ExpertTable* u = Experts(*op.up, E);
  const ExpertTable* dn = Experts(*op.down, E);
  if (!g || !u || !dn) return false;
  const int64_t ff = g->rows, slots = n * K;
  // Slots of whole 32-row groups (the SwiGLU's quantization blocks) and of whole warps' rows.
  if (u->rows != ff || dn->rows != d || op.gate->cols != d || op.up->cols != d ||
      op.down->cols != ff || ff % 32 != 0 || d % 4 != 0 || slots * std::max(ff, d) > INT32_MAX)
    return false;
  // The hybrid computes a share of the experts read in place on the host's CPU: that needs the
  // choice on the host (SUBSTRATE_CUDA_HYBRID_MOE=0: on the device, every expert over the link).
  if (host_ && hybrid_moe_ && n == 1 && (g->some_in_place || u->some_in_place || dn->some_in_place))
    return HybridExperts(op, *g, *u, *dn);
  const bool fast_g = GemvFastType(g->part.type, d, g->part.row_bytes, g->part.w);
  const bool fast_u = GemvFastType(u->part.type, d, u->part.row_bytes, u->part.w);
  const bool fast_d = GemvFastType(dn->part.type, ff, dn->part.row_bytes, dn->part.w);
  // A few tokens (decode): a GEMV per slot of expert rows. Many (prefill): the slots sorted
  // into tiles by expert, each expert's matrix read about once (repacked layouts only).
  const bool tiled = n > 8;
  if (tiled &&
      (!(g->part.type & kRepacked) || !(u->part.type & kRepacked) || !(dn->part.type & kRepacked) ||
       slots > kMoeSortMaxSlots || E > kMoeSortMaxExperts || std::max(d, ff) > GemvTilesMaxCols()))
    return false;

  // Tiles on int8 tensor cores where the device has them.
  const int tile_slots = tiled && moe_mma_ ? kMoeMmaTileSlots : kMoeTileSlots;
  const int64_t max_tiles = slots / tile_slots + E;
  EnsureStaging(op.bias ? StagingBytes(*op.bias) : 0);
  EnsureWork(static_cast<size_t>(E) * 4 + static_cast<size_t>(slots) * 16 +
             static_cast<size_t>(max_tiles) * 16 + ExpertWorkBytes(slots, ff, d) +
             static_cast<size_t>(n * d) * 2 + 16 * 256);
  const float* bias = op.bias ? VectorOf(*op.bias, E) : nullptr;
  auto* sel = static_cast<int32_t*>(Carve(static_cast<size_t>(slots) * 4));
  auto* weight = static_cast<float*>(Carve(static_cast<size_t>(slots) * 4));

  RouteTopKParams route;
  route.logits = op.logits.data;
  route.bias = bias;
  route.n = static_cast<int32_t>(n);
  route.n_expert = E;
  route.k = K;
  route.sigmoid = rp.gating == GatingFunc::kSigmoid ? 1 : 0;
  route.normalize = rp.normalize ? 1 : 0;
  route.scale = rp.scale;
  route.sel = sel;
  route.weight = weight;
  route.link_bytes = ExpertLinkBytes(op, *g, *u, *dn, E);
  route.link_counter = link_counter_;
  // One token whose logits the last launch (the router's float product) just wrote: that launch
  // routes them as it finishes, one launch less.
  GemvParams* router = n_recs_ > 0 && recs_[n_recs_ - 1].fn == &LaunchGemv
                           ? reinterpret_cast<GemvParams*>(recs_[n_recs_ - 1].p)
                           : nullptr;
  const bool joined =
      n == 1 && router && !router->fast && router->n_jobs == 1 && router->ntok == 1 &&
      !router->glu_out && !router->route.logits &&
      (router->type == kTypeF32 || router->type == kTypeF16 || router->type == kTypeBF16) &&
      router->jobs[0].y == op.logits.data && router->jobs[0].rows == E &&
      !router->jobs[0].accumulate && !router->jobs[0].add_to && !router->jobs[0].slot_expert;
  if (joined) {
    router->route = route;
    router->route_counter = route_counter_;
    router = JoinNormToRouter(router, op.xn);
  } else {
    *Add<RouteTopKParams>(&LaunchRouteTopK) = route;
  }

  const ExpertWork w = CarveExpertWork(slots, ff, d);
  const int32_t* pos = nullptr;
  if (tiled) {
    void* xq = nullptr;
    void* xs = nullptr;
    if (fast_g || fast_u) ConvertAct(op.xn, false, &xq, &xs);
    auto* tiles = static_cast<int4*>(Carve(static_cast<size_t>(max_tiles) * sizeof(int4)));
    auto* n_tiles = static_cast<int32_t*>(Carve(4));
    auto* row_src = static_cast<int32_t*>(Carve(static_cast<size_t>(slots) * 4));
    auto* spos = static_cast<int32_t*>(Carve(static_cast<size_t>(slots) * 4));
    pos = spos;
    auto* so = Add<MoeSortParams>(&LaunchMoeSort);
    so->sel = sel;
    so->n_slots = static_cast<int32_t>(slots);
    so->n_expert = E;
    so->k = K;
    so->tile_slots = tile_slots;
    so->tiles = tiles;
    so->n_tiles = n_tiles;
    so->row_src = row_src;
    so->pos = spos;
    // One launch of up to two products over the tiles.
    auto tiles_gemv = [&](const ExpertTable* const* t, float* const* y, int n_jobs, int64_t cols,
                          int64_t rows, const void* x, const void* x_scales, const int32_t* src) {
      auto* p = Add<GemvTilesParams>(moe_mma_ ? &LaunchGemvTilesMma : &LaunchGemvTiles);
      p->type = t[0]->part.type;
      p->n_jobs = n_jobs;
      p->cols = cols;
      p->rows = static_cast<int32_t>(rows);
      const int per = kGemvTilesRowsPerBlock;
      p->row_blocks = static_cast<int32_t>((rows + per - 1) / per);
      p->grid = static_cast<int32_t>(max_tiles * n_jobs * p->row_blocks);
      for (int j = 0; j < n_jobs; ++j) {
        p->expert_w[j] = t[j]->dev;
        p->row_bytes[j] = t[j]->part.row_bytes;
        p->y[j] = y[j];
      }
      p->xq = static_cast<const int8_t*>(x);
      p->xs = static_cast<const float2*>(x_scales);
      p->row_src = src;
      p->tiles = tiles;
      p->n_tiles = n_tiles;
    };
    const ExpertTable* gu_tables[2] = {g, u};
    float* gu_out[2] = {w.gate, w.up};
    if (g->part.type == u->part.type) {
      tiles_gemv(gu_tables, gu_out, 2, d, ff, xq, xs, row_src);
    } else {
      tiles_gemv(&gu_tables[0], &gu_out[0], 1, d, ff, xq, xs, row_src);
      tiles_gemv(&gu_tables[1], &gu_out[1], 1, d, ff, xq, xs, row_src);
    }
    AddSwiGlu(w, slots, ff, fast_d);
    float* out = w.out;
    tiles_gemv(&dn, &out, 1, ff, d, w.hq, w.hs, nullptr);
  } else {
    AddExpertSlots(op, *g, *u, *dn, sel, slots, K, w);
  }
  AddMoeCombine(w.out, weight, pos, op.acc, K, nullptr);
  FinishStaged();
  return true;
}

std::optional<double> CudaBackend::MeasureReadBandwidth(uint64_t bytes) {
  Sync();
  return cuda::MeasureReadBandwidth(bytes, 5, stream_);
}

std::optional<double> CudaBackend::MeasureUploadBandwidth(uint64_t bytes) {
  // Into the staging buffer (device memory already charged; under a budget it is not grown
  // for this), from pinned host memory: what a weight upload of that size gets. Best of 5.
  SetDevice();
  if (!opt_.max_vram) EnsureStaging(std::min<uint64_t>(bytes, 256u << 20));
  Sync();
  if (!staging_) return std::nullopt;
  const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes, staging_size_));
  void* host = nullptr;
  CK(cudaHostAlloc(&host, n, cudaHostAllocDefault));
  std::memset(host, 1, n);
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  float best_ms = 0;
  for (int rep = 0; rep < 5; ++rep) {
    CK(cudaEventRecord(a, stream_));
    CK(cudaMemcpyAsync(staging_, host, n, cudaMemcpyHostToDevice, stream_));
    CK(cudaEventRecord(b, stream_));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (rep == 0 || ms < best_ms) best_ms = ms;
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFreeHost(host);
  return static_cast<double>(n) / (static_cast<double>(best_ms) * 1e-3);
}

}  // namespace cuda

Expected<std::unique_ptr<Backend>> NewCudaBackend(const CudaBackendOptions& options) {
  auto b = std::make_unique<cuda::CudaBackend>(options);
  RETURN_IF_ERROR(b->Init());
  return std::unique_ptr<Backend>(std::move(b));
}

int CudaDeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

int64_t CudaLaunches(const Backend& backend) {
  const auto* cuda = dynamic_cast<const cuda::CudaBackend*>(&backend);
  return cuda ? cuda->launches() : 0;
}

}  // namespace substrate
