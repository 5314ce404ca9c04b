#pragma once
// CollectiveGroup: collectives and tagged point-to-point transfers over a set of ranks.
//
//   auto group = world.new_group({0, 2, 3});        // called by ranks 0, 2 and 3 only
//   auto t = torch::full({4}, world.rank() + 1.0);
//   group.all_reduce(t);                             // blocking, default timeout
//   auto w = group.all_reduce_async(t, ReduceOp::max);
//   w.wait(std::chrono::seconds(5));                 // push::Error after 5 s
//   auto x = torch::empty({4});
//   int from = group.recv(x);                        // any source; returns its global rank
//
// Ranks in this API (src, dst, the answer of recv) are *global* ranks; list arguments
// (all_gather, gather, scatter) are ordered like ranks(). Every member must call each
// collective, in the same order. CPU tensors travel over Gloo; CUDA tensors need a build
// with PUSH_WITH_NCCL (see docs/distributed.md). Complex tensors travel as their real and
// imaginary parts: sum and average reduce them, min, max and product refuse them. The group
// is thread-safe, but collectives issued from several threads must still reach every member
// in the same order.
#include <torch/arg.h>
#include <torch/types.h>

#include <push/dist/world.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace push::dist {

/// Element-wise reductions. `average` divides the sum by the group size (floating
/// tensors only): Gloo has no average of its own.
enum class ReduceOp { sum, product, min, max, average };

struct CollectiveGroupOptions {
  /// Default timeout of this group's calls; unset: the world's timeout.
  TORCH_ARG(std::optional<Milliseconds>, timeout) = std::nullopt;
  /// Distinguishes several groups over the same ranks; empty: "<ranks>#<n>", n counting
  /// the groups this process created over that rank set.
  TORCH_ARG(std::string, name) = "";
};

namespace detail {
struct GroupState;
struct WorkFactory;
}  // namespace detail

/// The handle of an asynchronous call. wait() rethrows the call's failure as a
/// push::Error naming the call; a handle that was waited on can be waited on again.
class Work {
 public:
  Work() = default;
  /// Blocks until done, at most the group's timeout.
  void wait() const;
  /// Blocks at most `timeout`; throws push::Error when it runs out.
  void wait(Milliseconds timeout) const;
  bool is_completed() const;
  /// The global rank the data came from (recv/irecv); -1 for other calls.
  int source_rank() const;

  struct State;  // opaque: defined in src/dist/work.h

 private:
  friend struct detail::WorkFactory;
  std::shared_ptr<State> state_;
};

class CollectiveGroup {
 public:
  CollectiveGroup() = default;

  /// Global ranks of the members, ascending.
  const std::vector<int>& ranks() const;
  int size() const;
  /// This process's index in ranks().
  int group_rank() const;
  bool contains(int global_rank) const;
  const World& world() const;

  void all_reduce(torch::Tensor& tensor, ReduceOp op = ReduceOp::sum) const;
  Work all_reduce_async(torch::Tensor& tensor, ReduceOp op = ReduceOp::sum) const;
  /// `output` receives one tensor per member, ordered like ranks(); sized for you.
  void all_gather(std::vector<torch::Tensor>& output, const torch::Tensor& input) const;
  Work all_gather_async(std::vector<torch::Tensor>& output, const torch::Tensor& input) const;
  void broadcast(torch::Tensor& tensor, int src) const;
  Work broadcast_async(torch::Tensor& tensor, int src) const;
  /// Only `dst` gets `output` filled (one tensor per member); others may pass anything.
  void gather(const torch::Tensor& input, std::vector<torch::Tensor>& output, int dst) const;
  Work gather_async(const torch::Tensor& input, std::vector<torch::Tensor>& output, int dst) const;
  /// `input` (one tensor per member, ordered like ranks()) is read on `src` only.
  void scatter(torch::Tensor& output, const std::vector<torch::Tensor>& input, int src) const;
  Work scatter_async(torch::Tensor& output, const std::vector<torch::Tensor>& input, int src) const;
  /// The reduction lands in `tensor` on `dst`.
  void reduce(torch::Tensor& tensor, int dst, ReduceOp op = ReduceOp::sum) const;
  Work reduce_async(torch::Tensor& tensor, int dst, ReduceOp op = ReduceOp::sum) const;
  void barrier() const;
  Work barrier_async() const;

  /// Tagged point-to-point transfers (tag >= 0). A recv matches a send with the same
  /// tag from the same source; sends to one destination with one tag arrive in order.
  void send(const torch::Tensor& tensor, int dst, int tag = 0) const;
  Work isend(const torch::Tensor& tensor, int dst, int tag = 0) const;
  /// Receives into `tensor` from `src`, or from any member when src is unset; returns
  /// the sender's global rank.
  int recv(torch::Tensor& tensor, std::optional<int> src = std::nullopt, int tag = 0) const;
  Work irecv(torch::Tensor& tensor, std::optional<int> src = std::nullopt, int tag = 0) const;

  Milliseconds timeout() const;

 private:
  friend class World;
  explicit CollectiveGroup(std::shared_ptr<detail::GroupState> state) : state_(std::move(state)) {}
  detail::GroupState& check(const char* origin) const;
  std::shared_ptr<detail::GroupState> state_;
};

}  // namespace push::dist
