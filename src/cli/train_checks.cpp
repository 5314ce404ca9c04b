// Checks of a push train run before it trains: options that apply, memory, threads.
#include "train_checks.h"

#include "core/host_memory.h"

#include "train_infer.h"

#include <push/bayes/laplace.h>
#include <push/core/cores.h>
#include <push/core/errors.h>

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace push::cli {
namespace {

/// What one particle costs beyond its parameters' copies (its module, optimizer and
/// record objects, the allocator's share): with push train's default MLP (4,418
/// parameters, fused) on sine-gap, RSS grew by 171 KB per particle from 1,000 to 10,000
/// particles (one epoch), of which 4 copies x 4,418 x 4 bytes are 71 KB.
constexpr uint64_t kParticleOverheadBytes = 100 << 10;
/// What one push train process costs before any particle (LibTorch, its allocator and
/// thread pools, the data): a whole run of one particle peaked at 176 MiB of RSS on
/// sine-gap and on Boston (/usr/bin/time -f %M, Debian's LibTorch 1.13).
constexpr uint64_t kRankOverheadBytes = uint64_t{160} << 20;
/// The buffer OpenBLAS maps for each thread that calls it (its BUFFER_SIZE, 128 MiB in
/// Debian's build: a lane's thread asked for 134,221,824 bytes under gdb).
constexpr uint64_t kBlasBufferBytes = uint64_t{128} << 20;
/// Room for a run's working tensors, fibers and the data beyond what is mapped at the check:
/// the default job hung under ulimit -v 1100000 and trained under 1200000 (KiB).
constexpr double kWorkingBytes = 160.0 * (1 << 20);

std::string gib(double bytes) { return c10::str(bytes / (1 << 30), " GiB"); }

}  // namespace

void check_options_apply(const TrainConfig& c) {
  for (const auto& [option, algos] : algo_options()) {
    if (!c.given.count(option) || std::find(algos.begin(), algos.end(), c.algo) != algos.end()) continue;
    throw Error(c10::str("[push train] ", option, " is for --algo ", names_of(algos, /*with_or=*/true), ", not ",
                         to_string(c.algo), " (it would be ignored)"));
  }
  PUSH_CHECK(!c.given.count("--samples") || c.algo != Algo::laplace ||
                 c.laplace_predictive == bayes::LaplacePredictive::sampling,
             "push train", "--samples is for --laplace-predictive sampling (it would be ignored)");
  PUSH_CHECK(c.algo != Algo::laplace || c.likelihood != bayes::Likelihood::learned_noise, "push train",
             "--algo laplace does not take --likelihood learned-noise");
  PUSH_CHECK(c.algo != Algo::laplace || c.prior_scale == 0, "push train",
             "--algo laplace does not take --prior-scale (the last-layer Laplace needs the network's own last layer, "
             "not one summed with a prior network's)");
  PUSH_CHECK(!c.given.count("--noise-std") || c.likelihood == bayes::Likelihood::gaussian, "push train",
             "--noise-std is for --likelihood gaussian (it would be ignored)");
  PUSH_CHECK(!c.allow_data_change || !c.resume.empty(), "push train",
             "--allow-data-change is for --resume (it would be ignored)");
  PUSH_CHECK(!c.given.count("--pretrain-epochs") || c.pretrain_epochs < c.epochs, "push train", "--pretrain-epochs ",
             c.pretrain_epochs, " leaves none of the ", c.epochs,
             " epochs (--epochs) for collecting: MultiSWAG would be an ensemble");
}

namespace {

/// The epochs in [0, end) that keep samples when their cycle of `length` epochs keeps from
/// its epoch `first` on (every epoch without cycles): counted, not enumerated.
int64_t sampling_epochs_before(int64_t end, int64_t length, int64_t first) {
  if (length == 0) return end;
  return end / length * (length - first) + std::max<int64_t>(0, end % length - first);
}

}  // namespace

void settle_chains(TrainConfig& c, int64_t train_rows) {
  if (!is_sgmcmc(c.algo) || c.epochs == 0) return;  // no epoch to train: nothing to sample
  PUSH_CHECK(c.cycles <= c.epochs, "push train", "--cycles ", c.cycles, " is more than the ", c.epochs,
             " epochs (--epochs): a cycle takes an epoch at least");
  PUSH_CHECK(c.burn_in < c.epochs, "push train", "--burn-in ", c.burn_in, " leaves none of the ", c.epochs,
             " epochs (--epochs) for sampling");
  // The steps that keep samples over the whole run (counting resumed epochs): with cycles,
  // each cycle samples from its first epoch whose position plan() counts as sampling.
  const auto plan = sgmcmc_options(c);
  const int64_t length = plan.cycle_epochs();
  int64_t first = 0;
  if (length > 0) {
    first = static_cast<int64_t>(std::ceil(plan.exploration() * static_cast<double>(length)));
    while (first > 0 && bayes::SGMCMC::plan(plan, first - 1).noisy) --first;
    while (first < length && !bayes::SGMCMC::plan(plan, first).noisy) ++first;
  }
  const int64_t sampling_epochs =
      sampling_epochs_before(c.epochs, length, first) - sampling_epochs_before(c.burn_in, length, first);
  const int64_t batches = (train_rows + c.batch_size - 1) / c.batch_size;
  const int64_t steps = sampling_epochs * batches;
  PUSH_CHECK(steps > 0, "push train", "no epoch of the ", c.epochs, " (--epochs) keeps samples: --cycles ", c.cycles,
             " leaves each cycle's first half to exploring, and --burn-in ", c.burn_in, " the first epochs");
  if (c.thin == 0) c.thin = std::max<int64_t>(1, (steps + c.samples - 1) / c.samples);
  PUSH_CHECK(c.thin <= steps, "push train", "--thin ", c.thin, " is more than the ", steps,
             " steps that keep samples (", sampling_epochs, " sampling epochs x ", batches,
             " steps): no sample would be kept");
}

void check_collection(const TrainConfig& c, int64_t train_rows) {
  if (c.algo != Algo::mswag || c.collect_every == 0 || c.epochs == 0) return;
  const int64_t collecting = c.epochs - std::max<int64_t>(c.pretrain_epochs, 0);
  const int64_t batches = (train_rows + c.batch_size - 1) / c.batch_size;
  PUSH_CHECK(c.collect_every <= collecting * batches, "push train", "--collect-every ", c.collect_every,
             " is more than the ", collecting * batches, " steps of the collecting epochs (", collecting, " epochs x ",
             batches, " steps): MultiSWAG would collect nothing and be an ensemble");
}

double particle_bytes(const TrainConfig& c, double parameters, int ranks, int64_t last_layer) {
  // Copies of the parameters per particle: weights, gradients and Adam's two moments;
  // MultiSWAG adds its mean, its mean of squares and --rank deviation columns.
  double copies = 4;
  if (c.algo == Algo::mswag) copies += 2 + static_cast<double>(c.rank);
  if (c.prior_scale > 0) copies += 1;  // the frozen prior network
  // SG-MCMC keeps --samples copies on the host and a momentum or preconditioner.
  if (is_sgmcmc(c.algo)) copies += 1 + static_cast<double>(c.samples);
  double per_particle = parameters * 4 * copies + static_cast<double>(kParticleOverheadBytes);
  // The particles are spread over the ranks, unless each rank trains them all.
  const int64_t here = !c.data_parallel ? (c.particles + ranks - 1) / ranks : c.particles;
  // laplace: each particle keeps its last layer's posterior; each lane fits one at a time.
  double fitting = 0;
  if (c.algo == Algo::laplace) {
    const auto laplace = bayes::laplace_bytes(last_layer, c.laplace_structure);
    per_particle += laplace.kept;
    fitting = laplace.fitting * static_cast<double>(std::min<int64_t>(c.devices, here));
  }
  return per_particle * static_cast<double>(here) + fitting;
}

void check_memory(const TrainConfig& c, double parameters, int ranks, int ranks_on_host, int64_t last_layer) {
  // Ranks of one host share its memory: count what all of this host's ranks need. On GPU
  // lanes the particles live in device memory, which this does not check.
  if (c.device_type == "cuda") return;
  const double particles = particle_bytes(c, parameters, ranks, last_layer) * ranks_on_host;
  const double processes = static_cast<double>(kRankOverheadBytes) * ranks_on_host;
  const double need = particles + processes;
  check_address_space(c, particles / ranks_on_host);
  const double available = static_cast<double>(push::detail::available_memory_bytes());
  if (need <= available) return;
  // The advice names what takes most of it: the ranks themselves, SG-MCMC's kept samples
  // (a copy of every particle's parameters each), or the particles.
  const int64_t here = !c.data_parallel ? (c.particles + ranks - 1) / ranks : c.particles;
  const double samples =
      is_sgmcmc(c.algo) ? parameters * 4 * static_cast<double>(c.samples) * static_cast<double>(here) * ranks_on_host
                        : 0;
  std::string advice = "use fewer particles or a smaller --model";
  if (c.algo == Algo::laplace && c.laplace_structure == bayes::LaplaceStructure::full)
    advice += " (or --laplace-structure diagonal)";
  if (samples > need / 2) {
    advice = "use fewer --samples (each keeps a copy of every particle's parameters: " + gib(samples) + " in all)";
  } else if (processes > need / 2) {
    advice = "start fewer ranks on this host (--nproc " + std::to_string(ranks_on_host) + ": each needs about " +
             gib(static_cast<double>(kRankOverheadBytes)) + " for itself)";
  }
  throw Error(c10::str("[push train] ", ranks_on_host > 1 ? c10::str(ranks_on_host, " ranks with ") : std::string(),
                       "--particles ", c.particles, " of ", static_cast<uint64_t>(std::min(parameters, 1e19)),
                       " parameters need about ", gib(need), " of memory to train, more than the ", gib(available),
                       " available here: ", advice));
}

namespace {

/// This process's mapped address space now (VmSize of /proc/self/status), in bytes.
uint64_t mapped_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string key; status >> key;) {
    uint64_t kib = 0;
    if (key == "VmSize:" && status >> kib) return kib * 1024;
    status.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return 0;
}

}  // namespace

