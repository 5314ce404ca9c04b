#pragma once
// MultiSWAG: every particle is pretrained (with InferOptions' optimizer, Adam by
// default), then takes SGD steps with momentum 0.9 at a constant learning rate (as in the
// SWAG paper; SWAGOptions::collect_momentum, swag_lr) and collects SWAG moments of that trajectory:
// running mean θ̄, running second moment θ̄², and the last K deviations D = [θ_i - θ̄_i]
// (a rank-K covariance factor). Prediction draws S weight vectors per particle,
//   θ = θ̄ + (sqrt(mean(θ²) - θ̄²) ⊙ z₁ + D z₂ / sqrt(K - 1)) / sqrt(2),  z₁, z₂ ~ N(0, I)
// (with fewer than 2 deviations SWAG-diagonal: θ̄ + sqrt(mean(θ²) - θ̄²) ⊙ z₁), and
// averages the predictions of all particles' samples. Each particle keeps its own counters
// in its state (saved with it).
//
//   push::bayes::MultiSWAG swag(model, InferOptions().particles(4),
//                               SWAGOptions().pretrain_epochs(20).rank(10).samples(10));
#include <push/bayes/infer.h>

namespace push::bayes {

struct SWAGOptions {
  /// Epochs of plain training before moments are collected.
  TORCH_ARG(int64_t, pretrain_epochs) = 10;
  /// K: deviations kept (columns of D).
  TORCH_ARG(int64_t, rank) = 10;
  /// Collect every this many optimizer steps; 0: at the end of every epoch.
  TORCH_ARG(int64_t, collect_every_steps) = 0;
  /// Learning rate during collection; unset: keep the pretraining one.
  TORCH_ARG(std::optional<double>, swag_lr) = std::nullopt;
  /// Collection steps are SGD with this momentum m, whatever the pretraining optimizer:
  /// SWAG's Gaussian models the iterates of SGD at a constant learning rate. Its learning
  /// rate is swag_lr, else lr (1 - m) (the effective step of plain SGD at the optimizer's
  /// lr). Unset: the particle's own optimizer collects, at swag_lr if set.
  TORCH_ARG(std::optional<double>, collect_momentum) = 0.9;
  /// Weight samples per particle at prediction.
  TORCH_ARG(int64_t, samples) = 10;
  /// Floor of the diagonal variance.
  TORCH_ARG(double, min_variance) = 1e-30;
};

/// SWAG's moments of one particle, as kept in its state.
struct SWAGMoments {
  int64_t count = 0;
  torch::Tensor mean, sq_mean;  // [D]
  torch::Tensor deviations;     // [k, D], k <= rank, oldest first
};

class MultiSWAG : public Infer {
 public:
  MultiSWAG(ModuleFactory model, InferOptions options = {}, SWAGOptions swag = {});
  std::string name() const override { return "mswag"; }
  /// A copy of particle `pid`'s moments (CPU).
  SWAGMoments moments(Pid pid);

  /// Adds flat parameters `theta` to `m` (count, mean, sq_mean, last `rank` deviations).
  static void collect(SWAGMoments& m, const torch::Tensor& theta, int64_t rank);
  /// `samples` weight vectors [samples, D] from `m`.
  static torch::Tensor sample(const SWAGMoments& m, int64_t samples, double min_variance, at::Generator& gen);

 protected:
  ParticleOptions particle_options() override;
  torch::Tensor predict_particle(Particle& p, const torch::Tensor& x) override;
  void prepare_epoch(Particle& p, int64_t epoch) override;
  StepHooks epoch_hooks(Particle& p, int64_t epoch) override;
  std::optional<StepHooks> fused_epoch_hooks(FusedStack& stack, const std::vector<Particle*>& members,
                                             int64_t epoch) override;
  void finish_epoch(Particle& p, int64_t epoch) override;
  std::string data_parallel_refusal(DataParallelMode mode) const override;

 private:
  bool collecting(int64_t epoch) const { return epoch >= swag_.pretrain_epochs(); }
  /// The collection phase's momentum-SGD learning rate for p.
  double momentum_lr(Particle& p) const;
  /// Counts one step in p's state; collects `theta` (its flat parameters) every
  /// collect_every_steps steps.
  void count_step(Particle& p, const std::function<torch::Tensor()>& theta) const;
  /// Adds `theta` (p's flat parameters) to the moments in p's state.
  void collect_into(Particle& p, const torch::Tensor& theta) const;

  SWAGOptions swag_;
};

}  // namespace push::bayes
