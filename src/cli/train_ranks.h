#pragma once
// The processes push train trains on: this one alone, the N local ranks that --nproc starts
// (through push launch), or the ranks of a job a launcher started (push launch, torchrun
// --no-python, mpirun: their WORLD_SIZE, RANK, ...).
#include <push/dist.h>

#include <optional>

#include "train_config.h"

namespace push::cli {

struct TrainRanks {
  std::optional<dist::World> world;  // set with several ranks
  /// Rank 0, or the only process: it reports and writes. Every rank trains its own
  /// particles (or, data-parallel, its share of every particle's rows).
  bool lead() const { return !world || world->rank() == 0; }
  int size() const { return world ? world->size() : 1; }
};

/// --data-parallel and --ranks-per-node against the job's `ranks`: push::Error
/// "[push train] --data-parallel ..." when they do not fit.
void check_data_parallel(const TrainConfig& c, int ranks);
/// --nnodes, --node-rank, --master-addr and --master-port: push::Error naming what is
/// missing for a job over several hosts, or that they were given under a launcher (whose
/// variables say where the ranks are).
void check_nodes(const TrainConfig& c);
/// Whether this run starts its ranks itself: --nproc N > 1 or --nnodes M > 1 outside a job.
bool starts_its_ranks(const TrainConfig& c);
/// The job's ranks when this run starts them: --nproc x --nnodes.
inline int started_ranks(const TrainConfig& c) { return c.nproc * c.nnodes; }
/// Runs `push launch --nproc N [--nnodes M --node-rank K --master-addr A --master-port P] --
/// <this program> train ...` (the same arguments without those), so the ranks find each
/// other as under any launcher; returns its exit status.
int relaunch(int argc, char** argv, const TrainConfig& c);
/// Joins the job this process is a rank of (none: alone), after checking that --nproc and
/// the data-parallel options fit it. push::Error "[push train] ..." otherwise.
TrainRanks join_ranks(const TrainConfig& c);

}  // namespace push::cli
