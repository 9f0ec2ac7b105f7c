#include "kernels/matmul.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/interleaved.h"
#include "kernels/interleaved_q4_0.h"
#include "kernels/interleaved_q4_k.h"
#include "kernels/interleaved_q6_k.h"
#include "kernels/interleaved_q8_0.h"
#include "kernels/profile.h"
#include "kernels/scratch_buffer.h"
#include "kernels/vec_dot.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace substrate {
namespace {

// ---------------------------------------------------------------- reference

// Dequantizes row r of the view (skeleton plus residuals) into out[0..cols).
void DequantizeViewRow(const WeightView& w, int64_t r, float* out, std::vector<float>& tmp) {
  uint64_t row_bytes = *RowBytes(w.type, static_cast<uint64_t>(w.cols));
  if (w.layout != WeightLayout::kRows) {
    static thread_local std::vector<uint8_t> plain;
    plain.resize(row_bytes);
    DeinterleaveRow(w.layout, w.data, w.cols, r, plain.data());
    DequantizeRow(w.type, plain.data(), out, w.cols);
  } else {
    DequantizeRow(w.type, w.data + r * row_bytes, out, w.cols);
  }
  for (int k = 0; k < w.n_residuals; ++k) {
    uint64_t rb = *RowBytes(w.residual_type[k], static_cast<uint64_t>(w.cols));
    tmp.resize(static_cast<size_t>(w.cols));
    DequantizeRow(w.residual_type[k], w.residual[k] + r * rb, tmp.data(), w.cols);
    for (int64_t c = 0; c < w.cols; ++c) out[c] += tmp[c];
  }
}

void MatMulRows(const WeightView& w, const float* x, int64_t n_tokens, float* y, int64_t r0,
                int64_t r1) {
  std::vector<float> row(static_cast<size_t>(w.cols)), tmp;
  for (int64_t r = r0; r < r1; ++r) {
    DequantizeViewRow(w, r, row.data(), tmp);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x + t * w.cols;
      double acc = 0;
      for (int64_t c = 0; c < w.cols; ++c) acc += static_cast<double>(row[c]) * xt[c];
      y[t * w.rows + r] = static_cast<float>(acc);
    }
  }
}

// ---------------------------------------------------------------- fast path

struct Part {  // one tier of the weight: the skeleton or a residual
  const DotKernel* kernel;
  const uint8_t* data;
  size_t row_bytes;
  const uint8_t* act;  // its activations, quantized to kernel->act_type
  size_t act_stride;
  int act_set;         // which ActSet holds them
};

constexpr int kMaxParts = 3;
// Tokens per weight-row pass; the kernels split it into register tiles of max_nt.
constexpr int64_t kTokenBlock = 64;
// Rows per block: the block's weights stay in L2 while every token block passes over them.
constexpr size_t kRowBlockBytes = 256 * 1024;
// Rows per block at least, for kernels with tiles of rows (DotKernel::rows).
constexpr int64_t kRowsTileBlock = 32;
// Interleaved weights: groups per panel (this many bytes) and tokens per block passing over it.
constexpr int64_t kPanelBytes = 512 * 1024;
constexpr int64_t kPanelTokens = 64;
// Rows per work item of the shared ParallelFor: one interleaved group, so an item of any layout
// is the same amount of weight.
constexpr int64_t kItemRows = kInterleavedRows;

bool PrepareParts(const WeightView& w, Isa isa, Part* parts, int* n_parts) {
  *n_parts = 1 + std::clamp(w.n_residuals, 0, 2);
  for (int p = 0; p < *n_parts; ++p) {
    DType type = p == 0 ? w.type : w.residual_type[p - 1];
    auto rb = RowBytes(type, static_cast<uint64_t>(w.cols));
    const DotKernel* k = FindDotKernel(type, isa);
    if (!rb || !k || !FindQuantizeAct(k->act_type, isa) || ActRowBytes(k->act_type, w.cols) == 0)
      return false;
    parts[p] = {k, p == 0 ? w.data : w.residual[p - 1], static_cast<size_t>(*rb), nullptr, 0, -1};
  }
  return true;
}

