#pragma once
// The learned-noise Gaussian likelihood (Likelihood::learned_noise): each particle holds
// its own log noise precision log γ, as in the Bayesian neural network of the original
// SVGD paper (Liu & Wang 2016), with a Gamma(a0, b0) prior on γ. A fixed σ = 1 in
// standardised units made SVGD's test NLL far worse than published figures whenever the
// data's noise is not 1.
#include <torch/torch.h>

namespace push::bayes::detail {

/// Name of the log-precision parameter inside the wrapper (excluded from the weight prior).
inline constexpr const char* kLogNoisePrecision = "log_noise_precision";

/// The user's network plus one parameter log γ (initialised to 0: σ = 1). forward returns
/// [M, 2t]: the network's t means, then log γ broadcast over the t targets.
class LearnedNoiseImpl : public torch::nn::Module {
 public:
  explicit LearnedNoiseImpl(torch::nn::AnyModule net);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::AnyModule net_;
  torch::Tensor log_precision_;
};
TORCH_MODULE(LearnedNoise);

}  // namespace push::bayes::detail
