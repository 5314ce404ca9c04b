#pragma once
// Last-layer Laplace approximation (Daxberger et al. 2021, "Laplace Redux"): each
// particle's network is trained to a MAP as an ensemble member is, then its last Linear
// layer θ = [W | b] (h + 1 columns, one row per output) gets a Gaussian posterior
// N(θ*, (G + δ I)⁻¹): G the generalised Gauss-Newton matrix Σₙ Jₙᵀ Λₙ Jₙ over the training
// set, Jₙ = ∂f(xₙ)/∂θ (the features φ̃ₙ = [φ(xₙ), 1] in each output's block), Λₙ the
// likelihood's Fisher in the outputs (gaussian 1/σ²; heteroscedastic diag(1/s², s'²/(2s²))
// for the mean and the variance output; categorical diag(p) - p pᵀ), δ the prior precision,
// by default the maximiser of the Laplace marginal likelihood
//   log p(D | δ) ≈ -Σₙ nllₙ(θ*) + P/2 log δ - δ/2 |θ*|² - 1/2 log det(G + δ I)
// (concave in δ: found by bisection on its derivative). With a gaussian likelihood the
// last layer is linear-Gaussian and the approximation is its exact posterior.
// Several particles make a mixture of Laplaces. Prediction: `linearized` gives, per
// particle, the network's output with the last layer's variance J Σ Jᵀ in closed form
// (regression: as two members at μ ± σ per output, whose mixture has exactly that mean and
// variance; classification: the probit approximation, logits μ / sqrt(1 + π/8 σ²)), or
// `sampling` draws `samples` last layers from the posterior.
//
//   push::bayes::Laplace la(model, InferOptions().particles(1), LaplaceOptions());
//   la.fit(train, 100);
//   la.approximate(train);          // after fit (or a load of an approximated checkpoint)
//   auto p = la.predict(test.x);
#include <push/bayes/ensemble.h>

#include <optional>

namespace push::bayes {

enum class LaplaceStructure { diagonal, full };
enum class LaplacePredictive { linearized, sampling };
const char* to_string(LaplaceStructure structure);
const char* to_string(LaplacePredictive predictive);

/// The largest last layer (outputs x (h + 1) parameters) whose full covariance is kept:
/// 512 MiB of float64 per particle.
constexpr int64_t kMaxFullParameters = 8192;

/// What a last-layer posterior of `parameters` last-layer parameters keeps per particle,
/// and what fitting one takes on top while it runs (the GGN, its eigenvalues' workspace,
/// the precision, its Cholesky factor and inverse), in bytes.
struct LaplaceBytes {
  double kept = 0;
  double fitting = 0;
};
LaplaceBytes laplace_bytes(int64_t parameters, LaplaceStructure structure);

/// The parameters of the last Linear layer of `model`'s networks (outputs x (inputs + 1)):
/// what the last-layer Laplace approximates. Builds one scratch network; throws push::Error
/// naming the module when the network is not a Sequential ending in a Linear layer.
int64_t last_layer_parameters(const ModuleFactory& model);

struct LaplaceOptions {
  TORCH_ARG(LaplaceStructure, structure) = LaplaceStructure::full;
  /// δ; unset: the marginal likelihood's maximiser.
  TORCH_ARG(std::optional<double>, prior_precision) = std::nullopt;
  TORCH_ARG(LaplacePredictive, predictive) = LaplacePredictive::linearized;
  /// Last layers drawn per particle by the sampling predictive.
  TORCH_ARG(int64_t, samples) = 20;
};

/// One network's last-layer posterior, float64 on the host.
struct LastLayerPosterior {
  torch::Tensor mean;        // [P], P = outputs x (h + 1): row k of [W | b] at k (h + 1)
  torch::Tensor covariance;  // [P, P] (full) or its diagonal [P]
  double prior_precision = 0;
  double log_marginal_likelihood = 0;
};

/// The last-layer Laplace of `network` (a Sequential whose last module is a Linear) on
/// (x, y) under `objective`'s likelihood. Throws push::Error naming what does not fit.
LastLayerPosterior last_layer_laplace(torch::nn::Module& network, const torch::Tensor& x, const torch::Tensor& y,
                                      const Objective& objective, const LaplaceOptions& options);

class Laplace : public Ensemble {
 public:
  Laplace(ModuleFactory model, InferOptions options = {}, LaplaceOptions laplace = {}, EnsembleOptions ensemble = {});
  std::string name() const override { return "laplace"; }
  /// Fits every particle's last-layer posterior on `train` (normalised as for fit; with a
  /// world, collective). Until then predict() is the MAP networks'.
  void approximate(const data::Dataset& train);
  /// A copy of particle `pid`'s posterior; empty tensors before approximate().
  LastLayerPosterior posterior(Pid pid);
  const LaplaceOptions& laplace_options() const { return laplace_; }

 protected:
  ParticleOptions particle_options() override;
  torch::Tensor predict_particle(Particle& p, const torch::Tensor& x) override;

 private:
  LaplaceOptions laplace_;
};

}  // namespace push::bayes
