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
// Objective. With N training points, every algorithm works with the negative log
// posterior U(θ) = N · mean_nll(batch; θ) + ||θ||² / (2 σ_p²): the ensemble, SWAG and
// MC dropout take optimizer steps on U/N; SVGD uses ∇log p(θ|D) = -∇U.
// Seeds. Initialisation, shuffling, bootstrap, dropout masks and posterior samples all
// come from generators seeded by (seed, particle id, epoch / purpose), so a run is
// reproducible whatever the number of lanes and the scheduling.
// Thread-safety: an Infer object is used from one thread at a time.
#include <push/data/dataset.h>
#include <push/dist/collective.h>
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

using data::Task;

enum class Likelihood {
  gaussian,         // y ~ N(f(x), noise_std²), one output per target
  heteroscedastic,  // the network outputs [mean, v] per target, variance = softplus(v) + 1e-6
  categorical,      // the network outputs logits
  // y ~ N(f(x), 1/γ), one output per target; each particle learns its own log noise
  // precision log γ (one for all targets, starting at 0) under a Gamma(noise_prior_shape,
  // noise_prior_rate) prior on γ, as the original SVGD Bayesian neural network does.
  learned_noise,
};
const char* to_string(Likelihood likelihood);
/// Network outputs needed for `targets` regression targets / `classes` classes.
int64_t output_units(Likelihood likelihood, int64_t targets_or_classes);

/// Reported after each particle finishes an epoch (from the thread that called fit).
struct Progress {
  int64_t epoch = 0;        // epochs done by this Infer, this one included
  int64_t last_epoch = 0;   // the epoch this fit() call stops after
  int64_t particles_done = 0, particles = 0;
  double loss = 0;          // running mean training loss (mean nll per point) this epoch
};

/// How the ranks of InferOptions::data_parallel share each particle's training.
enum class DataParallelMode {
  blocking,     // gradients averaged over the ranks before every step
  nonblocking,  // local steps; the averaged parameters are applied before the next forward
  daso,         // DASO (push/parallel/daso.h): node-local gradients, global syncs on a schedule
};
const char* to_string(DataParallelMode mode);
/// Throws push::Error naming the choices for anything but blocking, nonblocking or daso.
DataParallelMode parse_data_parallel_mode(const std::string& text);

struct DataParallelSpec {
  DataParallelSpec(dist::World world, DataParallelMode mode) : world_(std::move(world)), mode_(mode) {}
  TORCH_ARG(dist::World, world);
  TORCH_ARG(DataParallelMode, mode);
  /// daso: ranks per node (0: LOCAL_WORLD_SIZE; see parallel::DasoOptions).
  TORCH_ARG(int, ranks_per_node) = 0;
  /// daso: the schedule's warm-up and cool-down epochs (each fit() call is one schedule:
  /// a call of at most their sum epochs syncs after every batch) and its largest skip.
  TORCH_ARG(int64_t, daso_warmup_epochs) = 4;
  TORCH_ARG(int64_t, daso_cooldown_epochs) = 4;
  TORCH_ARG(int64_t, daso_max_global_skips) = 8;
};

struct InferOptions {
  TORCH_ARG(int, particles) = 4;
  /// Device lanes of the distribution (see PushOptions::devices).
  TORCH_ARG(int, devices) = 1;
  /// Particles resident per lane.
  TORCH_ARG(int, cache_size) = 16;
  TORCH_ARG(std::optional<int>, intra_op_threads) = std::nullopt;
  TORCH_ARG(Likelihood, likelihood) = Likelihood::gaussian;
  /// σ of the gaussian likelihood (in the units of the targets the model sees).
  TORCH_ARG(double, noise_std) = 1.0;
  /// σ_p of the Gaussian prior N(0, σ_p² I) on every parameter (but log γ).
  TORCH_ARG(double, prior_std) = 1.0;
  /// Gamma(a0, b0) prior on the noise precision γ of the learned_noise likelihood
  /// (Liu & Wang 2016: a0 = 1, b0 = 0.1).
  TORCH_ARG(double, noise_prior_shape) = 1.0;
  TORCH_ARG(double, noise_prior_rate) = 0.1;
  TORCH_ARG(int64_t, batch_size) = 128;
  TORCH_ARG(double, lr) = 1e-3;
  /// Optimizer of each particle; default Adam(lr).
  TORCH_ARG(OptimizerFactory, optimizer) = nullptr;
  TORCH_ARG(uint64_t, seed) = 0;
  TORCH_ARG(std::function<void(const Progress&)>, on_progress) = nullptr;
  /// Spans the ranks of this World (PushOptions::world). fit, predict, save and load are
  /// then collective: every rank calls them with the same data; each rank trains its own
  /// particles and every rank gets the same losses and predictions.
  TORCH_ARG(std::optional<dist::World>, world) = std::nullopt;
  /// Fused particles (push/bayes/fused.h): the particles of one lane train as stacked
  /// groups of at most cache_size, one batched forward/backward and optimizer step per
  /// minibatch for the whole group. Results equal unfused training up to float rounding.
  /// Models FusedStack cannot fuse (fusion_blocker) train unfused.
  TORCH_ARG(bool, fuse) = false;
  /// Data parallelism over the ranks of a World, instead of spreading the particles over
  /// them (not with world()): every rank holds every particle and trains it on its share
  /// of each epoch's rows (a rank's batches are batch_size rows: the effective batch is
  /// batch_size x ranks), kept equal as the mode says. Every epoch ends with one set of
  /// parameters on every rank, so predict() needs no communication; fit() is collective
  /// and losses() are the ranks' mean (on_progress reports this rank's own). A loss that
  /// is not finite on any rank fails every rank at the end of that epoch. Particles train unfused. save() and
  /// load() are each rank's own (the replicas are equal: one rank saves). SVGD refuses it,
  /// and MultiSWAG takes only the blocking mode. See docs/data-parallel.md.
  TORCH_ARG(std::optional<DataParallelSpec>, data_parallel) = std::nullopt;
};

