// The scale searches behind the K-quant and IQ4 quantizers (ggml's make_qx_quants family):
// for a group of values they pick integer levels and a scale (and for the "x" formats a min)
// that minimize a weighted squared (or absolute) error. The float operation order mirrors
// llama-quantize's, so our files come out the same or as close as rounding allows.
#pragma once

#include <cstdint>

namespace substrate::quant_internal {

// Symmetric levels in [-nmax, nmax-1], stored offset by nmax in L. rmse_type 0: plain
// round-to-nearest; 1: search 19 scales weighting by qw (or x^2 when qw is null).
float MakeQxQuants(int n, int nmax, const float* x, int8_t* L, int rmse_type, const float* qw);
// Q3_K's symmetric variant with a coordinate-descent refinement; weights null means x^2.
float MakeQ3Quants(int n, int nmax, const float* x, int8_t* L, bool do_rmse,
                   const float* weights = nullptr);
// Asymmetric levels in [0, nmax] with a min (returned negated in *the_min): a grid of nstep
// scales from (nmax + rmin) to (nmax + rmin + nstep*rdelta), each refit by least squares.
float MakeQkx2Quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                     float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep,
                     bool use_mad);
// As MakeQkx2Quants, but weights may be null (x^2 then) and levels are clamped safely; the
// importance-matrix paths use it.
float MakeQkx3Quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                     float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep,
                     bool use_mad);
// Non-negative levels in [0, nmax] for the super-block scales, weighted by quant_weights.
float MakeQpQuants(int n, int nmax, const float* x, uint8_t* L, const float* quant_weights);

}  // namespace substrate::quant_internal
