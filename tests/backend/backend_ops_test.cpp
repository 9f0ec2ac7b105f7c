// The differential op test (in the manner of llama.cpp's test-backend-ops): every op of every
// backend this build has — the CPU backend at each ISA tier the CPU runs (scalar, AVX2,
// AVX-512, AMX); a GPU backend joins the list when built — against ReferenceBackend, on random
// inputs of awkward shapes (odd rows, 1..70 tokens), every weight type, with residual tiers on
// and off, each op with its own bound on the normalized mean squared error. A deliberately
// wrong kernel must make it fail (the last test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#ifdef SUBSTRATE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "backend/reference_backend.h"
#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "quant/quant.h"

namespace substrate {
namespace {

// ---- the backends under test ----

struct Candidate {
  std::string name;
  std::function<std::unique_ptr<Backend>()> make;
  Isa isa = Isa::kScalar;  // the CPU tier it runs at
  // NMSE allowed to prefill attention (over 8 tokens): a GPU's tensor cores round queries, keys,
  // values and probabilities to f16 (the CPU is exact against the reference).
  double prefill_attention_nmse = 1e-9;
};

ThreadPool& Pool() {
  static ThreadPool pool(2);
  return pool;
}

MemoryLedger& Ledger() {
  static MemoryLedger ledger;
  return ledger;
}

std::vector<Candidate> Backends() {
  std::vector<Candidate> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    if (DetectedIsa() < isa) continue;
    out.push_back({std::string("cpu/") + IsaName(isa),
                   [] { return std::make_unique<CpuBackend>(&Pool(), &Ledger()); }, isa});
  }
#ifdef SUBSTRATE_HAVE_CUDA
  // A CUDA build runs the GPU too when the machine has one (a build machine without a GPU
  // checks the CPU tiers only, and says so).
  if (CudaDeviceCount() > 0) {
    out.push_back({"cuda",
                   [] {
                     auto b = NewCudaBackend({});
                     EXPECT_TRUE(b.ok()) << b.status().ToString();
                     return std::move(b).value();
                   },
                   DetectedIsa(), 2e-6});
  } else {
    std::printf("note: CUDA build without a CUDA device: the cuda backend is not checked here\n");
  }
#endif
  return out;
}

class ScopedIsa {
 public:
  explicit ScopedIsa(Isa isa) : prev_(SetIsaForTesting(isa)) {}
  ~ScopedIsa() { SetIsaForTesting(prev_); }

 private:
  Isa prev_;
};

// ---- host <-> backend tensors ----

class Tensors {
 public:
  explicit Tensors(Backend& be) : be_(be) {}
  Tensor Make(int64_t rows, int64_t cols, const std::vector<float>& values) {
    auto b = be_.Allocate(static_cast<size_t>(rows * cols) * sizeof(float), "test");
    EXPECT_TRUE(b.ok());
    Tensor t{static_cast<float*>(b->data()), rows, cols};
    if (!values.empty()) be_.Upload(values.data(), t);
    keep_.push_back(std::move(b).value());
    return t;
  }
  Tensor Zeros(int64_t rows, int64_t cols) { return Make(rows, cols, {}); }
  std::vector<float> Read(const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.size()));
    be_.Download(t, v.data());
    return v;
  }
  // A KV cache layer of `positions` rows in backend memory.
  KvLayer Kv(DType type, int64_t positions, int64_t k_stride, int64_t v_stride) {
    const size_t el = type == DType::kF16 ? 2 : 4;
    auto k = be_.Allocate(static_cast<size_t>(positions * k_stride) * el, "test");
    auto v = be_.Allocate(static_cast<size_t>(positions * v_stride) * el, "test");
    KvLayer kv{type, k->data(), k_stride, v->data(), v_stride};
    keep_.push_back(std::move(k).value());
    keep_.push_back(std::move(v).value());
    return kv;
  }

 private:
  Backend& be_;
  std::vector<Buffer> keep_;
};

// ---- comparison ----

double Nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    err += double(got[i] - want[i]) * (got[i] - want[i]);
    norm += double(want[i]) * want[i];
  }
  return err / std::max(norm, 1e-30);
}

// Mismatches found, one line each ("" when the op agrees).
using Failures = std::vector<std::string>;

void Expect(Failures& f, const std::string& what, const std::vector<float>& got,
            const std::vector<float>& want, double bound) {
  const double e = Nmse(got, want);
  if (!(e <= bound)) f.push_back(what + ": NMSE " + std::to_string(e) + " > " + std::to_string(bound));
}

std::vector<float> Random(int64_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> g(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = g(rng);
  return v;
}

// ---- weights ----

// W [rows, cols] quantized to `type`, with residual tiers Q8_0 and F16 of the error: the view
// serves tier `tier` (0 = skeleton only). Owns the bytes.
// Bytes on whole pages of their own, as resident weights handed to AdoptResidentWeight must be
// (a GPU under a budget pins their pages to read them in place).
template <typename T>
struct PageAllocator {
  using value_type = T;
  PageAllocator() = default;
  template <typename U>
  PageAllocator(const PageAllocator<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(std::aligned_alloc(4096, (n * sizeof(T) + 4095) / 4096 * 4096));
  }
  void deallocate(T* p, size_t) { std::free(p); }
  bool operator==(const PageAllocator&) const { return true; }
};
using PageBytes = std::vector<uint8_t, PageAllocator<uint8_t>>;

struct Weight {
  DType type;
  int64_t rows, cols;
  PageBytes skeleton;
  std::vector<uint8_t> res1, res2;
  WeightView View(int tier) const {
    WeightView v;
    v.type = type;
    v.data = skeleton.data();
    v.bytes = skeleton.size();
    v.rows = rows;
    v.cols = cols;
    v.n_residuals = tier;
    v.residual_type[0] = DType::kQ8_0;
    v.residual_type[1] = DType::kF16;
    v.residual[0] = res1.data();
    v.residual[1] = res2.data();
    return v;
  }
};

std::vector<uint8_t> Quantize(DType type, const std::vector<float>& w, int64_t rows, int64_t cols) {
  const size_t row_bytes = *RowBytes(type, static_cast<uint64_t>(cols));
  std::vector<uint8_t> out(row_bytes * rows);
  for (int64_t r = 0; r < rows; ++r)
    QuantizeRow(type, w.data() + r * cols, out.data() + r * row_bytes, cols);
  return out;
}

template <typename Bytes>
std::vector<float> Dequantize(DType type, const Bytes& q, int64_t rows, int64_t cols) {
  const size_t row_bytes = *RowBytes(type, static_cast<uint64_t>(cols));
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    DequantizeRow(type, q.data() + r * row_bytes, out.data() + r * cols, cols);
  return out;
}

Weight MakeWeight(DType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  Weight w{type, rows, cols, {}, {}, {}};
  std::vector<float> v = Random(rows * cols, rng, 0.05f);
  const std::vector<uint8_t> q = Quantize(type, v, rows, cols);
  w.skeleton.assign(q.begin(), q.end());
  // Residual tiers (Q8_0, F16) only for rows of whole Q8_0 blocks: vectors of 33 elements have
  // none (dereferencing RowBytes' empty answer for them was undefined, and failed in some builds).
  if (!RowBytes(DType::kQ8_0, static_cast<uint64_t>(cols))) return w;
  std::vector<float> err = Dequantize(type, w.skeleton, rows, cols);
  for (size_t i = 0; i < v.size(); ++i) err[i] = v[i] - err[i];
  w.res1 = Quantize(DType::kQ8_0, err, rows, cols);
  const std::vector<float> r1 = Dequantize(DType::kQ8_0, w.res1, rows, cols);
  for (size_t i = 0; i < v.size(); ++i) err[i] -= r1[i];
  w.res2 = Quantize(DType::kF16, err, rows, cols);
  return w;
}

const std::vector<DType>& WeightTypes() {
  static const std::vector<DType> types = {
      DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0,   DType::kQ4_0,
      DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ2_K,   DType::kQ3_K,
      DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kIQ4_NL, DType::kIQ4_XS};
  return types;
}

// Squared norms of each row of the weight at `tier` (skeleton plus residuals).
std::vector<double> RowNorms2(const Weight& w, int tier) {
  std::vector<float> m = Dequantize(w.type, w.skeleton, w.rows, w.cols);
  if (tier >= 1) {
    const std::vector<float> r = Dequantize(DType::kQ8_0, w.res1, w.rows, w.cols);
    for (size_t i = 0; i < m.size(); ++i) m[i] += r[i];
  }
  if (tier >= 2) {
    const std::vector<float> r = Dequantize(DType::kF16, w.res2, w.rows, w.cols);
    for (size_t i = 0; i < m.size(); ++i) m[i] += r[i];
  }
  std::vector<double> n(static_cast<size_t>(w.rows), 0.0);
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t c = 0; c < w.cols; ++c) n[r] += double(m[r * w.cols + c]) * m[r * w.cols + c];
  return n;
}

// A product's error against the scale of its terms: sum (got - want)^2 over sum of
// |w_r|^2 |x_t|^2 (Cauchy-Schwarz's bound on each output), so a product that happens to be
// near zero does not make a tiny denominator.
double ProductError(const std::vector<float>& got, const std::vector<float>& want,
                    const std::vector<double>& w_norms2, const std::vector<float>& x,
                    int64_t n, int64_t cols) {
  double err = 0, scale = 0;
  const int64_t rows = static_cast<int64_t>(w_norms2.size());
  for (int64_t t = 0; t < n; ++t) {
    double xn = 0;
    for (int64_t c = 0; c < cols; ++c) xn += double(x[t * cols + c]) * x[t * cols + c];
    for (int64_t r = 0; r < rows; ++r) {
      const float g = got[t * rows + r], w = want[t * rows + r];
      if (!std::isfinite(g)) return INFINITY;
      err += double(g - w) * (g - w);
      scale += w_norms2[r] * xn;
    }
  }
  return err / std::max(scale, 1e-30);
}

// ---- the op checks: each runs one op on `be` and on the reference ----

