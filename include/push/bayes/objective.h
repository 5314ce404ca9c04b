#pragma once
// The objective every algorithm of push::bayes trains on: with N training points, the
// negative log posterior U(θ) = N · mean_nll(batch; θ) + ||θ||² / (2 σ_p²) (+ the Gamma
// prior of the noise precision with the learned_noise likelihood). The ensemble, SWAG and
// MC dropout take optimizer steps on U/N; SVGD uses ∇log p(θ|D) = -∇U.
//
//   push::bayes::Objective u(push::bayes::InferOptions().likelihood(Likelihood::heteroscedastic));
//   auto loss = u.mean_nll(net->forward(x), y) + u.neg_log_prior(*net) / n;
//
// Every function works on one network's output [B, out] or on a fused stack's [N, B, out]
// (one value per member). Thread-safe: it only reads its options.
#include <push/bayes/options.h>

#include <torch/nn/module.h>
#include <torch/types.h>

namespace push::bayes {

class FusedStack;

/// The variance a heteroscedastic network's second output v stands for: softplus(v) + 1e-6.
torch::Tensor heteroscedastic_variance(const torch::Tensor& v);

class Objective {
 public:
  explicit Objective(const InferOptions& options);

  Likelihood likelihood() const { return likelihood_; }
  /// σ of the gaussian likelihood.
  double noise_std() const { return noise_std_; }

  /// Mean negative log-likelihood per point of network output `out` [B, o] for targets
  /// `y` [B, t]; with leading dimensions ([N, B, o] and [N, B, t]), one per leading index.
  torch::Tensor mean_nll(const torch::Tensor& out, const torch::Tensor& y) const;
  /// ||θ||² / (2 σ_p²) over the module's parameters; with learned_noise, plus
  /// -a0 log γ + b0 γ for log γ (the Gamma prior of γ, as a density of log γ).
  torch::Tensor neg_log_prior(torch::nn::Module& module) const;
  /// For each member of a fused stack, the learned-noise part of neg_log_prior: [N], or
  /// undefined without learned noise. The weights' part goes straight to the gradients:
  /// add_weight_prior_gradient.
  torch::Tensor noise_prior(const FusedStack& stack) const;
  /// Adds the gradient of (||θ||² / (2 σ_p²)) / divisor, θ every stacked weight, to the
  /// stacks' gradients, with the very float operations autograd performs for it unfused
  /// (so the result is the same bit for bit), at a fraction of the graph's cost.
  void add_weight_prior_gradient(FusedStack& stack, double divisor) const;

 private:
  Likelihood likelihood_;
  double noise_std_, prior_std_, noise_prior_shape_, noise_prior_rate_;
};

}  // namespace push::bayes
