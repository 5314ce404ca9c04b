#pragma once
// NonBlockingDataParallel: heat's non-blocking DataParallel, for any module. Gradients
// stay local: each rank steps on its own; then start_averaging() starts averaging the
// parameters over the ranks, asynchronously, and forward() applies the averages before
// they are used. For a Sequential each layer's average is applied just before that layer
// runs (LibTorch's C++ modules have no forward pre-hooks: this object's forward walks the
// Sequential itself), so the exchange of a layer overlaps the forward of the layers before
// it; any other module (as a torch::nn::AnyModule) gets every average before it runs, so
// its exchange overlaps whatever the caller does between the step and the next forward.
//
//   push::data_parallel::NonBlockingDataParallel dp(net, world.collective());
//   for (batch of this rank's rows) {
//     optimizer.zero_grad();
//     loss_fn(dp.forward(x[batch]), y[batch]).backward();   // layers on their averages
//     optimizer.step();
//     dp.start_averaging();
//   }
//   dp.eval();          // leaving training finishes every average (heat's eval() detection)
//
// heat finishes the averages when the model's `training` flag goes off; a C++ module's
// eval() cannot be watched from outside, so leave training through this object's eval() or
// train(false), or call synchronize() before evaluating, saving or reading the parameters.
// Collective: every rank calls start_averaging(), forward() and eval() equally often.
#include <push/data_parallel/replicas.h>
#include <push/dist/collective.h>

#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

namespace push::data_parallel {

class NonBlockingDataParallel {
 public:
  /// Broadcasts the network's parameters and buffers from the group's first rank.
  NonBlockingDataParallel(torch::nn::Sequential net, dist::CollectiveGroup group);
  /// Any module (`torch::nn::AnyModule(my_module)`), broadcast likewise.
  NonBlockingDataParallel(torch::nn::AnyModule module, dist::CollectiveGroup group);
  NonBlockingDataParallel(const NonBlockingDataParallel&) = delete;
  NonBlockingDataParallel& operator=(const NonBlockingDataParallel&) = delete;

  /// After the local optimizer step: the parameters start their average.
  void start_averaging();
  /// The module's forward with its own arguments, on the averages of its parameters (a
  /// Sequential's applied layer by layer, any other module's all before it runs).
  template <class... A>
  torch::Tensor forward(A&&... args) {
    if constexpr (sizeof...(A) == 1 && (std::is_convertible_v<A, const torch::Tensor&> && ...)) {
      if (net_) return forward_layers(args...);
    }
    synchronize();
    if (net_) return (*net_)->forward(std::forward<A>(args)...);
    return any_.forward(std::forward<A>(args)...);
  }
  /// Applies every outstanding average.
  void synchronize();
  /// The module's train(on); leaving training (on false) first applies every average.
  void train(bool on = true);
  void eval() { train(false); }

 private:
  void add_group(std::vector<torch::Tensor> params, dist::CollectiveGroup group);
  torch::Tensor forward_layers(const torch::Tensor& x);

  std::optional<torch::nn::Sequential> net_;  // a Sequential, averaged layer by layer
  torch::nn::AnyModule any_;                  // any other module, as given
  std::shared_ptr<torch::nn::Module> module_;
  // The parameters in groups (a Sequential's layers; otherwise by dtype and device), and
  // each group's average in flight.
  std::vector<std::vector<torch::Tensor>> params_;
  std::vector<std::unique_ptr<ParameterAverager>> averagers_;
};

}  // namespace push::data_parallel