Failures CheckMatMul(Backend& be) {
  Failures f;
  ReferenceBackend ref(&Ledger());
  std::mt19937 rng(1);
  for (DType type : WeightTypes()) {
    for (int64_t rows : {1, 33, 67}) {
      const int64_t cols = rows == 33 ? 512 : 256;
      const Weight w = MakeWeight(type, rows, cols, rng);
      for (int tier : {0, 1, 2}) {
        for (int64_t n : {1, 3, 16, 70}) {
          const std::vector<float> x = Random(n * cols, rng);
          Tensors tb(be), tr(ref);
          const Tensor xb = tb.Make(n, cols, x), yb = tb.Zeros(n, rows);
          const Tensor xr = tr.Make(n, cols, x), yr = tr.Zeros(n, rows);
          const WeightView v = w.View(tier);
          be.MatMul(v, xb, yb);
          ref.MatMul(v, xr, yr);
          // Quantized products round the activations to 8 bits; float ones are nearly exact.
          const bool exact = (type == DType::kF32 || type == DType::kF16 || type == DType::kBF16) &&
                             tier == 0;
          const double bound = exact ? 1e-12 : 4e-6;
          const double e = ProductError(tb.Read(yb), tr.Read(yr), RowNorms2(w, tier), x, n, cols);
          if (!(e <= bound))
            f.push_back(std::string("MatMul ") + DTypeName(type) + " " + std::to_string(rows) +
                        "x" + std::to_string(cols) + " tier " + std::to_string(tier) + " n=" +
                        std::to_string(n) + ": error " + std::to_string(e) + " > " +
                        std::to_string(bound));
        }
      }
    }
  }
  return f;
}

// A NaN or infinity in the activations reaches the outputs of that token (a quantizer that
// dropped it would hand the model finite garbage: Model::Forward's check relies on this).
Failures CheckNonFinitePropagates(Backend& be) {
  Failures f;
  std::mt19937 rng(9);
  for (DType type : WeightTypes()) {
    const Weight w = MakeWeight(type, 16, 256, rng);
    for (float bad : {NAN, INFINITY}) {
      for (int tier : {0, 1}) {
        for (int64_t n : {2, 5}) {
          std::vector<float> x = Random(n * 256, rng);
          x[7] = bad;  // token 0
          Tensors tb(be);
          const Tensor y = tb.Zeros(n, 16);
          be.MatMul(w.View(tier), tb.Make(n, 256, x), y);
          const std::vector<float> out = tb.Read(y);
          const std::string what = std::string("MatMul ") + DTypeName(type) + " tier " +
                                   std::to_string(tier) + " n=" + std::to_string(n);
          for (int r = 0; r < 16; ++r) {
            if (std::isfinite(out[r])) f.push_back(what + ": a non-finite input gave a finite output");
            if (!std::isfinite(out[16 + r])) f.push_back(what + ": the clean token is not finite");
          }
        }
      }
    }
  }
  return f;
}

TEST(BackendOps, NonFiniteActivationsReachTheOutputs) {
  for (const Candidate& c : Backends()) {
    ScopedIsa isa(c.isa);
    auto be = c.make();
    for (const std::string& m : CheckNonFinitePropagates(*be)) ADD_FAILURE() << c.name << ": " << m;
  }
}

TEST(BackendOps, MatMulEveryTypeTierAndTokenCount) {
  for (const Candidate& c : Backends()) {
    ScopedIsa isa(c.isa);
    auto be = c.make();
    for (const std::string& m : CheckMatMul(*be)) ADD_FAILURE() << c.name << ": " << m;
  }
}

// Products with more rows than a GPU runs at once (a model's output and FFN matrices: tens of
// thousands of rows, several waves of blocks); the shapes above fit in one wave, so a kernel
// that hands one warp several rows in turn, or indexes rows wrongly past the first wave, passes
// them (a one-wave GEMV that kept its sums from row to row failed this test, then of 20011
// rows, on the H200).
TEST(BackendOps, MatMulRowsBeyondOneWave) {
  // An H200 holds 132 x 16 blocks of four rows at once (8448 rows).
  constexpr int64_t kRows = 10007, kCols = 256;
  std::mt19937 rng(5);
  std::vector<Weight> weights;
  for (DType type : {DType::kQ4_0, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K, DType::kQ5_K})
    weights.push_back(MakeWeight(type, kRows, kCols, rng));
  const std::vector<float> x = Random(3 * kCols, rng);
  ReferenceBackend ref(&Ledger());
  for (const Candidate& c : Backends()) {
    ScopedIsa isa(c.isa);
    auto be = c.make();
    for (const Weight& w : weights) {
      for (int tier : {0, 1}) {
        for (int64_t n : {1, 3}) {
          Tensors tb(*be), tr(ref);
          const Tensor yb = tb.Zeros(n, kRows), yr = tr.Zeros(n, kRows);
          be->MatMul(w.View(tier), tb.Make(n, kCols, x), yb);
          ref.MatMul(w.View(tier), tr.Make(n, kCols, x), yr);
          const double e = ProductError(tb.Read(yb), tr.Read(yr), RowNorms2(w, tier), x, n, kCols);
          EXPECT_LE(e, 4e-6) << c.name << ": MatMul " << DTypeName(w.type) << " " << kRows << "x"
                             << kCols << " tier " << tier << " n=" << n;
        }
      }
    }
  }
}

// Expert-sized products over many tokens (a prefill's experts: slices of a 3-D tensor with
// narrow rows, 65..150 tokens each, where a GPU backend switches to its GEMM), as a MoE layer
// issues them: gather, gate and up, SwiGLU, down, weighted scatter, expert after expert.
TEST(BackendOps, ExpertSizedProductsOverManyTokens) {
  for (const Candidate& c : Backends()) {
    ScopedIsa isa(c.isa);
    ReferenceBackend ref(&Ledger());
    std::mt19937 rng(13);
    for (DType type : {DType::kF32, DType::kQ8_0}) {
      const int64_t d = 64, ff = 32, experts = 4;
      const Weight gate = MakeWeight(type, experts * ff, d, rng), up = MakeWeight(type, experts * ff, d, rng);
      const Weight down = MakeWeight(type, experts * d, ff, rng);
      auto be = c.make();
      for (const Weight* w : {&gate, &up, &down})
        be->AdoptResidentBytes(w->skeleton.data(), w->skeleton.size());
      auto slice = [](const Weight& w, int e, int64_t rows) {
        WeightView v = w.View(0);
        v.rows = rows;
        v.bytes = w.skeleton.size() / 4;
        v.data += v.bytes * e;
        return v;
      };
      const int64_t n = 300;
      const std::vector<float> x = Random(n * d, rng);
      Tensors tb(*be), tr(ref);
      const Tensor xb = tb.Make(n, d, x), xr = tr.Make(n, d, x);
      // The router first: 8 narrow rows over every token.
      const Weight router = MakeWeight(type, 8, d, rng);
      const Tensor lb = tb.Zeros(n, 8), lr = tr.Zeros(n, 8);
      be->MatMul(router.View(0), xb, lb);
      ref.MatMul(router.View(0), xr, lr);
      EXPECT_LE(ProductError(tb.Read(lb), tr.Read(lr), RowNorms2(router, 0), x, n, d),
                type == DType::kF32 ? 1e-12 : 4e-6)
          << c.name << " router " << DTypeName(type);
      const Tensor accb = tb.Zeros(n, d), accr = tr.Zeros(n, d);
      const Tensor gb = tb.Zeros(n, d), gr = tr.Zeros(n, d);
      const Tensor hb = tb.Zeros(n, ff), hr = tr.Zeros(n, ff), ub = tb.Zeros(n, ff), ur = tr.Zeros(n, ff);
      const Tensor ob = tb.Zeros(n, d), orr = tr.Zeros(n, d);
      for (int e = 0; e < experts; ++e) {
        std::vector<int32_t> rows;
        std::vector<float> wts;
        for (int64_t t = 0; t < n; ++t)
          if ((t * 7 + e * 3) % 5 < 2 + e % 2) {  // 120..180 of the 300 tokens
            rows.push_back(static_cast<int32_t>(t));
            wts.push_back(0.25f + 0.1f * static_cast<float>(e));
          }
        const int64_t m = static_cast<int64_t>(rows.size());
        for (auto [be_, g_, h_, u_, o_, acc_, x_] :
             {std::tuple<Backend*, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>{be.get(), gb, hb, ub, ob, accb, xb},
              std::tuple<Backend*, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>{&ref, gr, hr, ur, orr, accr, xr}}) {
          const Tensor g = g_.Rows(0, m), h = h_.Rows(0, m), u = u_.Rows(0, m), o = o_.Rows(0, m);
          be_->GatherRows(x_, rows.data(), m, g);
          const WeightView wg = slice(gate, e, ff), wu = slice(up, e, ff), wd = slice(down, e, d);
          be_->MatMul(wg, g, h);
          be_->MatMul(wu, g, u);
          be_->SwiGlu(h, u, h);
          be_->MatMul(wd, h, o);
          be_->ScatterAddRows(o, rows.data(), wts.data(), m, acc_);
        }
      }
      EXPECT_LE(Nmse(tb.Read(accb), tr.Read(accr)), type == DType::kF32 ? 1e-10 : 1e-3)
          << c.name << " " << DTypeName(type);
    }
  }
}

// The CPU backend's own resident layout (interleaved Q8_0 on AVX-512): the same products.
TEST(BackendOps, MatMulOverAdoptedResidentLayout) {
  for (const Candidate& c : Backends()) {
    ScopedIsa isa(c.isa);
    auto be = c.make();
    ReferenceBackend ref(&Ledger());
    std::mt19937 rng(2);
    Weight w = MakeWeight(DType::kQ8_0, 48, 256, rng);
    const Weight plain = w;
    WeightView v = w.View(1);
    v.layout = be->AdoptResidentWeight(DType::kQ8_0, 48, 256, w.skeleton.data());
    for (int64_t n : {1, 5, 70}) {
      const std::vector<float> x = Random(n * 256, rng);
      Tensors tb(*be), tr(ref);
      const Tensor yb = tb.Zeros(n, 48), yr = tr.Zeros(n, 48);
      be->MatMul(v, tb.Make(n, 256, x), yb);
      ref.MatMul(plain.View(1), tr.Make(n, 256, x), yr);
      EXPECT_LE(Nmse(tb.Read(yb), tr.Read(yr)), 2e-4) << c.name << " n=" << n;
      // Embedding rows read through the same layout.
      const int32_t ids[3] = {0, 17, 47};
      const Tensor eb = tb.Zeros(3, 256), er = tr.Zeros(3, 256);
      be->EmbedRows(v, ids, 3, eb);
      ref.EmbedRows(plain.View(1), ids, 3, er);
      EXPECT_EQ(tb.Read(eb), tr.Read(er)) << c.name;
    }
  }
}

