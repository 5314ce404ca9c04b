#pragma once
// What an algorithm is, and what it may call: the narrow interface between push's Bayesian
// algorithms and the training loop that runs them (infer.h).
//
// An algorithm is a subclass of Infer. It defines Algorithm's members: name() and
// particle_options() always, the other hooks when it needs them (each has a default that
// adds nothing). While it trains it calls Training's services, through Infer::training(),
// and the free helpers below. The loop (one particle at a time or in fused groups,
// data-parallel or not, on every rank) calls the hooks the same way in every case. See
// docs/bayes.md, "Adding an algorithm".
#include <push/bayes/options.h>
#include <push/runtime/push.h>

#include <ATen/core/Generator.h>

#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace push::bayes {

class FusedStack;
namespace detail {
struct TrainingState;
}  // namespace detail

/// What an algorithm adds to the minibatch steps of one epoch, of one particle or of a
/// fused group (Algorithm::epoch_hooks, Algorithm::fused_epoch_hooks). Every member is
/// optional.
struct StepHooks {
  /// After every optimizer step.
  std::function<void()> after_step;
  /// Instead of the optimizer's (or the stack's) own step, once the gradients are in place.
  std::function<void()> step;
  /// Fused groups: after the stack is written back into its members.
  std::function<void()> finish;

  bool empty() const { return !after_step && !step && !finish; }
};

/// What an algorithm defines. The training loop calls these; an algorithm's users do not
/// (Infer inherits this privately: a user sees fit, predict, save and load).
class Algorithm {
 public:
  virtual ~Algorithm() = default;

  // ---- Always ----
  /// "ensemble", "mswag", "svgd", "mcdropout", "sgld", "sghmc", "laplace".
  virtual std::string name() const = 0;
  /// The algorithm's handlers. Every particle also gets "predict"(x) -> [S, M, out], which
  /// calls predict_particle, and the handlers of the training loop.
  virtual ParticleOptions particle_options() = 0;

  // ---- When needed ----
  /// A particle's raw network outputs at x: [S, M, out]. Infer's: one forward pass.
  virtual torch::Tensor predict_particle(Particle& p, const torch::Tensor& x) = 0;
  /// One epoch over (x, y): the mean training loss of each particle this rank ran, by id
  /// (every particle without a world). Infer's: the training loop, with the hooks below.
  /// An algorithm that drives its own epochs (SVGD) overrides it.
  virtual std::map<Pid, double> run_epoch(const torch::Tensor& x, const torch::Tensor& y, int64_t epoch) = 0;
  /// Why this algorithm cannot train data-parallel in `mode`; empty when it can.
  virtual std::string data_parallel_refusal(DataParallelMode mode) const { return {}; }

  // ---- Hooks of the training loop (fused or not) ----
  /// On each particle before its epoch (before its group is stacked).
  virtual void prepare_epoch(Particle& p, int64_t epoch) {}
  /// The rows of (x, y) particle p trains on this epoch; undefined: all of them.
  virtual torch::Tensor epoch_rows(Particle& p, int64_t n) const { return {}; }
  /// The hooks of one particle's epoch, trained alone. It may be called more than once
  /// for an epoch: the closures it returns do the work.
  virtual StepHooks epoch_hooks(Particle& p, int64_t epoch) { return {}; }
  /// The hooks of a fused group's epoch (members in id order, all on one lane), acting on
  /// the stack. Without them (nullopt, the default) a group trains fused only when
  /// epoch_hooks adds nothing; otherwise its members train one by one with epoch_hooks,
  /// so that an algorithm never trains differently fused.
  virtual std::optional<StepHooks> fused_epoch_hooks(FusedStack& stack, const std::vector<Particle*>& members,
                                                     int64_t epoch) {
    return std::nullopt;
  }
  /// On each particle after its epoch (written back when fused).
  virtual void finish_epoch(Particle& p, int64_t epoch) {}
};

/// What an algorithm may call while it trains (Infer::training()). The first group serves
/// every algorithm; the second an algorithm that drives its own epochs (SVGD).
class Training {
 public:
  explicit Training(detail::TrainingState& state) : state_(state) {}

  /// The training set's size N (the objective's scale), set by fit().
  int64_t dataset_size() const;
  /// A generator seeded by (the distribution's seed, a, b, c): every random draw of an
  /// algorithm comes from one, so a run is the same whatever the lanes and scheduling.
  at::Generator generator(uint64_t a, uint64_t b = 0, uint64_t c = 0) const;
  /// The training loop's epoch for one particle, for an algorithm with an "epoch" handler
  /// of its own: schedule_lr(p, epoch) (a rate the handler sets after it, in `hooks`,
  /// wins), then minibatch steps on the objective over (x, y) in p's seeded order, with
  /// `hooks`; the mean nll per point.
  double train_epoch(Particle& p, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch,
                     const StepHooks& hooks = {}) const;
  /// Sets p's learning rate for `epoch` as options().cosine_epochs() says (nothing without
  /// a schedule). The loop calls it before prepare_epoch.
  void schedule_lr(Particle& p, int64_t epoch) const;
  /// Sets each param group's learning rate of p to `fraction` of its lr₀, the rate the
  /// optimizer factory gives (read from a scratch copy: the same for every particle; only
  /// with options().cosine_epochs() > 0 or fuse()).
  void set_lr_fraction(Particle& p, double fraction) const;
  /// With a world: every rank's values by particle id, or, when a rank failed, its error
  /// thrown on every rank (this rank's own first). Without one: `mine`, or `error` rethrown.
  std::map<Pid, c10::IValue> exchange(std::map<Pid, c10::IValue> mine, const std::exception_ptr& error,
                                      const char* origin) const;

  /// The epoch the current fit() call stops after (progress reports).
  int64_t fit_last_epoch() const;
  /// Minibatch index order of `particle` in `epoch` (seeded), over n rows.
  torch::Tensor epoch_order(Pid particle, int64_t epoch, int64_t n) const;
  /// The particles in fused groups: by rank and lane, at most cache_size each, in id
  /// order; this rank's only unless `every_rank`.
  std::vector<std::vector<Pid>> fused_groups(bool every_rank = false) const;
  /// Builds the stack of `members` (this lane's particles); throws when they cannot fuse.
  std::unique_ptr<FusedStack> make_stack(const std::vector<Particle*>& members) const;
  /// Throws push::Error naming the algorithm, particle and epoch (0-based here, 1-based in
  /// the text, as progress reports count) when a training loss is NaN or infinite: a
  /// diverged run must stop, not go on to report NaN metrics.
  void check_finite(const Particle& p, int64_t epoch, double loss) const;
  /// The same for the particle's parameters (a last step can diverge after its loss).
  void check_finite(Particle& p, int64_t epoch) const;
  /// The same for every member of a stack.
  void check_finite(const FusedStack& stack, const std::vector<Particle*>& members, int64_t epoch) const;
  /// Reports a particle's epoch loss to on_progress.
  void report(int64_t epoch, int64_t last_epoch, int64_t done, double running_loss) const;

 private:
  detail::TrainingState& state_;
};

/// Forward in chunks without autograd, the outputs on the host.
torch::Tensor forward_chunked(Particle& p, const torch::Tensor& x);
/// forward_chunked with each row of `thetas` [S, D] (flat parameters, any device and type)
/// in place of p's parameters in turn: [S, M, out]. p's own are back afterwards, also when
/// a forward throws.
torch::Tensor forward_each(Particle& p, const torch::Tensor& thetas, const torch::Tensor& x);

}  // namespace push::bayes
