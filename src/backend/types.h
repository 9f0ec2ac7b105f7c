// The values backend ops work on and the parameters that describe them.
#pragma once

#include <cstdint>

#include "format/dtype.h"
#include "kernels/kernel_types.h"
#include "quant/weight_view.h"

namespace substrate {

// A dense float32 matrix [rows, cols], row-major, in a backend's memory (see backend.h: the
// host passes it to ops and never dereferences it).
struct Tensor {
  float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;

  int64_t size() const { return rows * cols; }
  // Rows [first, first + n) of this tensor.
  Tensor Rows(int64_t first, int64_t n) const { return {data + first * cols, n, cols}; }
  // The same memory seen as [rows, cols] (rows * cols <= size()).
  Tensor Reshape(int64_t r, int64_t c) const { return {data, r, c}; }
};

// y = x . W^T (Backend::MatMul) as one entry of a batch.
struct MatMulOp {
  const WeightView* w = nullptr;
  Tensor x;
  Tensor y;
};

// The routed experts of one MoE layer, chosen and computed by the backend itself
// (Backend::RoutedExperts): every expert's matrices in the backend's memory, the choice never
// read back to the host.
struct RoutedExpertsOp {
  Tensor logits;                     // [n, E] router scores
  const WeightView* bias = nullptr;  // selection bias [E] (deepseek-v3) or null
  RoutingParams routing;             // exact routing: no cached bonus
  // The stacked expert tensors, whole (rows = E x each expert's rows): expert e's gate and up
  // [ff, d] and down [d, ff] matrices are their e-th equal slices, skeleton only.
  const WeightView* gate = nullptr;
  const WeightView* up = nullptr;
  const WeightView* down = nullptr;
  Tensor xn;   // [n, d] the normed input
  Tensor acc;  // [n, d] receives sum over the token's k experts of weight * expert(xn)
};

// One layer of a KV cache, writable: position p's key row at k + p * k_stride elements of
// `type` (F32 or F16), its value row at v + p * v_stride.
struct KvLayer {
  DType type = DType::kF32;
  void* k = nullptr;
  int64_t k_stride = 0;
  void* v = nullptr;
  int64_t v_stride = 0;
};

// Multi-head latent attention's per-head split (deepseek): key = [nope | rot], value = dv.
struct MlaShape {
  int n_head = 0;
  int nope = 0;
  int rot = 0;
  int dv = 0;
};

}  // namespace substrate