// Matrices handed over with AdoptResidentWeight, which a GPU backend may keep in a layout of
// its own (the CUDA backend's repacked planes, rows padded to 16 bytes): products at every
// token count (decode kernels and the prefill GEMM's dequantization), with residual tiers read
// from the host layout, a slice of whole rows (an expert's), and embedding rows.
TEST(BackendOps, MatMulOverRepackedDeviceLayout) {
  for (const Candidate& c : Backends()) {
    ScopedIsa isa(c.isa);
    std::mt19937 rng(21);
    for (DType type : {DType::kQ4_0, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
      for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 768}, {19, 2304}}) {
        auto be = c.make();
        ReferenceBackend ref(&Ledger());
        Weight w = MakeWeight(type, rows, cols, rng);
        const Weight plain = w;
        const WeightLayout layout = be->AdoptResidentWeight(type, rows, cols, w.skeleton.data());
        const size_t rb = *RowBytes(type, static_cast<uint64_t>(cols));
        for (int tier : {0, 2}) {
          for (int64_t n : {1, 2, 3, 8, 70}) {
            const std::vector<float> x = Random(n * cols, rng);
            WeightView v = w.View(tier);
            v.layout = layout;
            Tensors tb(*be), tr(ref);
            const Tensor yb = tb.Zeros(n, rows), yr = tr.Zeros(n, rows);
            be->MatMul(v, tb.Make(n, cols, x), yb);
            ref.MatMul(plain.View(tier), tr.Make(n, cols, x), yr);
            const std::string what = c.name + ": " + DTypeName(type) + " " + std::to_string(rows) +
                                     "x" + std::to_string(cols) + " tier " + std::to_string(tier) +
                                     " n=" + std::to_string(n);
            EXPECT_LE(Nmse(tb.Read(yb), tr.Read(yr)), 2e-4) << what;
            if (n <= 8) {
              EXPECT_LE(ProductError(tb.Read(yb), tr.Read(yr), RowNorms2(plain, tier), x, n, cols),
                        4e-6)
                  << what;
            }
            if (layout != WeightLayout::kRows || tier != 0) continue;
            // Rows 5..16 alone, as an expert's slice of a 3-D tensor.
            WeightView s = v;
            s.rows = 12;
            s.data += 5 * rb;
            s.bytes = 12 * rb;
            WeightView sr = plain.View(0);
            sr.rows = 12;
            sr.data += 5 * rb;
            sr.bytes = 12 * rb;
            const Tensor zb = tb.Zeros(n, 12), zr = tr.Zeros(n, 12);
            be->MatMul(s, tb.Make(n, cols, x), zb);
            ref.MatMul(sr, tr.Make(n, cols, x), zr);
            EXPECT_LE(Nmse(tb.Read(zb), tr.Read(zr)), 2e-4) << what << " slice";
          }
          if (layout != WeightLayout::kRows) continue;
          const int32_t ids[3] = {0, 17, static_cast<int32_t>(rows - 1)};
          Tensors tb(*be), tr(ref);
          WeightView v = w.View(tier);
          const Tensor eb = tb.Zeros(3, cols), er = tr.Zeros(3, cols);
          be->EmbedRows(v, ids, 3, eb);
          ref.EmbedRows(plain.View(tier), ids, 3, er);
          EXPECT_EQ(tb.Read(eb), tr.Read(er)) << c.name << " " << DTypeName(type) << " embed";
        }
      }
    }
  }
}

