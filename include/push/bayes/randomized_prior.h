#pragma once
// Randomized prior functions (Osband, Aslanides & Cassirer 2018; PusH's create(..., prior,
// train_key)): each particle's output is f_θ(x) + β p(x), where p is a second network of
// the same architecture, initialised under the particle's own seed and never trained.
// Where the data say nothing, the members then keep the disagreement of their priors.
//
//   auto model = push::bayes::with_randomized_prior(push::bayes::make_model("mlp:64,64", {1}, 2), 1.0);
//   push::bayes::Ensemble ens(model, push::bayes::InferOptions().particles(8));
//
// The prior's weights are buffers of the module, not parameters: optimizers, the
// objective's weight prior, SVGD's kernel, SWAG's moments and SG-MCMC's chains see the
// trained network only, while checkpoints, device moves and the particle cache carry the
// prior with it. Such a module trains unfused (FusedStack fuses plain stacks of layers).
#include <push/runtime/types.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>

namespace push::bayes {

class RandomizedPriorImpl : public torch::nn::Module {
 public:
  /// `net` is trained; `prior` (same outputs) is frozen and scaled by `scale` >= 0.
  RandomizedPriorImpl(torch::nn::AnyModule net, torch::nn::AnyModule prior, double scale);
  /// net(x) + scale · prior(x), the prior without a graph.
  torch::Tensor forward(const torch::Tensor& x);
  /// The prior's output alone, unscaled.
  torch::Tensor prior_forward(const torch::Tensor& x);
  double scale() const { return scale_; }

 private:
  torch::nn::AnyModule net_, prior_;
  double scale_;
};
TORCH_MODULE(RandomizedPrior);

/// A factory of RandomizedPrior(model(), model(), scale): the trained network first, then
/// its prior, both drawn under the generator the particle is built under (its seed).
/// Throws push::Error when scale is negative or not finite.
ModuleFactory with_randomized_prior(ModuleFactory model, double scale);
/// The same with the prior from a factory of its own (the same outputs): for a model with
/// stochastic layers, a prior without them (make_model with dropout 0).
ModuleFactory with_randomized_prior(ModuleFactory model, ModuleFactory prior, double scale);

}  // namespace push::bayes