void check_address_space(const TrainConfig& c, double particles_here) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
  // What training maps beyond what is mapped now: OpenBLAS's buffer of every thread that
  // calls it (it retries a failed allocation forever: a hang, not an error), the
  // particles, and room for LibTorch's working tensors.
  // Before settle_devices (the early check), 0 lanes means the default; every lane counted
  // as a CPU lane, whose thread calls OpenBLAS.
  const int lanes = c.devices > 0 ? c.devices : default_cpu_lanes();
  const double blas = static_cast<double>(kBlasBufferBytes) * static_cast<double>(lanes * std::max(1, c.threads));
  const double need = static_cast<double>(mapped_bytes()) + blas + particles_here + kWorkingBytes;
  const double have = static_cast<double>(limit.rlim_cur);
  PUSH_CHECK(need <= have, "push train", "the address-space limit (ulimit -v ", limit.rlim_cur / 1024,
             ") is below the about ", static_cast<uint64_t>(need / 1024), " KiB this run maps (", gib(blas),
             " of it BLAS buffers for ", lanes * std::max(1, c.threads),
             " threads): raise ulimit -v, or use fewer --devices or --threads");
}

void check_stack() {
  constexpr rlim_t kNeeded = 512 << 10;
  rlimit limit{};
  if (::getrlimit(RLIMIT_STACK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
  PUSH_CHECK(limit.rlim_cur >= kNeeded, "push train", "the stack size limit (ulimit -s ", limit.rlim_cur / 1024,
             ") is below the ", kNeeded / 1024,
             " KiB training's threads need (each thread's stack is that size): raise it (ulimit -s 8192 is the usual "
             "default)");
}

void warn_about_threads(const TrainConfig& c) {
  const int cores = usable_cores();
  const int64_t threads = static_cast<int64_t>(c.threads) * c.devices;
  if (c.device_type == "cpu" && threads > cores) {
    std::cerr << "push train: warning: --threads " << c.threads << " on " << c.devices << " lanes starts " << threads
              << " threads on " << cores << " cores; they will slow each other down\n";
  }
}

}  // namespace push::cli