/// A predictive distribution on M points.
struct Predictive {
  Task task = Task::regression;
  /// Regression: [M, targets]. variance = aleatoric + epistemic (law of total variance
  /// over the members); aleatoric = the members' mean noise variance.
  torch::Tensor mean, variance, aleatoric;
  /// Classification: [M, classes], the members' mean softmax.
  torch::Tensor probs;
  /// Each member's prediction (regression means or class probabilities): [S, M, ·].
  torch::Tensor members;
};

class FusedStack;
namespace detail {
class Replica;
}

class Infer {
 public:
  virtual ~Infer();
  Infer(const Infer&) = delete;
  Infer& operator=(const Infer&) = delete;

  /// "ensemble", "mswag", "svgd", "mcdropout".
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
  const InferOptions& options() const { return options_; }
  /// The particle distribution (created on first use).
  Push& dist();
  /// Whether particles train fused: options().fuse() and a model FusedStack supports.
  bool fused();

 protected:
  Infer(ModuleFactory model, InferOptions options);

  /// The algorithm's handlers. Every particle also gets "predict"(x) -> [S, M, out],
  /// which calls predict_particle.
  virtual ParticleOptions particle_options() = 0;
  /// One epoch over (x, y). Default: "epoch"(x, y, epoch) on every particle of this
  /// rank, concurrently (the hooks below; a subclass whose particle_options() defines its
  /// own "epoch" keeps it, and trains unfused), or "fused_epoch" on every fused group.
  /// One epoch: the mean training loss of each particle this rank ran, by id (every
  /// particle without a world).
  virtual std::map<Pid, double> run_epoch(const torch::Tensor& x, const torch::Tensor& y, int64_t epoch);
  /// A particle's raw network outputs at x: [S, M, out]. Default: one forward pass.
  virtual torch::Tensor predict_particle(Particle& p, const torch::Tensor& x);

  /// Mean negative log-likelihood per point of network output `out` [B, o] for targets
  /// `y` [B, t]; with leading dimensions ([N, B, o] and [N, B, t]), one per leading index.
  torch::Tensor mean_nll(const torch::Tensor& out, const torch::Tensor& y) const;
  /// ||θ||² / (2 σ_p²) over the module's parameters; with learned_noise, plus
  /// -a0 log γ + b0 γ for log γ (the Gamma prior of γ, as a density of log γ).
  torch::Tensor neg_log_prior(torch::nn::Module& module) const;
  /// For each member of a fused stack, the learned-noise part of neg_log_prior: [N], or
  /// undefined without learned noise. The weights' part goes straight to the gradients:
  /// add_weight_prior_gradient.
  torch::Tensor noise_prior(const FusedStack& stack) const;
  /// Adds the gradient of (||θ||² / (2 σ_p²)) / divisor, θ every stacked weight, to the
  /// stacks' gradients, with the very float operations autograd performs for it unfused
  /// (so the result is the same bit for bit), at a fraction of the graph's cost.
  void add_weight_prior_gradient(FusedStack& stack, double divisor) const;

  // What an algorithm adds to an epoch of minibatch training, fused or not.
  /// Runs on each particle before its epoch (before its group is stacked).
  virtual void prepare_epoch(Particle& p, int64_t epoch) {}
  /// The rows of (x, y) particle p trains on this epoch; undefined: all of them.
  virtual torch::Tensor epoch_rows(Particle& p, int64_t n) const { return {}; }
  /// Unfused: the after_step and step callbacks of train_epoch for p.
  virtual void epoch_hooks(Particle& p, int64_t epoch, std::function<void()>& after_step,
                           std::function<void()>& step) {}
  /// Fused: the same for a group; `finish` runs after the stack is written back.
  virtual void fused_epoch_hooks(FusedStack& stack, const std::vector<Particle*>& members, int64_t epoch,
                                 std::function<void()>& after_step, std::function<void()>& step,
                                 std::function<void()>& finish) {}
  /// Runs on each particle after its epoch (written back when fused).
  virtual void finish_epoch(Particle& p, int64_t epoch) {}
  /// Why this algorithm cannot train data-parallel in `mode`; empty when it can.
  virtual std::string data_parallel_refusal(DataParallelMode mode) const { return {}; }

