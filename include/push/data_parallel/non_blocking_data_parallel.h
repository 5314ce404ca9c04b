#pragma once
// NonBlockingDataParallel: heat's non-blocking DataParallel, for a Sequential network.
// Gradients stay local: each rank steps on its own; then start_averaging() starts averaging
// each layer's parameters over the ranks, asynchronously, and forward() applies each
// layer's average just before that layer runs (LibTorch's C++ modules have no forward
// pre-hooks: this object's forward walks the Sequential itself). So the exchange of a layer
// overlaps the forward of the layers before it.
//
//   push::data_parallel::NonBlockingDataParallel dp(net, world.collective());
//   for (batch of this rank's rows) {
//     optimizer.zero_grad();
//     loss_fn(dp.forward(x[batch]), y[batch]).backward();   // layers on their averages
//     optimizer.step();
//     dp.start_averaging();
//   }
//   dp.synchronize();   // before evaluating, saving or reading the parameters
//
// Collective: every rank calls start_averaging() and forward() equally often.
#include <push/data_parallel/replicas.h>
#include <push/dist/collective.h>

#include <torch/nn/modules/container/sequential.h>

#include <memory>
#include <vector>

namespace push::data_parallel {

class NonBlockingDataParallel {
 public:
  /// Broadcasts the network's parameters and buffers from the group's first rank.
  NonBlockingDataParallel(torch::nn::Sequential net, dist::CollectiveGroup group);
  NonBlockingDataParallel(const NonBlockingDataParallel&) = delete;
  NonBlockingDataParallel& operator=(const NonBlockingDataParallel&) = delete;

  /// After the local optimizer step: every layer's parameters start their average.
  void start_averaging();
  /// The network's forward, each layer on the average of its parameters.
  torch::Tensor forward(const torch::Tensor& x);
  /// Applies every outstanding average.
  void synchronize();

 private:
  torch::nn::Sequential net_;
  // One per child of the Sequential: its parameters, and their average in flight.
  std::vector<std::vector<torch::Tensor>> params_;
  std::vector<std::unique_ptr<ParameterAverager>> averagers_;
};

}  // namespace push::data_parallel
