#pragma once
// DASO (heat's DataParallelMultiGPU with its DASO optimizer; Coquelin et al., 2021):
// data parallelism in two levels. The ranks of a node average their gradients every batch
// (DataParallel over the node's ranks). Across nodes, the replicas sync their parameters
// only now and then, over one group per local index (local rank i of every node), and
// mostly without waiting: a sync started after one batch is received some batches later
// and blended into the parameters that went on training meanwhile.
//
//   push::parallel::Daso daso(*net, optimizer, world, push::parallel::DasoOptions(epochs)
//                                                       .ranks_per_node(2));
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     auto rows = push::parallel::shard(n, world.collective(), epoch);   // every rank's rows
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
#include <push/dist/collective.h>
#include <push/dist/world.h>

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace push::parallel {

struct DasoOptions {
  explicit DasoOptions(int64_t total_epochs) : total_epochs_(total_epochs) {}
  /// Epochs of the whole run: the cool-down is its last cooldown_epochs.
  TORCH_ARG(int64_t, total_epochs);
  TORCH_ARG(int64_t, warmup_epochs) = 4;
  TORCH_ARG(int64_t, cooldown_epochs) = 4;
  /// The most batches between the starts of two global syncs.
  TORCH_ARG(int64_t, max_global_skips) = 8;
  /// Relative improvement of the epoch loss below which it counts as not improving.
  TORCH_ARG(double, stability_level) = 0.05;
  /// Epochs without improvement tolerated before the loss counts as stable.
  TORCH_ARG(int64_t, stability_patience) = 2;
  /// global_skip is divided by this when the loss is stable.
  TORCH_ARG(int64_t, skip_reduction_factor) = 2;
  /// On a restart at max_global_skips, batches_to_wait = max_global_skips / this.
  TORCH_ARG(int64_t, local_skip_factor) = 4;
  /// Type the parameters travel in: kBFloat16, kHalf or kFloat.
  TORCH_ARG(torch::Dtype, downcast) = torch::kBFloat16;
  /// Ranks of one node (consecutive ranks); 0: LOCAL_WORLD_SIZE, or the whole world when
  /// that is unset. The world's size must be a multiple, with at least 2 nodes.
  TORCH_ARG(int, ranks_per_node) = 0;
  /// Gradient bucket size of the node-local averaging (DataParallelOptions).
  TORCH_ARG(int64_t, bucket_bytes) = int64_t{4} << 20;
  /// Average the node's gradients in step(), before the optimizer's step (one all_reduce
  /// of the flat gradient), instead of during backward through DataParallel's gradient
  /// hooks. For training inside particle handlers (fibers), where those hooks cannot wait.
  TORCH_ARG(bool, average_in_step) = false;
};

/// What one batch's step does across nodes.
struct DasoStep {
  /// Receive the sync started earlier and blend it in (before sending a new one).
  bool receive = false;
  /// Start a global sync of the parameters.
  bool send = false;
  /// ...and wait for it now: the average replaces the parameters.
  bool blocking = false;
  /// Batches until a non-blocking send is due to be received.
  int64_t wait = 0;
  /// With receive: batches since the received sync was sent (its blending weight).
  int64_t waited = 0;
};

/// heat's DASO schedule, without communication: which batches sync globally, and how.
class DasoSchedule {
 public:
  explicit DasoSchedule(DasoOptions options);
  /// Batches in each epoch (>= 1), from the next epoch on.
  void set_batches_per_epoch(int64_t batches);
  /// The current batch's step; moves on to the next batch (and epoch, after the last).
  DasoStep next();
  /// After an epoch's last batch: the loss averaged over the ranks sets the next epoch's
  /// global_skip and batches_to_wait (heat's epoch_loss_logic).
  void end_epoch(double mean_loss);

  int64_t epoch() const { return epoch_; }
  int64_t batch() const { return batch_; }
  /// 0: every batch syncs and waits (warm-up and cool-down).
  int64_t global_skip() const { return global_skip_; }
  int64_t batches_to_wait() const { return batches_to_wait_; }
  const DasoOptions& options() const { return options_; }

 private:
  DasoOptions options_;
  int64_t batches_ = 0, batch_ = 0, epoch_ = 0;
  int64_t global_skip_ = 0, batches_to_wait_ = 0;
  void start_cycling();
  bool epoch_ended_ = true;  // end_epoch is due once per epoch, after its last batch
  bool cycling_ = false;     // past the warm-up
  bool outstanding_ = false;
  int64_t sent_at_ = 0, receive_at_ = 0;
  // the plateau test
  double best_;
  int64_t bad_epochs_ = 0;
};

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

}  // namespace push::parallel
