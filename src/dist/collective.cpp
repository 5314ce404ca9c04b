// CollectiveGroup over c10d's ProcessGroupGloo (and ProcessGroupNCCL for CUDA tensors in
// builds with PUSH_WITH_NCCL). Ranks cross the API as global ranks.
#include "c10d.h"

#include "core/torch_compat.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "blocking_waits.h"
#include "core/fiber.h"

#if PUSH_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace push::dist {

struct Work::State {
  c10::intrusive_ptr<c10d::Work> work;
  std::string origin;
  Milliseconds timeout{0};
  std::function<void()> on_success;     // runs once, after the data arrived
  std::function<int(int)> source;       // group rank of the sender -> global rank
  int fixed_source = -1;
  std::mutex mutex;
  bool finished = false;
  std::exception_ptr error;
  int source_rank = -1;
};

namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::average:
      return c10d::ReduceOp::SUM;
    case ReduceOp::product:
      return c10d::ReduceOp::PRODUCT;
    case ReduceOp::min:
      return c10d::ReduceOp::MIN;
    case ReduceOp::max:
      return c10d::ReduceOp::MAX;
  }
  throw Error("[push::dist] unknown ReduceOp");
}

/// Checks the tensor and runs `call(backend)` on the backend for its device.
template <class Call>
c10::intrusive_ptr<c10d::Work> on_backend(detail::GroupState& s, const torch::Tensor& tensor,
                                          const std::string& origin, Call&& call) {
  PUSH_CHECK(tensor.defined(), origin, "the tensor is undefined");
  PUSH_CHECK(tensor.is_contiguous(), origin, "the tensor must be contiguous (call .contiguous())");
  if (tensor.is_cuda()) {
#if PUSH_WITH_NCCL
    {
      std::lock_guard<std::mutex> lock(s.nccl_mutex);
      if (!s.nccl) s.nccl = push::compat::make_nccl_group(s.world, s.nccl_prefix, s.ranks, s.timeout);
    }
    try {
      return call(s.nccl);
    } catch (const std::exception&) {
      throw Error(c10::str("[", origin, "] ", detail::current_message()));
    }
#else
    throw Error(c10::str("[", origin, "] got a CUDA tensor, but push was built without NCCL "
                         "(configure with -DPUSH_WITH_NCCL=ON against a CUDA LibTorch)"));
#endif
  }
  PUSH_CHECK(tensor.device().is_cpu(), origin, "tensors must be on the CPU (Gloo), got ",
             tensor.device());
  try {
    return call(s.gloo);
  } catch (const std::exception&) {
    throw Error(c10::str("[", origin, "] ", detail::current_message()));
  }
}

std::string op_name(const char* fn) { return c10::str("push::dist::CollectiveGroup::", fn); }

/// In a fiber (a particle's or an RPC handler), waits for `work` without blocking the
/// thread, which runs the other fibers of its loop: the fiber suspends until c10d's future
/// of the work completes. False when `timeout` passed first, or when the work has no
/// future (Gloo's send/recv; see BlockingWaits).
bool wait_for_future(const c10::intrusive_ptr<c10d::Work>& work, Milliseconds timeout, bool& has_future) {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  try {
    future = work->getFuture();
  } catch (const std::exception&) {
    // Not implemented for this kind of work.
  }
  has_future = static_cast<bool>(future);
  if (!future) return false;
  auto done = std::make_shared<Promise<bool>>();
  auto f = done->future();
  future->addCallback([done](c10::ivalue::Future&) { done->set_value(true); });
  return f.wait_for(timeout);
}

/// Waits for the work, blocking this thread (at most `timeout`), then records its source
/// and runs its completion step. Once per work: later calls return at once.
void finish(Work::State& s, Milliseconds timeout);

}  // namespace

void Work::wait() const {
  PUSH_CHECK(state_, "push::dist::Work::wait", "this work handle is empty");
  wait(state_->timeout);
}