  /// The particles in fused groups: by rank and lane, at most cache_size each, in id
  /// order; this rank's only unless `every_rank`.
  std::vector<std::vector<Pid>> fused_groups(bool every_rank = false);
  /// Builds the stack of `members` (this lane's particles); throws when they cannot fuse.
  std::unique_ptr<FusedStack> make_stack(const std::vector<Particle*>& members) const;
  /// One epoch of sgd steps for a stacked group, each member on its own minibatches (the
  /// order train_epoch gives it, over its epoch_rows: `rows`, one per member, undefined
  /// for all of x); returns each member's mean nll per point.
  std::vector<double> train_epoch_fused(FusedStack& stack, const std::vector<Particle*>& members,
                                        const std::vector<torch::Tensor>& rows, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch,
                                        const std::function<void()>& after_step,
                                        const std::function<void()>& step) const;
  /// check_parameters_finite for every member of a stack.
  void check_parameters_finite(const FusedStack& stack, const std::vector<Particle*>& members, int64_t epoch) const;
  /// One optimizer step on U/N = mean_nll + neg_log_prior / N; returns mean_nll. `step`
  /// replaces the particle's optimizer step once the gradients are in place.
  double sgd_step(Particle& p, const torch::Tensor& x, const torch::Tensor& y, int64_t dataset_size,
                  const std::function<void()>& step = nullptr) const;
  /// One epoch of sgd_step over seeded minibatches of (x, y); after_step runs after
  /// every step. Returns the mean nll per point.
  double train_epoch(Particle& p, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch,
                     const std::function<void()>& after_step = nullptr,
                     const std::function<void()>& step = nullptr) const;
  /// Throws push::Error naming the algorithm, particle and epoch (0-based here, 1-based in
  /// the text, as progress reports count) when a training loss is NaN or infinite: a
  /// diverged run must stop, not go on to report NaN metrics.
  void check_finite(const Particle& p, int64_t epoch, double loss) const;
  /// The same for the particle's parameters (a last step can diverge after its loss).
  void check_parameters_finite(Particle& p, int64_t epoch) const;
  /// Minibatch index order of `particle` in `epoch` (seeded), over n rows.
  torch::Tensor epoch_order(Pid particle, int64_t epoch, int64_t n) const;
  /// A generator seeded by (options.seed, a, b, c).
  at::Generator generator(uint64_t a, uint64_t b = 0, uint64_t c = 0) const;
  /// Forward in chunks without autograd.
  static torch::Tensor forward_chunked(Particle& p, const torch::Tensor& x);
  /// Reports a particle's epoch loss to on_progress.
  void report(int64_t epoch, int64_t last_epoch, int64_t done, double running_loss) const;
  void write_meta(const std::filesystem::path& dir) const;
  void read_meta(const std::filesystem::path& dir, int64_t& epochs, std::vector<double>& losses) const;
  /// Destroys the distribution now (joining its handlers): a subclass whose handlers use
  /// its own members calls it from its destructor. Collective with a world.
  void close_distribution() { dist_.reset(); }
  /// With a world: every rank's values by particle id, or, when a rank failed, its error
  /// thrown on every rank (this rank's own first). Without one: `mine`, or `error` rethrown.
  std::map<Pid, c10::IValue> exchange(std::map<Pid, c10::IValue> mine, const std::exception_ptr& error,
                                      const char* origin);

  int64_t dataset_size_ = 0;
  int64_t fit_last_epoch_ = 0;

 private:
  void ensure_created();
  /// The "epoch" handler of the plain algorithms: one particle, or its fused group.
  c10::IValue epoch_of(Particle& p, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch);
  /// epoch_of after prepare_epoch: the mean nll per point.
  double epoch_body(Particle& p, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch);
  c10::IValue fused_epoch_of(Particle& p, const std::vector<Pid>& members, const torch::Tensor& x,
                             const torch::Tensor& y, int64_t epoch);

  /// data_parallel: the replica state of particle `pid` (nullptr without data parallelism).
  detail::Replica* replica(Pid pid) const;
  /// data_parallel: every particle's epoch loss averaged over the ranks.
  std::map<Pid, double> average_over_replicas(const std::map<Pid, double>& mine);
  ModuleFactory model_;
  OptimizerFactory optimizer_;  // the particles' (set when the distribution is built)
  std::map<Pid, std::unique_ptr<detail::Replica>> replicas_;  // data_parallel only
  std::optional<dist::CollectiveGroup> replica_group_;
  int64_t fit_calls_ = 0;
  bool fused_ = false;
  InferOptions options_;
  int64_t epochs_done_ = 0;
  std::vector<double> losses_;
  std::unique_ptr<Push> dist_;  // last: destroyed (handlers joined) before the rest
};

/// A regression / classification predictive distribution from raw member outputs
/// [S, M, out] under `likelihood` (noise_std for the gaussian one; learned_noise outputs
/// are [means, log γ] as the particles' forward returns them).
Predictive make_predictive(const torch::Tensor& outputs, Likelihood likelihood, double noise_std);

}  // namespace push::bayes
