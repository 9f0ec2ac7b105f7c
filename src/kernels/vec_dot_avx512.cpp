// AVX-512VL + VNNI (+ BF16 where present) kernels: 256-bit vectors, dpbusd integer products
// and 32 registers, so 8 tokens per weight pass; see vec_dot_x86.inc.
#define SUBSTRATE_VNNI 1
#define SUBSTRATE_MAX_NT 8
#define SUBSTRATE_ISA_NS avx512
#include "kernels/vec_dot_x86.inc"