void Work::wait(Milliseconds timeout) const {
  PUSH_CHECK(state_, "push::dist::Work::wait", "this work handle is empty");
  auto& s = *state_;
  if (push::detail::Fiber::current() != nullptr) {
    // Never block the lane, and never hold the mutex across a suspension: another fiber
    // of this thread may want it.
    bool finished;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      finished = s.finished;
    }
    if (!finished) {
      bool has_future = false;
      const bool done = wait_for_future(s.work, timeout, has_future);
      if (!has_future) {
        detail::BlockingWaits::instance().run([state = state_, timeout] { finish(*state, timeout); }).wait();
      } else if (!done) {
        std::lock_guard<std::mutex> lock(s.mutex);
        if (!s.finished) {
          s.error = std::make_exception_ptr(Error(c10::str(
              "[", s.origin, "] failed or timed out (waited up to ", timeout.count(), " ms)")));
          s.finished = true;
        }
      }
    }
  }
  finish(s, timeout);
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.error) std::rethrow_exception(s.error);
}

namespace {
void finish(Work::State& s, Milliseconds timeout) {
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.finished) return;
  try {
    // c10d reads 0 ms as "no timeout": never hand it a 0.
    s.work->wait(std::max(timeout, Milliseconds(1)));
#if defined(PUSH_TSAN)
    // Gloo's worker drops its reference to the work (and the work's tensors) after waking
    // us, in code ThreadSanitizer cannot see. Were that the last reference, the tensors
    // would be freed there, unordered (for TSan) with our reads: wait until ours is the
    // only one left (briefly; bounded).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (s.work.use_count() > 1 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
#endif
    if (s.source) s.source_rank = s.source(s.work->sourceRank());
    else s.source_rank = s.fixed_source;
    if (s.on_success) s.on_success();
  } catch (const std::exception&) {
    s.error = std::make_exception_ptr(Error(c10::str(
        "[", s.origin, "] failed or timed out (waited up to ", timeout.count(),
        " ms): ", detail::current_message())));
  }
  s.finished = true;
}
}  // namespace

bool Work::is_completed() const {
  if (!state_) return false;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->finished || state_->work->isCompleted();
}

int Work::source_rank() const {
  PUSH_CHECK(state_, "push::dist::Work::source_rank", "this work handle is empty");
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->source_rank;
}

detail::GroupState& CollectiveGroup::check(const char* origin) const {
  PUSH_CHECK(state_, "push::dist::CollectiveGroup::", origin,
             "this group is empty (default-constructed)");
  return *state_;
}

const std::vector<int>& CollectiveGroup::ranks() const { return check("ranks").ranks; }
int CollectiveGroup::size() const { return static_cast<int>(check("size").ranks.size()); }
int CollectiveGroup::group_rank() const { return check("group_rank").group_rank; }
const World& CollectiveGroup::world() const { return check("world").world; }
Milliseconds CollectiveGroup::timeout() const { return check("timeout").timeout; }
bool CollectiveGroup::contains(int global_rank) const {
  auto& r = check("contains").ranks;
  return std::binary_search(r.begin(), r.end(), global_rank);
}

namespace {

int to_group_rank(const detail::GroupState& s, int global_rank, const std::string& origin) {
  auto it = std::lower_bound(s.ranks.begin(), s.ranks.end(), global_rank);
  PUSH_CHECK(it != s.ranks.end() && *it == global_rank, origin, "rank ", global_rank,
             " is not a member of this group (members: ", c10::Join(", ", s.ranks), ")");
  return static_cast<int>(it - s.ranks.begin());
}


}  // namespace

// Work's state is private: this one function builds handles for the group.
struct WorkFactory {
  static Work make(c10::intrusive_ptr<c10d::Work> work, std::string origin, Milliseconds timeout,
                   std::function<void()> on_success = nullptr, int fixed_source = -1,
                   std::function<int(int)> source = nullptr) {
    Work w;
    w.state_ = std::make_shared<Work::State>();
    w.state_->work = std::move(work);
    w.state_->origin = std::move(origin);
    w.state_->timeout = timeout;
    w.state_->on_success = std::move(on_success);
    w.state_->fixed_source = fixed_source;
    w.state_->source = std::move(source);
    return w;
  }
};

