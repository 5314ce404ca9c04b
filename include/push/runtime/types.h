#pragma once
#include <ATen/core/ivalue.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace push {

class Particle;

/// A particle's id: unique in its distribution, stable across save/load.
using Pid = int64_t;

/// The arguments of a message. IValues (tensors, numbers, strings, lists, dicts,
/// tuples) so that the same messages can cross process boundaries.
using Args = std::vector<c10::IValue>;

/// A receive handler: runs on the particle's device, may wait on futures.
using Handler = std::function<c10::IValue(Particle&, const Args&)>;

/// Message name -> handler.
using Handlers = std::map<std::string, Handler>;

/// A Sequential behind a plain Tensor(Tensor) forward, so that it fits in an AnyModule
/// (LibTorch's AnyModule refuses Sequential's templated forward).
class SequentialNetImpl : public torch::nn::Module {
 public:
  explicit SequentialNetImpl(torch::nn::Sequential layers) : layers_(register_module("layers", std::move(layers))) {}
  torch::Tensor forward(torch::Tensor x) { return layers_->forward(std::move(x)); }
  torch::nn::Sequential& layers() { return layers_; }

 private:
  torch::nn::Sequential layers_;
};
TORCH_MODULE(SequentialNet);

/// Wraps what a module factory returns into an AnyModule.
template <class M>
torch::nn::AnyModule to_any_module(M&& module) {
  if constexpr (std::is_same_v<std::decay_t<M>, torch::nn::AnyModule>) {
    return std::forward<M>(module);
  } else if constexpr (std::is_same_v<std::decay_t<M>, torch::nn::Sequential>) {
    return torch::nn::AnyModule(SequentialNet(std::forward<M>(module)));
  } else {
    return torch::nn::AnyModule(std::forward<M>(module));
  }
}

/// Builds a fresh network. Called once per particle, on the CPU, under the particle's seed.
using ModuleFactory = std::function<torch::nn::AnyModule()>;

/// Builds a particle's optimizer over its parameters.
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

/// Builds a particle's learning-rate scheduler over its optimizer.
using SchedulerFactory = std::function<std::unique_ptr<torch::optim::LRScheduler>(torch::optim::Optimizer&)>;

/// The loss of a training step: loss_fn(output, label) -> scalar tensor.
using LossFn = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>;

/// Per-particle user state (name -> IValue): saved with the particle.
using State = std::map<std::string, c10::IValue>;

}  // namespace push