// A decode layer's one-token chain as the model records it: a product adding to the residual
// stream (a GPU joins the add to the product), that stream's norm, and the products reading the
// norm (two at once, then gate and up with SwiGLU). The stream, the norm's output (which an op
// after the products may read) and the products must agree with the reference, with and
// without residual tiers.
TEST(BackendOps, NormsBetweenRepackedProducts) {
  constexpr int64_t d = 512, ff = 768;
  for (const Candidate& c : Backends()) {
    ScopedIsa isa(c.isa);
    std::mt19937 rng(23);
    for (DType type : {DType::kQ4_0, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
      const Weight o = MakeWeight(type, d, d, rng), q = MakeWeight(type, d, d, rng),
                   k = MakeWeight(type, 128, d, rng), gate = MakeWeight(type, ff, d, rng),
                   up = MakeWeight(type, ff, d, rng);
      // Norm weights near 1 and a stream of scale 3, as a model's (its norm's scale ~1/3: a
      // product that misses it is far off).
      const auto norm_weight = [&] {
        Weight w{DType::kF32, 1, d, {}, {}, {}};
        std::vector<float> v = Random(d, rng, 0.1f);
        for (float& e : v) e += 1.0f;
        const auto* b = reinterpret_cast<const uint8_t*>(v.data());
        w.skeleton.assign(b, b + v.size() * sizeof(float));
        return w;
      };
      const Weight n1 = norm_weight(), n2 = norm_weight();
      for (int tier : {0, 2}) {
        // The backend's own copies (a CPU backend may rearrange adopted bytes in place), made
        // before it: adopted bytes must outlive it. The norm weights are adopted too, as a
        // model's are (a GPU stages a weight it does not hold with a launch of its own).
        Weight mine[7] = {o, q, k, gate, up, n1, n2};
        auto be = c.make();
        ReferenceBackend ref(&Ledger());
        WeightView v[7];
        for (int i = 0; i < 7; ++i) {
          Weight& w = mine[i];
          v[i] = w.View(i < 5 ? tier : 0);
          v[i].layout = be->AdoptResidentWeight(w.type, w.rows, w.cols, w.skeleton.data());
        }
        const std::vector<float> a = Random(d, rng), r0 = Random(d, rng, 3.0f);
        struct Out {
          std::vector<float> res, h1, qy, ky, q_again, h2, glu;
        };
        const auto chain = [&](Backend& b, const WeightView& wo, const WeightView& wq,
                               const WeightView& wk, const WeightView& wg, const WeightView& wu,
                               const WeightView& wn1, const WeightView& wn2) {
          Tensors t(b);
          const Tensor res = t.Make(1, d, r0), ob = t.Zeros(1, d), h1 = t.Zeros(1, d),
                       qy = t.Zeros(1, d), ky = t.Zeros(1, 128), q_again = t.Zeros(1, d),
                       o2 = t.Zeros(1, d), h2 = t.Zeros(1, d), g = t.Zeros(1, ff),
                       u = t.Zeros(1, ff);
          b.MatMul(wo, t.Make(1, d, a), ob);
          b.Add(res, ob);
          b.RmsNorm(res, wn1, 1e-5f, h1);
          const MatMulOp qk[2] = {{&wq, h1, qy}, {&wk, h1, ky}};
          b.MatMulBatch(qk, 2);
          b.MatMul(wq, h1, q_again);  // the norm's output read again by a later product
          b.MatMul(wo, qy, o2);
          b.Add(res, o2);
          b.RmsNorm(res, wn2, 1e-5f, h2);
          const MatMulOp gu[2] = {{&wg, h2, g}, {&wu, h2, u}};
          b.MatMulBatch(gu, 2);
          b.SwiGlu(g, u, g);
          return Out{t.Read(res),     t.Read(h1), t.Read(qy), t.Read(ky),
                     t.Read(q_again), t.Read(h2), t.Read(g)};
        };
        const Out got = chain(*be, v[0], v[1], v[2], v[3], v[4], v[5], v[6]);
        const Out want = chain(ref, o.View(tier), q.View(tier), k.View(tier), gate.View(tier),
                               up.View(tier), n1.View(0), n2.View(0));
        const std::string what = c.name + " " + DTypeName(type) + " tier " + std::to_string(tier);
        EXPECT_LE(Nmse(got.res, want.res), 2e-4) << what << " residual stream";
        EXPECT_LE(Nmse(got.h1, want.h1), 2e-4) << what << " first norm";
        EXPECT_LE(Nmse(got.qy, want.qy), 2e-4) << what << " first product";
        EXPECT_LE(Nmse(got.ky, want.ky), 2e-4) << what << " second product";
        EXPECT_LE(Nmse(got.q_again, want.q_again), 2e-4) << what << " a later product";
        EXPECT_LE(Nmse(got.h2, want.h2), 2e-4) << what << " second norm";
        EXPECT_LE(Nmse(got.glu, want.glu), 4e-4) << what << " SwiGLU";
      }
    }
  }
}

Failures CheckMatMulBatchAndEmbed(Backend& be) {
  Failures f;
  ReferenceBackend ref(&Ledger());
  std::mt19937 rng(3);
  const Weight a = MakeWeight(DType::kQ4_K, 35, 256, rng), b = MakeWeight(DType::kQ6_K, 64, 512, rng),
               c = MakeWeight(DType::kQ8_0, 17, 256, rng);
  for (int64_t n : {1, 2, 4, 9}) {
    Tensors tb(be), tr(ref);
    const std::vector<float> x1 = Random(n * 256, rng), x2 = Random(n * 512, rng);
    const WeightView va = a.View(1), vb = b.View(0), vc = c.View(2);
    MatMulOp ob[3] = {{&va, tb.Make(n, 256, x1), tb.Zeros(n, 35)},
                      {&vb, tb.Make(n, 512, x2), tb.Zeros(n, 64)},
                      {&vc, tb.Make(n, 256, x1), tb.Zeros(n, 17)}};
    MatMulOp orf[3] = {{&va, tr.Make(n, 256, x1), tr.Zeros(n, 35)},
                       {&vb, tr.Make(n, 512, x2), tr.Zeros(n, 64)},
                       {&vc, tr.Make(n, 256, x1), tr.Zeros(n, 17)}};
    be.MatMulBatch(ob, 3);
    ref.MatMulBatch(orf, 3);
    for (int i = 0; i < 3; ++i)
      Expect(f, "MatMulBatch job " + std::to_string(i) + " n=" + std::to_string(n),
             tb.Read(ob[i].y), tr.Read(orf[i].y), 2e-4);
  }
  for (DType type : WeightTypes()) {
    const Weight w = MakeWeight(type, 29, 256, rng);
    for (int tier : {0, 2}) {
      const int32_t ids[4] = {28, 0, 7, 7};
      Tensors tb(be), tr(ref);
      const Tensor eb = tb.Zeros(4, 256), er = tr.Zeros(4, 256);
      be.EmbedRows(w.View(tier), ids, 4, eb);
      ref.EmbedRows(w.View(tier), ids, 4, er);
      Expect(f, std::string("EmbedRows ") + DTypeName(type) + " tier " + std::to_string(tier),
             tb.Read(eb), tr.Read(er), 1e-12);
    }
  }
  return f;
}

TEST(BackendOps, MatMulBatchAndEmbedRows) {
  for (const Candidate& c : Backends()) {
    ScopedIsa isa(c.isa);
    auto be = c.make();
    for (const std::string& m : CheckMatMulBatchAndEmbed(*be)) ADD_FAILURE() << c.name << ": " << m;
  }
}

Failures CheckElementwise(Backend& be) {
  Failures f;
  ReferenceBackend ref(&Ledger());
  std::mt19937 rng(4);
  for (int64_t rows : {1, 7, 70}) {
    for (int64_t cols : {1, 33, 256, 4097}) {
      const std::vector<float> x = Random(rows * cols, rng), y = Random(rows * cols, rng);
      const std::vector<float> g = Random(rows, rng);
      const std::string shape = " [" + std::to_string(rows) + "x" + std::to_string(cols) + "]";
      // RmsNorm and AddBias with F32 and F16 vectors.
      for (DType vt : {DType::kF32, DType::kF16}) {
        const Weight w = MakeWeight(vt, 1, cols, rng), w2 = MakeWeight(vt, 1, cols, rng);
        const std::vector<float> x2 = Random((rows + 2) * cols, rng);
        Tensors tb(be), tr(ref);
        // Two norms back to back, as a model's query and key head norms (the GPU joins them).
        const Tensor xb = tb.Make(rows, cols, x), x2b = tb.Make(rows + 2, cols, x2);
        const Tensor nb = tb.Zeros(rows, cols), n2b = tb.Zeros(rows + 2, cols);
        const Tensor nr = tr.Zeros(rows, cols), n2r = tr.Zeros(rows + 2, cols);
        be.RmsNorm(xb, w.View(0), 1e-6f, nb);
        be.RmsNorm(x2b, w2.View(0), 1e-6f, n2b);
        ref.RmsNorm(tr.Make(rows, cols, x), w.View(0), 1e-6f, nr);
        ref.RmsNorm(tr.Make(rows + 2, cols, x2), w2.View(0), 1e-6f, n2r);
        Expect(f, std::string("RmsNorm ") + DTypeName(vt) + shape, tb.Read(nb), tr.Read(nr), 1e-10);
        Expect(f, std::string("RmsNorm (second) ") + DTypeName(vt) + shape, tb.Read(n2b),
               tr.Read(n2r), 1e-10);
        const Tensor bb = tb.Make(rows, cols, y), br = tr.Make(rows, cols, y);
        be.AddBias(bb, w.View(0));
        ref.AddBias(br, w.View(0));
        Expect(f, std::string("AddBias ") + DTypeName(vt) + shape, tb.Read(bb), tr.Read(br), 1e-12);
      }
      Tensors tb(be), tr(ref);
      // In place on the same tensor, as the model calls it.
      const Tensor sb = tb.Make(rows, cols, x), sr = tr.Make(rows, cols, x);
      be.SwiGlu(sb, tb.Make(rows, cols, y), sb);
      ref.SwiGlu(sr, tr.Make(rows, cols, y), sr);
      Expect(f, "SwiGlu" + shape, tb.Read(sb), tr.Read(sr), 1e-10);
      const Tensor ab = tb.Make(rows, cols, x), ar = tr.Make(rows, cols, x);
      be.Add(ab, tb.Make(rows, cols, y));
      ref.Add(ar, tr.Make(rows, cols, y));
      Expect(f, "Add" + shape, tb.Read(ab), tr.Read(ar), 1e-14);
      const Tensor gb = tb.Make(rows, cols, x), gr = tr.Make(rows, cols, x);
      be.ScaleRowsBySigmoid(gb, tb.Make(rows, 1, g));
      ref.ScaleRowsBySigmoid(gr, tr.Make(rows, 1, g));
      Expect(f, "ScaleRowsBySigmoid" + shape, tb.Read(gb), tr.Read(gr), 1e-10);
      const Tensor fb = tb.Make(rows, cols, x), fr = tr.Make(rows, cols, x);
      be.Fill(fb, 0.25f);
      ref.Fill(fr, 0.25f);
      Expect(f, "Fill" + shape, tb.Read(fb), tr.Read(fr), 0);
      if (cols > 8) {
        const Tensor cb = tb.Zeros(rows, 11), cr = tr.Zeros(rows, 11);
        be.CopyColumns(tb.Make(rows, cols, x), 3, cb, 2, 9);
        ref.CopyColumns(tr.Make(rows, cols, x), 3, cr, 2, 9);
        Expect(f, "CopyColumns" + shape, tb.Read(cb), tr.Read(cr), 0);
      }
      std::vector<float> bad = x;
      bad[bad.size() / 2] = NAN;
      if (!be.AllFinite(tb.Make(rows, cols, x)) || be.AllFinite(tb.Make(rows, cols, bad)))
        f.push_back("AllFinite" + shape);
      bad[bad.size() / 2] = -INFINITY;
      if (be.AllFinite(tb.Make(rows, cols, bad))) f.push_back("AllFinite -inf" + shape);
      // Two tensors in one wait: either one's infinity is seen, and two finite ones pass.
      const Tensor xb = tb.Make(rows, cols, x), badb = tb.Make(rows, cols, bad);
      if (!be.AllFinite(xb, &xb) || be.AllFinite(xb, &badb) || be.AllFinite(badb, &xb))
        f.push_back("AllFinite of two" + shape);
    }
  }
  return f;
}

TEST(BackendOps, NormsBiasActivationsCopies) {
  for (const Candidate& c : Backends()) {
    ScopedIsa isa(c.isa);
    auto be = c.make();
    for (const std::string& m : CheckElementwise(*be)) ADD_FAILURE() << c.name << ": " << m;
  }
}

// The launches a CUDA backend has recorded (CudaLaunches), 0 for any other or without CUDA.
int64_t CudaLaunchesOf(const Backend& be) {
#ifdef SUBSTRATE_HAVE_CUDA
  return CudaLaunches(be);
#else
  (void)be;
  return 0;
#endif
}

Failures CheckRope(Backend& be) {
  Failures f;
  ReferenceBackend ref(&Ledger());
  std::mt19937 rng(5);
  struct Case {
    RopeStyle style;
    int n_heads, head_dim, offset, n_rot;
    float yarn;
  };
  for (const Case& k : {Case{RopeStyle::kNeox, 4, 64, 0, 64, 0}, Case{RopeStyle::kNormal, 3, 40, 0, 40, 0},
                        Case{RopeStyle::kNeox, 2, 64, 0, 32, 0}, Case{RopeStyle::kNormal, 5, 48, 16, 32, 0},
                        Case{RopeStyle::kNormal, 1, 72, 64, 8, 4.0f}}) {
    for (int64_t n : {1, 9, 70}) {
      RopeParams p;
      p.style = k.style;
      p.n_rot = k.n_rot;
      p.freq_base = 10000.0f;
      if (k.yarn > 0) {
        p.yarn_factor = k.yarn;
        p.yarn_orig_ctx = 256;
        p.attn_factor = 1.1f;
      }
      std::vector<int32_t> pos(static_cast<size_t>(n));
      for (int64_t t = 0; t < n; ++t) pos[t] = static_cast<int32_t>(100 + 7 * t);
      const int64_t cols = int64_t{k.n_heads} * k.head_dim;
      const std::vector<float> x = Random(n * cols, rng);
      Tensors tb(be), tr(ref);
      const Tensor xb = tb.Make(n, cols, x), xr = tr.Make(n, cols, x);
      be.Rope(xb, k.n_heads, k.head_dim, k.offset, pos.data(), p);
      ref.Rope(xr, k.n_heads, k.head_dim, k.offset, pos.data(), p);
      Expect(f, "Rope heads " + std::to_string(k.n_heads) + "x" + std::to_string(k.head_dim) +
                    " offset " + std::to_string(k.offset) + " n=" + std::to_string(n),
             tb.Read(xb), tr.Read(xr), 1e-10);
    }
  }
  // qwen3's attention start: each head of q and k normed in place, both rotated, k and v
  // stored (a GPU joins the two norms, the store to the rotation and, where every column
  // turns, the norms to it too); full and partial rotation, both styles.
  std::deque<Weight> norms;
  for (const Case& k :
       {Case{RopeStyle::kNeox, 8, 128, 0, 128, 0}, Case{RopeStyle::kNormal, 6, 64, 0, 64, 0},
        Case{RopeStyle::kNeox, 4, 64, 0, 32, 0}}) {
    for (int64_t n : {1, 5, 40}) {
      RopeParams p;
      p.style = k.style;
      p.n_rot = k.n_rot;
      p.freq_base = 1000000.0f;
      const int kv_heads = k.n_heads / 2;
      const int64_t qd = int64_t{k.n_heads} * k.head_dim, kd = int64_t{kv_heads} * k.head_dim;
      const int64_t pos0 = 3;
      std::vector<int32_t> pos(static_cast<size_t>(n));
      for (int64_t t = 0; t < n; ++t) pos[t] = static_cast<int32_t>(pos0 + t);
      const std::vector<float> q = Random(n * qd, rng), kk = Random(n * kd, rng);
      const std::vector<float> v = Random(n * kd, rng);
      // Resident, as a model's (a GPU would stage them and issue the norms at once, never
      // joining them to the rotation), and kept to the check's end: a GPU finds adopted bytes
      // by address, and a freed weight's address may come back holding another's.
      const Weight& qn = norms.emplace_back(MakeWeight(DType::kF32, 1, k.head_dim, rng));
      const Weight& kn = norms.emplace_back(MakeWeight(DType::kF32, 1, k.head_dim, rng));
      be.AdoptResidentBytes(qn.skeleton.data(), qn.skeleton.size());
      be.AdoptResidentBytes(kn.skeleton.data(), kn.skeleton.size());
      Tensors tb(be), tr(ref);
      // Every input made first: an upload issues the ops recorded before it, which then join
      // nothing.
      const Tensor qb = tb.Make(n, qd, q), kb = tb.Make(n, kd, kk), vb = tb.Make(n, kd, v);
      const Tensor qr = tr.Make(n, qd, q), kr = tr.Make(n, kd, kk), vr = tr.Make(n, kd, v);
      const KvLayer cb = tb.Kv(DType::kF32, pos0 + n, kd, kd);
      const KvLayer cr = tr.Kv(DType::kF32, pos0 + n, kd, kd);
      int64_t launches = 0;
      for (auto [b, qt, kt, vt, c] :
           {std::tuple<Backend*, Tensor, Tensor, Tensor, KvLayer>{&be, qb, kb, vb, cb},
            {&ref, qr, kr, vr, cr}}) {
        const Tensor qh = qt.Reshape(n * k.n_heads, k.head_dim);
        const Tensor kh = kt.Reshape(n * kv_heads, k.head_dim);
        launches -= CudaLaunchesOf(*b);
        b->RmsNorm(qh, qn.View(0), 1e-6f, qh);
        b->RmsNorm(kh, kn.View(0), 1e-6f, kh);
        b->Rope(qt, k.n_heads, k.head_dim, 0, pos.data(), p);
        b->Rope(kt, kv_heads, k.head_dim, 0, pos.data(), p);
        b->StoreKv(c, pos0, kt, vt);
        launches += CudaLaunchesOf(*b);
      }
      const std::string what = "head norms, Rope and StoreKv " + std::to_string(k.n_heads) +
                               "x" + std::to_string(k.head_dim) + " rot " +
                               std::to_string(k.n_rot) + " n=" + std::to_string(n);
      // A GPU: the two norms one launch, q and k's rotations one with the store; where every
      // column turns, all of it one launch.
      if (std::string(be.name()) == "cuda" && launches != (k.n_rot == k.head_dim ? 1 : 3))
        f.push_back(what + ": " + std::to_string(launches) + " launches");
      Expect(f, what + ": q", tb.Read(qb), tr.Read(qr), 1e-10);
      Expect(f, what + ": k", tb.Read(kb), tr.Read(kr), 1e-10);
      for (const bool keys : {true, false}) {
        const auto rows = [&](const KvLayer& c) {
          return Tensor{static_cast<float*>(keys ? c.k : c.v) + pos0 * kd, n, kd};
        };
        Expect(f, what + (keys ? ": cached k" : ": cached v"), tb.Read(rows(cb)),
               tr.Read(rows(cr)), 1e-10);
      }
    }
  }
  return f;
}

TEST(BackendOps, RopeStylesOffsetsAndYarn) {
  for (const Candidate& c : Backends()) {
    ScopedIsa isa(c.isa);
    auto be = c.make();
    for (const std::string& m : CheckRope(*be)) ADD_FAILURE() << c.name << ": " << m;
  }
}

Failures CheckAttention(Backend& be, double prefill_nmse) {
  Failures f;
  ReferenceBackend ref(&Ledger());
  std::mt19937 rng(6);
  for (DType kv_type : {DType::kF32, DType::kF16}) {
    // (GQA groups of 4 and 8 at the two head sizes a GPU's tensor-core prefill takes.)
    for (const AttentionShape& s :
         {AttentionShape{8, 2, 64, 64, 0.125f}, AttentionShape{6, 6, 40, 24, 0.2f},
          AttentionShape{4, 1, 128, 128, 0.0883f}, AttentionShape{16, 2, 128, 128, 0.0883f}}) {
      // pos0 300: a decode token's positions span more tiles than it has blocks; 2100: more
      // than 32 blocks share them (a GPU's merge takes two splits a lane).
      for (int64_t pos0 : {0, 37, 300, 2100}) {
        for (int64_t n : {1, 5, 70}) {
          const int64_t kd = int64_t{s.n_head_kv} * s.dk, vd = int64_t{s.n_head_kv} * s.dv;
          const int64_t total = pos0 + n;
          const std::vector<float> k = Random(total * kd, rng), v = Random(total * vd, rng);
          const std::vector<float> q = Random(n * s.n_head * s.dk, rng);
          Tensors tb(be), tr(ref);
          const KvLayer kb = tb.Kv(kv_type, total, kd, vd), kr = tr.Kv(kv_type, total, kd, vd);
          // The history in one store, then this pass's rows (as decode appends).
          std::vector<float> kh(k.begin(), k.begin() + pos0 * kd), vh(v.begin(), v.begin() + pos0 * vd);
          std::vector<float> kn(k.begin() + pos0 * kd, k.end()), vn(v.begin() + pos0 * vd, v.end());
          if (pos0 > 0) {
            be.StoreKv(kb, 0, tb.Make(pos0, kd, kh), tb.Make(pos0, vd, vh));
            ref.StoreKv(kr, 0, tr.Make(pos0, kd, kh), tr.Make(pos0, vd, vh));
          }
          be.StoreKv(kb, pos0, tb.Make(n, kd, kn), tb.Make(n, vd, vn));
          ref.StoreKv(kr, pos0, tr.Make(n, kd, kn), tr.Make(n, vd, vn));
          const int64_t od = int64_t{s.n_head} * s.dv;
          const Tensor ob = tb.Zeros(n, od), orf = tr.Zeros(n, od);
          // The product that reads the output next (a GPU may quantize the output for it in the
          // attention launch).
          const Weight wo = MakeWeight(od % 32 == 0 ? DType::kQ8_0 : DType::kF32, 24, od, rng);
          const Tensor pb = tb.Zeros(n, 24), pr = tr.Zeros(n, 24);
          const Tensor qb = tb.Make(n, int64_t{s.n_head} * s.dk, q);
          be.Attention(s, qb, kb, pos0, ob);
          be.MatMul(wo.View(0), ob, pb);
          ref.Attention(s, tr.Make(n, int64_t{s.n_head} * s.dk, q), kr, pos0, orf);
          ref.MatMul(wo.View(0), orf, pr);
          const std::string what = std::string("Attention kv ") + DTypeName(kv_type) + " heads " +
                                   std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv) +
                                   " dk " + std::to_string(s.dk) + " pos0 " +
                                   std::to_string(pos0) + " n=" + std::to_string(n);
          Expect(f, what, tb.Read(ob), tr.Read(orf), n > 8 ? prefill_nmse : 1e-9);
          Expect(f, what + ", then a product", tb.Read(pb), tr.Read(pr), 2e-4);
        }
      }
    }
  }
  // A NaN query reaches the head's output (a softmax that drops it would hide it as zeros).
  for (DType kv_type : {DType::kF32, DType::kF16}) {
    const AttentionShape s{4, 2, 64, 64, 0.125f};
    Tensors tb(be);
    const KvLayer kv = tb.Kv(kv_type, 3, 128, 128);
    be.StoreKv(kv, 0, tb.Make(3, 128, Random(3 * 128, rng)), tb.Make(3, 128, Random(3 * 128, rng)));
    std::vector<float> q = Random(3 * 256, rng);
    q[5] = NAN;  // token 0, head 0
    const Tensor o = tb.Zeros(3, 256);
    be.Attention(s, tb.Make(3, 256, q), kv, 0, o);
    const std::vector<float> out = tb.Read(o);
    if (!std::isnan(out[0])) f.push_back(std::string("Attention kv ") + DTypeName(kv_type) + ": NaN query lost");
    if (!std::isfinite(out[256 + 70])) f.push_back("Attention: a clean token not finite");
  }
  // MLA: the per-head key/value assembly, then attention over it.
  const MlaShape m{4, 32, 16, 24};
  for (int64_t n : {1, 6}) {
    const int64_t kvb_cols = int64_t{m.n_head} * (m.nope + m.dv), lat_cols = 64 + m.rot;
    const std::vector<float> kvb = Random(n * kvb_cols, rng), lat = Random(n * lat_cols, rng);
    const std::vector<float> q = Random(n * m.n_head * (m.nope + m.rot), rng);
    Tensors tb(be), tr(ref);
    const int64_t kd = int64_t{m.n_head} * (m.nope + m.rot), vd = int64_t{m.n_head} * m.dv;
    const KvLayer kb = tb.Kv(DType::kF32, n, kd, vd), kr = tr.Kv(DType::kF32, n, kd, vd);
    be.StoreMlaKv(kb, 0, tb.Make(n, kvb_cols, kvb), tb.Make(n, lat_cols, lat), 64, m);
    ref.StoreMlaKv(kr, 0, tr.Make(n, kvb_cols, kvb), tr.Make(n, lat_cols, lat), 64, m);
    const AttentionShape s{m.n_head, m.n_head, m.nope + m.rot, m.dv, 0.15f};
    const Tensor ob = tb.Zeros(n, vd), orf = tr.Zeros(n, vd);
    be.Attention(s, tb.Make(n, kd, q), kb, 0, ob);
    ref.Attention(s, tr.Make(n, kd, q), kr, 0, orf);
    Expect(f, "MLA n=" + std::to_string(n), tb.Read(ob), tr.Read(orf), 1e-9);
  }
  return f;
}

