#include "kernels/matmul.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "kernels/gemm.h"
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
  if (w.layout == WeightLayout::kQ8_0Interleaved) {
    static thread_local std::vector<uint8_t> plain;
    plain.resize(row_bytes);
    DeinterleaveQ8_0Row(w.data, w.cols, r, plain.data());
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

// Quantized activations, kept per calling thread and grown only when a larger product comes
// along, so the token loop does not allocate. Charged to the ledger's "scratch" account.
struct Part {  // one tier of the weight: the skeleton or a residual
  const DotKernel* kernel;
  const uint8_t* data;
  size_t row_bytes;
  const uint8_t* act;  // its activations, quantized to kernel->act_type
  size_t act_stride;
};

constexpr int kMaxParts = 3;
// Tokens per weight-row pass; the kernels split it into register tiles of max_nt.
constexpr int64_t kTokenBlock = 64;
// Rows per block: the block's weights stay in L2 while every token block passes over them.
constexpr size_t kRowBlockBytes = 256 * 1024;

bool PrepareParts(const WeightView& w, Isa isa, Part* parts, int* n_parts) {
  *n_parts = 1 + std::clamp(w.n_residuals, 0, 2);
  for (int p = 0; p < *n_parts; ++p) {
    DType type = p == 0 ? w.type : w.residual_type[p - 1];
    auto rb = RowBytes(type, static_cast<uint64_t>(w.cols));
    const DotKernel* k = FindDotKernel(type, isa);
    if (!rb || !k || !FindQuantizeAct(k->act_type, isa) || ActRowBytes(k->act_type, w.cols) == 0)
      return false;
    parts[p] = {k, p == 0 ? w.data : w.residual[p - 1], static_cast<size_t>(*rb), nullptr, 0};
  }
  return true;
}

void QuantizeActivations(const float* x, int64_t n_tokens, int64_t cols, Isa isa, Part* parts,
                         int n_parts, ThreadPool& pool) {
  static thread_local ScratchBuffer scratch[kMaxParts];
  for (int p = 0; p < n_parts; ++p) {
    DType at = parts[p].kernel->act_type;
    int same = -1;  // a residual with the skeleton's activation format reuses its rows
    for (int q = 0; q < p; ++q)
      if (parts[q].kernel->act_type == at) same = q;
    if (same >= 0) {
      parts[p].act = parts[same].act;
      parts[p].act_stride = parts[same].act_stride;
      continue;
    }
    size_t stride = ActRowBytes(at, cols);
    uint8_t* buf = scratch[p].Reserve(stride * static_cast<size_t>(n_tokens));
    QuantizeActFn quantize = FindQuantizeAct(at, isa);
    auto run = [&](int64_t t0, int64_t t1, int) {
      for (int64_t t = t0; t < t1; ++t) quantize(x + t * cols, buf + t * stride, cols);
    };
    if (n_tokens >= 16) {
      pool.ParallelFor(n_tokens, 4, run);
    } else {
      run(0, n_tokens, 0);
    }
    parts[p].act = buf;
    parts[p].act_stride = stride;
  }
}

// Rows [r0, r1) of parts (each part's row r at data + r * row_bytes) for every token:
// y[t * y_stride + r].
void FastRows(int64_t cols, int64_t y_stride, const Part* parts, int n_parts, int64_t n_tokens,
              float* y, int64_t r0, int64_t r1) {
  float tmp[kTokenBlock], res[kTokenBlock];
  size_t row_bytes = parts[0].row_bytes;
  for (int p = 1; p < n_parts; ++p) row_bytes += parts[p].row_bytes;
  int64_t row_block = std::max<int64_t>(1, static_cast<int64_t>(kRowBlockBytes / row_bytes));
  // One register tile of tokens per pass: its activation rows stay in L1 while the rows of the
  // block (in L2) stream past; larger token blocks would stream activations from L2 per row.
  int64_t token_block = kTokenBlock;
  for (int p = 0; p < n_parts; ++p)
    token_block = std::min<int64_t>(token_block, std::max(1, parts[p].kernel->max_nt));
  for (int64_t rb = r0; rb < r1; rb += row_block) {
    int64_t re = std::min(r1, rb + row_block);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += token_block) {
      int nt = static_cast<int>(std::min(token_block, n_tokens - t0));
      for (int64_t r = rb; r < re; ++r) {
        for (int p = 0; p < n_parts; ++p) {
          const Part& part = parts[p];
          part.kernel->dot(cols, part.data + r * part.row_bytes,
                           part.act + t0 * part.act_stride, part.act_stride, nt,
                           p == 0 ? tmp : res);
          if (p > 0)
            for (int t = 0; t < nt; ++t) tmp[t] += res[t];
        }
        for (int t = 0; t < nt; ++t) y[(t0 + t) * y_stride + r] = tmp[t];
      }
    }
  }
}

