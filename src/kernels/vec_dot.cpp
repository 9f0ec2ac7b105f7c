#include "kernels/vec_dot.h"

#include "quant/blocks.h"

namespace substrate {

const DotKernel* FindDotKernel(DType type, Isa isa) {
  const DotKernel* k = nullptr;
  if (isa >= Isa::kAvx512) k = avx512::Find(type);
  if (!k && isa >= Isa::kAvx2) k = avx2::Find(type);
  if (!k) k = scalar::Find(type);
  return k;
}

QuantizeActFn FindQuantizeAct(DType act_type, Isa isa) {
  QuantizeActFn f = nullptr;
  if (isa >= Isa::kAvx512) f = avx512::FindQuantize(act_type);
  if (!f && isa >= Isa::kAvx2) f = avx2::FindQuantize(act_type);
  if (!f) f = scalar::FindQuantize(act_type);
  return f;
}

size_t ActRowBytes(DType act_type, int64_t n) {
  auto bytes = RowBytes(act_type, static_cast<uint64_t>(n));
  if (!bytes) return 0;
  size_t extra = act_type == DType::kQ8_0 ? static_cast<size_t>(n / kQK8_0) * sizeof(float) : 0;
  return static_cast<size_t>(*bytes) + extra;
}

}  // namespace substrate