Work CollectiveGroup::all_reduce_async(torch::Tensor& tensor, ReduceOp op) const {
  const auto origin = op_name("all_reduce");
  auto& s = check("all_reduce");
  PUSH_CHECK(op != ReduceOp::average || tensor.is_floating_point() || tensor.is_complex(), origin,
             "average needs a floating-point tensor, got ", tensor.scalar_type());
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = s.timeout;
  std::vector<at::Tensor> tensors{tensor};
  auto work = on_backend(s, tensor, origin, [&](auto& pg) { return pg->allreduce(tensors, o); });
  std::function<void()> done;
  if (op == ReduceOp::average) {
    done = [tensor, n = s.ranks.size()]() mutable { tensor.div_(static_cast<double>(n)); };
  }
  return WorkFactory::make(std::move(work), origin, s.timeout, std::move(done));
}

void CollectiveGroup::all_reduce(torch::Tensor& tensor, ReduceOp op) const {
  all_reduce_async(tensor, op).wait();
}

Work CollectiveGroup::all_gather_async(std::vector<torch::Tensor>& output,
                                       const torch::Tensor& input) const {
  const auto origin = op_name("all_gather");
  auto& s = check("all_gather");
  PUSH_CHECK(input.defined(), origin, "the input tensor is undefined");
  output.clear();
  for (size_t i = 0; i < s.ranks.size(); ++i) output.push_back(torch::empty_like(input));
  std::vector<std::vector<at::Tensor>> outputs{output};
  std::vector<at::Tensor> inputs{input};
  auto work = on_backend(s, input, origin, [&](auto& pg) {
    c10d::AllgatherOptions o;
    o.timeout = s.timeout;
    return pg->allgather(outputs, inputs, o);
  });
  return WorkFactory::make(std::move(work), origin, s.timeout);
}

void CollectiveGroup::all_gather(std::vector<torch::Tensor>& output, const torch::Tensor& input) const {
  all_gather_async(output, input).wait();
}

Work CollectiveGroup::broadcast_async(torch::Tensor& tensor, int src) const {
  const auto origin = op_name("broadcast");
  auto& s = check("broadcast");
  c10d::BroadcastOptions o;
  o.rootRank = to_group_rank(s, src, origin);
  o.timeout = s.timeout;
  std::vector<at::Tensor> tensors{tensor};
  auto work = on_backend(s, tensor, origin, [&](auto& pg) { return pg->broadcast(tensors, o); });
  return WorkFactory::make(std::move(work), origin, s.timeout);
}

void CollectiveGroup::broadcast(torch::Tensor& tensor, int src) const {
  broadcast_async(tensor, src).wait();
}

Work CollectiveGroup::gather_async(const torch::Tensor& input, std::vector<torch::Tensor>& output,
                                   int dst) const {
  const auto origin = op_name("gather");
  auto& s = check("gather");
  c10d::GatherOptions o;
  o.rootRank = to_group_rank(s, dst, origin);
  o.timeout = s.timeout;
  std::vector<std::vector<at::Tensor>> outputs;
  if (o.rootRank == s.group_rank) {
    output.clear();
    for (size_t i = 0; i < s.ranks.size(); ++i) output.push_back(torch::empty_like(input));
    outputs.push_back(output);
  }
  std::vector<at::Tensor> inputs{input};
  auto work = on_backend(s, input, origin, [&](auto& pg) { return pg->gather(outputs, inputs, o); });
  return WorkFactory::make(std::move(work), origin, s.timeout);
}

void CollectiveGroup::gather(const torch::Tensor& input, std::vector<torch::Tensor>& output,
                             int dst) const {
  gather_async(input, output, dst).wait();
}

