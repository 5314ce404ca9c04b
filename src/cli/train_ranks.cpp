// Starting, joining and checking the ranks of a push train run.
#include "train_ranks.h"

#include <sys/resource.h>

#include <push/data_parallel/daso.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "command.h"
#include "launch_nodes.h"

namespace push::cli {
void check_data_parallel(const TrainConfig& c, int ranks) {
  const bool is_data_parallel = c.data_parallel.has_value();
  const char* mode = is_data_parallel ? bayes::to_string(*c.data_parallel) : "";
  PUSH_CHECK(!is_data_parallel || ranks >= 2, "push train", "--data-parallel ", mode,
             " needs several ranks: add --nproc N (N >= 2), or start push train under a launcher");
  PUSH_CHECK(c.ranks_per_node == 0 || c.data_parallel == bayes::DataParallelMode::daso, "push train",
             "--ranks-per-node is for --data-parallel daso");
  PUSH_CHECK(!is_data_parallel || !is_sgmcmc(c.algo), "push train", "--data-parallel does not train --algo ",
             to_string(c.algo),
             " (each chain's noise and samples are its own); without --data-parallel the ranks share the chains");
  PUSH_CHECK(!is_data_parallel || c.algo != Algo::svgd, "push train",
             "--data-parallel does not train svgd (its update couples the particles); without --data-parallel the "
             "ranks share the particles");
  PUSH_CHECK(!is_data_parallel || c.algo != Algo::mswag || c.data_parallel == bayes::DataParallelMode::blocking,
             "push train",
             "--algo mswag trains data-parallel only with --data-parallel blocking (it collects every step's "
             "parameters, which differ between the ranks in ",
             mode, " mode)");
  PUSH_CHECK(!is_data_parallel || !c.fuse.value_or(false), "push train",
             "--fuse does not combine with --data-parallel (data-parallel particles train unfused)");
  if (c.data_parallel == bayes::DataParallelMode::daso) {
    const bool own_nodes = !dist::WorldOptions::launched_world_size() && c.nnodes > 1;  // --nnodes: --nproc each
    const int per_node = data_parallel::DasoGroups::resolve_ranks_per_node(c.ranks_per_node > 0 ? c.ranks_per_node
                                                                           : own_nodes          ? c.nproc
                                                                                                : 0,
                                                                           ranks);
    const char* source =
        c.ranks_per_node > 0                              ? ""
        : own_nodes                                       ? " (--nproc on each of --nnodes hosts)"
        : !dist::WorldOptions::launched_world_size()      ? " (all of them: --nproc starts them on one machine)"
        : dist::WorldOptions::launched_local_world_size() ? " (the launcher's ranks per node)"
                                                          : " (all of them: LOCAL_WORLD_SIZE is unset)";
    PUSH_CHECK(ranks % per_node == 0 && ranks / per_node >= 2, "push train",
               "--data-parallel daso needs at least 2 nodes of equal size: ", ranks, " ranks with ", per_node,
               " ranks per node", source, " do not make them; set --ranks-per-node (e.g. ", std::max(1, ranks / 2),
               ") to simulate nodes on one machine");
  }
}

namespace {

/// The options that say where push train's own ranks run: push launch's, passed on to it.
constexpr const char* kLaunchOptions[] = {"--nproc", "--nnodes", "--node-rank", "--master-addr", "--master-port"};

}  // namespace

void check_nodes(const TrainConfig& c) {
  // A launcher's variables, checked before anything reads them (RANK=-1 made a bad_alloc,
  // WORLD_SIZE=-5 an open-files estimate of -28).
  const auto size = dist::WorldOptions::launched_world_size();
  const auto rank = dist::WorldOptions::launched_rank();
  PUSH_CHECK(!size || (*size >= 1 && *size <= 65536), "push train", "WORLD_SIZE ", size.value_or(0),
             " is not a number of ranks (1 to 65536): start push train under its launcher, or unset it");
  PUSH_CHECK(!rank || (*rank >= 0 && *rank < size.value_or(1)), "push train", "RANK ", rank.value_or(0),
             size ? c10::str(" is not a rank of WORLD_SIZE ", *size, " (0 to ", *size - 1, ")")
                  : std::string(" is set without WORLD_SIZE"),
             ": start push train under its launcher, or unset it");
  const bool launched = size.has_value();
  for (const char* option : kLaunchOptions) {
    if (std::string(option) == "--nproc" || !c.given.count(option)) continue;
    PUSH_CHECK(!launched, "push train", option,
               " is for a job push train starts itself; under a launcher, its variables (WORLD_SIZE, RANK, "
               "MASTER_ADDR, MASTER_PORT) say where the ranks are");
  }
  if (c.nnodes == 1) {
    for (const char* option : {"--master-addr", "--master-port"}) {
      PUSH_CHECK(!c.given.count(option), "push train", option,
                 " is for --nnodes M > 1 (one host picks its own store address)");
    }
  }
  const auto why = nodes_refusal(c.nnodes, c.node_rank, c.master_addr, c.master_port);
  PUSH_CHECK(why.empty(), "push train", why);
  if (c.nproc > 1 || c.nnodes > 1 || launched) {
    const auto secret = secret_refusal();
    PUSH_CHECK(secret.empty(), "push train", secret);
    // Each rank holds connections to the others and to the store (rank 0 hosts it): with
    // too few files a rank failed deep inside Gloo or the store with internal logging.
    // Measured: 2, 4 and 8 ranks needed 33-48, 65-72 and 97-120 open files a rank.
    const int64_t world = launched ? *dist::WorldOptions::launched_world_size() : int64_t{c.nproc} * c.nnodes;
    const int64_t need = 32 + 12 * world;
    rlimit files{};
    PUSH_CHECK(::getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur == RLIM_INFINITY ||
                   files.rlim_cur >= static_cast<rlim_t>(need),
               "push train", "the open-files limit (ulimit -n ", files.rlim_cur, ") is below the about ", need,
               " a job of ", world,
               " ranks needs in each (connections to the other ranks and the store): raise it, "
               "e.g. ulimit -n ",
               std::max<int64_t>(1024, need));
  }
}

bool starts_its_ranks(const TrainConfig& c) {
  return (c.nproc > 1 || c.nnodes > 1) && !dist::WorldOptions::launched_world_size().has_value();
}

int relaunch(int argc, char** argv, const TrainConfig& c) {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  PUSH_CHECK(!ec, "push train", "cannot find this program to start its ranks: ", ec.message());
  std::vector<std::string> args = {"launch", "--nproc", std::to_string(c.nproc)};
  if (c.nnodes > 1) {
    args.insert(args.end(), {"--nnodes", std::to_string(c.nnodes), "--node-rank", std::to_string(c.node_rank),
                             "--master-addr", c.master_addr, "--master-port", std::to_string(c.master_port)});
  }
  args.insert(args.end(), {"--", self.string(), "train"});
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    bool launch_option = false;
    for (const std::string option : kLaunchOptions) {
      if (a == option) {
        ++i;  // its value
        launch_option = true;
      }
      launch_option = launch_option || a.rfind(option + "=", 0) == 0;
    }
    if (!launch_option) args.push_back(a);
  }
  std::vector<char*> pointers;
  for (auto& a : args) pointers.push_back(a.data());
  pointers.push_back(nullptr);
  return commands().at("launch").run(static_cast<int>(args.size()), pointers.data());
}

TrainRanks join_ranks(const TrainConfig& c) {
  TrainRanks ranks;
  // Started by a launcher: push launch or torchrun (WORLD_SIZE), mpirun (OMPI_COMM_WORLD_SIZE)
  // or srun (SLURM_NTASKS).
  const std::optional<int> world_size = dist::WorldOptions::launched_world_size();
  if (world_size) {
    PUSH_CHECK(c.nproc == 1 || c.nproc == *world_size, "push train", "--nproc ", c.nproc, " differs from the job's ",
               *world_size, " ranks (the launcher's WORLD_SIZE, OMPI_COMM_WORLD_SIZE or SLURM_NTASKS)");
  }
  if (world_size && *world_size > 1) ranks.world.emplace(dist::World::from_env());
  check_data_parallel(c, ranks.size());
  return ranks;
}

}  // namespace push::cli
