#pragma once
// The options of push's Bayesian algorithms (push::bayes::Infer and its subclasses): the
// likelihood and prior of the objective, the training loop, the distribution the
// particles live in (push::PushOptions, composed, with its own defaults), and data
// parallelism over the ranks of a World.
//
//   auto options = push::bayes::InferOptions()
//       .particles(8).likelihood(push::bayes::Likelihood::heteroscedastic).lr(1e-2)
//       .distribution(push::PushOptions().devices(2).seed(1));
#include <push/data_parallel/daso_schedule.h>
#include <push/dist/world.h>
#include <push/runtime/options.h>

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace push::bayes {

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
  // Making the particles (before the first fit or load): particles_done of particles
  // made so far; the other fields are 0.
  bool creating = false;
  int64_t epoch = 0;       // epochs done by this Infer, this one included
  int64_t last_epoch = 0;  // the epoch this fit() call stops after
  int64_t particles_done = 0, particles = 0;
  double loss = 0;  // running mean training loss (mean nll per point) this epoch
};

/// How the ranks of InferOptions::data_parallel share each particle's training.
enum class DataParallelMode {
  blocking,     // gradients averaged over the ranks before every step
  nonblocking,  // local steps; the averaged parameters are applied before the next forward
  daso,         // DASO (push/data_parallel/daso.h): node-local gradients, global syncs on a schedule
};
const char* to_string(DataParallelMode mode);
/// Throws push::Error naming the choices for anything but blocking, nonblocking or daso.
DataParallelMode parse_data_parallel_mode(const std::string& text);

struct DataParallelSpec {
  DataParallelSpec(dist::World world, DataParallelMode mode) : world_(std::move(world)), mode_(mode) {}
  TORCH_ARG(dist::World, world);
  TORCH_ARG(DataParallelMode, mode);
  /// daso: DASO's options (ranks per node, the schedule's warm-up, cool-down and largest
  /// skip, ...). Each fit() call is one schedule: its total_epochs is the call's epochs (a
  /// call of at most warm-up + cool-down epochs syncs after every batch), and the node's
  /// gradients are averaged in step() (average_in_step), as particle handlers need.
  TORCH_ARG(data_parallel::DasoOptions, daso) = data_parallel::DasoOptions(1);
};

struct InferOptions {
  TORCH_ARG(int, particles) = 4;
  /// The distribution the particles live in: its lanes, cache, intra-op threads, seed
  /// (also the seed of every shuffle, bootstrap, mask and sample, see Infer) and World.
  /// With distribution().world(), the particles are spread over the ranks: fit, predict,
  /// save and load are collective (every rank calls them with the same data; each trains
  /// its own particles and every rank gets the same losses and predictions). The cache
  /// size also bounds a fused group (fuse()).
  TORCH_ARG(PushOptions, distribution) = {};
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
  /// T > 0: before each epoch e (counted from this Infer's first, loaded ones included) every
  /// particle's learning rate is set to lr₀ (1 + cos(π e / T)) / 2, a half cosine from the
  /// optimizer's own lr₀ to 0 over T epochs (SGDR without restarts, Loshchilov & Hutter
  /// 2017); epochs after the T-th train at lr 0 (MultiSWAG's collection keeps its own rate).
  /// The members of a constant-rate ensemble keep moving by about one step's size to the
  /// end: near the data that jitter, not the data, sets their disagreement (docs/bayes.md).
  /// 0: the rate stays as the optimizer was made.
  TORCH_ARG(int64_t, cosine_epochs) = 0;
  /// Optimizer of each particle; default Adam(lr).
  TORCH_ARG(OptimizerFactory, optimizer) = nullptr;
  TORCH_ARG(std::function<void(const Progress&)>, on_progress) = nullptr;
  /// Fused particles (push/bayes/fused.h): the particles of one lane train as stacked
  /// groups of at most the cache size, one batched forward/backward and optimizer step per
  /// minibatch for the whole group. Results equal unfused training up to float rounding.
  /// Models FusedStack cannot fuse (fusion_blocker) train unfused.
  TORCH_ARG(bool, fuse) = false;
  /// Data parallelism over the ranks of a World, instead of spreading the particles over
  /// them (not with distribution().world()): every rank holds every particle and trains it
  /// on its share of each epoch's rows (a rank's batches are batch_size rows: the effective
  /// batch is batch_size x ranks), kept equal as the mode says. Every epoch ends with one
  /// set of parameters on every rank, so predict() needs no communication; fit() is
  /// collective and losses() are the ranks' mean (on_progress reports this rank's own). A
  /// loss that is not finite on any rank fails every rank at the end of that epoch.
  /// Particles train unfused. save() and load() are each rank's own (the replicas are
  /// equal: one rank saves). SVGD refuses it, and MultiSWAG takes only the blocking mode.
  /// See docs/data-parallel.md.
  TORCH_ARG(std::optional<DataParallelSpec>, data_parallel) = std::nullopt;
};

}  // namespace push::bayes