// Rows [r0, r1) of parts (each part's row r at data + r * row_bytes) for every token:
// y[t * y_stride + r], the parts' products added in order; with `accumulate` added to what y
// holds (an interleaved skeleton's product, whose residuals these parts are).
void FastRows(int64_t cols, int64_t y_stride, const Part* parts, int n_parts, int64_t n_tokens,
              float* y, int64_t r0, int64_t r1, bool accumulate = false) {
  float tmp[kTokenBlock], res[kTokenBlock];
  size_t row_bytes = parts[0].row_bytes;
  for (int p = 1; p < n_parts; ++p) row_bytes += parts[p].row_bytes;
  int64_t row_block = std::max<int64_t>(1, static_cast<int64_t>(kRowBlockBytes / row_bytes));
  // One register tile of tokens per pass: its activation rows stay in L1 while the rows of the
  // block (in L2) stream past; larger token blocks would stream activations from L2 per row.
  // A kernel with tiles of rows (DotKernel::rows) takes the block's rows and tokens whole and
  // tiles both itself: row by row, prefill over float weights loaded an activation per FMA.
  const RowsDotFn rows = n_parts == 1 && !accumulate && n_tokens > 1 ? parts[0].kernel->rows
                                                                     : nullptr;
  int64_t token_block = kTokenBlock;
  for (int p = 0; p < n_parts && !rows; ++p)
    token_block = std::min<int64_t>(token_block, std::max(1, parts[p].kernel->max_nt));
  // (Such a kernel blocks the columns itself; rows of long columns would leave it blocks too
  // thin for its tiles: 9 rows of 14,336 F16 columns.)
  if (rows) row_block = std::max<int64_t>(row_block, kRowsTileBlock);
  for (int64_t rb = r0; rb < r1; rb += row_block) {
    int64_t re = std::min(r1, rb + row_block);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += token_block) {
      int nt = static_cast<int>(std::min(token_block, n_tokens - t0));
      if (rows) {
        const Part& part = parts[0];
        rows(cols, part.data + rb * part.row_bytes, part.row_bytes, static_cast<int>(re - rb),
             part.act + t0 * part.act_stride, part.act_stride, nt, y + t0 * y_stride + rb,
             y_stride);
        continue;
      }
      for (int64_t r = rb; r < re; ++r) {
        if (accumulate)
          for (int t = 0; t < nt; ++t) tmp[t] = y[(t0 + t) * y_stride + r];
        for (int p = 0; p < n_parts; ++p) {
          const Part& part = parts[p];
          const bool first = p == 0 && !accumulate;
          part.kernel->dot(cols, part.data + r * part.row_bytes,
                           part.act + t0 * part.act_stride, part.act_stride, nt,
                           first ? tmp : res);
          if (!first)
            for (int t = 0; t < nt; ++t) tmp[t] += res[t];
        }
        for (int t = 0; t < nt; ++t) y[(t0 + t) * y_stride + r] = tmp[t];
      }
    }
  }
}

// How a job's rows are computed.
enum class Path : uint8_t {
  kSkip,           // nothing to do (no tokens or no rows)
  kReference,      // no dot kernel for a tier (or an odd shape): the scalar reference
  kGemm,           // prefill: AMX tiles over panels of unpacked rows (gemm.h), alone
  kRows,           // the row kernels (FastRows), in the shared ParallelFor
  kInterleaved,    // interleaved weights where the tier has their kernel (InterleavedKernelFor:
                   // every layout on AVX-512, Q4_0 / Q4_K / Q6_K on AVX2), 16 rows per step;
                   // residual tiers (plain rows) added by FastRows
  kDeinterleaved,  // interleaved weights where the tier has no such kernel (a store's experts
                   // read with no backend to rearrange them, a test lowering the tier): each
                   // group put back into plain rows in scratch, then FastRows
};

struct JobPlan {
  const MatMulJob* job;
  Path path;
  Part parts[kMaxParts];
  int n_parts;
  int64_t items;         // work items of kItemRows rows (interleaved: one group each)
  const uint8_t* tiles;  // kInterleaved Q8_0 / Q4_0: the activations' tiles (ActTileBytes apart)
  Isa isa;               // the tier the batch runs at
};

// One distinct set of quantized activation rows: (x, n_tokens, cols, format).
struct ActSet {
  const float* x;
  int64_t n_tokens, cols;
  DType type;
  QuantizeActFn quantize;
  bool tiles;            // also packed in tiles of kActTileTokens (read by an interleaved job)
  size_t stride, offset, tiles_offset;  // offsets into the batch's activation buffer
};

