// The tensor ids one transformer layer may use, resolved once at load (kNoTensor when the
// model has no such tensor: a bias, a QK-norm, a shared expert...).
#pragma once

#include "model/weight_source.h"

namespace substrate {

struct LayerWeights {
  // Attention.
  TensorId attn_norm = kNoTensor;
  TensorId wq = kNoTensor, wk = kNoTensor, wv = kNoTensor, wo = kNoTensor;
  TensorId bq = kNoTensor, bk = kNoTensor, bv = kNoTensor, bo = kNoTensor;
  TensorId q_norm = kNoTensor, k_norm = kNoTensor;  // qwen3 QK-norm, per head
  // MLA (deepseek).
  TensorId wq_a = kNoTensor, q_a_norm = kNoTensor, wq_b = kNoTensor;
  TensorId wkv_a = kNoTensor, kv_a_norm = kNoTensor, wkv_b = kNoTensor;
  // Dense FFN.
  TensorId ffn_norm = kNoTensor;
  TensorId ffn_gate = kNoTensor, ffn_up = kNoTensor, ffn_down = kNoTensor;
  // Mixture of experts.
  TensorId gate_inp = kNoTensor, exp_probs_b = kNoTensor;
  TensorId gate_exps = kNoTensor, up_exps = kNoTensor, down_exps = kNoTensor;
  TensorId gate_shexp = kNoTensor, up_shexp = kNoTensor, down_shexp = kNoTensor;
  TensorId gate_inp_shexp = kNoTensor;
  // A next-n (MTP) layer's input and head: x = eh_proj [enorm(embed(t+1)); hnorm(h)]; its own
  // embeddings and head are optional (the main model's when absent).
  TensorId eh_proj = kNoTensor, enorm = kNoTensor, hnorm = kNoTensor;
  TensorId nextn_embd = kNoTensor, nextn_head_norm = kNoTensor, nextn_head = kNoTensor;

  // The layer's ops, as indices into Model::ops() (and its per-op tier table); -1 when absent.
  // The routed experts' ops are expert_op0 + e.
  int attn_op = -1, ffn_op = -1, router_op = -1, shared_op = -1, expert_op0 = -1;
  int nextn_op = -1;  // block_N.nextn of a next-n layer
};

}  // namespace substrate
