#pragma once
// The settings of one `push train` run, filled by its command line (train_command_line.h).
// What the line leaves to the machine, the data or the checkpoint (--devices, --task,
// --likelihood, --pretrain-epochs) is settled before training, in place.
#include <push/bayes/laplace.h>
#include <push/bayes/options.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "train_algorithms.h"

namespace push::cli {

struct TrainConfig {
  Algo algo = Algo::ensemble;
  std::string model = "mlp:64,64", data = "sine-gap", target, task;
  // Unset: categorical for classification, else heteroscedastic (settled by load_train_data).
  std::optional<bayes::Likelihood> likelihood;
  std::string out = "push-out", save, resume;
  // cosine (over --epochs; mswag: its pretraining) or constant; unset: cosine (mswag:
  // constant), or when resuming the checkpoint's (train_resume.h).
  std::optional<LrSchedule> lr_schedule;
  int particles = 8, devices = 0, threads = 1;  // devices 0: every GPU, else 2 CPU lanes
  std::string device_type;                      // --devices cpu|cuda[:N]; empty: GPUs if any
  int nproc = 1;  // local ranks push train starts itself (not part of identity: any count resumes)
  // Hosts of a job push train starts itself (--nnodes, this one's --node-rank, node 0's
  // --master-addr and a --master-port): push launch's, passed on. Not part of identity.
  int nnodes = 1, node_rank = 0, master_port = 0;
  std::string master_addr;
  int64_t epochs = 150, batch_size = 64, samples = 20, rank = 10, pretrain_epochs = -1, limit = 0, collect_every = 0;
  double lr = 1e-2, swag_lr = 0, test_fraction = 0.2, dropout = 0.1, noise_std = 1.0, prior_std = 1.0, bandwidth = 0;
  uint64_t seed = 0;
  bool bootstrap = false, quiet = false;
  // --fuse / --no-fuse; unset: fuse MLPs, not the CNN (fused convolutions measured slower
  // on CPU). Not part of identity: fused and unfused runs resume each other.
  std::optional<bool> fuse;
  // --data-parallel blocking|nonblocking|daso: every rank trains every particle on its share
  // of the rows (empty: the particles are spread over the ranks). Not part of identity.
  std::optional<bayes::DataParallelMode> data_parallel;
  int ranks_per_node = 0;  // daso: 0 = LOCAL_WORLD_SIZE
  // The options given on the command line (by their long names, "--bootstrap"): an option
  // that does not apply to the run is refused only when given.
  std::set<std::string> given;
  // The CRC-32C of the data as trained (train_data.h); --resume refuses another unless
  // --allow-data-change.
  std::string data_fingerprint;
  bool allow_data_change = false;
  // --strict: a member that trained badly (train_warnings.h) fails the run instead of warning.
  bool strict = false;
  // sgld / sghmc (bayes/sgmcmc.h): SGHMC's friction, pSGLD, cycles of the step size over
  // --epochs (0: constant), burn-in epochs (-1: half of --epochs, none with cycles; when
  // resuming, the checkpoint's) and one sample kept in `thin` steps (0: --samples spread
  // over the sampling steps; train_checks.h settles it, not part of identity).
  // laplace: the last layer's covariance (full, diagonal) and the predictive (linearized,
  // sampling with --samples).
  bayes::LaplaceStructure laplace_structure = bayes::LaplaceStructure::full;
  bayes::LaplacePredictive laplace_predictive = bayes::LaplacePredictive::linearized;
  double laplace_prior_precision = 0;  // 0: the marginal likelihood's
  double friction = 0.1;
  // --prior-scale β > 0: each particle adds β times a frozen prior network's output
  // (bayes/randomized_prior.h).
  double prior_scale = 0;
  // sgld: pSGLD; unset until the checkpoint is matched (--preconditioned or
  // --no-preconditioned; else the checkpoint's, else pSGLD).
  std::optional<bool> preconditioned;
  int64_t cycles = 0, burn_in = -1, thin = 0;

  /// The settings a checkpoint depends on (--resume must match them all). The total
  /// --epochs is not one of them: a resumed run continues to a new total.
  nlohmann::ordered_json identity() const {
    return {{"algo", to_string(algo)},
            {"model", model},
            {"data", data},
            {"target", target},
            {"task", task},
            {"likelihood", likelihood ? bayes::to_string(*likelihood) : ""},
            {"particles", particles},
            {"batch_size", batch_size},
            {"lr", lr},
            {"lr_schedule", lr_schedule ? to_string(*lr_schedule) : ""},
            {"test_fraction", test_fraction},
            {"seed", seed},
            {"limit", limit},
            {"dropout", algo == Algo::mcdropout ? dropout : 0.0},
            {"rank", algo == Algo::mswag ? rank : 0},
            {"pretrain_epochs", algo == Algo::mswag ? pretrain_epochs : 0},
            {"swag_lr", algo == Algo::mswag ? swag_lr : 0.0},
            {"collect_every", algo == Algo::mswag ? collect_every : 0},
            {"friction", algo == Algo::sghmc ? friction : 0.0},
            {"laplace_structure", algo == Algo::laplace ? bayes::to_string(laplace_structure) : ""},
            {"laplace_predictive", algo == Algo::laplace ? bayes::to_string(laplace_predictive) : ""},
            {"laplace_prior_precision", algo == Algo::laplace ? laplace_prior_precision : 0.0},
            {"preconditioned", algo == Algo::sgld && preconditioned.value_or(false)},
            {"cycles", is_sgmcmc(algo) ? cycles : 0},
            {"samples", is_sgmcmc(algo) ? samples : 0},
            {"burn_in", is_sgmcmc(algo) ? burn_in : 0},
            {"bootstrap", bootstrap},
            {"bandwidth", bandwidth},
            {"noise_std", noise_std},
            {"prior_std", prior_std},
            {"prior_scale", prior_scale},
            {"data_fingerprint", data_fingerprint}};
  }
};

}  // namespace push::cli