// Bookkeeping of the calling thread's batch, grown once: a steady decode step allocates
// nothing. The ParallelFor bodies get this object by reference (workers must not read their
// own thread_local instance).
struct BatchState {
  Isa isa = Isa::kScalar;
  std::vector<JobPlan> plans;
  std::vector<ActSet> sets;
  std::vector<int> shared;           // plans run in the shared ParallelFor, in job order
  std::vector<int64_t> first_item;   // [shared.size() + 1]: first item of each
  int64_t act_rows = 0;              // sum of the sets' n_tokens
  uint8_t* act_buf = nullptr;
  ScratchBuffer act_scratch;         // quantized rows (and their tiles) of every set
  // Per pool thread, one 16-row group in plain rows (Path::kDeinterleaved only: residual tiers
  // of an interleaved skeleton are added to its own kernel's products and need none).
  uint8_t* plain_buf = nullptr;
  size_t plain_stride = 0;
  ScratchBuffer plain_scratch;
};

int FindOrAddSet(BatchState& st, const MatMulJob& job, int64_t cols, DType type, bool tiles) {
  for (size_t i = 0; i < st.sets.size(); ++i) {
    ActSet& s = st.sets[i];
    if (s.x == job.x && s.n_tokens == job.n_tokens && s.cols == cols && s.type == type) {
      s.tiles = s.tiles || tiles;
      return static_cast<int>(i);
    }
  }
  st.sets.push_back({job.x, job.n_tokens, cols, type, FindQuantizeAct(type, st.isa), tiles, 0, 0,
                     0});
  return static_cast<int>(st.sets.size()) - 1;
}

void PlanJob(BatchState& st, const MatMulJob& job, JobPlan& p) {
  const WeightView& w = *job.w;
  p = JobPlan{};
  p.job = &job;
  p.isa = st.isa;
  if (job.n_tokens <= 0 || w.rows <= 0) {
    p.path = Path::kSkip;
    return;
  }
  if (!PrepareParts(w, st.isa, p.parts, &p.n_parts)) {
    p.path = Path::kReference;
    return;
  }
  const bool interleaved = w.layout != WeightLayout::kRows;
  if (p.n_parts == 1 && !ExactTokenRows::Active() &&
      GemmSupports(w.type, w.cols, job.n_tokens, st.isa) &&
      p.parts[0].kernel->act_type == GemmActType(w.type)) {
    p.path = Path::kGemm;
  } else if (InterleavedKernelFor(w.layout, st.isa)) {
    p.path = Path::kInterleaved;
  } else if (interleaved) {
    p.path = Path::kDeinterleaved;
  } else {
    p.path = Path::kRows;
  }
  p.items = interleaved ? w.rows / kInterleavedRows : (w.rows + kItemRows - 1) / kItemRows;
  for (int k = 0; k < p.n_parts; ++k)
    p.parts[k].act_set = FindOrAddSet(st, job, w.cols, p.parts[k].kernel->act_type,
                                      k == 0 && p.path == Path::kInterleaved &&
                                          (w.layout == WeightLayout::kQ8_0Interleaved ||
                                           w.layout == WeightLayout::kQ4_0Interleaved));
}

// Activation rows [a, b) of all sets together (set after set).
void QuantizeSetRows(const BatchState& st, int64_t a, int64_t b) {
  int64_t base = 0;
  for (const ActSet& s : st.sets) {
    const int64_t lo = std::max(a, base), hi = std::min(b, base + s.n_tokens);
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t t = r - base;
      uint8_t* row = st.act_buf + s.offset + static_cast<size_t>(t) * s.stride;
      s.quantize(s.x + t * s.cols, row, s.cols);
      if (s.tiles) {
        const int64_t first = t - t % kActTileTokens;
        const int n = static_cast<int>(std::min<int64_t>(kActTileTokens, s.n_tokens - first));
        PackActTileToken(row, s.cols, static_cast<int>(t - first), n,
                         st.act_buf + s.tiles_offset +
                             ActTileBytes(s.cols, kActTileTokens) * (first / kActTileTokens));
      }
    }
    base += s.n_tokens;
    if (base >= b) break;
  }
}