Work CollectiveGroup::scatter_async(torch::Tensor& output, const std::vector<torch::Tensor>& input,
                                    int src) const {
  const auto origin = op_name("scatter");
  auto& s = check("scatter");
  c10d::ScatterOptions o;
  o.rootRank = to_group_rank(s, src, origin);
  o.timeout = s.timeout;
  std::vector<std::vector<at::Tensor>> inputs;
  if (o.rootRank == s.group_rank) {
    PUSH_CHECK(input.size() == s.ranks.size(), origin, "the source passes one tensor per member: ",
               s.ranks.size(), " expected, got ", input.size());
    inputs.emplace_back();
    for (const auto& t : input) inputs.back().push_back(t.contiguous());
  }
  std::vector<at::Tensor> outputs{output};
  auto work = on_backend(s, output, origin, [&](auto& pg) { return pg->scatter(outputs, inputs, o); });
  return WorkFactory::make(std::move(work), origin, s.timeout);
}

void CollectiveGroup::scatter(torch::Tensor& output, const std::vector<torch::Tensor>& input,
                              int src) const {
  scatter_async(output, input, src).wait();
}

Work CollectiveGroup::reduce_async(torch::Tensor& tensor, int dst, ReduceOp op) const {
  const auto origin = op_name("reduce");
  auto& s = check("reduce");
  PUSH_CHECK(op != ReduceOp::average || tensor.is_floating_point() || tensor.is_complex(), origin,
             "average needs a floating-point tensor, got ", tensor.scalar_type());
  c10d::ReduceOptions o;
  o.rootRank = to_group_rank(s, dst, origin);
  o.reduceOp = to_c10d(op);
  o.timeout = s.timeout;
  std::vector<at::Tensor> tensors{tensor};
  auto work = on_backend(s, tensor, origin, [&](auto& pg) { return pg->reduce(tensors, o); });
  std::function<void()> done;
  if (op == ReduceOp::average && o.rootRank == s.group_rank) {
    done = [tensor, n = s.ranks.size()]() mutable { tensor.div_(static_cast<double>(n)); };
  }
  return WorkFactory::make(std::move(work), origin, s.timeout, std::move(done));
}

void CollectiveGroup::reduce(torch::Tensor& tensor, int dst, ReduceOp op) const {
  reduce_async(tensor, dst, op).wait();
}

Work CollectiveGroup::barrier_async() const {
  const auto origin = op_name("barrier");
  auto& s = check("barrier");
  c10d::BarrierOptions o;
  o.timeout = s.timeout;
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = s.gloo->barrier(o);
  } catch (const std::exception&) {
    throw Error(c10::str("[", origin, "] ", detail::current_message()));
  }
  return WorkFactory::make(std::move(work), origin, s.timeout);
}

void CollectiveGroup::barrier() const { barrier_async().wait(); }

Work CollectiveGroup::isend(const torch::Tensor& tensor, int dst, int tag) const {
  const auto origin = op_name("isend");
  auto& s = check("isend");
  PUSH_CHECK(tag >= 0, origin, "tags are >= 0, got ", tag);
  const int to = to_group_rank(s, dst, origin);
  PUSH_CHECK(to != s.group_rank, origin, "rank ", dst, " cannot send to itself");
  std::vector<at::Tensor> tensors{tensor};
  auto work = on_backend(s, tensor, origin, [&](auto& pg) { return pg->send(tensors, to, tag); });
  return WorkFactory::make(std::move(work), origin, s.timeout);
}

void CollectiveGroup::send(const torch::Tensor& tensor, int dst, int tag) const {
  isend(tensor, dst, tag).wait();
}

