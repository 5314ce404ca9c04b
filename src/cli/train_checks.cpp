// Checks of a push train run before it trains: options that apply, memory, threads.
#include "train_checks.h"

#include <push/core/errors.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>
#include <thread>

namespace push::cli {
namespace {

/// What one particle costs beyond its parameters' copies (its module, optimizer and
/// record objects, the allocator's share): with push train's default MLP (4,418
/// parameters, fused) on sine-gap, RSS grew by 171 KB per particle from 1,000 to 10,000
/// particles (one epoch), of which 4 copies x 4,418 x 4 bytes are 71 KB.
constexpr uint64_t kParticleOverheadBytes = 100 << 10;

/// The algorithms an algorithm-specific option applies to.
struct OptionScope {
  const char* option;
  const char* algos;  // space-separated
};

constexpr OptionScope kScopes[] = {
    {"--bootstrap", "ensemble"},      {"--bandwidth", "svgd"},    {"--rank", "mswag"},
    {"--pretrain-epochs", "mswag"},   {"--swag-lr", "mswag"},     {"--collect-every", "mswag"},
    {"--samples", "mswag mcdropout"}, {"--dropout", "mcdropout"},
};

/// The bytes of host memory this process may still use: the kernel's MemAvailable, or
/// less when a cgroup (a container, a Slurm job) caps it.
uint64_t available_bytes() {
  uint64_t available = std::numeric_limits<uint64_t>::max();
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    uint64_t kib = 0;
    if (key == "MemAvailable:" && meminfo >> kib) available = kib * 1024;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  uint64_t limit = 0, current = 0;
  std::ifstream max_file("/sys/fs/cgroup/memory.max"), current_file("/sys/fs/cgroup/memory.current");
  if (max_file >> limit && current_file >> current && limit > current) available = std::min(available, limit - current);
  return available;
}

std::string gib(uint64_t bytes) { return c10::str(static_cast<double>(bytes) / (1 << 30), " GiB"); }

}  // namespace

void check_options_apply(const TrainConfig& c) {
  for (const auto& scope : kScopes) {
    const std::string algos = std::string(" ") + scope.algos + " ";
    if (!c.given.count(scope.option) || algos.find(" " + c.algo + " ") != std::string::npos) continue;
    std::string named = scope.algos;
    if (const auto space = named.find(' '); space != std::string::npos) named.replace(space, 1, " or ");
    throw Error(
        c10::str("[push train] ", scope.option, " is for --algo ", named, ", not ", c.algo, " (it would be ignored)"));
  }
  PUSH_CHECK(!c.given.count("--noise-std") || c.likelihood == "gaussian", "push train",
             "--noise-std is for --likelihood gaussian (it would be ignored)");
}

uint64_t particle_bytes(const TrainConfig& c, int64_t parameters, int ranks) {
  // Copies of the parameters per particle: weights, gradients and Adam's two moments;
  // MultiSWAG adds its mean, its mean of squares and --rank deviation columns.
  int64_t copies = 4;
  if (c.algo == "mswag") copies += 2 + c.rank;
  const uint64_t per_particle = static_cast<uint64_t>(parameters) * 4 * copies + kParticleOverheadBytes;
  // The particles are spread over the ranks, unless each rank trains them all.
  const int64_t here = c.data_parallel.empty() ? (c.particles + ranks - 1) / ranks : c.particles;
  return per_particle * static_cast<uint64_t>(here);
}

void check_memory(const TrainConfig& c, const ModuleFactory& model, int ranks, int ranks_on_host) {
  int64_t parameters = 0;
  for (const auto& p : model().ptr()->parameters()) parameters += p.numel();
  const uint64_t need = particle_bytes(c, parameters, ranks);
  // Ranks of one host share its memory: count what all of this host's ranks need.
  const uint64_t host_need = need * static_cast<uint64_t>(ranks_on_host);
  const uint64_t available = available_bytes();
  PUSH_CHECK(host_need <= available, "push train", "--particles ", c.particles, " of ", parameters,
             " parameters need about ", gib(host_need), " of memory to train, more than the ", gib(available),
             " available: use fewer particles or a smaller --model");
}

void warn_about_threads(const TrainConfig& c) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int64_t threads = static_cast<int64_t>(c.threads) * c.devices;
  if (c.device_type == "cpu" && threads > cores) {
    std::cerr << "push train: warning: --threads " << c.threads << " on " << c.devices << " lanes starts " << threads
              << " threads on " << cores << " cores; they will slow each other down\n";
  }
}

}  // namespace push::cli
