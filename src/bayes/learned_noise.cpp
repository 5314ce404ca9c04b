// The network wrapper of the learned-noise likelihood; see learned_noise.h.
#include "learned_noise.h"

namespace push::bayes::detail {

LearnedNoiseImpl::LearnedNoiseImpl(torch::nn::AnyModule net) : net_(std::move(net)) {
  register_module("net", net_.ptr());
  // Draws nothing from the generator: the network's seeded initialisation is unchanged.
  log_precision_ = register_parameter(kLogNoisePrecision, torch::zeros({1}));
}

torch::Tensor LearnedNoiseImpl::forward(const torch::Tensor& x) {
  auto mean = net_.forward(x);
  return torch::cat({mean, log_precision_.expand_as(mean)}, 1);
}

}  // namespace push::bayes::detail
