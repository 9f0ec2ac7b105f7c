#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu_features.h"

namespace substrate {

void RmsNorm(const float* x, const float* w, float eps, int64_t n, int64_t n_rows, float* y) {
  for (int64_t t = 0; t < n_rows; ++t) {
    const float* xr = x + t * n;
    float* yr = y + t * n;
    double ss = 0;  // double: the sum of squares over a wide row is where float drifts
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
    if (w) {
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale * w[i];
    } else {
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale;
    }
  }
}

namespace {

// YaRN's ramp: which rotated dims keep extrapolating (high frequency) and which interpolate.
float YarnCorrDim(int n_rot, int orig_ctx, float n_rotations, float base) {
  return n_rot * std::log(orig_ctx / (n_rotations * 2.0f * static_cast<float>(M_PI))) /
         (2.0f * std::log(base));
}

}  // namespace

void Rope(float* x, int64_t n_rows, int n_heads, int head_dim, const int32_t* pos,
          const RopeParams& p) {
  const int half = p.n_rot / 2;
  // Per-pair angle multipliers (theta_i) and YaRN mixing, computed once per call.
  float corr_lo = 0, corr_hi = 0;
  const bool yarn = p.yarn_factor > 0 && p.yarn_orig_ctx > 0;
  if (yarn) {
    corr_lo = std::max(0.0f, std::floor(YarnCorrDim(p.n_rot, p.yarn_orig_ctx, p.yarn_beta_fast,
                                                    p.freq_base)));
    corr_hi = std::min(static_cast<float>(p.n_rot - 1),
                       std::ceil(YarnCorrDim(p.n_rot, p.yarn_orig_ctx, p.yarn_beta_slow,
                                             p.freq_base)));
  }
  static thread_local std::vector<double> inv_freq;
  inv_freq.resize(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i)
    inv_freq[static_cast<size_t>(i)] = std::pow(static_cast<double>(p.freq_base), -2.0 * i / p.n_rot);
  for (int64_t t = 0; t < n_rows; ++t) {
    const double position = pos[t];
    for (int i = 0; i < half; ++i) {
      double theta = position * inv_freq[static_cast<size_t>(i)];
      float mscale = p.attn_factor;
      if (yarn) {
        // Interpolated angle for low frequencies, extrapolated for high; linear ramp between.
        const double interp = theta / p.yarn_factor;
        float y = (static_cast<float>(i) - corr_lo) / std::max(0.001f, corr_hi - corr_lo);
        const float ramp = 1.0f - std::min(1.0f, std::max(0.0f, y));
        theta = interp * (1.0 - ramp) + theta * ramp;
      } else {
        theta *= p.freq_scale;
      }
      const float c = static_cast<float>(std::cos(theta)) * mscale;
      const float s = static_cast<float>(std::sin(theta)) * mscale;
      for (int h = 0; h < n_heads; ++h) {
        float* xh = x + (t * n_heads + h) * head_dim;
        const int a = p.style == RopeStyle::kNormal ? 2 * i : i;
        const int b = p.style == RopeStyle::kNormal ? 2 * i + 1 : i + half;
        const float x0 = xh[a], x1 = xh[b];
        xh[a] = x0 * c - x1 * s;
        xh[b] = x0 * s + x1 * c;
      }
    }
  }
}

void Softmax(float* x, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    mx = std::max(mx, x[i]);
    nan |= x[i] != x[i];
  }
  if (nan) {  // max drops NaN: keep it visible rather than normalizing it away
    for (int64_t i = 0; i < n; ++i) x[i] = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  if (mx == -std::numeric_limits<float>::infinity()) {
    for (int64_t i = 0; i < n; ++i) x[i] = 0;
    return;
  }
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float Silu(float x) { return x / (1.0f + std::exp(-x)); }
float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

void SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  if (ActiveIsa() >= Isa::kAvx512) return avx512::SwiGlu(gate, up, n, out);
  for (int64_t i = 0; i < n; ++i) out[i] = Silu(gate[i]) * up[i];
}

void AddInPlace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void AddBias(float* y, const float* b, int64_t n, int64_t n_rows) {
  for (int64_t t = 0; t < n_rows; ++t) AddInPlace(y + t * n, b, n);
}

}  // namespace substrate
