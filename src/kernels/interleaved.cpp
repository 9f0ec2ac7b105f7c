#include "kernels/interleaved.h"

#include <cstring>
#include <vector>

#include "kernels/interleaved_q4_0.h"
#include "kernels/interleaved_q4_k.h"
#include "kernels/interleaved_q6_k.h"
#include "kernels/interleaved_q8_0.h"

namespace substrate {

WeightLayout DecodeLayoutFor(DType type, int64_t rows, int64_t cols) {
  if (CanInterleaveQ8_0(type, rows, cols)) return WeightLayout::kQ8_0Interleaved;
  if (CanInterleaveQ4_0(type, rows, cols)) return WeightLayout::kQ4_0Interleaved;
  if (CanInterleaveQ4_K(type, rows, cols)) return WeightLayout::kQ4_KInterleaved;
  if (CanInterleaveQ5_K(type, rows, cols)) return WeightLayout::kQ5_KInterleaved;
  if (CanInterleaveQ6_K(type, rows, cols)) return WeightLayout::kQ6_KInterleaved;
  return WeightLayout::kRows;
}

WeightLayout InterleaveForDecode(DType type, int64_t rows, int64_t cols, uint8_t* data,
                                 ThreadPool* pool) {
  const WeightLayout layout = DecodeLayoutFor(type, rows, cols);
  switch (layout) {
    case WeightLayout::kQ8_0Interleaved: InterleaveQ8_0(data, rows, cols, pool); break;
    case WeightLayout::kQ4_0Interleaved: InterleaveQ4_0(data, rows, cols, pool); break;
    case WeightLayout::kQ4_KInterleaved: InterleaveQ4_K(data, rows, cols, pool); break;
    case WeightLayout::kQ5_KInterleaved: InterleaveQ5_K(data, rows, cols, pool); break;
    case WeightLayout::kQ6_KInterleaved: InterleaveQ6_K(data, rows, cols, pool); break;
    case WeightLayout::kRows: break;
  }
  return layout;
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

namespace {
constexpr struct {
  WeightLayout layout;
  const char* name;
} kLayoutNames[] = {
    {WeightLayout::kRows, "rows"},
    {WeightLayout::kQ8_0Interleaved, "q8_0_x16"},
    {WeightLayout::kQ4_0Interleaved, "q4_0_x16"},
    {WeightLayout::kQ4_KInterleaved, "q4_k_x16"},
    {WeightLayout::kQ5_KInterleaved, "q5_k_x16"},
    {WeightLayout::kQ6_KInterleaved, "q6_k_x16"},
};
}  // namespace

const char* WeightLayoutName(WeightLayout layout) {
  for (const auto& n : kLayoutNames)
    if (n.layout == layout) return n.name;
  return "?";
}

bool WeightLayoutFromName(const std::string& name, WeightLayout* layout) {
  for (const auto& n : kLayoutNames)
    if (name == n.name) {
      *layout = n.layout;
      return true;
    }
  return false;
}

void DeinterleaveGroup(WeightLayout layout, const uint8_t* data, int64_t cols, int64_t g,
                       uint8_t* out) {
  switch (layout) {
    case WeightLayout::kQ8_0Interleaved: DeinterleaveQ8_0Group(data, cols, g, out); break;
    case WeightLayout::kQ4_0Interleaved: DeinterleaveQ4_0Group(data, cols, g, out); break;
    case WeightLayout::kQ4_KInterleaved: DeinterleaveQ4_KGroup(data, cols, g, out); break;
    case WeightLayout::kQ5_KInterleaved: DeinterleaveQ5_KGroup(data, cols, g, out); break;
    case WeightLayout::kQ6_KInterleaved: DeinterleaveQ6_KGroup(data, cols, g, out); break;
    case WeightLayout::kRows: break;
  }
}

void DeinterleaveRow(WeightLayout layout, const uint8_t* data, int64_t cols, int64_t r,
                     uint8_t* out) {
  switch (layout) {
    case WeightLayout::kQ8_0Interleaved: DeinterleaveQ8_0Row(data, cols, r, out); break;
    case WeightLayout::kQ4_0Interleaved: DeinterleaveQ4_0Row(data, cols, r, out); break;
    case WeightLayout::kQ4_KInterleaved: DeinterleaveQ4_KRow(data, cols, r, out); break;
    case WeightLayout::kQ5_KInterleaved: DeinterleaveQ5_KRow(data, cols, r, out); break;
    case WeightLayout::kQ6_KInterleaved: DeinterleaveQ6_KRow(data, cols, r, out); break;
    case WeightLayout::kRows: break;
  }
}

}  // namespace substrate
