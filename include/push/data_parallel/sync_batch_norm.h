#pragma once
// Synchronized batch norm (jactorch's SynchronizedBatchNorm1d/2d): batch statistics over
// the replicas of a model in this process (one thread each, through a SyncMaster) and
// over the ranks of a CollectiveGroup (all_reduce), so that N replicas, each on its part
// of a batch, normalise as one BatchNorm on the whole batch would; the backward pass
// reduces its gradients the same way.
//
//   auto sync = std::make_shared<push::data_parallel::BatchNormSync>(2, world.collective());
//   // replica r (on its own thread) builds its network with
//   push::data_parallel::SyncBatchNorm bn(push::data_parallel::SyncBatchNormOptions(16), sync, r);
//
// Each replica holds its own weight, bias and running statistics (all replicas compute the
// same statistics, so running statistics stay equal); the sum of the replicas' weight and
// bias gradients is the whole batch's. Every replica must run each forward and backward
// (in training mode, or in any mode without running statistics) at the same time as the
// others: they wait for each other, at most `timeout`, then fail naming who did not come.
// One thread per replica, each with its own device: not on an event loop (a particle or
// RPC handler), where the replicas' backward passes would wait inside one autograd engine
// thread. Inputs [B, C], [B, C, L] or [B, C, H, W]. Statistics are summed in double
// precision.
#include <push/dist/collective.h>
#include <push/parallel/sync_master.h>

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <optional>

namespace push::data_parallel {

/// What replicas of SyncBatchNorm share: `replicas` participants in this process, and the
/// ranks of `group` when given (each rank with the same number of replicas).
class BatchNormSync {
 public:
  explicit BatchNormSync(int replicas, std::optional<dist::CollectiveGroup> group = std::nullopt,
                         std::chrono::milliseconds timeout = std::chrono::seconds(60));
  int replicas() const { return master_.participants(); }
  /// The sum over every replica of every rank of `t` (replica `replica`'s part), a copy
  /// for each replica. Collective over the replicas and ranks.
  torch::Tensor sum(int replica, const torch::Tensor& t);

 private:
  std::optional<dist::CollectiveGroup> group_;
  parallel::SyncMaster<torch::Tensor, torch::Tensor> master_;
};

struct SyncBatchNormOptions {
  /* implicit */ SyncBatchNormOptions(int64_t num_features) : num_features_(num_features) {}  // NOLINT
  TORCH_ARG(int64_t, num_features);
  TORCH_ARG(double, eps) = 1e-5;
  TORCH_ARG(double, momentum) = 0.1;
  TORCH_ARG(bool, affine) = true;
  TORCH_ARG(bool, track_running_stats) = true;
};

class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  SyncBatchNormImpl(SyncBatchNormOptions options, std::shared_ptr<BatchNormSync> sync, int replica);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& input);

  SyncBatchNormOptions options;
  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  std::shared_ptr<BatchNormSync> sync_;
  int replica_;
};
TORCH_MODULE(SyncBatchNorm);

}  // namespace push::data_parallel
