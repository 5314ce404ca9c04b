#pragma once
// Infer: the common interface of push's Bayesian deep-learning algorithms. Each one is a
// set of particle programs (receive handlers) on a push::Push distribution.
//
//   auto model = push::bayes::make_model("mlp:64,64", {1}, 2);   // 2: mean + variance
//   push::bayes::Ensemble ens(model, push::bayes::InferOptions()
//       .particles(8).likelihood(push::bayes::Likelihood::heteroscedastic).lr(1e-2));
//   ens.fit(train, 50);
//   push::bayes::Predictive p = ens.predict(test.x);   // p.mean, p.variance
//   ens.save("ckpt");   /* later */   ens.load("ckpt");
//
// Writing an algorithm: subclass Infer, give its particles their handlers
// (particle_options) and say what it adds to an epoch of minibatch training: the hooks
// below, each optional. The training loop itself (one particle at a time, or stacked in
// fused groups; data-parallel or not; on every rank) is Infer's and runs the hooks the
// same way in every case. The objective (objective.h) is shared; an algorithm that drives
// its own epochs (SVGD) overrides run_epoch.
// Seeds. Initialisation, shuffling, bootstrap, dropout masks and posterior samples all
// come from generators seeded by (seed, particle id, epoch / purpose), so a run is
// reproducible whatever the number of lanes and the scheduling.
// Thread-safety: an Infer object is used from one thread at a time.
#include <push/bayes/objective.h>
#include <push/bayes/options.h>
#include <push/bayes/predictive.h>
#include <push/data/dataset.h>
#include <push/runtime/push.h>

#include <ATen/core/Generator.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace push::bayes {

class FusedStack;
namespace detail {
class DataParallelTraining;
class EpochEngine;
class FusedEpochs;
class UnfusedEpochs;
}  // namespace detail

/// One particle's training losses (mean nll per point of an epoch) as fit() saw them:
/// its best epoch and its last. Kept across save/load.
struct ParticleLosses {
  double best = 0;         // the lowest epoch loss
  int64_t best_epoch = 0;  // that epoch, counted from 1
  double last = 0;         // the latest epoch's loss
  int64_t last_epoch = 0;  // counted from 1
};

/// What an algorithm adds to the minibatch steps of one epoch, of one particle or of a
/// fused group (Infer::epoch_hooks, Infer::fused_epoch_hooks). Every member is optional.
struct StepHooks {
  /// After every optimizer step.
  std::function<void()> after_step;
  /// Instead of the optimizer's (or the stack's) own step, once the gradients are in place.
  std::function<void()> step;
  /// Fused groups: after the stack is written back into its members.
  std::function<void()> finish;
};

class Infer {
 public:
  virtual ~Infer();
  Infer(const Infer&) = delete;
  Infer& operator=(const Infer&) = delete;

  /// "ensemble", "mswag", "svgd", "mcdropout", "sgld", "sghmc", "laplace".
  virtual std::string name() const = 0;

  /// Trains `epochs` more epochs on `train` (normalised data; see data::Standardizer).
  void fit(const data::Dataset& train, int64_t epochs);
  /// The predictive distribution at inputs x.
  Predictive predict(const torch::Tensor& x);

  /// Writes particles (parameters, optimizer state, per-particle algorithm state) and
  /// this object's counters to `dir`.
  void save(const std::filesystem::path& dir);
  /// Restores what save wrote; the algorithm and the number of particles must match.
  void load(const std::filesystem::path& dir);

  int64_t epochs_done() const { return epochs_done_; }
  /// Mean training loss (nll per point) of each epoch.
  const std::vector<double>& losses() const { return losses_; }
  /// Each particle's best and last epoch loss, by id (every particle, on every rank).
  const std::map<Pid, ParticleLosses>& particle_losses() const { return particle_losses_; }
  const InferOptions& options() const { return options_; }
  const Objective& objective() const { return objective_; }
  /// The particle distribution (created on first use).
  Push& distribution();
  /// Whether particles train fused: options().fuse() and a model FusedStack supports.
  bool fused();

 protected:
  Infer(ModuleFactory model, InferOptions options);

  // ---- What an algorithm is ----
  /// The algorithm's handlers. Every particle also gets "predict"(x) -> [S, M, out], which
  /// calls predict_particle, and the epoch handlers of the training loop.
  virtual ParticleOptions particle_options() = 0;
  /// A particle's raw network outputs at x: [S, M, out]. Default: one forward pass.
  virtual torch::Tensor predict_particle(Particle& p, const torch::Tensor& x);
  /// One epoch over (x, y): the mean training loss of each particle this rank ran, by id
  /// (every particle without a world). Default: the training loop, with the hooks below.
  virtual std::map<Pid, double> run_epoch(const torch::Tensor& x, const torch::Tensor& y, int64_t epoch);
  /// Why this algorithm cannot train data-parallel in `mode`; empty when it can.
  virtual std::string data_parallel_refusal(DataParallelMode mode) const { return {}; }

