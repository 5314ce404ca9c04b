#pragma once
// DASO's schedule (heat's DASO, Coquelin et al., 2021), without communication: which
// batches sync globally across nodes, when a sync is received, and how the skips shrink
// when the loss stops improving. Daso (daso.h) follows it; it is tested on its own.
//
//   push::data_parallel::DasoSchedule schedule(push::data_parallel::DasoOptions(epochs));
//   schedule.set_batches_per_epoch(batches);
//   for (each batch) { push::data_parallel::DasoStep step = schedule.next(); /* ... */ }
//   schedule.end_epoch(mean_loss);
#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>

namespace push::data_parallel {

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

}  // namespace push::data_parallel
