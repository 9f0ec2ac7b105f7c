// Verifier probes: the adaptive runtime's sensors. A probe watches each pass's residual stream
// (PassObserver) and tells the TierController, per watched op and token, how far that op's
// output at its current tier is from the top tier's (its "disagreement", >= 0, relative).
// Three kinds:
//   ScriptedVerifier       a fixed schedule per op and token (tests);
//   LinearProbeVerifier    per-op linear probes over the hidden state, trained offline
//                          (TrainProbes, `substrate train-probe`);
//   ResidualSampleVerifier applies a few rows of the op's residual to this very token's input
//                          and measures how much the output would change: ||R_s x|| / ||W_s x||
//                          over sampled rows s of the op's input projection (ours); for routed
//                          experts, of each expert the token routes to.
// Probes read the last row of x (the newest token) on the host; they allocate nothing per token.
// A routed expert is observed only on the tokens routed to it; on the others it adds no error,
// so an escalated expert the token did not use counts as calm (and decays as calm ops do).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/tier_controller.h"

namespace substrate {

class VerifierProbe : public PassObserver {
 public:
  explicit VerifierProbe(TierController* controller)
      : controller_(controller), seen_(static_cast<size_t>(controller->n_ops()), 0) {}
  // The token just evaluated is done (the engine calls it after each pass, before the
  // controller's EndToken): every escalated op the token gave no signal for is observed calm.
  void NextToken();

 protected:
  // Tells the controller op's disagreement on this token.
  void Observe(int op, float disagreement);
  // The probe's own end of token (NextToken, before the calm observations).
  virtual void TokenDone() {}

 private:
  TierController* controller_;
  std::vector<uint32_t> seen_;  // per op: the stamp of the token it was last observed on
  uint32_t stamp_ = 1;
};

class ScriptedVerifier : public VerifierProbe {
 public:
  // schedule[op][t]: op's disagreement on the t-th token (0 past the end).
  // A routed expert's schedule is read on the tokens routed to it, at the token's end (as a
  // block's is after the block): its tier changes from the next token, like every op's.
  ScriptedVerifier(TierController* c, std::map<int, std::vector<float>> schedule);
  void AfterBlock(int op, const Tensor& x) override;
  void BeforeExperts(int expert_op0, const int32_t* experts, const float* weights, int k,
                     const Tensor& xn) override;

 private:
  void TokenDone() override;
  float At(int op) const;
  std::map<int, std::vector<float>> schedule_;
  std::vector<int> routed_;  // scheduled experts routed to this token (capacity: every op)
  size_t token_ = 0;
};

// Probe weights: per op id, w (n_embd) and b; prediction |w . x + b|.
struct LinearProbes {
  struct Probe {
    std::vector<float> w;
    float b = 0;
    double heldout_corr = 0;  // Pearson correlation on tokens not used for training
    int64_t n_train = 0;
  };
  std::string target;  // what the probes predict (documented in the JSON)
  std::map<std::string, Probe> ops;
  static Expected<LinearProbes> Load(const std::string& path);
  Status Save(const std::string& path) const;
};

class LinearProbeVerifier : public VerifierProbe {
 public:
  // Probes of ops the model does not have are an error naming them.
  static Expected<std::unique_ptr<LinearProbeVerifier>> Create(TierController* c, const Model& m,
                                                               const LinearProbes& probes);
  void AfterBlock(int op, const Tensor& x) override;

 private:
  using VerifierProbe::VerifierProbe;
  std::vector<const LinearProbes::Probe*> by_op_;  // indexed by model op
  LinearProbes probes_;
};

class ResidualSampleVerifier : public VerifierProbe {
 public:
  // Samples `rows` rows of each dense block's input projection (attention: attn_q or MLA's
  // q/kv_a; FFN: ffn_gate) and its norm, and `expert_rows` rows of each routed expert's
  // ffn_gate_exps slice (0: experts not watched), at tier 0 and at the top tier, through the
  // model's weight source, once. Charged to the ledger account "verifier".
  static Expected<std::unique_ptr<ResidualSampleVerifier>> Create(TierController* c, Model& m,
                                                                  int top_tier, int rows,
                                                                  MemoryLedger* ledger,
                                                                  int expert_rows = 0);
  void BeforeBlock(int op, const Tensor& x) override;
  void BeforeExperts(int expert_op0, const int32_t* experts, const float* weights, int k,
                     const Tensor& xn) override;

 private:
  struct Sample {
    std::vector<float> norm;      // [d] the block's RMSNorm scale (empty: input normed already)
    std::vector<float> skeleton;  // [rows, d] tier-0 rows
    std::vector<float> residual;  // [rows, d] top tier minus tier 0
  };
  using VerifierProbe::VerifierProbe;
  // ||R_s x|| / ||W_s x|| over the sampled rows, x = xn_ (the op's normed input).
  float Ratio(const Sample& s, int64_t d) const;
  float eps_ = 1e-6f;
  std::vector<std::unique_ptr<Sample>> by_op_;  // indexed by model op, null: not watched
  std::vector<float> xn_;
  LedgerCharge charge_;
};

}  // namespace substrate
