// Randomized prior functions: a trained network plus a frozen, scaled prior network whose
// weights are the module's buffers (push/bayes/randomized_prior.h).
#include <push/bayes/randomized_prior.h>
#include <push/core/errors.h>

#include <torch/torch.h>

#include <cmath>
#include <set>
#include <string>

namespace push::bayes {

RandomizedPriorImpl::RandomizedPriorImpl(torch::nn::AnyModule net, torch::nn::AnyModule prior, double scale)
    : net_(std::move(net)), prior_(std::move(prior)), scale_(scale) {
  const char* origin = "push::bayes::RandomizedPrior";
  PUSH_CHECK(scale >= 0 && std::isfinite(scale), origin, "scale must be >= 0 and finite, got ", scale);
  register_module("net", net_.ptr());
  // Frozen: always in evaluation mode (dropout off, batch norm on its running statistics);
  // not a submodule, so train() and eval() of this module do not reach it.
  prior_.ptr()->eval();
  // The prior is not a submodule: its tensors become this module's buffers, the very same
  // tensors (in-place moves and loads, which LibTorch and push's cache use, reach both).
  std::set<std::string> names;
  for (auto& item : prior_.ptr()->named_parameters()) {
    item.value().requires_grad_(false);
    std::string name = "prior_" + item.key();
    for (char& ch : name) ch = ch == '.' ? '_' : ch;
    PUSH_CHECK(names.insert(name).second, origin, "two prior tensors map to the buffer name '", name, "'");
    register_buffer(name, item.value());
  }
  for (auto& item : prior_.ptr()->named_buffers()) {
    std::string name = "prior_buffer_" + item.key();
    for (char& ch : name) ch = ch == '.' ? '_' : ch;
    PUSH_CHECK(names.insert(name).second, origin, "two prior tensors map to the buffer name '", name, "'");
    register_buffer(name, item.value());
  }
}

torch::Tensor RandomizedPriorImpl::prior_forward(const torch::Tensor& x) {
  torch::NoGradGuard no_grad;
  return prior_.forward(x);
}

torch::Tensor RandomizedPriorImpl::forward(const torch::Tensor& x) {
  auto out = net_.forward(x);
  if (scale_ == 0) return out;
  return out + scale_ * prior_forward(x);
}

ModuleFactory with_randomized_prior(ModuleFactory model, double scale) {
  auto prior = model;
  return with_randomized_prior(std::move(model), std::move(prior), scale);
}

ModuleFactory with_randomized_prior(ModuleFactory model, ModuleFactory prior, double scale) {
  PUSH_CHECK(scale >= 0 && std::isfinite(scale), "push::bayes::with_randomized_prior",
             "scale must be >= 0 and finite, got ", scale);
  PUSH_CHECK(static_cast<bool>(model) && static_cast<bool>(prior), "push::bayes::with_randomized_prior",
             "model or prior is empty");
  return [model = std::move(model), prior = std::move(prior), scale]() -> torch::nn::AnyModule {
    auto net = model();
    auto frozen = prior();
    return torch::nn::AnyModule(RandomizedPrior(std::move(net), std::move(frozen), scale));
  };
}

}  // namespace push::bayes
