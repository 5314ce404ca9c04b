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
// Writing an algorithm: subclass Infer and define Algorithm's members (algorithm.h): its
// particles' handlers and what it adds to an epoch of minibatch training. The training
// loop itself is Infer's; the algorithm calls its services through training().
//
// Seeds. Initialisation, shuffling, bootstrap, dropout masks and posterior samples all
// come from generators seeded by (seed, particle id, epoch / purpose), so a run is
// reproducible whatever the number of lanes and the scheduling.
// Thread-safety: an Infer object is used from one thread at a time.
#include <push/bayes/algorithm.h>
#include <push/bayes/objective.h>
#include <push/bayes/options.h>
#include <push/bayes/predictive.h>
#include <push/data/dataset.h>
#include <push/runtime/push.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace push::bayes {

/// One particle's training losses (mean nll per point of an epoch) as fit() saw them:
/// its best epoch and its last. Kept across save/load.
struct ParticleLosses {
  double best = 0;         // the lowest epoch loss
  int64_t best_epoch = 0;  // that epoch, counted from 1
  double last = 0;         // the latest epoch's loss
  int64_t last_epoch = 0;  // counted from 1
};

class Infer : private Algorithm {
 public:
  ~Infer() override;
  Infer(const Infer&) = delete;
  Infer& operator=(const Infer&) = delete;

  /// "ensemble", "mswag", "svgd", "mcdropout", "sgld", "sghmc", "laplace".
  using Algorithm::name;

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
  const InferOptions& options() const;
  const Objective& objective() const;
  /// The particle distribution (created on first use).
  Push& distribution();
  /// Whether particles train fused: options().fuse() and a model FusedStack supports.
  bool fused();

 protected:
  Infer(ModuleFactory model, InferOptions options);

  /// The training loop's services (algorithm.h).
  const Training& training() const { return training_; }
  /// Destroys the distribution now (joining its handlers): a subclass whose handlers use
  /// its own members calls it from its destructor. Collective with a world.
  void close_distribution();

  // Infer's defaults of two of Algorithm's members (algorithm.h).
  torch::Tensor predict_particle(Particle& p, const torch::Tensor& x) override;
  std::map<Pid, double> run_epoch(const torch::Tensor& x, const torch::Tensor& y, int64_t epoch) override;

 private:
  void ensure_created();
  /// The particles of a new distribution: their handlers, the training loop, data parallelism.
  void create_particles();
  void write_meta(const std::filesystem::path& dir) const;
  void read_meta(const std::filesystem::path& dir, int64_t& epochs, std::vector<double>& losses,
                 std::map<Pid, ParticleLosses>& particle_losses) const;

  ModuleFactory model_;
  std::unique_ptr<detail::TrainingState> state_;  // what the loop and its services share
  Training training_;
  int64_t epochs_done_ = 0;
  std::vector<double> losses_;
  std::map<Pid, ParticleLosses> particle_losses_;
  std::unique_ptr<Push> dist_;  // last: destroyed (handlers joined) before the rest
};

}  // namespace push::bayes