// One token's decode steps as the model records them: q and k rotated, k and v stored, then
// attention (a GPU joins the store to the rotation's launch, and its attention reads the
// history before it waits and the token's own row after), over positions that cross tiles and
// splits, against the reference: each step's output and, for float caches, every cached row.
// A cached row stored wrong also shows in the outputs of the steps after it.
Failures CheckDecodeSteps(Backend& be) {
  Failures f;
  ReferenceBackend ref(&Ledger());
  std::mt19937 rng(21);
  struct Case {
    AttentionShape s;
    RopeStyle style;
    DType kv;
    bool yarn;  // (a GPU does not join the store to a YaRN rotation)
  };
  for (const Case& c : {Case{{8, 2, 128, 128, 0.0883f}, RopeStyle::kNormal, DType::kF32, false},
                        Case{{4, 4, 64, 64, 0.125f}, RopeStyle::kNeox, DType::kF16, false},
                        Case{{8, 1, 128, 128, 0.0883f}, RopeStyle::kNeox, DType::kF16, false},
                        Case{{4, 2, 64, 64, 0.125f}, RopeStyle::kNormal, DType::kF32, true}}) {
    const AttentionShape& s = c.s;
    RopeParams rp;
    rp.style = c.style;
    rp.n_rot = s.dk;
    rp.freq_base = 10000.0f;
    if (c.yarn) {
      rp.yarn_factor = 4.0f;
      rp.yarn_orig_ctx = 256;
      rp.attn_factor = 1.1f;
    }
    const int64_t qd = int64_t{s.n_head} * s.dk, kd = int64_t{s.n_head_kv} * s.dk;
    const int64_t vd = int64_t{s.n_head_kv} * s.dv, od = int64_t{s.n_head} * s.dv;
    constexpr int32_t kSteps = 70;  // three tiles of 32 positions
    Tensors tb(be), tr(ref);
    struct Side {
      Backend* b;
      Tensors* t;
      KvLayer kv;
      Tensor q, k, v, o;
    };
    Side sides[2];
    for (int i = 0; i < 2; ++i) {
      Tensors& t = i == 0 ? tb : tr;
      sides[i] = {i == 0 ? &be : static_cast<Backend*>(&ref), &t, t.Kv(c.kv, kSteps, kd, vd),
                  t.Zeros(1, qd), t.Zeros(1, kd), t.Zeros(1, vd), t.Zeros(1, od)};
    }
    const std::string what = std::string("decode steps kv ") + DTypeName(c.kv) + " heads " +
                             std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv) +
                             " dk " + std::to_string(s.dk) + (c.yarn ? " yarn" : "");
    for (int32_t pos = 0; pos < kSteps; ++pos) {
      const std::vector<float> q = Random(qd, rng), k = Random(kd, rng), v = Random(vd, rng);
      for (const Side& d : sides) {
        d.b->Upload(q.data(), d.q);
        d.b->Upload(k.data(), d.k);
        d.b->Upload(v.data(), d.v);
        d.b->Rope(d.q, s.n_head, s.dk, 0, &pos, rp);
        d.b->Rope(d.k, s.n_head_kv, s.dk, 0, &pos, rp);
        d.b->StoreKv(d.kv, pos, d.k, d.v);
        d.b->Attention(s, d.q, d.kv, pos, d.o);
      }
      Expect(f, what + " pos " + std::to_string(pos), tb.Read(sides[0].o), tr.Read(sides[1].o),
             1e-9);
    }
    if (c.kv == DType::kF32) {
      for (const bool keys : {true, false}) {
        const auto rows = [&](const KvLayer& kv) {
          return Tensor{static_cast<float*>(keys ? kv.k : kv.v), kSteps, keys ? kd : vd};
        };
        Expect(f, what + (keys ? ": cached k" : ": cached v"), tb.Read(rows(sides[0].kv)),
               tr.Read(rows(sides[1].kv)), 1e-10);
      }
    }
  }
  return f;
}

