// AVX-512 bodies of elementwise ops (kernels/ops.h dispatches to them on the kAvx512 tier).
// GCC 12's 512-bit intrinsics pass an "undefined" vector that its own -Wuninitialized then
// flags; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstdint>

#include "kernels/exp_avx512.h"
#include "kernels/ops.h"

namespace substrate::avx512 {

// silu(g) * u with silu(g) = g * sigmoid(g), and sigmoid from e^-|g| (never above 1, so the
// polynomial exp serves both signs): 1 / (1 + z) for g >= 0, z / (1 + z) below. Prefill runs it
// over tokens x the FFN width every layer; the scalar loop's libm exp was 2-3 % of a prompt.
void SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const auto m = static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 u = _mm512_maskz_loadu_ps(m, up + i);
    const __m512 z = ExpNonPositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));
    const __m512 inv = _mm512_div_ps(one, _mm512_add_ps(one, z));
    const __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 sig = _mm512_mask_mul_ps(inv, neg, inv, z);
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_mul_ps(g, sig), u));
  }
}

}  // namespace substrate::avx512
