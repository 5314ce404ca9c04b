#pragma once
// The algorithm push train runs: --algo over the --model networks, with the options of its
// distribution (particles, lanes, threads, cache, seed, ranks) and of its training.
#include <push/bayes.h>

#include <functional>
#include <memory>
#include <optional>

#include "train_config.h"
#include "train_data.h"

namespace push::cli {

/// Settles --devices: the device type (cuda when the machine has a GPU, else cpu) and the
/// lane count (every GPU; 2 CPU lanes, 1 on a one-core machine). --devices cuda where there
/// is no usable GPU, or more GPUs than there are, is a push::Error.
void settle_devices(TrainConfig& c);
/// The CPU lanes of a run that names none: 2, or 1 where this thread may run on one core.
int default_cpu_lanes();

/// The likelihood --likelihood names (settled by load_train_data; categorical when `classify`).
bayes::Likelihood likelihood_of(const TrainConfig& c, bool classify);

/// The networks: --model from the data's inputs to the units `likelihood` needs (with
/// --dropout for mcdropout).
ModuleFactory make_train_model(const TrainConfig& c, const bayes::ModelSpec& spec, const TrainData& d,
                               bayes::Likelihood likelihood);

/// The parameters of one of those networks, counted without building one.
double train_model_parameters(const bayes::ModelSpec& spec, const TrainData& d, bayes::Likelihood likelihood);

/// The options of the run's distribution and training. `world`: the job's ranks, shared
/// by the particles or, with --data-parallel, by every particle's rows.
bayes::InferOptions infer_options(const TrainConfig& c, const bayes::ModelSpec& spec, bayes::Likelihood likelihood,
                                  const std::optional<dist::World>& world);

/// sgld / sghmc: the chains' options (--lr the step size, --friction, --preconditioned,
/// --cycles over --epochs, --burn-in, --thin, --samples).
bayes::SGMCMCOptions sgmcmc_options(const TrainConfig& c);

/// What a run trains, and what follows its training: laplace's last-layer posteriors on the
/// training set (collective), nothing for the others.
struct TrainAlgorithm {
  std::unique_ptr<bayes::Infer> infer;
  std::function<void(const data::Dataset& train)> after_fit;
};

/// --algo with its own options (--bootstrap, --rank, --bandwidth, ...).
TrainAlgorithm make_infer(const TrainConfig& c, ModuleFactory model, bayes::InferOptions options);

}  // namespace push::cli
