// Building push train's algorithm from its configuration.
#include "train_infer.h"

#include <push/core/cores.h>

#include <algorithm>
#include <thread>

namespace push::cli {

void settle_devices(TrainConfig& c) {
  const int gpus = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  if (c.device_type == "cuda") {
#if PUSH_WITH_CUDA
    PUSH_CHECK(gpus > 0, "push train", "--devices cuda: this machine has no CUDA device that LibTorch can use");
#else
    PUSH_CHECK(false, "push train", "--devices cuda: push was built against LibTorch ", TORCH_VERSION,
               " without CUDA (./scripts/setup --libtorch wheel builds against the CUDA one)");
#endif
  }
  if (c.device_type.empty()) c.device_type = gpus > 0 ? "cuda" : "cpu";
  if (c.device_type == "cuda") {
    if (c.devices == 0) c.devices = gpus;
    PUSH_CHECK(c.devices <= gpus, "push train", "--devices cuda:", c.devices, ": this machine has ", gpus,
               " CUDA device", gpus == 1 ? "" : "s");
  } else if (c.devices == 0) {
    c.devices = default_cpu_lanes();
  }
}

int default_cpu_lanes() { return std::min(usable_cores(), 2); }

bayes::Likelihood likelihood_of(const TrainConfig& c, bool classify) {
  if (classify) return bayes::Likelihood::categorical;
  return c.likelihood.value_or(bayes::Likelihood::heteroscedastic);
}

namespace {
int64_t output_units(const TrainData& d, bayes::Likelihood likelihood) {
  return bayes::output_units(likelihood, d.classify() ? d.train.num_classes : d.train.y.size(1));
}
}  // namespace

ModuleFactory make_train_model(const TrainConfig& c, const bayes::ModelSpec& spec, const TrainData& d,
                               bayes::Likelihood likelihood) {
  auto model = bayes::make_model(spec, d.train.input_shape(), output_units(d, likelihood),
                                 c.algo == Algo::mcdropout ? c.dropout : 0.0);
  if (c.prior_scale == 0) return model;
  // The prior is deterministic: a network of the same spec without dropout.
  return bayes::with_randomized_prior(
      model, bayes::make_model(spec, d.train.input_shape(), output_units(d, likelihood)), c.prior_scale);
}

double train_model_parameters(const bayes::ModelSpec& spec, const TrainData& d, bayes::Likelihood likelihood) {
  return bayes::parameter_count(spec, d.train.input_shape(), output_units(d, likelihood));
}

bayes::InferOptions infer_options(const TrainConfig& c, const bayes::ModelSpec& spec, bayes::Likelihood likelihood,
                                  const std::optional<dist::World>& world) {
  const bool data_parallel = c.data_parallel.has_value();
  // Every particle resident: push train's sets are small, and a fused group is then a lane.
  auto distribution = PushOptions()
                          .devices(c.devices)
                          .device_type(c.device_type == "cuda" ? torch::kCUDA : torch::kCPU)
                          .intra_op_threads(c.threads)
                          .cache_size(std::max(1, (c.particles + c.devices - 1) / c.devices))
                          .seed(c.seed);
  if (!data_parallel) distribution.world(world);
  bayes::InferOptions options;
  options.particles(c.particles)
      .distribution(distribution)
      .likelihood(likelihood)
      .noise_std(c.noise_std)
      .prior_std(c.prior_std)
      .batch_size(c.batch_size)
      .lr(c.lr)
      .cosine_epochs(c.lr_schedule == LrSchedule::constant ? 0
                     : c.algo == Algo::mswag               ? c.pretrain_epochs
                                                           : c.epochs)
      .fuse(!data_parallel && c.fuse.value_or(spec.kind != "cnn"));
  if (data_parallel) {
    options.data_parallel(bayes::DataParallelSpec(*world, *c.data_parallel)
                              .daso(data_parallel::DasoOptions(1).ranks_per_node(c.ranks_per_node)));
  }
  return options;
}

bayes::SGMCMCOptions sgmcmc_options(const TrainConfig& c) {
  return bayes::SGMCMCOptions()
      .method(c.algo == Algo::sghmc ? bayes::SGMCMCMethod::sghmc : bayes::SGMCMCMethod::sgld)
      .step_size(c.lr)
      .friction(c.friction)
      .preconditioned(c.preconditioned.value_or(false))  // false but for sgld (match_checkpoint)
      .cycle_epochs(c.cycles > 0 ? (c.epochs + c.cycles - 1) / c.cycles : 0)
      .burn_in_epochs(std::max<int64_t>(c.burn_in, 0))
      .thin(std::max<int64_t>(c.thin, 1))
      .samples(c.samples);
}

TrainAlgorithm make_infer(const TrainConfig& c, ModuleFactory model, bayes::InferOptions options) {
  switch (c.algo) {
    case Algo::ensemble:
      return {std::make_unique<bayes::Ensemble>(model, options, bayes::EnsembleOptions().bootstrap(c.bootstrap)), {}};
    case Algo::mswag: {
      auto s = bayes::SWAGOptions()
                   .pretrain_epochs(c.pretrain_epochs)
                   .rank(c.rank)
                   .samples(c.samples)
                   .collect_every_steps(c.collect_every);
      if (c.swag_lr > 0) s.swag_lr(c.swag_lr);
      return {std::make_unique<bayes::MultiSWAG>(model, options, s), {}};
    }
    case Algo::svgd: {
      auto s = bayes::SVGDOptions();
      if (c.bandwidth > 0) s.bandwidth(c.bandwidth);
      return {std::make_unique<bayes::SVGD>(model, options, s), {}};
    }
    case Algo::sgld:
    case Algo::sghmc:
      return {std::make_unique<bayes::SGMCMC>(model, options, sgmcmc_options(c)), {}};
    case Algo::laplace: {
      auto l =
          bayes::LaplaceOptions().structure(c.laplace_structure).predictive(c.laplace_predictive).samples(c.samples);
      if (c.laplace_prior_precision > 0) l.prior_precision(c.laplace_prior_precision);
      auto laplace =
          std::make_unique<bayes::Laplace>(model, options, l, bayes::EnsembleOptions().bootstrap(c.bootstrap));
      auto* made = laplace.get();
      return {std::move(laplace), [made](const data::Dataset& train) { made->approximate(train); }};
    }
    case Algo::mcdropout:
      return {std::make_unique<bayes::MCDropout>(model, options, bayes::McDropoutOptions().samples(c.samples)), {}};
  }
  throw Error(c10::str("[push train] --algo ", static_cast<int>(c.algo), " has no builder"));
}

}  // namespace push::cli
