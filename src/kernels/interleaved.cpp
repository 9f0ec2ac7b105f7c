#include "kernels/interleaved.h"

#include "kernels/interleaved_q4_0.h"
#include "kernels/interleaved_q4_k.h"
#include "kernels/interleaved_q6_k.h"
#include "kernels/interleaved_q8_0.h"

namespace substrate {

WeightLayout InterleaveForDecode(DType type, int64_t rows, int64_t cols, uint8_t* data,
                                 ThreadPool* pool) {
  if (CanInterleaveQ8_0(type, rows, cols)) {
    InterleaveQ8_0(data, rows, cols, pool);
    return WeightLayout::kQ8_0Interleaved;
  }
  if (CanInterleaveQ4_0(type, rows, cols)) {
    InterleaveQ4_0(data, rows, cols, pool);
    return WeightLayout::kQ4_0Interleaved;
  }
  if (CanInterleaveQ4_K(type, rows, cols)) {
    InterleaveQ4_K(data, rows, cols, pool);
    return WeightLayout::kQ4_KInterleaved;
  }
  if (CanInterleaveQ5_K(type, rows, cols)) {
    InterleaveQ5_K(data, rows, cols, pool);
    return WeightLayout::kQ5_KInterleaved;
  }
  if (CanInterleaveQ6_K(type, rows, cols)) {
    InterleaveQ6_K(data, rows, cols, pool);
    return WeightLayout::kQ6_KInterleaved;
  }
  return WeightLayout::kRows;
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
