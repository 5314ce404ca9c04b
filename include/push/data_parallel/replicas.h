#pragma once
// The pieces that keep the replicas of a model equal over the ranks of a CollectiveGroup,
// shared by DataParallel, NonBlockingDataParallel, Daso and push::bayes' data-parallel
// particles: rank 0's values everywhere, gradients averaged after backward, parameters
// averaged in the background, and each rank's share of the rows.
//
//   auto group = push::data_parallel::group_of_everyone(world);
//   push::data_parallel::broadcast_from_first(net->parameters(), group);  // one start
//   push::data_parallel::GradientAverager grads(group);
//   loss.backward();  grads.average(params);  optimizer.step();     // blocking
//   push::data_parallel::ParameterAverager params_avg(group);
//   optimizer.step();  params_avg.start(params);  /* ... */  params_avg.apply();  // non-blocking
//
// GradientAverager averages after backward, not during it as DataParallel's hooks do: code
// that cannot wait inside a backward pass (a particle's handler, a fiber) averages there.
// Every call here is collective: every rank of the group makes it, in the same order. Not
// thread-safe: one object per thread (or fiber) of each rank.
#include <push/dist/collective.h>
#include <push/dist/world.h>

#include <torch/types.h>

#include <vector>

namespace push::data_parallel {

/// A group of every rank of `world`, the caller's own (its collectives never interleave
/// with another user's of the world's default group). Collective.
dist::CollectiveGroup group_of_everyone(const dist::World& world);

/// Every tensor of `tensors` takes the value it has on the group's first rank. Collective.
void broadcast_from_first(const std::vector<torch::Tensor>& tensors, const dist::CollectiveGroup& group);

/// Rank `rank`'s share of `rows` among `size` ranks: every size-th row from its position,
/// the rows repeated from the start to a multiple of the ranks (every rank gets as many).
torch::Tensor share_of(const torch::Tensor& rows, int rank, int size);

class GradientAverager {
 public:
  explicit GradientAverager(dist::CollectiveGroup group) : group_(std::move(group)) {}

  /// Replaces the gradients of `params` with their average over the group (an undefined
  /// gradient counts as zero and is then defined), through one flat all_reduce. In a
  /// fiber, the wait suspends it.
  void average(const std::vector<torch::Tensor>& params);

 private:
  dist::CollectiveGroup group_;
  torch::Tensor flat_;  // reused while the parameters keep their size
};

class ParameterAverager {
 public:
  explicit ParameterAverager(dist::CollectiveGroup group) : group_(std::move(group)) {}
  /// Waits for an average in flight (its buffer must outlive the collective), quietly.
  ~ParameterAverager();
  ParameterAverager(const ParameterAverager&) = delete;
  ParameterAverager& operator=(const ParameterAverager&) = delete;

  /// Starts averaging `params` (after this rank's local step), asynchronously; an average
  /// still in flight is applied first.
  void start(const std::vector<torch::Tensor>& params);
  /// Writes the average in flight, if any, into the parameters it was started on.
  void apply();
  /// Waits for an average in flight, whatever became of it, and forgets it.
  void drop();
  bool outstanding() const { return outstanding_; }

 private:
  dist::CollectiveGroup group_;
  std::vector<torch::Tensor> params_;
  torch::Tensor flat_;
  dist::Work work_;
  bool outstanding_ = false;
};

}  // namespace push::data_parallel
