#pragma once
// DASO (heat's DataParallelMultiGPU with its DASO optimizer; Coquelin et al., 2021):
// data parallelism in two levels. The ranks of a node average their gradients every batch
// (DataParallel over the node's ranks). Across nodes, the replicas sync their parameters
// only now and then, over one group per local index (local rank i of every node), and
// mostly without waiting: a sync started after one batch is received some batches later
// and blended into the parameters that went on training meanwhile.
//
//   push::data_parallel::Daso daso(*net, optimizer, world, push::data_parallel::DasoOptions(epochs)
//                                                       .ranks_per_node(2));
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     auto rows = push::data_parallel::shard(n, world.collective(), epoch);   // every rank's rows
//     daso.set_batches_per_epoch(batches);                               // the same on every rank
//     for (each batch) {
//       optimizer.zero_grad();
//       loss.backward();        // averaged over the node's ranks
//       daso.step();            // optimizer.step(), then this batch's global sync (if any)
//     }
//     daso.end_epoch(epoch_loss);   // averaged over every rank; sets the next epoch's schedule
//   }
//
// The schedule (DasoSchedule, heat's): warm-up epochs sync globally after every batch and
// wait for it; then syncs start every `global_skip` batches and are received
// `batches_to_wait` batches later; when the epoch loss stops improving (by more than
// stability_level, for more than stability_patience epochs), global_skip and
// batches_to_wait shrink, and from 1 they start again at max_global_skips; cool-down epochs
// sync after every batch again. The last batch of every epoch syncs and waits, so every
// epoch ends with one set of parameters on every rank. Unlike heat's: a late sync is
// received exactly batches_to_wait batches after it was sent (or when the next one is
// sent, if that comes first; heat re-derives the batch from a wait clipped at the epoch's
// end and can miss it), warmup_epochs(0) starts cycling at once (heat's stays blocking),
// and neither global_skip nor batches_to_wait shrinks to 0 while cycling.
// A global sync sends the parameters cast to `downcast` (bfloat16 by default), gathers them
// from every node and sums them in float32 (heat sums in the downcast type, and casts only
// blocking syncs). Received at once, the average replaces the parameters; received late, the
// sum S of n nodes' stale parameters is blended: p <- (k p + S) / (k + n), k = 2 x the
// batches it waited (heat's weights). The receiving ranks then broadcast the result to their
// node. Every call is collective: every rank calls step() and end_epoch() equally often.
#include <push/data_parallel/daso_schedule.h>
#include <push/dist/collective.h>
#include <push/dist/world.h>

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace push::data_parallel {

/// The groups one Daso communicates over. make() is collective over every rank of the
/// world; several Daso objects that may run at once (one per particle) each need their own.
struct DasoGroups {
  /// `ranks_per_node` as DasoOptions::ranks_per_node (0: LOCAL_WORLD_SIZE, else the world).
  static DasoGroups make(const dist::World& world, int ranks_per_node);
  /// What ranks_per_node `asked` means in a world of `world_size` ranks: itself when
  /// positive, else LOCAL_WORLD_SIZE (an error when that is no positive integer), else the
  /// world. Not checked against the world's size (make() does that).
  static int resolve_ranks_per_node(int asked, int world_size);
  int ranks_per_node = 1, nodes = 1, node = 0, local_rank = 0;
  dist::CollectiveGroup everyone;
  std::optional<dist::CollectiveGroup> node_group;  // unset with one rank per node
  dist::CollectiveGroup global;                     // local rank `local_rank` of every node
};

class Daso {
 public:
  /// Collective over every rank of `world`. Broadcasts rank 0's parameters and buffers,
  /// then hooks `module` for node-local gradient averaging. `optimizer` steps `module`'s
  /// parameters; both must outlive this object.
  Daso(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const dist::World& world, DasoOptions options);
  /// The same over groups made beforehand (options.ranks_per_node() is then theirs).
  Daso(torch::nn::Module& module, torch::optim::Optimizer& optimizer, DasoGroups groups, DasoOptions options);
  ~Daso();
  Daso(const Daso&) = delete;
  Daso& operator=(const Daso&) = delete;

  /// Batches in each epoch from the next epoch on; the same on every rank.
  void set_batches_per_epoch(int64_t batches);
  /// After backward: the optimizer's step, then this batch's global sync.
  void step();
  /// The same with `apply` in place of optimizer.step() (a custom update of the parameters).
  void step(const std::function<void()>& apply);
  /// After the epoch's last step, with this rank's epoch loss.
  void end_epoch(double loss);

  const DasoSchedule& schedule() const;
  int nodes() const;
  int node() const;
  int local_rank() const;
  /// Global syncs started and received so far (every rank counts its node's).
  int64_t syncs_sent() const;
  int64_t syncs_received() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace push::data_parallel