TEST(BackendOps, DecodeStepsRotateStoreAndAttend) {
  for (const Candidate& c : Backends()) {
    ScopedIsa isa(c.isa);
    auto be = c.make();
    for (const std::string& m : CheckDecodeSteps(*be)) ADD_FAILURE() << c.name << ": " << m;
  }
}

TEST(BackendOps, AttentionGqaKvTypesAndMla) {
  for (const Candidate& c : Backends()) {
    ScopedIsa isa(c.isa);
    auto be = c.make();
    for (const std::string& m : CheckAttention(*be, c.prefill_attention_nmse))
      ADD_FAILURE() << c.name << ": " << m;
  }
}

Failures CheckMoeOps(Backend& be) {
  Failures f;
  ReferenceBackend ref(&Ledger());
  std::mt19937 rng(7);
  struct Case {
    int E, k;
    GatingFunc gating;
    bool normalize, bias;
    int groups, used;
    float scale;
  };
  for (const Case& c : {Case{8, 2, GatingFunc::kSoftmax, false, false, 0, 0, 1.0f},
                        Case{64, 8, GatingFunc::kSoftmax, true, false, 0, 0, 1.0f},
                        Case{32, 4, GatingFunc::kSigmoid, true, true, 4, 2, 2.5f},
                        Case{60, 4, GatingFunc::kSoftmax, false, false, 0, 0, 1.0f}}) {
    for (int64_t n : {1, 13}) {
      RoutingParams p{c.E, c.k, c.gating, c.normalize, c.scale, c.groups, c.used};
      const std::vector<float> logits = Random(n * c.E, rng, 2.0f);
      const Weight bias = MakeWeight(DType::kF32, 1, c.E, rng);
      Tensors tb(be), tr(ref);
      std::vector<int32_t> sb(static_cast<size_t>(n * c.k)), sr(sb.size());
      std::vector<float> wb(sb.size()), wr(sb.size());
      const WeightView bv = bias.View(0);
      be.Route(tb.Make(n, c.E, logits), c.bias ? &bv : nullptr, p, sb.data(), wb.data());
      ref.Route(tr.Make(n, c.E, logits), c.bias ? &bv : nullptr, p, sr.data(), wr.data());
      const std::string what = "Route E=" + std::to_string(c.E) + " k=" + std::to_string(c.k);
      if (sb != sr) f.push_back(what + ": different experts");
      Expect(f, what + " weights", wb, wr, 1e-12);
    }
  }
  for (int64_t cols : {1, 64, 300}) {
    const int64_t n = 9;
    const std::vector<float> src = Random(n * cols, rng), acc = Random(n * cols, rng);
    const std::vector<int32_t> rows = {8, 0, 3, 3, 5, 1, 8};
    const std::vector<float> wts = {0.5f, 1.0f, 0.25f, 2.0f, -1.0f, 0.1f, 0.7f};
    Tensors tb(be), tr(ref);
    const Tensor gb = tb.Zeros(7, cols), gr = tr.Zeros(7, cols);
    be.GatherRows(tb.Make(n, cols, src), rows.data(), 7, gb);
    ref.GatherRows(tr.Make(n, cols, src), rows.data(), 7, gr);
    Expect(f, "GatherRows cols " + std::to_string(cols), tb.Read(gb), tr.Read(gr), 0);
    const Tensor ab = tb.Make(n, cols, acc), ar = tr.Make(n, cols, acc);
    be.ScatterAddRows(gb, rows.data(), wts.data(), 7, ab);
    ref.ScatterAddRows(gr, rows.data(), wts.data(), 7, ar);
    Expect(f, "ScatterAddRows cols " + std::to_string(cols), tb.Read(ab), tr.Read(ar), 1e-14);
  }
  return f;
}

TEST(BackendOps, RoutingGatherScatter) {
  for (const Candidate& c : Backends()) {
    ScopedIsa isa(c.isa);
    auto be = c.make();
    for (const std::string& m : CheckMoeOps(*be)) ADD_FAILURE() << c.name << ": " << m;
  }
}

// The routed experts of a MoE layer computed by the backend alone (Backend::RoutedExperts)
// against the host's way: the reference's routing, then each chosen expert's SwiGLU MLP by the
// reference, summed with the routing weights. The experts are adopted one by one, as the
// resident weight source hands them over. `takes` says which cases the backend must take (and
// then choose the same experts and give the same sums) and which it must decline (return
// false). A fresh backend per case (the adopted bytes outlive it). The last case is one token
// whose router input a norm writes and whose logits a float product makes, as a model's are;
// with `count_norm_join` (a GPU) that norm must join the router's launch.
Failures CheckRoutedExperts(const Candidate& cand,
                            const std::function<bool(DType, DType, int64_t)>& takes,
                            const std::function<void(Backend&, int64_t n)>& after = nullptr,
                            bool count_norm_join = false) {
  Failures f;
  std::mt19937 rng(11);
  struct Case {
    DType gate, down;
    int E, k;
    int64_t d, ff;
    GatingFunc gating;
    bool normalize, bias;
    float scale;
  };
  for (const Case& c :
       {Case{DType::kQ4_0, DType::kQ4_0, 16, 4, 256, 96, GatingFunc::kSoftmax, false, false, 1},
        Case{DType::kQ4_K, DType::kQ6_K, 20, 4, 256, 768, GatingFunc::kSoftmax, true, false, 1},
        Case{DType::kQ8_0, DType::kQ8_0, 128, 8, 128, 64, GatingFunc::kSigmoid, true, true, 2.5f},
        Case{DType::kQ5_K, DType::kF16, 8, 2, 256, 256, GatingFunc::kSoftmax, false, false, 1}}) {
    int64_t plain_launches = -1;  // of the one-token case
    for (int64_t case_n : {1, 3, 40, -1}) {
      const bool from_norm = case_n < 0;
      const int64_t n = from_norm ? 1 : case_n;
      const std::string what = std::string("RoutedExperts ") + DTypeName(c.gate) + "/" +
                               DTypeName(c.down) + " E=" + std::to_string(c.E) +
                               " n=" + std::to_string(n) + (from_norm ? " from a norm" : "");
      Weight gate = MakeWeight(c.gate, c.E * c.ff, c.d, rng);
      Weight up = MakeWeight(c.gate, c.E * c.ff, c.d, rng);
      Weight down = MakeWeight(c.down, c.E * c.d, c.ff, rng);
      const Weight bias = MakeWeight(DType::kF32, 1, c.E, rng);
      Weight router = MakeWeight(DType::kF32, c.E, c.d, rng);
      const Weight norm = MakeWeight(DType::kF32, 1, c.d, rng);
      std::vector<float> logits = Random(n * c.E, rng, 2.0f);
      std::vector<float> x = Random(n * c.d, rng);  // the norm's input when from_norm
      auto be = cand.make();
      for (Weight* w : {&gate, &up, &down}) {
        const int64_t rows = w->rows / c.E;
        const size_t slice = w->skeleton.size() / static_cast<size_t>(c.E);
        for (int e = 0; e < c.E; ++e)
          be->AdoptResidentWeight(w->type, rows, w->cols, w->skeleton.data() + e * slice);
      }
      // The routing bias too, as a model's resident weights hand it over: a GPU stages a weight
      // it has not seen and issues the ops recorded so far, so the add below would not join.
      be->AdoptResidentBytes(bias.skeleton.data(), bias.skeleton.size());
      be->AdoptResidentBytes(norm.skeleton.data(), norm.skeleton.size());
      WeightView rv = router.View(0);
      rv.layout =
          be->AdoptResidentWeight(router.type, router.rows, router.cols, router.skeleton.data());
      const WeightView gv = gate.View(0), uv = up.View(0), dv = down.View(0), bv = bias.View(0),
                       nv = norm.View(0);
      Tensors tb(*be);
      RoutedExpertsOp op;
      const Tensor raw = tb.Make(n, c.d, x);
      op.logits = from_norm ? tb.Zeros(n, c.E) : tb.Make(n, c.E, logits);
      op.bias = c.bias ? &bv : nullptr;
      op.routing = RoutingParams{c.E, c.k, c.gating, c.normalize, c.scale};
      op.gate = &gv;
      op.up = &uv;
      op.down = &dv;
      op.xn = from_norm ? tb.Zeros(n, c.d) : raw;
      op.acc = tb.Zeros(n, c.d);
      // The stream the layer adds to, made first: an upload issues the ops recorded before it,
      // and the launch that sums the experts could then not take the add.
      const std::vector<float> resid = Random(n * c.d, rng);
      const Tensor rt = tb.Make(n, c.d, resid);
      int64_t launches = CudaLaunchesOf(*be);
      if (from_norm) {
        be->RmsNorm(raw, nv, 1e-6f, op.xn);
        be->MatMul(rv, op.xn, op.logits);
      }
      const bool took = be->RoutedExperts(op);
      launches = CudaLaunchesOf(*be) - launches;
      if (case_n == 1) plain_launches = launches;
      // With int8 activations the plain case quantizes them in a launch of its own; the norm
      // joined to the router quantizes them there, and computes the norm there.
      const bool fast = c.gate == DType::kQ4_0 || c.gate == DType::kQ8_0 || c.gate == DType::kQ4_K;
      if (count_norm_join && from_norm && took && fast && launches != plain_launches - 1)
        f.push_back(what + ": " + std::to_string(launches) + " launches against " +
                    std::to_string(plain_launches) + " without the norm and the router");
      if (took != takes(c.gate, c.down, n)) {
        f.push_back(what + (took ? ": taken" : ": declined"));
        return f;
      }
      if (!took) {
        if (!takes(c.gate, c.down, 1)) return f;  // declines them all
        continue;
      }
      // The residual add a MoE layer does next (a GPU joins it to the launch that sums the
      // experts).
      launches = CudaLaunchesOf(*be);
      be->Add(rt, op.acc);
      if (cand.name == "cuda" && CudaLaunchesOf(*be) != launches)
        f.push_back(what + ": the residual add did not join the experts' sum");
      const std::vector<float> got = tb.Read(op.acc), got_resid = tb.Read(rt);

      ReferenceBackend ref(&Ledger());
      Tensors tr(ref);
      if (from_norm) {  // the reference's own norm and logits
        const Tensor xn = tr.Zeros(n, c.d), lg = tr.Zeros(n, c.E);
        ref.RmsNorm(tr.Make(n, c.d, x), nv, 1e-6f, xn);
        ref.MatMul(router.View(0), xn, lg);
        x = tr.Read(xn);
        logits = tr.Read(lg);
        Expect(f, what + ", the norm", tb.Read(op.xn), x, 1e-10);
      }
      std::vector<int32_t> sel(static_cast<size_t>(n * c.k));
      std::vector<float> wt(sel.size());
      ref.Route(tr.Make(n, c.E, logits), op.bias, op.routing, sel.data(), wt.data());
      auto slice = [&](const WeightView& v, int e) {
        WeightView s = v;
        s.rows = v.rows / c.E;
        s.bytes = v.bytes / static_cast<uint64_t>(c.E);
        s.data = v.data + s.bytes * static_cast<uint64_t>(e);
        return s;
      };
      std::vector<float> want(static_cast<size_t>(n * c.d), 0.0f);
      for (int64_t t = 0; t < n; ++t) {
        const Tensor xt =
            tr.Make(1, c.d, std::vector<float>(x.begin() + t * c.d, x.begin() + (t + 1) * c.d));
        for (int j = 0; j < c.k; ++j) {
          const int e = sel[static_cast<size_t>(t * c.k + j)];
          const WeightView ge = slice(gv, e), ue = slice(uv, e), de = slice(dv, e);
          const Tensor g = tr.Zeros(1, c.ff), u = tr.Zeros(1, c.ff), o = tr.Zeros(1, c.d);
          ref.MatMul(ge, xt, g);
          ref.MatMul(ue, xt, u);
          ref.SwiGlu(g, u, g);
          ref.MatMul(de, g, o);
          const std::vector<float> ov = tr.Read(o);
          for (int64_t i = 0; i < c.d; ++i)
            want[static_cast<size_t>(t * c.d + i)] += wt[static_cast<size_t>(t * c.k + j)] * ov[i];
        }
      }
      // int8 activations on the device's fast paths, as in the products' own checks.
      Expect(f, what, got, want, 2e-3);
      std::vector<float> want_resid = resid;
      for (size_t i = 0; i < want_resid.size(); ++i) want_resid[i] += got[i];
      Expect(f, what + ", added to the residual", got_resid, want_resid, 1e-12);
      if (after) after(*be, n);
    }
  }
  return f;
}

