// The CUDA decode products alone, on the shapes of a llama3-8b layer: each weight type, each
// kernel shape of the repacked layout (GemvParams::variant) and the GGUF-layout kernel, in
// GB/s of weight bytes against the device's streaming read measured in the same run. Launches
// are replayed from a CUDA graph over enough copies of each matrix that none is read from L2
// (the L2 of an H200 holds 50 MB), as a decode step reads them.
//   bench_cuda_gemv [TOKENS]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#if SUBSTRATE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_ops.h"
#include "cuda_timing.h"
#include "format/dtype.h"

namespace {

using namespace substrate;
using namespace substrate::cuda;

#define CHECK CUDA_BENCH_CHECK

// Random blocks with a small finite scale in every scale field.
std::vector<uint8_t> RandomRows(int type, int64_t rows, int64_t cols, std::mt19937& rng) {
  const int64_t rb = static_cast<int64_t>(*RowBytes(static_cast<DType>(type), cols));
  std::vector<uint8_t> v(static_cast<size_t>(rows * rb));
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  int qk = 32, bb = 0;
  std::vector<int> scale_offs;
  switch (type) {
    case kTypeQ4_0: bb = 18; scale_offs = {0}; break;
    case kTypeQ8_0: bb = 34; scale_offs = {0}; break;
    case kTypeQ4_K: qk = 256; bb = 144; scale_offs = {0, 2}; break;
    case kTypeQ6_K: qk = 256; bb = 210; scale_offs = {208}; break;
  }
  for (int64_t i = 0; i < rows * (cols / qk); ++i)
    for (int o : scale_offs) {
      const uint16_t h = static_cast<uint16_t>(0x1c00 + rng() % 0x400);  // ~0.004..0.008
      v[static_cast<size_t>(i * bb + o)] = static_cast<uint8_t>(h & 0xFF);
      v[static_cast<size_t>(i * bb + o + 1)] = static_cast<uint8_t>(h >> 8);
    }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const int ntok = argc > 1 ? std::atoi(argv[1]) : 1;
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double hbm = MeasureReadBandwidth(2ull << 30, 5, s);
  std::printf("streaming read %.0f GB/s; tokens %d\n", hbm / 1e9, ntok);
  struct Shape {
    const char* name;
    int64_t rows, cols;
  };
  const Shape shapes[] = {{"qkv", 6144, 4096},      {"o", 4096, 4096},
                          {"gate+up", 28672, 4096}, {"down", 4096, 14336},
                          {"output", 128256, 4096}, {"expert", 768, 2048}};
  std::mt19937 rng(1);
  float* x = nullptr;
  int8_t* xq = nullptr;
  float2* xs = nullptr;
  float* y = nullptr;
  CHECK(cudaMalloc(reinterpret_cast<void**>(&x), 8 * 14336 * 4));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&xq), 8 * 14336));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&xs), 8 * 14336 / 32 * 8));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&y), 8 * 128256 * 4));
  std::vector<float> hx(8 * 14336);
  std::normal_distribution<float> nd(0, 1);
  for (float& f : hx) f = nd(rng);
  CHECK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
  for (int type : {kTypeQ4_0, kTypeQ4_K, kTypeQ6_K, kTypeQ8_0}) {
    for (const Shape& sh : shapes) {
      const int64_t rb = static_cast<int64_t>(*RowBytes(static_cast<DType>(type), sh.cols));
      const int64_t drb = RepackedRowBytes(type, sh.cols);
      if (!drb) continue;
      const uint64_t bytes = static_cast<uint64_t>(sh.rows * rb);
      const int copies = static_cast<int>(std::min<uint64_t>(64, (1ull << 30) / bytes + 1));
      const std::vector<uint8_t> host = RandomRows(type, sh.rows, sh.cols, rng);
      std::vector<uint8_t> packed(static_cast<size_t>(sh.rows * drb));
      RepackRows(type, sh.rows, sh.cols, host.data(), packed.data());
      uint8_t *plain = nullptr, *rp = nullptr;
      CHECK(cudaMalloc(reinterpret_cast<void**>(&plain), bytes * copies));
      CHECK(cudaMalloc(reinterpret_cast<void**>(&rp), packed.size() * copies));
      for (int c = 0; c < copies; ++c) {
        CHECK(cudaMemcpy(plain + bytes * c, host.data(), bytes, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(rp + packed.size() * c, packed.data(), packed.size(),
                         cudaMemcpyHostToDevice));
      }
      QuantizeQ8Params qp{x, ntok, sh.cols, xq, xs};
      LaunchQuantizeQ8(&qp, s);
      std::vector<float> ref;
      for (int v = -1; v < kGemvVariants; ++v) {
        if (v > 0 && ntok != 1) break;
        const bool repacked = v >= 0;
        GemvParams p;
        p.type = repacked ? (type | kRepacked) : type;
        p.fast = 1;
        p.nt = ntok == 1 ? 1 : ntok == 2 ? 2 : ntok <= 4 ? 4 : 8;
        p.ntok = ntok;
        p.cols = sh.cols;
        p.variant = repacked ? v : 0;
        p.n_jobs = 1;
        const int per = GemvRowsPerBlock(p.type, true, p.variant);
        p.block_start[1] = static_cast<int32_t>((sh.rows + per - 1) / per);
        p.jobs[0].x = xq;
        p.jobs[0].xs = xs;
        p.jobs[0].y = y;
        p.jobs[0].ldy = sh.rows;
        p.jobs[0].rows = static_cast<int32_t>(sh.rows);
        p.jobs[0].row_bytes = repacked ? drb : rb;
        const uint64_t stride = repacked ? packed.size() : bytes;
        uint8_t* base = repacked ? rp : plain;
        // One launch to check against the GGUF kernel, then the timed graph.
        p.jobs[0].w = base;
        LaunchGemv(&p, s);
        std::vector<float> out(static_cast<size_t>(sh.rows * ntok));
        CHECK(cudaMemcpyAsync(out.data(), y, out.size() * 4, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        double err = 0, norm = 0;
        if (ref.empty()) {
          ref = out;
        } else {
          for (size_t i = 0; i < out.size(); ++i) {
            err += (out[i] - ref[i]) * static_cast<double>(out[i] - ref[i]);
            norm += ref[i] * static_cast<double>(ref[i]);
          }
        }
        const double us = MicrosecondsPerLaunch(s, std::max(copies, 32), [&](int i) {
          p.jobs[0].w = base + stride * (i % copies);
          LaunchGemv(&p, s);
        });
        std::printf("%-5s %-8s %6lldx%-6lld %-9s %8.2f us %7.0f GB/s %5.1f %%  rel.err %.1e\n",
                    DTypeName(static_cast<DType>(type)), sh.name,
                    static_cast<long long>(sh.rows), static_cast<long long>(sh.cols),
                    repacked ? ("rp v" + std::to_string(v)).c_str() : "gguf", us,
                    bytes / us / 1e3, 100.0 * bytes / (us * 1e-6) / hbm,
                    norm > 0 ? std::sqrt(err / norm) : 0.0);
        std::fflush(stdout);
      }
      CHECK(cudaFree(plain));
      CHECK(cudaFree(rp));
    }
  }
  return 0;
}

#else
int main() {
  std::printf("bench_cuda_gemv: built without CUDA (-DSUBSTRATE_CUDA=ON)\n");
  return 0;
}
#endif
