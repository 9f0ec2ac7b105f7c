// AVX2 + FMA + F16C kernels (integer products via maddubs); see vec_dot_x86.inc.
#define SUBSTRATE_VNNI 0
#define SUBSTRATE_MAX_NT 4
#define SUBSTRATE_ISA_NS avx2
#include "kernels/vec_dot_x86.inc"
