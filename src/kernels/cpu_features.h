// Which SIMD instruction sets the kernels may use, decided once per process. Tests and
// benchmarks force a lower tier (SetIsaForTesting, or SUBSTRATE_ISA=scalar|avx2|avx512|amx) to compare
// every implementation with the scalar reference on the same machine.
#pragma once

namespace substrate {

// kAmx: kAvx512 plus AMX int8 tiles, which the OS granted this process (Linux: arch_prctl
// ARCH_REQ_XCOMP_PERM); only prefill GEMMs use the tiles, everything else runs the AVX-512 code.
enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3 };

// The best tier this CPU supports: kAvx2 needs AVX2+FMA+F16C; kAvx512 needs F/BW/VL/DQ/VNNI
// (Ice Lake and later; no BF16 or AVX-VNNI needed).
Isa DetectedIsa();
// The tier MatMul uses now: min(detected, SUBSTRATE_ISA, the testing override).
Isa ActiveIsa();
// Forces a tier (clamped to what the CPU has); returns the previous active tier.
Isa SetIsaForTesting(Isa isa);
const char* IsaName(Isa isa);

// How far ahead of the weight line it reads a one-token (decode) kernel of Q4_0, Q4_K, Q5_K or
// Q6_K requests lines: into L1 `l1` bytes ahead, into L2 `l2` bytes ahead (0: no L2 request).
// Decode streams every weight once per token, so the distances decide how many lines are in
// flight, and the best ones differ by core; measured with bench_matmul_kernels --prefetch on
// cold matrices, alternating per call so both settings meet the same neighbours.
struct PrefetchDistances {
  int l1 = 2048;
  int l2 = 8192;
};
// This CPU's: Intel cores {2 KiB, 8 KiB}; AMD Zen cores {6 KiB, none}: 4-13 % more bandwidth
// than Intel's distances on a Zen 5 EPYC (Q8_0 cannot tell the two apart and keeps Intel's).
// SUBSTRATE_PREFETCH=L1,L2 overrides them.
PrefetchDistances DecodePrefetch();
// Sets them (benchmarks comparing distances); returns the previous ones.
PrefetchDistances SetDecodePrefetchForTesting(PrefetchDistances d);
// A kernel's distances for `n_tokens` tokens: DecodePrefetch()'s for one; a tile of several
// computes long enough per line that an L1 request `tile_l1` bytes ahead is all it needs.
inline PrefetchDistances PrefetchFor(int n_tokens, int tile_l1) {
  return n_tokens == 1 ? DecodePrefetch() : PrefetchDistances{tile_l1, 0};
}

}  // namespace substrate