void QuantizeSets(BatchState& st, ThreadPool& pool) {
  auto align = [](size_t n) { return (n + 63) & ~size_t{63}; };
  size_t total = 0;
  int64_t elements = 0;
  st.act_rows = 0;
  for (ActSet& s : st.sets) {
    elements += s.n_tokens * s.cols;
    s.stride = ActRowBytes(s.type, s.cols);
    s.offset = total;
    total += align(s.stride * static_cast<size_t>(s.n_tokens));
    s.tiles_offset = total;
    if (s.tiles)
      total += align(ActTileBytes(s.cols, kActTileTokens) *
                     static_cast<size_t>((s.n_tokens + kActTileTokens - 1) / kActTileTokens));
    st.act_rows += s.n_tokens;
  }
  st.act_buf = st.act_scratch.Reserve(std::max<size_t>(total, 64));
  BatchState* sp = &st;
  // A decode row stays on the caller; several rows (a batched step, a prompt) are split.
  if (st.act_rows >= 2 && elements >= 16384) {
    pool.ParallelFor(st.act_rows, 1,
                     [sp](int64_t a, int64_t b, int) { QuantizeSetRows(*sp, a, b); });
  } else {
    QuantizeSetRows(st, 0, st.act_rows);
  }
  for (JobPlan& p : st.plans) {
    if (p.path == Path::kSkip || p.path == Path::kReference) continue;
    for (int k = 0; k < p.n_parts; ++k) {
      const ActSet& s = st.sets[static_cast<size_t>(p.parts[k].act_set)];
      p.parts[k].act = st.act_buf + s.offset;
      p.parts[k].act_stride = s.stride;
      if (k == 0 && s.tiles) p.tiles = st.act_buf + s.tiles_offset;
    }
  }
}

// Items [a, b) of one job of the shared ParallelFor; `plain`: the running thread's group of
// plain rows (BatchState::plain_buf).
void RunItems(const JobPlan& p, int64_t a, int64_t b, uint8_t* plain) {
  const WeightView& w = *p.job->w;
  const int64_t n_tokens = p.job->n_tokens;
  float* y = p.job->y;
  switch (p.path) {
    case Path::kRows:
      FastRows(w.cols, w.rows, p.parts, p.n_parts, n_tokens, y, a * kItemRows,
               std::min(w.rows, b * kItemRows));
      break;
    case Path::kInterleaved: {
      // Panels of groups that stay in L2 while blocks of tokens (their activations in L2 too)
      // pass over them in register tiles: each weight byte comes from DRAM once per token
      // block, each activation byte from L3 once per panel. The Q8_0 and Q4_0 kernels take a
      // whole tile of activations (kActTileTokens, packed) over the panel's groups at once.
      const Part& part = p.parts[0];
      constexpr int tile = 8;  // tokens per register tile (every kernel takes 1..8)
      static_assert(tile == kActTileTokens);
      const size_t tile_bytes = ActTileBytes(w.cols, kActTileTokens);
      auto gemv = [&](int64_t g0, int64_t g1, int64_t t0, int nt) {
        const uint8_t* act = part.act + t0 * part.act_stride;
        float* yt = y + t0 * w.rows;
        switch (w.layout) {
          case WeightLayout::kQ4_KInterleaved:
            (p.isa >= Isa::kAvx512 ? avx512::GemvQ4_KInterleaved : avx2::GemvQ4_KInterleaved)(
                w.data, w.cols, g0, g1, act, part.act_stride, nt, yt, w.rows);
            break;
          case WeightLayout::kQ5_KInterleaved:
            avx512::GemvQ5_KInterleaved(w.data, w.cols, g0, g1, act, part.act_stride, nt, yt,
                                        w.rows);
            break;
          case WeightLayout::kQ6_KInterleaved:
            (p.isa >= Isa::kAvx512 ? avx512::GemvQ6_KInterleaved : avx2::GemvQ6_KInterleaved)(
                w.data, w.cols, g0, g1, act, part.act_stride, nt, yt, w.rows);
            break;
          case WeightLayout::kQ4_0Interleaved:
            (p.isa >= Isa::kAvx512 ? avx512::GemvQ4_0Interleaved : avx2::GemvQ4_0Interleaved)(
                w.data, w.cols, g0, g1, p.tiles + t0 / tile * tile_bytes, nt, yt, w.rows);
            break;
          default:
            avx512::GemvQ8_0Interleaved(w.data, w.cols, g0, g1, p.tiles + t0 / tile * tile_bytes,
                                        nt, yt, w.rows);
            break;
        }
      };
      const bool whole_panel = p.tiles != nullptr;
      const int64_t group_bytes = kInterleavedRows * static_cast<int64_t>(part.row_bytes);
      const int64_t panel = std::max<int64_t>(1, kPanelBytes / group_bytes);
      for (int64_t g0 = a; g0 < b; g0 += panel) {
        const int64_t g1 = std::min(b, g0 + panel);
        for (int64_t tb = 0; tb < n_tokens; tb += kPanelTokens) {
          const int64_t te = std::min(n_tokens, tb + kPanelTokens);
          auto nt = [&](int64_t t0) { return static_cast<int>(std::min<int64_t>(tile, te - t0)); };
          if (whole_panel) {
            for (int64_t t0 = tb; t0 < te; t0 += tile) gemv(g0, g1, t0, nt(t0));
          } else {
            for (int64_t g = g0; g < g1; ++g)
              for (int64_t t0 = tb; t0 < te; t0 += tile) gemv(g, g + 1, t0, nt(t0));
          }
        }
        // Residual tiers (plain rows) added to the panel's skeleton products.
        if (p.n_parts > 1)
          FastRows(w.cols, w.rows, p.parts + 1, p.n_parts - 1, n_tokens, y,
                   g0 * kInterleavedRows, g1 * kInterleavedRows, /*accumulate=*/true);
      }
      break;
    }
    case Path::kDeinterleaved: {
      Part local[kMaxParts];
      for (int k = 0; k < p.n_parts; ++k) local[k] = p.parts[k];
      for (int64_t g = a; g < b; ++g) {
        const int64_t r0 = g * kInterleavedRows;
        DeinterleaveGroup(w.layout, w.data, w.cols, g, plain);
        local[0].data = plain;
        for (int k = 1; k < p.n_parts; ++k)
          local[k].data = p.parts[k].data + r0 * p.parts[k].row_bytes;
        FastRows(w.cols, w.rows, local, p.n_parts, n_tokens, y + r0, 0, kInterleavedRows);
      }
      break;
    }
    default:
      break;
  }
}

