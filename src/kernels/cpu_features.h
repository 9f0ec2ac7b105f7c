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

}  // namespace substrate
