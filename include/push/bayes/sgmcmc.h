#pragma once
// Stochastic-gradient MCMC: each particle is a Markov chain whose iterates sample the
// posterior p(θ | D) ∝ exp(-U(θ)), U the objective's negative log posterior (objective.h).
// The training loop gives each step the minibatch gradient g of U/N (N training points);
// with a step size ε per point (the same scale as an optimizer's learning rate) and
// z ~ N(0, I) drawn from the particle's own generator:
//
//   SGLD (Welling & Teh 2011):      θ ← θ - ε g + sqrt(2 ε T / N) z
//   pSGLD (Li et al. 2016):         V ← β V + (1 - β) g²,  G = 1 / (λ + sqrt(V)),
//                                   θ ← θ - ε G g + sqrt(2 ε T G / N) z   (Γ dropped, or V held)
//   SGHMC (Chen et al. 2014, eq. 15 with β̂ = 0): v ← (1 - α) v - ε g + sqrt(2 α ε T / N) z,
//                                   θ ← θ + v   (α the friction; ε/N is Chen et al.'s η)
//
// That is Chen et al.'s η = ε / N on U itself: ε is comparable across data-set sizes. T is
// the posterior's temperature (1: the Bayesian posterior). With cycle_epochs L > 0 the
// step size is cyclical (cSG-MCMC, Zhang et al. 2020): in epoch e, with r = (e mod L) / L,
// ε_e = ε (cos(π r) + 1) / 2, and while r < exploration the chain only descends (no noise,
// no samples). Samples are the parameters after every thin-th step of the sampling
// epochs (after burn_in_epochs; with cycles, in each cycle's sampling stage); each
// particle keeps the last `samples` of them in its state, on the host, in float32, saved
// with it (a load puts them where it puts state, the lane's device, until the next sample). Prediction averages the
// particles' samples (before any, the current parameters). Fused groups take the same steps with the same noise as
// particles alone.
//
//   push::bayes::SGMCMC chains(model, InferOptions().particles(4).batch_size(32),
//                              SGMCMCOptions().method(SGMCMCMethod::sghmc).step_size(1e-2)
//                                  .burn_in_epochs(50).thin(10).samples(100));
#include <push/bayes/infer.h>

#include <cstdint>

namespace push::bayes {

enum class SGMCMCMethod { sgld, sghmc };
const char* to_string(SGMCMCMethod method);

struct SGMCMCOptions {
  TORCH_ARG(SGMCMCMethod, method) = SGMCMCMethod::sgld;
  /// ε, per training point (above). The chains' only step size: InferOptions::lr is not
  /// used, and InferOptions::optimizer and cosine_epochs are refused.
  TORCH_ARG(double, step_size) = 1e-3;
  /// SGHMC's α in (0, 1]: the fraction of the momentum lost per step.
  TORCH_ARG(double, friction) = 0.1;
  /// SGLD only: precondition with RMSprop's running second moment (pSGLD).
  TORCH_ARG(bool, preconditioned) = false;
  TORCH_ARG(double, precondition_decay) = 0.99;  // β
  TORCH_ARG(double, precondition_eps) = 1e-5;    // λ
  /// pSGLD: hold V in the epochs that keep samples, adapting it only while the chain burns
  /// in or explores: G is then constant where samples are kept, so Li et al.'s Γ = Σⱼ
  /// ∂Gᵢⱼ/∂θⱼ, which pSGLD drops, is zero and the chain samples exp(-U) up to the step's
  /// discretisation (docs/bayes.md, *pSGLD*). A held coordinate still adapts where g² > 100 V
  /// (a network unit inactive through burn-in, V ≈ 0, that wakes: a step G g with G ≈ 1/λ
  /// would diverge), a 10-sd event for one that samples its posterior. Off by default, as
  /// Li et al. run it. Needs preconditioned, and burn_in_epochs or cycles that explore.
  TORCH_ARG(bool, hold_preconditioner) = false;
  TORCH_ARG(double, temperature) = 1.0;  // T
  /// Epochs per cycle of the cyclical step size; 0: constant.
  TORCH_ARG(int64_t, cycle_epochs) = 0;
  /// With cycles: the fraction of each cycle that only descends.
  TORCH_ARG(double, exploration) = 0.5;
  /// Epochs (counted from the first, loaded ones included) before samples are kept.
  TORCH_ARG(int64_t, burn_in_epochs) = 0;
  /// Keep the parameters after every thin-th step of the sampling epochs.
  TORCH_ARG(int64_t, thin) = 1;
  /// Samples each particle keeps (the latest) and predicts with.
  TORCH_ARG(int64_t, samples) = 20;
};

class SGMCMC : public Infer {
 public:
  SGMCMC(ModuleFactory model, InferOptions options = {}, SGMCMCOptions chains = {});
  /// "sgld" or "sghmc".
  std::string name() const override { return to_string(chains_.method()); }
  const SGMCMCOptions& chain_options() const { return chains_; }
  /// A copy of particle `pid`'s samples, [k, D] flat parameters in float32 on the host,
  /// oldest first (k <= samples()).
  torch::Tensor samples(Pid pid);
  /// The step size of `epoch` (0-based) and whether it samples (noise and kept samples).
  struct EpochPlan {
    double step_size = 0;
    bool noisy = true, keeps = true;
  };
  EpochPlan plan(int64_t epoch) const { return plan(chains_, epoch); }
  static EpochPlan plan(const SGMCMCOptions& chains, int64_t epoch);

 protected:
  ParticleOptions particle_options() override;
  torch::Tensor predict_particle(Particle& p, const torch::Tensor& x) override;
  StepHooks epoch_hooks(Particle& p, int64_t epoch) override;
  std::optional<StepHooks> fused_epoch_hooks(FusedStack& stack, const std::vector<Particle*>& members,
                                             int64_t epoch) override;
  std::string data_parallel_refusal(DataParallelMode mode) const override;

 private:
  /// Counts a step of p; keeps its parameters (`theta`, called only then) every thin-th.
  void count_step(Particle& p, const std::function<torch::Tensor()>& theta) const;

  SGMCMCOptions chains_;
};

}  // namespace push::bayes
