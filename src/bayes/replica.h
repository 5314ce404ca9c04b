#pragma once
// One particle's data-parallel state (InferOptions::data_parallel): its own collective
// groups, made on the calling thread in particle order, and what each mode does around
// the particle's steps, which run in its handler (a fiber: every wait suspends it).
#include <push/bayes/infer.h>
#include <push/parallel/daso.h>

#include <functional>
#include <memory>
#include <optional>

namespace push::bayes::detail {

class Replica {
 public:
  /// Collective: every rank makes the replicas of the same particles in the same order.
  explicit Replica(const DataParallelSpec& spec);
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  /// This rank's share of `rows` (parallel::detail::share_of: every rank gets as many).
  torch::Tensor shard(const torch::Tensor& rows) const;
  /// Before an epoch of `batches` steps of particle `p` (until end_epoch, the other calls
  /// act on `p`). The first of each fit() call (`fit_call` counts
  /// them), whose last epoch is `epochs_left` away, drops what a failed call left in
  /// flight and makes every rank start from rank 0's parameters (daso: a new schedule
  /// over those epochs).
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
  /// on every rank; the schedule and the averages are skipped when it is not 0).
  int end_epoch(double loss);
  int ranks() const;

 private:
  const dist::CollectiveGroup& everyone() const;
  /// Waits for (and forgets) an average in flight, whatever became of it.
  void drop_outstanding();

  DataParallelSpec spec_;
  dist::CollectiveGroup group_;                   // blocking, nonblocking
  std::vector<torch::Tensor> params_;             // the particle's trainable ones, this epoch
  std::optional<parallel::DasoGroups> daso_groups_;
  bool diverged_ = false;                         // a non-finite loss this epoch
  std::unique_ptr<parallel::Daso> daso_;
  int64_t fit_call_ = -1;
  torch::Tensor flat_;       // gradients (blocking) or parameters (nonblocking) in flight
  dist::Work work_;
  bool outstanding_ = false;
};

}  // namespace push::bayes::detail
