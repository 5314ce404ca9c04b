#pragma once
// InferOptions::data_parallel: every particle on every rank, each rank training it on its
// share of each epoch's rows, its replicas kept equal by the chosen mode with the
// data-parallel area's own pieces (push/data_parallel: GradientAverager for blocking,
// ParameterAverager for nonblocking, Daso). Each particle has its own collective groups,
// made on the calling thread in particle order, so particles on different lanes never
// interleave their collectives; what a mode does around a step runs in the particle's
// handler (a fiber: every wait suspends it, and its lane trains other particles meanwhile).
#include <push/bayes/options.h>
#include <push/data_parallel/daso.h>
#include <push/data_parallel/replicas.h>
#include <push/runtime/particle.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

namespace push::bayes::detail {

/// One particle's replica on this rank.
class Replica {
 public:
  /// Collective: every rank makes the replicas of the same particles in the same order.
  explicit Replica(const DataParallelSpec& spec);
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  /// This rank's share of `rows` (every rank gets as many).
  torch::Tensor shard(const torch::Tensor& rows) const;
  /// Before an epoch of `batches` steps of particle `p` (until end_epoch, the other calls
  /// act on `p`). The first of each fit() call (`fit_call` counts them), whose last epoch
  /// is `epochs_left` away, drops what a failed call left in flight and makes every rank
  /// start from rank 0's parameters (daso: a new schedule over those epochs).
  void begin_epoch(Particle& p, int64_t epochs_left, int64_t batches, int64_t fit_call);
  /// A step's loss on this rank: a non-finite one is remembered for end_epoch, so that
  /// every rank stops at the same point instead of one rank leaving the others waiting.
  void note_loss(double loss);
  /// Before a batch's forward: nonblocking applies the average in flight.
  void before_forward();
  /// After backward: `apply` (the optimizer's step) with the mode's communication.
  void step(Particle& p, const std::function<void()>& apply);
  /// After the epoch's last step, with this rank's epoch loss: every rank then holds the
  /// same parameters. Returns how many ranks had a non-finite loss this epoch (the same
  /// on every rank; the schedule is not moved when it is not 0).
  int end_epoch(double loss);
  int ranks() const { return spec_.world().size(); }

 private:
  DataParallelSpec spec_;
  dist::CollectiveGroup everyone_;                              // this particle's own group of every rank
  std::optional<data_parallel::GradientAverager> gradients_;    // blocking
  std::optional<data_parallel::ParameterAverager> parameters_;  // nonblocking
  std::optional<data_parallel::DasoGroups> daso_groups_;        // daso
  std::unique_ptr<data_parallel::Daso> daso_;                   // daso, per fit() call
  std::vector<torch::Tensor> params_;                           // the particle's trainable ones, this epoch
  bool diverged_ = false;                                       // a non-finite loss this epoch
  int64_t fit_call_ = -1;
};

/// Every particle's replica, and what the ranks do together per epoch.
class DataParallelTraining {
 public:
  /// Collective: the replicas of `pids`, made in that order on every rank. When that
  /// fails (a bad node layout), nothing is left half made.
  DataParallelTraining(const DataParallelSpec& spec, const std::vector<Pid>& pids);

  /// Particle `pid`'s replica (nullptr for an id it does not know).
  Replica* replica(Pid pid) const;
  /// Every particle's epoch loss averaged over the ranks. Collective.
  std::map<Pid, double> average(const std::map<Pid, double>& losses);

 private:
  std::map<Pid, std::unique_ptr<Replica>> replicas_;
  dist::CollectiveGroup group_;  // the losses' own
};

}  // namespace push::bayes::detail