// Interleaved Q8_0 (interleaved_q8_0.h) on AVX-512: 16 rows per kernel step, tokens in
// tiles of 4 while a group (16 rows) stays in L2.
void InterleavedProduct(const WeightView& w, const Part& part, int64_t n_tokens, float* y,
                        ThreadPool& pool) {
  const int64_t nb = w.cols / kQK8_0;
  static thread_local ScratchBuffer sums_scratch;
  auto* sums = reinterpret_cast<int32_t*>(sums_scratch.Reserve(
      static_cast<size_t>(n_tokens * nb) * sizeof(int32_t)));
  for (int64_t t = 0; t < n_tokens; ++t)
    ActBlockSums(part.act + t * part.act_stride, w.cols, sums + t * nb);
  const int64_t groups = w.rows / kInterleavedRows;
  pool.ParallelFor(groups, 1, [&](int64_t g0, int64_t g1, int) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t t0 = 0; t0 < n_tokens; t0 += 4)
        avx512::GemvQ8_0Interleaved(w.data, w.cols, g, g + 1, part.act + t0 * part.act_stride,
                                    part.act_stride, sums + t0 * nb,
                                    static_cast<int>(std::min<int64_t>(4, n_tokens - t0)),
                                    y + t0 * w.rows, w.rows);
  });
}

// Interleaved Q8_0 where the tier has no interleaved kernel (or with residual tiers): each
// group of 16 rows is put back into plain rows in scratch, then the row kernels run on it.
void DeinterleavedRows(const WeightView& w, const Part* parts, int n_parts, int64_t n_tokens,
                       float* y, ThreadPool& pool) {
  const int64_t groups = w.rows / kInterleavedRows;
  pool.ParallelFor(groups, 1, [&](int64_t g0, int64_t g1, int) {
    static thread_local ScratchBuffer plain_scratch;
    uint8_t* plain = plain_scratch.Reserve(kInterleavedRows * parts[0].row_bytes);
    Part local[kMaxParts];
    for (int p = 0; p < n_parts; ++p) local[p] = parts[p];
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t r0 = g * kInterleavedRows;
      DeinterleaveQ8_0Group(w.data, w.cols, g, plain);
      local[0].data = plain;
      for (int p = 1; p < n_parts; ++p) local[p].data = parts[p].data + r0 * parts[p].row_bytes;
      FastRows(w.cols, w.rows, local, n_parts, n_tokens, y + r0, 0, kInterleavedRows);
    }
  });
}

}  // namespace

void DequantizeWeightRow(const WeightView& w, int64_t r, float* out) {
  static thread_local std::vector<float> tmp;
  DequantizeViewRow(w, r, out, tmp);
}

void MatMulReference(const WeightView& w, const float* x, int64_t n_tokens, float* y) {
  MatMulRows(w, x, n_tokens, y, 0, w.rows);
}

void MatMul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool) {
  if (n_tokens <= 0 || w.rows <= 0) return;
  Isa isa = ActiveIsa();
  Part parts[kMaxParts];
  int n_parts = 0;
  if (!PrepareParts(w, isa, parts, &n_parts)) {
    // A type without a dot kernel (or an odd shape): the reference, split over rows.
    pool.ParallelFor(w.rows, 16, [&](int64_t r0, int64_t r1, int) {
      MatMulRows(w, x, n_tokens, y, r0, r1);
    });
    return;
  }
  const bool profile = KernelProfilingEnabled();
  auto t0 = profile ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  QuantizeActivations(x, n_tokens, w.cols, isa, parts, n_parts, pool);
  auto t1 = profile ? std::chrono::steady_clock::now() : t0;
  const bool interleaved = w.layout == WeightLayout::kQ8_0Interleaved;
  if (n_parts == 1 && GemmSupports(w.type, w.cols, n_tokens, isa) &&
      parts[0].kernel->act_type == GemmActType(w.type)) {
    // Prefill: AMX tiles over panels of unpacked rows (gemm.h).
    GemmQuantized(w.type, w.layout, w.data, parts[0].row_bytes, w.rows, w.cols, parts[0].act,
                  parts[0].act_stride, n_tokens, y, pool);
  } else if (interleaved && n_parts == 1 && isa >= Isa::kAvx512) {
    InterleavedProduct(w, parts[0], n_tokens, y, pool);
  } else if (interleaved) {
    DeinterleavedRows(w, parts, n_parts, n_tokens, y, pool);
  } else {
    // Chunks of whole row groups; small products run on the caller alone.
    int64_t grain = std::max<int64_t>(4, 16384 / std::max<int64_t>(1, w.cols * n_tokens));
    pool.ParallelFor(w.rows, grain, [&](int64_t r0, int64_t r1, int) {
      FastRows(w.cols, w.rows, parts, n_parts, n_tokens, y, r0, r1);
    });
  }
  if (profile) {
    auto t2 = std::chrono::steady_clock::now();
    uint64_t bytes = 0;
    for (int p = 0; p < n_parts; ++p) bytes += parts[p].row_bytes * static_cast<uint64_t>(w.rows);
    AddKernelProfile(kProfileQuantizeAct, std::chrono::duration<double>(t1 - t0).count(), 0);
    AddKernelProfile(static_cast<int>(w.type), std::chrono::duration<double>(t2 - t1).count(),
                     bytes);
  }
}

}  // namespace substrate
