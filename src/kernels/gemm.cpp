#include "kernels/gemm.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/gemm_amx.h"
#include "kernels/interleaved.h"
#include "kernels/interleaved_q8_0.h"
#include "kernels/scratch_buffer.h"
#include "kernels/vec_dot.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace substrate {
namespace {

struct Format {
  int min_tokens;     // fewest tokens for which the tiles beat the dot kernels (gemm.h)
  int sub;            // elements per tile product: a scale block, or 64 for folded formats
  bool folded;        // weights stored as q * integer sub-block scale, low/high planes
  int act_block;      // elements per activation scale: 32 (Q8_0) or 256 (Q8_K)
  bool offsets;       // the weight has per-sub-block mins (needs activation sub-block sums)
  DType act_type;
  amx::WeightFormat weight;
};

const Format* FindFormat(DType type) {
  static const Format kQ8_0{8, 32, false, 32, false, DType::kQ8_0, amx::WeightFormat::kQ8_0};
  static const Format kQ4_0{8, 32, false, 32, false, DType::kQ8_0, amx::WeightFormat::kQ4_0};
  static const Format kQ4_K{12, 64, true, 256, true, DType::kQ8_K, amx::WeightFormat::kQ4_K};
  static const Format kQ6_K{8, 64, true, 256, false, DType::kQ8_K, amx::WeightFormat::kQ6_K};
  switch (type) {
    case DType::kQ8_0: return &kQ8_0;
    case DType::kQ4_0: return &kQ4_0;
    case DType::kQ4_K: return &kQ4_K;
    case DType::kQ6_K: return &kQ6_K;
    default: return nullptr;
  }
}

constexpr int kTile = 16;
static_assert(kTile == kInterleavedRows, "an interleaved group is one row tile");
// Weight panel budget: the unpacked rows of one panel stay in L2 while all tokens pass.
constexpr size_t kPanelBytes = 512 * 1024;
constexpr int kMaxPanelTiles = 4;

size_t RoundUp64(size_t n) { return (n + 63) / 64 * 64; }

// Layout of one packed 16-token activation tile.
struct ActTileLayout {
  size_t q_bytes, ad_floats, asum_floats, bytes;
  ActTileLayout(const Format& f, int64_t cols) {
    q_bytes = static_cast<size_t>(cols) * kTile;
    ad_floats = static_cast<size_t>(cols / f.act_block) * kTile;
    asum_floats = f.offsets ? static_cast<size_t>(cols / 32) * kTile : 0;  // Q4_K's 32s
    bytes = RoundUp64(q_bytes + 4 * (ad_floats + asum_floats));
  }
};

// Packs tokens [t0, t0 + nt) (nt <= 16; missing tokens are zeros) into tile order.
void PackActTile(const Format& f, const ActTileLayout& lay, const uint8_t* act, size_t stride,
                 int64_t cols, int64_t t0, int nt, uint8_t* dst) {
  std::memset(dst, 0, lay.bytes);
  auto* q32 = reinterpret_cast<uint32_t*>(dst);
  auto* ad = reinterpret_cast<float*>(dst + lay.q_bytes);
  float* asum = ad + lay.ad_floats;
  for (int n = 0; n < nt; ++n) {
    const uint8_t* row = act + static_cast<size_t>(t0 + n) * stride;
    if (f.act_type == DType::kQ8_0) {
      const int64_t nb = cols / kQK8_0;
      auto* y = reinterpret_cast<const BlockQ8_0*>(row);
      auto* yd = reinterpret_cast<const float*>(y + nb);  // float scales (ActRowBytes)
      for (int64_t b = 0; b < nb; ++b) {
        ad[b * kTile + n] = yd[b];
        for (int g = 0; g < 8; ++g) {
          uint32_t v;
          std::memcpy(&v, y[b].qs + 4 * g, 4);
          q32[(b * 8 + g) * kTile + n] = v;
        }
      }
    } else {  // Q8_K
      auto* y = reinterpret_cast<const BlockQ8_K*>(row);
      for (int64_t b = 0; b < cols / kQK_K; ++b) {
        ad[b * kTile + n] = y[b].d;
        for (int g = 0; g < kQK_K / 4; ++g) {
          uint32_t v;
          std::memcpy(&v, y[b].qs + 4 * g, 4);
          q32[(b * kQK_K / 4 + g) * kTile + n] = v;
        }
        if (f.offsets)  // sub-blocks of 32: two bsums of 16 each
          for (int j = 0; j < kQK_K / 32; ++j)
            asum[(b * 8 + j) * kTile + n] =
                y[b].d * static_cast<float>(y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
      }
    }
  }
}

}  // namespace

DType GemmActType(DType type) {
  const Format* f = FindFormat(type);
  return f ? f->act_type : DType::kF32;
}

bool GemmSupports(DType type, int64_t cols, int64_t n_tokens, Isa isa) {
  const Format* f = FindFormat(type);
  return isa >= Isa::kAmx && f && cols > 0 && cols % f->act_block == 0 &&
         n_tokens >= f->min_tokens;
}

void GemmQuantized(DType type, WeightLayout layout, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols,
                   const uint8_t* act, size_t act_stride, int64_t n_tokens, float* y,
                   ThreadPool& pool) {
  const Format& f = *FindFormat(type);
  const ActTileLayout lay(f, cols);
  const int64_t n_tt = (n_tokens + kTile - 1) / kTile;
  static thread_local ScratchBuffer act_scratch;
  uint8_t* packed = act_scratch.Reserve(lay.bytes * static_cast<size_t>(n_tt));
  pool.ParallelFor(n_tt, 1, [&](int64_t a, int64_t b, int) {
    for (int64_t tt = a; tt < b; ++tt)
      PackActTile(f, lay, act, act_stride, cols, tt * kTile,
                  static_cast<int>(std::min<int64_t>(kTile, n_tokens - tt * kTile)),
                  packed + tt * lay.bytes);
  });

  const int64_t n_sub = cols / f.sub;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  const int64_t panel_tiles = std::clamp<int64_t>(
      static_cast<int64_t>(kPanelBytes / (static_cast<size_t>(cols) * kTile)), 1, kMaxPanelTiles);
  const int64_t n_panels = (row_tiles + panel_tiles - 1) / panel_tiles;
  // Per 16-row tile: int8 values [n_sub][16][sub] (folded: low then high planes), then scales
  // and offsets, (cols / 16) * 16 floats each (gemm_amx.h).
  const size_t plane = static_cast<size_t>(cols) * kTile;
  const size_t tile_q = f.folded ? 2 * plane : plane;
  const size_t n_scales = static_cast<size_t>(cols / 16) * kTile;
  const size_t tile_bytes = RoundUp64(tile_q + 4 * n_scales * 2);
  pool.ParallelFor(n_panels, 1, [&](int64_t p0, int64_t p1, int) {
    static thread_local ScratchBuffer panel_scratch, plain_scratch;
    uint8_t* panel = panel_scratch.Reserve(tile_bytes * static_cast<size_t>(panel_tiles));
    const bool interleaved = layout != WeightLayout::kRows;
    uint8_t* plain = interleaved ? plain_scratch.Reserve(kTile * row_bytes) : nullptr;
    alignas(64) float out[kTile * kTile];
    amx::ConfigureTiles(f.sub);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t tile0 = p * panel_tiles;
      const int64_t n_tiles = std::min(panel_tiles, row_tiles - tile0);
      for (int64_t i = 0; i < n_tiles; ++i) {
        uint8_t* base = panel + i * tile_bytes;
        auto* s = reinterpret_cast<float*>(base + tile_q);
        const int64_t r0 = (tile0 + i) * kTile;
        auto* q = reinterpret_cast<int8_t*>(base);
        const uint8_t* rows_at = w + static_cast<size_t>(r0) * row_bytes;
        if (interleaved) {  // whole groups: rows is a multiple of 16 (CanInterleave*)
          DeinterleaveGroup(layout, w, cols, r0 / kTile, plain);
          rows_at = plain;
        }
        amx::UnpackTile(f.weight, rows_at, row_bytes,
                        static_cast<int>(std::min<int64_t>(kTile, rows - r0)), cols, q,
                        f.folded ? q + plane : nullptr, s, f.offsets ? s + n_scales : nullptr);
      }
      for (int64_t tt = 0; tt < n_tt; ++tt) {
        const uint8_t* at = packed + tt * lay.bytes;
        const int nt = static_cast<int>(std::min<int64_t>(kTile, n_tokens - tt * kTile));
        for (int64_t i = 0; i < n_tiles; ++i) {
          const uint8_t* base = panel + i * tile_bytes;
          amx::TileArgs args;
          args.wq = reinterpret_cast<const int8_t*>(base);
          args.wq_hi = f.folded ? args.wq + plane : nullptr;
          args.ws = reinterpret_cast<const float*>(base + tile_q);
          args.wo = f.offsets ? args.ws + n_scales : nullptr;
          args.aq = at;
          args.ad = reinterpret_cast<const float*>(at + lay.q_bytes);
          args.asum = args.ad + lay.ad_floats;
          args.n_sub = n_sub;
          args.sub = f.sub;
          args.act_shift = __builtin_ctz(static_cast<unsigned>(f.act_block / f.sub));
          amx::TileDot(args, out);
          const int64_t r0 = (tile0 + i) * kTile;
          const int nr = static_cast<int>(std::min<int64_t>(kTile, rows - r0));
          for (int n = 0; n < nt; ++n) {
            float* yt = y + (tt * kTile + n) * rows + r0;
            for (int m = 0; m < nr; ++m) yt[m] = out[m * kTile + n];
          }
        }
      }
    }
    amx::ReleaseTiles();
  });
}

}  // namespace substrate
