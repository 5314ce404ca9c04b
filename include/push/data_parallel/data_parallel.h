#pragma once
// DataParallel: one replica of a module per rank of a CollectiveGroup, trained on each
// rank's shard of the data, with gradients averaged over the ranks during backward (heat's
// blocking DataParallel; what PyTorch's DistributedDataParallel does, which LibTorch's C++
// API lacks).
//
//   auto group = world.collective();
//   push::data_parallel::DataParallel dp(*net, group);        // rank 0's parameters everywhere
//   for (int64_t epoch = 0; ...) {
//     auto rows = push::data_parallel::shard(data.size(0), group, epoch);   // this rank's rows
//     for (batch of rows) {
//       optimizer.zero_grad();
//       loss_fn(net->forward(x[batch]), y[batch]).backward();  // gradients averaged here
//       optimizer.step();                                       // the same step on every rank
//     }
//   }
//
// Gradients are averaged in buckets of about `bucket_bytes`, in reverse parameter order
// (the order backward produces them): a gradient hook on each parameter copies its
// gradient into its bucket, and a full bucket's all_reduce starts at once, while backward
// goes on computing the layers below; the end of backward waits for every bucket and adds
// the averages to the gradients. Buckets start in one order on every rank (a bucket waits
// for those before it), so the collectives pair up whatever order the hooks fire in. A
// parameter that took no part in this backward counts as a zero gradient (every rank still
// reduces every bucket; such a parameter's gradient is then zero, not undefined as plain
// LibTorch leaves it). Gradients accumulate over several backward calls as in plain
// LibTorch, each call's contribution averaged. Every rank must run the same number of
// backward calls, each reaching at least one of the module's parameters (a rank whose loss
// touches none of them starts no reduction, and the others wait for it until the group's
// timeout); call backward from one thread at a time, outside particle handlers; no
// create_graph. A backward that fails on one rank fails the step on the others once their
// collectives time out; the next backward starts clean.
#include <push/dist/collective.h>

#include <torch/arg.h>
#include <torch/nn/module.h>

#include <memory>

namespace push::data_parallel {

struct DataParallelOptions {
  /// Target size of a gradient bucket (a parameter larger than this is a bucket alone).
  TORCH_ARG(int64_t, bucket_bytes) = int64_t{4} << 20;
};

class DataParallel {
 public:
  /// Broadcasts `module`'s parameters and buffers from the group's first rank and hooks
  /// its trainable parameters. Collective: every rank of `group` constructs it, with
  /// modules of one architecture. The module must outlive this object.
  DataParallel(torch::nn::Module& module, dist::CollectiveGroup group, DataParallelOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  /// Broadcasts the buffers (batch-norm statistics) from the group's first rank again.
  /// Collective.
  void broadcast_buffers();
  /// Buckets, and the parameters in each (reverse parameter order).
  const std::vector<std::vector<std::string>>& buckets() const;
  /// Backward passes whose gradients were averaged.
  int64_t reductions() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

/// This rank's rows of a data set of `n` rows for `epoch`: a permutation drawn from
/// (seed, epoch), the same on every rank (or 0..n-1 without shuffle), padded by repeating
/// its start to a multiple of the group size, then every size-th row from this rank's
/// position. Every rank gets ceil(n / size) rows.
torch::Tensor shard(int64_t n, const dist::CollectiveGroup& group, int64_t epoch, uint64_t seed = 0,
                    bool shuffle = true);

}  // namespace push::data_parallel