  // ---- Hooks of the training loop (fused or not) ----
  /// On each particle before its epoch (before its group is stacked).
  virtual void prepare_epoch(Particle& p, int64_t epoch) {}
  /// The rows of (x, y) particle p trains on this epoch; undefined: all of them.
  virtual torch::Tensor epoch_rows(Particle& p, int64_t n) const { return {}; }
  /// The hooks of one particle's epoch, trained alone.
  virtual StepHooks epoch_hooks(Particle& p, int64_t epoch) { return {}; }
  /// The hooks of a fused group's epoch (members in id order, all on one lane).
  virtual StepHooks fused_epoch_hooks(FusedStack& stack, const std::vector<Particle*>& members, int64_t epoch) {
    return {};
  }
  /// On each particle after its epoch (written back when fused).
  virtual void finish_epoch(Particle& p, int64_t epoch) {}

  // ---- Helpers for algorithms ----
  /// The training loop's epoch for one particle, for an algorithm with an "epoch" handler
  /// of its own: schedule_lr(p, epoch) (a rate the handler sets after it, in `hooks`, wins),
  /// then minibatch steps on the objective over (x, y) in p's seeded order, with `hooks`;
  /// the mean nll per point.
  double train_epoch(Particle& p, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch,
                     const StepHooks& hooks = {});
  /// Sets p's learning rate for `epoch` as options().cosine_epochs() says (nothing without
  /// a schedule). The training loop calls it before prepare_epoch; an algorithm with loops
  /// of its own calls it before a particle's first step of each epoch.
  void schedule_lr(Particle& p, int64_t epoch) const;
  /// Sets each param group's learning rate of p to `fraction` of its lr₀, the rate the
  /// optimizer factory gives (read from a scratch copy: the same for every particle; only
  /// with options().cosine_epochs() > 0 or fuse()).
  void set_lr_fraction(Particle& p, double fraction) const;
  /// The training set's size N (the objective's scale), set by fit().
  int64_t dataset_size() const { return dataset_size_; }
  /// The epoch the current fit() call stops after (progress reports).
  int64_t fit_last_epoch() const { return fit_last_epoch_; }
  /// The particles in fused groups: by rank and lane, at most cache_size each, in id
  /// order; this rank's only unless `every_rank`.
  std::vector<std::vector<Pid>> fused_groups(bool every_rank = false);
  /// Builds the stack of `members` (this lane's particles); throws when they cannot fuse.
  std::unique_ptr<FusedStack> make_stack(const std::vector<Particle*>& members) const;
  /// Throws push::Error naming the algorithm, particle and epoch (0-based here, 1-based in
  /// the text, as progress reports count) when a training loss is NaN or infinite: a
  /// diverged run must stop, not go on to report NaN metrics.
  void check_finite(const Particle& p, int64_t epoch, double loss) const;
  /// The same for the particle's parameters (a last step can diverge after its loss).
  void check_parameters_finite(Particle& p, int64_t epoch) const;
  /// check_parameters_finite for every member of a stack.
  void check_parameters_finite(const FusedStack& stack, const std::vector<Particle*>& members, int64_t epoch) const;
  /// Minibatch index order of `particle` in `epoch` (seeded), over n rows.
  torch::Tensor epoch_order(Pid particle, int64_t epoch, int64_t n) const;
  /// A generator seeded by (the distribution's seed, a, b, c).
  at::Generator generator(uint64_t a, uint64_t b = 0, uint64_t c = 0) const;
  /// Forward in chunks without autograd.
  static torch::Tensor forward_chunked(Particle& p, const torch::Tensor& x);
  /// forward_chunked with each row of `thetas` [S, D] (flat parameters, any device and
  /// type) in place of p's parameters in turn: [S, M, out]. p's own are back afterwards,
  /// also when a forward throws.
  static torch::Tensor forward_each(Particle& p, const torch::Tensor& thetas, const torch::Tensor& x);
  /// Reports a particle's epoch loss to on_progress.
  void report(int64_t epoch, int64_t last_epoch, int64_t done, double running_loss) const;
  /// With a world: every rank's values by particle id, or, when a rank failed, its error
  /// thrown on every rank (this rank's own first). Without one: `mine`, or `error` rethrown.
  std::map<Pid, c10::IValue> exchange(std::map<Pid, c10::IValue> mine, const std::exception_ptr& error,
                                      const char* origin);
  /// Destroys the distribution now (joining its handlers): a subclass whose handlers use
  /// its own members calls it from its destructor. Collective with a world.
  void close_distribution();

 private:
  friend class detail::EpochEngine;
  friend class detail::FusedEpochs;
  friend class detail::UnfusedEpochs;

  void ensure_created();
  /// The particles of a new distribution: their handlers, the training loop, data parallelism.
  void create_particles();
  void write_meta(const std::filesystem::path& dir) const;
  void read_meta(const std::filesystem::path& dir, int64_t& epochs, std::vector<double>& losses,
                 std::map<Pid, ParticleLosses>& particle_losses) const;

  ModuleFactory model_;
  InferOptions options_;
  Objective objective_;
  OptimizerFactory optimizer_;                                   // the particles' (set when the distribution is built)
  std::vector<double> base_lrs_;                                 // lr₀ of optimizer_'s param groups
  std::unique_ptr<detail::DataParallelTraining> data_parallel_;  // data_parallel only
  std::unique_ptr<detail::EpochEngine> engine_;
  int64_t dataset_size_ = 0;
  int64_t fit_last_epoch_ = 0;
  int64_t fit_calls_ = 0;
  int64_t epochs_done_ = 0;
  std::vector<double> losses_;
  std::map<Pid, ParticleLosses> particle_losses_;
  std::unique_ptr<Push> dist_;  // last: destroyed (handlers joined) before the rest
};

}  // namespace push::bayes