Work CollectiveGroup::irecv(torch::Tensor& tensor, std::optional<int> src, int tag) const {
  const auto origin = op_name("irecv");
  auto& s = check("irecv");
  PUSH_CHECK(tag >= 0, origin, "tags are >= 0, got ", tag);
  std::vector<at::Tensor> tensors{tensor};
  if (src) {
    const int from = to_group_rank(s, *src, origin);
    PUSH_CHECK(from != s.group_rank, origin, "rank ", *src, " cannot receive from itself");
    auto work = on_backend(s, tensor, origin, [&](auto& pg) { return pg->recv(tensors, from, tag); });
    return WorkFactory::make(std::move(work), origin, s.timeout, nullptr, *src);
  }
  PUSH_CHECK(s.ranks.size() > 1, origin, "a group of one has nobody to receive from");
  auto work = on_backend(s, tensor, origin, [&](auto& pg) { return pg->recvAnysource(tensors, tag); });
  return WorkFactory::make(std::move(work), origin, s.timeout, nullptr, -1,
                           [ranks = s.ranks](int group_rank) { return ranks.at(group_rank); });
}

int CollectiveGroup::recv(torch::Tensor& tensor, std::optional<int> src, int tag) const {
  auto work = irecv(tensor, src, tag);
  work.wait();
  return work.source_rank();
}

// -- World's group factories -------------------------------------------------------------

namespace {

std::shared_ptr<detail::GroupState> make_group(const World& world, std::vector<int> ranks,
                                               const std::string& name, Milliseconds timeout,
                                               c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo) {
  auto s = std::make_shared<detail::GroupState>(world);
  s->ranks = std::move(ranks);
  s->group_rank = static_cast<int>(
      std::find(s->ranks.begin(), s->ranks.end(), world.rank()) - s->ranks.begin());
  s->timeout = timeout;
  s->nccl_prefix = c10::str("push/group/", name, "/nccl/");
  if (gloo) {
    s->gloo = std::move(gloo);
  } else {
    try {
      s->gloo = world.state()->make_gloo(c10::str("push/group/", name, "/gloo/"), s->ranks, timeout);
    } catch (const std::exception&) {
      throw Error(c10::str("[push::dist::World::new_group] rank ", world.rank(),
                           " could not connect group '", name, "' (ranks ", c10::Join(", ", s->ranks),
                           ") within ", world.options().init_timeout().count(),
                           " ms: ", detail::current_message()));
    }
  }
  return s;
}

}  // namespace

CollectiveGroup World::collective() const {
  auto& s = *state_;
  std::vector<int> all(s.options.world_size());
  for (int r = 0; r < s.options.world_size(); ++r) all[r] = r;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.world_gloo) {
    s.world_gloo = make_group(*this, all, "world", s.options.timeout(), {})->gloo;
  }
  return CollectiveGroup(make_group(*this, all, "world", s.options.timeout(), s.world_gloo));
}

CollectiveGroup World::new_group(std::vector<int> ranks) const {
  return new_group(std::move(ranks), CollectiveGroupOptions());
}

CollectiveGroup World::new_group(std::vector<int> ranks, const CollectiveGroupOptions& options) const {
  constexpr const char* origin = "push::dist::World::new_group";
  auto& s = *state_;
  std::sort(ranks.begin(), ranks.end());
  PUSH_CHECK(!ranks.empty(), origin, "a group needs at least one rank");
  PUSH_CHECK(std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end(), origin,
             "rank listed twice: ", c10::Join(", ", ranks));
  PUSH_CHECK(ranks.front() >= 0 && ranks.back() < size(), origin, "ranks must be in 0..",
             size() - 1, ", got ", c10::Join(", ", ranks));
  PUSH_CHECK(std::binary_search(ranks.begin(), ranks.end(), rank()), origin, "rank ", rank(),
             " is not in the group {", c10::Join(", ", ranks),
             "}: only members create a group (unlike machin, where every process enters)");
  std::string name = options.name();
  if (name.empty()) {
    const std::string key = c10::Join(",", ranks);
    std::lock_guard<std::mutex> lock(s.mutex);
    name = c10::str(key, "#", s.group_counts[key]++);
  }
  PUSH_CHECK(options.timeout().value_or(Milliseconds(1)).count() > 0, origin,
             "timeout must be positive");
  return CollectiveGroup(make_group(*this, std::move(ranks), name,
                                    options.timeout().value_or(s.options.timeout()), {}));
}

}  // namespace push::dist