// Items [i0, i1) of the shared ParallelFor, which may span several jobs.
void RunSharedItems(const BatchState& st, int64_t i0, int64_t i1, int thread) {
  size_t k = static_cast<size_t>(
      std::upper_bound(st.first_item.begin(), st.first_item.end(), i0) - st.first_item.begin() - 1);
  uint8_t* plain = st.plain_buf + static_cast<size_t>(thread) * st.plain_stride;
  for (int64_t i = i0; i < i1; ++k) {
    const int64_t base = st.first_item[k], end = std::min(i1, st.first_item[k + 1]);
    RunItems(st.plans[static_cast<size_t>(st.shared[k])], i - base, end - base, plain);
    i = end;
  }
}

uint64_t WeightBytes(const JobPlan& p) {
  uint64_t bytes = 0;
  for (int k = 0; k < p.n_parts; ++k)
    bytes += p.parts[k].row_bytes * static_cast<uint64_t>(p.job->w->rows);
  return bytes;
}

thread_local bool exact_token_rows = false;

}  // namespace

ExactTokenRows::ExactTokenRows() : previous_(exact_token_rows) { exact_token_rows = true; }
ExactTokenRows::~ExactTokenRows() { exact_token_rows = previous_; }
bool ExactTokenRows::Active() { return exact_token_rows; }

void DequantizeWeightRow(const WeightView& w, int64_t r, float* out) {
  static thread_local std::vector<float> tmp;
  DequantizeViewRow(w, r, out, tmp);
}

void MatMulReference(const WeightView& w, const float* x, int64_t n_tokens, float* y) {
  MatMulRows(w, x, n_tokens, y, 0, w.rows);
}

void MatMul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool) {
  const MatMulJob job{&w, x, n_tokens, y};
  MatMulBatch(&job, 1, pool);
}