TEST(BackendOps, RoutedExpertsOnTheBackend) {
  // The GPU routes adopted experts itself: a GEMV per slot for a few tokens, sorted tiles for
  // many, where the experts have its repacked layout. The CPU backends route on the host.
  const auto gpu = [](DType gate, DType down, int64_t n) {
    const auto tiled = [](DType t) {
      return t == DType::kQ4_0 || t == DType::kQ8_0 || t == DType::kQ4_K || t == DType::kQ6_K;
    };
    return n <= 8 || (tiled(gate) && tiled(down));
  };
  for (const Candidate& c : Backends()) {
    ScopedIsa isa(c.isa);
    const auto cpu = [](DType, DType, int64_t) { return false; };
    for (const std::string& m :
         c.name == "cuda" ? CheckRoutedExperts(c, gpu, nullptr, true) : CheckRoutedExperts(c, cpu))
      ADD_FAILURE() << c.name << ": " << m;
  }
}

// Weights handed to the backend as resident (AdoptResidentBytes: a GPU backend keeps device
// copies and finds views, expert slices and residuals in them by address) give the products
// and rows of weights it has not seen (uploaded per op). A fresh backend per weight: the
// adopted bytes must outlive it.
TEST(BackendOps, MatMulAndEmbedOverAdoptedWeights) {
  for (const Candidate& c : Backends()) {
    ScopedIsa isa(c.isa);
    ReferenceBackend ref(&Ledger());
    std::mt19937 rng(11);
    for (DType type : WeightTypes()) {
      const Weight w = MakeWeight(type, 2 * 37, 256, rng);  // two "experts" of 37 rows
      auto be = c.make();
      be->AdoptResidentBytes(w.skeleton.data(), w.skeleton.size());
      be->AdoptResidentBytes(w.res1.data(), w.res1.size());
      be->AdoptResidentBytes(w.res2.data(), w.res2.size());
      for (int tier : {0, 2}) {
        for (int64_t n : {1, 3, 70}) {
          const std::vector<float> x = Random(n * 256, rng);
          Tensors tb(*be), tr(ref);
          const Tensor yb = tb.Zeros(n, 2 * 37), yr = tr.Zeros(n, 2 * 37);
          be->MatMul(w.View(tier), tb.Make(n, 256, x), yb);
          ref.MatMul(w.View(tier), tr.Make(n, 256, x), yr);
          const double e = ProductError(tb.Read(yb), tr.Read(yr), RowNorms2(w, tier), x, n, 256);
          EXPECT_LE(e, 4e-6) << c.name << " " << DTypeName(type) << " tier " << tier << " n=" << n;
          // The second expert's slice: a view into the middle of the adopted bytes.
          WeightView s = w.View(tier);
          const size_t half = w.skeleton.size() / 2;
          s.data += half;
          s.bytes = half;
          s.rows = 37;
          s.residual[0] += w.res1.size() / 2;
          s.residual[1] += w.res2.size() / 2;
          const Tensor sb = tb.Zeros(n, 37), sr = tr.Zeros(n, 37);
          be->MatMul(s, tb.Make(n, 256, x), sb);
          ref.MatMul(s, tr.Make(n, 256, x), sr);
          const std::vector<double> all = RowNorms2(w, tier);
          const std::vector<double> second(all.begin() + 37, all.end());
          EXPECT_LE(ProductError(tb.Read(sb), tr.Read(sr), second, x, n, 256), 4e-6)
              << c.name << " slice " << DTypeName(type) << " tier " << tier << " n=" << n;
        }
        const int32_t ids[3] = {73, 0, 40};
        Tensors tb(*be), tr(ref);
        const Tensor eb = tb.Zeros(3, 256), er = tr.Zeros(3, 256);
        be->EmbedRows(w.View(tier), ids, 3, eb);
        ref.EmbedRows(w.View(tier), ids, 3, er);
        EXPECT_LE(Nmse(tb.Read(eb), tr.Read(er)), 1e-12) << c.name << " embed " << DTypeName(type);
      }
    }
  }
}

// The same run of ops repeated with new token ids and positions, as decode steps repeat (a GPU
// backend replays such a run as a graph from its second time): every repetition reads its own
// ids and positions, not those of the run it replays.
TEST(BackendOps, RepeatedRunsReadTheirOwnIdsAndPositions) {
  for (const Candidate& c : Backends()) {
    ScopedIsa isa(c.isa);
    auto be = c.make();
    ReferenceBackend ref(&Ledger());
    std::mt19937 rng(12);
    const int64_t d = 256, qd = 128, vocab = 50;  // 4 query heads and 2 KV heads of 32
    const AttentionShape shape{4, 2, 32, 32, 0.17f};
    const Weight emb = MakeWeight(DType::kQ8_0, vocab, d, rng), wq = MakeWeight(DType::kQ4_0, qd, d, rng),
                 wk = MakeWeight(DType::kQ4_K, 64, d, rng), wv = MakeWeight(DType::kQ6_K, 64, d, rng),
                 wo = MakeWeight(DType::kQ8_0, d, qd, rng), norm = MakeWeight(DType::kF32, 1, d, rng);
    for (const Weight* w : {&emb, &wq, &wk, &wv, &wo, &norm})
      be->AdoptResidentBytes(w->skeleton.data(), w->skeleton.size());
    Tensors tb(*be), tr(ref);
    struct Side {
      Tensor x, xn, q, k, v, a, o;
      KvLayer kv;
    };
    auto make = [&](Tensors& t) {
      return Side{t.Zeros(1, d), t.Zeros(1, d), t.Zeros(1, qd), t.Zeros(1, 64), t.Zeros(1, 64),
                  t.Zeros(1, qd), t.Zeros(1, d), t.Kv(DType::kF16, 16, 64, 64)};
    };
    const Side sb = make(tb), sr = make(tr);
    RopeParams rope;
    rope.n_rot = 32;
    auto step = [&](Backend& b, const Side& s, int32_t id, int32_t pos) {
      b.EmbedRows(emb.View(0), &id, 1, s.x);
      b.RmsNorm(s.x, norm.View(0), 1e-5f, s.xn);
      b.MatMul(wq.View(0), s.xn, s.q);
      b.MatMul(wk.View(0), s.xn, s.k);
      b.MatMul(wv.View(0), s.xn, s.v);
      b.Rope(s.q, 4, 32, 0, &pos, rope);
      b.Rope(s.k, 2, 32, 0, &pos, rope);
      b.StoreKv(s.kv, pos, s.k, s.v);
      b.Attention(shape, s.q, s.kv, pos, s.a);
      b.MatMul(wo.View(0), s.a, s.o);
      b.Add(s.x, s.o);
    };
    for (int32_t pos = 0; pos < 8; ++pos) {
      const int32_t id = static_cast<int32_t>((pos * 7 + 3) % vocab);
      step(*be, sb, id, pos);
      step(ref, sr, id, pos);
      // Activations are rounded to 8 bits for the quantized products: 1e-3 leaves room for
      // that, while a stale id or position changes these outputs entirely.
      EXPECT_LE(Nmse(tb.Read(sb.a), tr.Read(sr.a)), 1e-3) << c.name << " attention, step " << pos;
      EXPECT_LE(Nmse(tb.Read(sb.x), tr.Read(sr.x)), 1e-3) << c.name << " output, step " << pos;
    }
  }
}

// A backend with one deliberately wrong kernel of each kind the checks cover: each check must
// report it, or the bounds above are too loose to catch a real bug.
class WrongBackend : public CpuBackend {
 public:
  enum Fault { kMatMulLastRow, kAttentionScale, kRopeAngle, kNormEps, kRouteOrder };
  WrongBackend(Fault fault) : CpuBackend(&Pool(), &Ledger()), fault_(fault) {}

  void MatMul(const WeightView& w, const Tensor& x, const Tensor& y) override {
    CpuBackend::MatMul(w, x, y);
    // An off-by-one in a row loop: the last row of the last token is not written.
    if (fault_ == kMatMulLastRow) y.data[y.size() - 1] = 0.0f;
  }
  void Attention(const AttentionShape& s, const Tensor& q, const KvLayer& kv, int64_t pos0,
                 const Tensor& out) override {
    AttentionShape t = s;
    if (fault_ == kAttentionScale) t.scale *= 1.02f;
    CpuBackend::Attention(t, q, kv, pos0, out);
  }
  void Rope(const Tensor& x, int n_heads, int head_dim, int head_offset, const int32_t* pos,
            const RopeParams& p) override {
    RopeParams q = p;
    if (fault_ == kRopeAngle) q.freq_base *= 1.001f;
    CpuBackend::Rope(x, n_heads, head_dim, head_offset, pos, q);
  }
  void RmsNorm(const Tensor& x, const WeightView& w, float eps, const Tensor& y) override {
    CpuBackend::RmsNorm(x, w, fault_ == kNormEps ? eps + 1e-3f : eps, y);
  }
  void Route(const Tensor& logits, const WeightView* bias, const RoutingParams& p, int32_t* sel,
             float* weight) override {
    CpuBackend::Route(logits, bias, p, sel, weight);
    if (fault_ == kRouteOrder) std::swap(sel[0], sel[1]);
  }

