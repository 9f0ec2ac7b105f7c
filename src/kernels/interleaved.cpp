#include "kernels/interleaved.h"

#include <cstring>
#include <vector>

#include "kernels/interleaved_q4_0.h"
#include "kernels/interleaved_q4_k.h"
#include "kernels/interleaved_q6_k.h"
#include "kernels/interleaved_q8_0.h"

namespace substrate {

namespace {

// Every interleaved layout: its manifest name, the shapes it takes, and its rearrangements. One
// entry a layout; kRows has a name only.
struct LayoutEntry {
  WeightLayout layout;
  const char* name;
  bool (*can)(DType, int64_t, int64_t);
  void (*interleave)(uint8_t*, int64_t, int64_t, ThreadPool*);
  void (*group)(const uint8_t*, int64_t, int64_t, uint8_t*);
  void (*row)(const uint8_t*, int64_t, int64_t, uint8_t*);
};
constexpr LayoutEntry kLayouts[] = {
    {WeightLayout::kRows, "rows", nullptr, nullptr, nullptr, nullptr},
    {WeightLayout::kQ8_0Interleaved, "q8_0_x16", CanInterleaveQ8_0, InterleaveQ8_0,
     DeinterleaveQ8_0Group, DeinterleaveQ8_0Row},
    {WeightLayout::kQ4_0Interleaved, "q4_0_x16", CanInterleaveQ4_0, InterleaveQ4_0,
     DeinterleaveQ4_0Group, DeinterleaveQ4_0Row},
    {WeightLayout::kQ4_KInterleaved, "q4_k_x16", CanInterleaveQ4_K, InterleaveQ4_K,
     DeinterleaveQ4_KGroup, DeinterleaveQ4_KRow},
    {WeightLayout::kQ5_KInterleaved, "q5_k_x16", CanInterleaveQ5_K, InterleaveQ5_K,
     DeinterleaveQ5_KGroup, DeinterleaveQ5_KRow},
    {WeightLayout::kQ6_KInterleaved, "q6_k_x16", CanInterleaveQ6_K, InterleaveQ6_K,
     DeinterleaveQ6_KGroup, DeinterleaveQ6_KRow},
};

const LayoutEntry& Entry(WeightLayout layout) {
  for (const LayoutEntry& e : kLayouts)
    if (e.layout == layout) return e;
  return kLayouts[0];
}

}  // namespace

WeightLayout DecodeLayoutFor(DType type, int64_t rows, int64_t cols) {
  for (const LayoutEntry& e : kLayouts)
    if (e.can && e.can(type, rows, cols)) return e.layout;
  return WeightLayout::kRows;
}

bool InterleavedKernelFor(WeightLayout layout, Isa isa) {
  if (layout == WeightLayout::kRows) return false;
  if (isa >= Isa::kAvx512) return true;
  // AVX2: the kernels of interleaved_q4_0_avx2.cpp, interleaved_q4_k_avx2.cpp and
  // interleaved_q6_k_avx2.cpp.
  return isa >= Isa::kAvx2 &&
         (layout == WeightLayout::kQ4_0Interleaved || layout == WeightLayout::kQ4_KInterleaved ||
          layout == WeightLayout::kQ6_KInterleaved);
}

WeightLayout InterleaveForDecode(DType type, int64_t rows, int64_t cols, uint8_t* data,
                                 ThreadPool* pool) {
  const LayoutEntry& e = Entry(DecodeLayoutFor(type, rows, cols));
  if (e.interleave) e.interleave(data, rows, cols, pool);
  return e.layout;
}

void DeinterleaveInPlace(WeightLayout layout, DType type, int64_t rows, int64_t cols,
                         uint8_t* data) {
  if (layout == WeightLayout::kRows) return;
  const size_t group_bytes = kInterleavedRows * *RowBytes(type, static_cast<uint64_t>(cols));
  std::vector<uint8_t> plain(group_bytes);
  for (int64_t g = 0; g < rows / kInterleavedRows; ++g) {
    DeinterleaveGroup(layout, data, cols, g, plain.data());
    std::memcpy(data + static_cast<size_t>(g) * group_bytes, plain.data(), group_bytes);
  }
}

const char* WeightLayoutName(WeightLayout layout) { return Entry(layout).name; }

bool WeightLayoutFromName(const std::string& name, WeightLayout* layout) {
  for (const LayoutEntry& e : kLayouts)
    if (name == e.name) {
      *layout = e.layout;
      return true;
    }
  return false;
}

void DeinterleaveGroup(WeightLayout layout, const uint8_t* data, int64_t cols, int64_t g,
                       uint8_t* out) {
  if (const LayoutEntry& e = Entry(layout); e.group) e.group(data, cols, g, out);
}

void DeinterleaveRow(WeightLayout layout, const uint8_t* data, int64_t cols, int64_t r,
                     uint8_t* out) {
  if (const LayoutEntry& e = Entry(layout); e.row) e.row(data, cols, r, out);
}

}  // namespace substrate