void MatMulBatch(const MatMulJob* jobs, int n_jobs, ThreadPool& pool) {
  if (n_jobs <= 0) return;
  static thread_local BatchState state;
  BatchState& st = state;
  st.isa = ActiveIsa();
  st.plans.resize(static_cast<size_t>(n_jobs));
  st.sets.clear();
  st.shared.clear();
  st.first_item.clear();
  // Room for the most a batch of this size can use (each job's parts in sets of their own): once
  // a batch this large has run, none allocates, whichever tiers its ops run at (an escalation
  // whose residual arrives adds sets that the tokens before it did not have).
  st.sets.reserve(static_cast<size_t>(n_jobs) * kMaxParts);
  st.shared.reserve(static_cast<size_t>(n_jobs));
  st.first_item.reserve(static_cast<size_t>(n_jobs) + 1);
  bool any_fast = false;
  for (int j = 0; j < n_jobs; ++j) {
    PlanJob(st, jobs[j], st.plans[static_cast<size_t>(j)]);
    const Path path = st.plans[static_cast<size_t>(j)].path;
    any_fast = any_fast || (path != Path::kSkip && path != Path::kReference);
  }
  for (const JobPlan& p : st.plans) {
    if (p.path != Path::kReference) continue;
    // A type without a dot kernel (or an odd shape): the reference, split over rows.
    const MatMulJob* job = p.job;
    pool.ParallelFor(job->w->rows, 16, [job](int64_t r0, int64_t r1, int) {
      MatMulRows(*job->w, job->x, job->n_tokens, job->y, r0, r1);
    });
  }
  if (!any_fast) return;

  const bool profile = KernelProfilingEnabled();
  using Clock = std::chrono::steady_clock;
  auto t0 = profile ? Clock::now() : Clock::time_point();
  QuantizeSets(st, pool);
  auto t1 = profile ? Clock::now() : t0;
  if (profile) AddKernelProfile(kProfileQuantizeAct, std::chrono::duration<double>(t1 - t0).count(), 0);

  // Grain: chunks of at least ~16K multiply-adds (MatMul's rule per job, the smallest one wins);
  // a small batch runs on the caller alone.
  int64_t grain_rows = INT64_MAX;
  for (int j = 0; j < n_jobs; ++j) {
    const JobPlan& p = st.plans[static_cast<size_t>(j)];
    if (p.path == Path::kGemm) {
      auto g0 = profile ? Clock::now() : Clock::time_point();
      const WeightView& w = *p.job->w;
      GemmQuantized(w.type, w.layout, w.data, p.parts[0].row_bytes, w.rows, w.cols,
                    p.parts[0].act, p.parts[0].act_stride, p.job->n_tokens, p.job->y, pool);
      if (profile)
        AddKernelProfile(static_cast<int>(w.type),
                         std::chrono::duration<double>(Clock::now() - g0).count(), WeightBytes(p));
      continue;
    }
    if (p.path != Path::kRows && p.path != Path::kInterleaved && p.path != Path::kDeinterleaved)
      continue;
    if (p.items == 0) continue;
    if (st.first_item.empty()) st.first_item.push_back(0);
    st.shared.push_back(j);
    st.first_item.push_back(st.first_item.back() + p.items);
    grain_rows = std::min(grain_rows, p.path == Path::kRows
                                          ? std::max<int64_t>(4, 16384 / std::max<int64_t>(
                                                                     1, p.job->w->cols *
                                                                            p.job->n_tokens))
                                          : kInterleavedRows);
  }
  if (st.shared.empty()) return;
  st.plain_stride = 0;
  for (int j : st.shared) {
    const JobPlan& p = st.plans[static_cast<size_t>(j)];
    if (p.path == Path::kDeinterleaved)
      st.plain_stride = std::max(st.plain_stride, kInterleavedRows * p.parts[0].row_bytes);
  }
  st.plain_buf = st.plain_stride
                     ? st.plain_scratch.Reserve(st.plain_stride * static_cast<size_t>(pool.size()))
                     : nullptr;
  auto t2 = profile ? Clock::now() : Clock::time_point();
  const BatchState* sp = &st;
  pool.ParallelFor(st.first_item.back(), (grain_rows + kItemRows - 1) / kItemRows,
                   [sp](int64_t i0, int64_t i1, int t) { RunSharedItems(*sp, i0, i1, t); });
  if (profile) {
    // One timing for the whole dispatch: each job gets the share of its weight bytes.
    const double sec = std::chrono::duration<double>(Clock::now() - t2).count();
    uint64_t total = 0;
    for (int j : st.shared) total += WeightBytes(st.plans[static_cast<size_t>(j)]);
    for (int j : st.shared) {
      const JobPlan& p = st.plans[static_cast<size_t>(j)];
      const uint64_t bytes = WeightBytes(p);
      AddKernelProfile(static_cast<int>(p.job->w->type),
                       total ? sec * static_cast<double>(bytes) / static_cast<double>(total) : 0,
                       bytes);
    }
  }
}

}  // namespace substrate