 private:
  Fault fault_;
};

TEST(BackendOps, AWrongKernelFailsTheChecks) {
  {
    WrongBackend be(WrongBackend::kMatMulLastRow);
    EXPECT_FALSE(CheckMatMul(be).empty());
  }
  {
    WrongBackend be(WrongBackend::kAttentionScale);
    EXPECT_FALSE(CheckAttention(be, 1e-9).empty());
  }
  {
    WrongBackend be(WrongBackend::kRopeAngle);
    EXPECT_FALSE(CheckRope(be).empty());
    EXPECT_FALSE(CheckDecodeSteps(be).empty());
  }
  {
    WrongBackend be(WrongBackend::kAttentionScale);
    EXPECT_FALSE(CheckDecodeSteps(be).empty());
  }
  {
    WrongBackend be(WrongBackend::kNormEps);
    EXPECT_FALSE(CheckElementwise(be).empty());
  }
  {
    WrongBackend be(WrongBackend::kRouteOrder);
    EXPECT_FALSE(CheckMoeOps(be).empty());
  }
}

#ifdef SUBSTRATE_HAVE_CUDA
// A GPU under a memory budget (--max-vram): matrices past it stay in host memory (pinned) and
// each op that reads them uploads them into a staging buffer smaller than a batch of them (the
// batch is then split), or its kernels read them in place over the link; with a host pool (the
// hybrid) the host's CPU computes a share of each one-token product over those weights, the
// device the rest. An embedding table the device does not hold travels by rows. Results are the
// reference's within the bounds of held weights, the budget's cap holds, and the bytes each
// side read are counted.
// Routed experts of which the device holds only some (--max-vram): with the hybrid, one token's
// layer is routed on the host and the CPU computes a share of the chosen experts that lie whole
// in host memory while the device computes the rest (its own, or over the link); the device adds
// the two sums. Both the balanced share and all of them on the CPU give the reference's sum.
TEST(BackendOps, RoutedExpertsPastADeviceBudget) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t own = 0;
  {
    auto probe = NewCudaBackend({});
    ASSERT_TRUE(probe.ok()) << probe.status().ToString();
    own = (*probe)->device_ledger()->current();
  }
  ThreadPool pool(2);
  setenv("SUBSTRATE_CUDA_ZEROCOPY", "1", 1);
  // The experts are adopted one by one, so a layer's table mixes held and unheld experts: the
  // file's layout on the device too keeps them of one layout (a repacked table must be whole).
  setenv("SUBSTRATE_CUDA_REPACK", "0", 1);
  for (const char* share : {"", "1"}) {
    if (*share) {
      setenv("SUBSTRATE_CUDA_HYBRID", share, 1);
    } else {
      unsetenv("SUBSTRATE_CUDA_HYBRID");
    }
    Candidate c;
    c.name = std::string("cuda hybrid") + (*share ? ", all on the CPU" : "");
    c.make = [&] {
      CudaBackendOptions o;
      o.staging = 1u << 20;
      o.reserve = o.staging + (8u << 20);
      // Room for the first experts adopted (every case's gate stack goes first): the cases'
      // layers then have experts held, partly held and wholly in host memory.
      o.max_vram = own + o.reserve + (48u << 20) + (512u << 10);
      o.host_pool = &pool;
      o.host_ledger = &Ledger();
      auto made = NewCudaBackend(o);
      EXPECT_TRUE(made.ok()) << made.status().ToString();
      return std::move(made).value();
    };
    uint64_t host_bytes = 0, link_bytes = 0;
    // (prefill's tiles need every expert in the device's repacked layout: declined here)
    const auto gpu = [](DType, DType, int64_t n) { return n <= 8; };
    const auto count = [&](Backend& be, int64_t n) {  // the one-token layer's (a fresh backend)
      if (n != 1) return;
      host_bytes += be.host_compute_bytes();
      link_bytes += be.host_link_bytes();
    };
    for (const std::string& m : CheckRoutedExperts(c, gpu, count))
      ADD_FAILURE() << c.name << ": " << m;
    EXPECT_GT(host_bytes, 0u) << c.name << ": the CPU computed no expert";
    if (!*share) {
      EXPECT_GT(link_bytes, 0u) << c.name << ": no expert was read over the link";
    }
  }
  unsetenv("SUBSTRATE_CUDA_ZEROCOPY");
  unsetenv("SUBSTRATE_CUDA_REPACK");
  unsetenv("SUBSTRATE_CUDA_HYBRID");
}

TEST(BackendOps, WeightsPastADeviceBudget) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(31);
  constexpr int64_t kRows = 512, kCols = 1024;
  std::vector<Weight> ws;
  uint64_t total = 0;
  for (DType type : {DType::kQ4_0, DType::kQ4_K, DType::kQ6_K, DType::kQ8_0}) {
    ws.push_back(MakeWeight(type, kRows, kCols, rng));
    total += ws.back().skeleton.size();
  }
  // The backend's own memory, measured on one without a budget; then a budget that holds that,
  // cuBLAS's temporaries (16 + 32 MiB at the smallest), a 1 MiB staging buffer, the test's
  // tensors, and about half of the weights.
  uint64_t own = 0;
  {
    auto probe = NewCudaBackend({});
    ASSERT_TRUE(probe.ok()) << probe.status().ToString();
    own = (*probe)->device_ledger()->current();
  }
  CudaBackendOptions o;
  o.staging = 1u << 20;
  o.reserve = o.staging + (8u << 20);
  o.max_vram = own + o.reserve + (48u << 20) + total / 2;
  // Every way to reach what the device does not hold: read in place over the link, the same
  // with the hybrid (its shares measured, then all rows on the CPU), and copied into the
  // staging buffer per op.
  ThreadPool pool(2);
  struct Mode {
    const char* name;
    const char* zero_copy;
    const char* hybrid;  // SUBSTRATE_CUDA_HYBRID, or null: no host pool
  };
  for (const Mode& mode : {Mode{"zero-copy", "1", nullptr}, Mode{"hybrid", "1", ""},
                           Mode{"hybrid, all rows on the CPU", "1", "1"},
                           Mode{"staging", "0", nullptr}}) {
    setenv("SUBSTRATE_CUDA_ZEROCOPY", mode.zero_copy, 1);
    if (mode.hybrid && *mode.hybrid) {
      setenv("SUBSTRATE_CUDA_HYBRID", mode.hybrid, 1);
    } else {
      unsetenv("SUBSTRATE_CUDA_HYBRID");
    }
    o.host_pool = mode.hybrid ? &pool : nullptr;
    o.host_ledger = &Ledger();
    auto made = NewCudaBackend(o);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    Backend& be = **made;
    for (Weight& w : ws) be.AdoptResidentWeight(w.type, kRows, kCols, w.skeleton.data());
    const auto accounts = be.device_ledger()->Accounts();
    const uint64_t held = accounts.count("weights") ? accounts.at("weights").current : 0;
    EXPECT_GT(held, 0u);
    EXPECT_LT(held, total) << "every weight fit the budget: the test checks nothing";
    EXPECT_FALSE(be.Allocate(o.max_vram, "test").ok()) << "the budget is not the ledger's cap";

    ReferenceBackend ref(&Ledger());
    for (int tier : {0, 1}) {
      for (int64_t n : {1, 3, 70}) {
        const std::vector<float> x = Random(n * kCols, rng);
        Tensors tb(be), tr(ref);
        const Tensor xb = tb.Make(n, kCols, x), xr = tr.Make(n, kCols, x);
        std::vector<WeightView> views;
        for (const Weight& w : ws) views.push_back(w.View(tier));
        std::vector<MatMulOp> ob, orf;
        for (const WeightView& v : views) {
          ob.push_back({&v, xb, tb.Zeros(n, kRows)});
          orf.push_back({&v, xr, tr.Zeros(n, kRows)});
        }
        const uint64_t link0 = be.host_link_bytes(), host0 = be.host_compute_bytes();
        be.MatMulBatch(ob.data(), static_cast<int>(ob.size()));
        ref.MatMulBatch(orf.data(), static_cast<int>(orf.size()));
        // Copied or read in place, the weights the device does not hold crossed the link, and
        // only they (tier 0: skeletons, some held; tier 1 adds residuals, never held); the
        // hybrid's CPU computed a share of them for one token, all of them when told to.
        const uint64_t link = be.host_link_bytes() - link0;
        const uint64_t host = be.host_compute_bytes() - host0;
        // (tier 1's residuals are the test's own memory, neither held nor pinned: products
        // over them are copied per op, and so never split)
        const bool split = mode.hybrid && n == 1 && tier == 0;
        EXPECT_EQ(host > 0, split) << mode.name << " n=" << n;
        if (tier == 0) {
          EXPECT_EQ(link > 0, !(split && *mode.hybrid)) << mode.name << " n=" << n;
          EXPECT_LT(link + host, total) << mode.name;
        } else {
          EXPECT_GT(link, 0u) << mode.name << ": residuals of held skeletons cross the link";
        }
        for (size_t i = 0; i < ws.size(); ++i) {
          const double e = ProductError(tb.Read(ob[i].y), tr.Read(orf[i].y), RowNorms2(ws[i], tier),
                                        x, n, kCols);
          EXPECT_LE(e, 4e-6) << mode.name << " MatMulBatch "
                             << DTypeName(ws[i].type) << " tier " << tier << " n=" << n;
        }
      }
      for (const Weight& w : ws) {
        const int32_t ids[4] = {0, 17, 17, static_cast<int32_t>(kRows - 1)};
        Tensors tb(be), tr(ref);
        const Tensor eb = tb.Zeros(4, kCols), er = tr.Zeros(4, kCols);
        be.EmbedRows(w.View(tier), ids, 4, eb);
        ref.EmbedRows(w.View(tier), ids, 4, er);
        EXPECT_EQ(tb.Read(eb), tr.Read(er))
            << mode.name << " EmbedRows " << DTypeName(w.type) << " tier " << tier;
      }
    }
    EXPECT_LE(be.device_ledger()->current(), o.max_vram);
  }
  unsetenv("SUBSTRATE_CUDA_ZEROCOPY");
  unsetenv("SUBSTRATE_CUDA_HYBRID");
}
#endif

}  // namespace
}  // namespace substrate
