#include <push/bayes/objective.h>

#include <push/bayes/fused.h>
#include <push/core/errors.h>

#include <torch/torch.h>

#include <cmath>
#include <numbers>

#include "learned_noise.h"

namespace push::bayes {

torch::Tensor heteroscedastic_variance(const torch::Tensor& v) { return torch::softplus(v) + 1e-6; }

Objective::Objective(const InferOptions& options)
    : likelihood_(options.likelihood()),
      noise_std_(options.noise_std()),
      prior_std_(options.prior_std()),
      noise_prior_shape_(options.noise_prior_shape()),
      noise_prior_rate_(options.noise_prior_rate()) {
  PUSH_CHECK(noise_std_ > 0 && prior_std_ > 0, "push::bayes::Infer", "noise_std and prior_std must be positive");
  PUSH_CHECK(noise_prior_shape_ > 0 && noise_prior_rate_ > 0, "push::bayes::Infer",
             "noise_prior_shape and noise_prior_rate must be positive");
}

torch::Tensor Objective::mean_nll(const torch::Tensor& out, const torch::Tensor& y) const {
  // Over the last two dimensions (points, outputs): [B, o] gives a scalar, [N, B, o] one
  // value per member of a fused stack.
  static const double half_log_2pi = 0.5 * std::log(2 * std::numbers::pi);
  switch (likelihood_) {
    case Likelihood::categorical: {
      if (out.dim() == 2) return torch::nn::functional::cross_entropy(out, y);
      namespace F = torch::nn::functional;
      auto each = F::cross_entropy(out.reshape({-1, out.size(-1)}), y.reshape({-1}),
                                   F::CrossEntropyFuncOptions().reduction(torch::kNone));
      return each.view(y.sizes()).mean(-1);
    }
    case Likelihood::heteroscedastic: {
      const int64_t t = out.size(-1) / 2;
      PUSH_CHECK(t == y.size(-1) && out.size(-1) == 2 * t, "push::bayes::Objective",
                 "a heteroscedastic model needs 2 outputs per target (", y.size(-1), " targets), it has ",
                 out.size(-1));
      auto mu = out.narrow(-1, 0, t), var = heteroscedastic_variance(out.narrow(-1, t, t));
      return (0.5 * (torch::log(var) + (y - mu).pow(2) / var) + half_log_2pi).sum(-1).mean(-1);
    }
    case Likelihood::learned_noise: {
      const int64_t t = y.size(-1);
      PUSH_CHECK(out.dim() == y.dim() && out.size(-1) == 2 * t, "push::bayes::Objective", "model outputs ", out.sizes(),
                 " do not match targets ", y.sizes());
      auto mu = out.narrow(-1, 0, t), log_gamma = out.narrow(-1, t, t);
      return (0.5 * (torch::exp(log_gamma) * (y - mu).pow(2) - log_gamma) + half_log_2pi).sum(-1).mean(-1);
    }
    case Likelihood::gaussian: {
      PUSH_CHECK(out.sizes() == y.sizes(), "push::bayes::Objective", "model outputs ", out.sizes(),
                 " do not match targets ", y.sizes());
      const double s = noise_std_;
      return ((y - out).pow(2) * (0.5 / (s * s))).sum(-1).mean(-1) + y.size(-1) * (std::log(s) + half_log_2pi);
    }
  }
  return {};
}

torch::Tensor Objective::neg_log_prior(torch::nn::Module& module) const {
  torch::Tensor sum, noise;
  for (const auto& item : module.named_parameters()) {
    if (likelihood_ == Likelihood::learned_noise && item.key() == detail::kLogNoisePrecision) {
      // -log Gamma(γ; a0, b0) - log |dγ/dlog γ| = -a0 log γ + b0 γ + const.
      const auto& log_gamma = item.value();
      noise = (noise_prior_rate_ * torch::exp(log_gamma) - noise_prior_shape_ * log_gamma).sum();
      continue;
    }
    auto s = item.value().pow(2).sum();
    sum = sum.defined() ? sum + s : s;
  }
  const double v = prior_std_ * prior_std_;
  auto weights = sum.defined() ? sum / (2 * v) : torch::zeros({});
  return noise.defined() ? weights + noise : weights;
}

torch::Tensor Objective::noise_prior(const FusedStack& stack) const {
  if (likelihood_ != Likelihood::learned_noise) return {};
  const auto& params = stack.parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    if (stack.parameter_names()[k] != detail::kLogNoisePrecision) continue;
    auto flat = params[k].reshape({stack.size(), -1});
    return (noise_prior_rate_ * torch::exp(flat) - noise_prior_shape_ * flat).sum(1);
  }
  return {};
}

void Objective::add_weight_prior_gradient(FusedStack& stack, double divisor) const {
  // Unfused, autograd differentiates (Σ_k sum(p_k²) / (2 v)) / divisor: the division nodes
  // hand c = (1 / divisor) / (2 v), in float32, to every pow node, which returns c · (2 p).
  // Here the same products, over the stacks' one buffer at once (but the learned noise).
  torch::NoGradGuard no_grad;
  const double v = prior_std_ * prior_std_;
  const auto& values = stack.flat_values();
  const auto& grads = stack.flat_gradients();
  auto c = torch::ones({}, values.options()) / divisor / (2 * v);
  auto add = [&](int64_t from, int64_t to) {
    if (to > from) grads.narrow(0, from, to - from).add_((values.narrow(0, from, to - from) * 2.0) * c);
  };
  int64_t from = 0;
  const auto& names = stack.parameter_names();
  for (size_t k = 0; k < names.size(); ++k) {
    if (likelihood_ == Likelihood::learned_noise && names[k] == detail::kLogNoisePrecision) {
      const auto [offset, length] = stack.flat_range(k);
      add(from, offset);
      from = offset + length;
    }
  }
  add(from, values.numel());
}

}  // namespace push::bayes
