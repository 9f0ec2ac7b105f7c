// A vectorized e^x for the AVX-512 kernels (blocked attention's softmax, the SwiGLU). Included
// by translation units built for the kAvx512 tier only.
#pragma once

#include <immintrin.h>

namespace substrate::avx512 {

// e^x for x <= 0 (a score minus its running max; minus the size of a SiLU input): 2^n * e^r
// with |r| <= ln2/2, a degree-6 Taylor polynomial (relative error ~1e-7) and scalef for 2^n.
// Very negative x gives (nearly) zero; masked lanes are zeroed by the caller, not here.
inline __m512 ExpNonPositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-100.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);  // ln2, high bits
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);       // ln2, the rest
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace substrate::avx512
