#pragma once
// Infer's training loop: one epoch of minibatch steps on the objective for every particle
// of this rank, one particle at a time (UnfusedEpochs: an "epoch" message per particle) or
// as stacked groups (FusedEpochs: a "fused_epoch" message per group, fused.h), running the
// algorithm's hooks (Algorithm::prepare_epoch, epoch_rows, epoch_hooks, fused_epoch_hooks,
// finish_epoch, push/bayes/algorithm.h) the same way in both, and each data-parallel replica's communication
// (data_parallel_training.h) around its steps.
#include <push/bayes/algorithm.h>

#include <map>
#include <memory>
#include <vector>

namespace push::bayes::detail {

struct TrainingState;

class EpochEngine {
 public:
  /// `state` is Infer's: the algorithm whose hooks run, and what they train with.
  explicit EpochEngine(TrainingState& state);
  virtual ~EpochEngine() = default;
  EpochEngine(const EpochEngine&) = delete;
  EpochEngine& operator=(const EpochEngine&) = delete;

  /// Whether particles train as stacked groups.
  virtual bool fused() const = 0;
  /// Adds the handlers the engine's messages run to every particle's options.
  virtual void add_handlers(ParticleOptions& options) = 0;
  /// One epoch of this rank's particles, launched on `dist`: each one's mean training
  /// loss (nll per point), by id. Waits for every particle before it rethrows a failure.
  virtual std::map<Pid, double> run(Push& dist, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch) = 0;

 protected:
  /// Launches `message` on each group's first member (with the group as a last argument
  /// when `with_group`), collects every member's loss and reports progress as each ends.
  std::map<Pid, double> launch(Push& dist, const std::vector<std::vector<Pid>>& groups, const char* message,
                               const torch::Tensor& x, const torch::Tensor& y, int64_t epoch, bool with_group);

  TrainingState& state_;
  Algorithm& algorithm_;  // state_.algorithm
  Training training_;     // the services, as algorithms see them
};

class UnfusedEpochs : public EpochEngine {
 public:
  using EpochEngine::EpochEngine;
  bool fused() const override { return false; }
  void add_handlers(ParticleOptions& options) override;
  std::map<Pid, double> run(Push& dist, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch) override;
  /// The epoch's minibatch steps over (x, y), in p's seeded order: the mean nll per point.
  double train(Particle& p, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch, const StepHooks& hooks);

 protected:
  /// One particle's epoch (the "epoch" handler), from prepare_epoch to finish_epoch.
  double particle_epoch(Particle& p, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch);
  /// The same after prepare_epoch (already done for a fused group's members).
  double prepared_epoch(Particle& p, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch);

 private:
  /// One optimizer step on U/N = mean_nll + neg_log_prior / N; returns mean_nll.
  double step(Particle& p, const torch::Tensor& x, const torch::Tensor& y, const StepHooks& hooks);
};

class FusedEpochs : public UnfusedEpochs {
 public:
  using UnfusedEpochs::UnfusedEpochs;
  bool fused() const override { return true; }
  void add_handlers(ParticleOptions& options) override;
  std::map<Pid, double> run(Push& dist, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch) override;

 private:
  /// One group's epoch (the "fused_epoch" handler of its first member, `p`); members that
  /// cannot stack train one by one, with the same results.
  std::vector<double> group_epoch(Particle& p, const std::vector<Pid>& members, const torch::Tensor& x,
                                  const torch::Tensor& y, int64_t epoch);
  /// The group's minibatch steps, each member on its own minibatches (the order the
  /// unfused loop draws for it, over its epoch rows `rows`: one per member, undefined for
  /// all of x); each member's mean nll per point.
  std::vector<double> train_group(FusedStack& stack, const std::vector<Particle*>& members,
                                  const std::vector<torch::Tensor>& rows, const torch::Tensor& x,
                                  const torch::Tensor& y, int64_t epoch, const StepHooks& hooks);
};

}  // namespace push::bayes::detail
