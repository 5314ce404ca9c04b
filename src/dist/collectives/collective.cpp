// CollectiveGroup over c10d's ProcessGroupGloo (and ProcessGroupNCCL for CUDA tensors in
// builds with PUSH_WITH_NCCL). Ranks cross the API as global ranks.
#include "dist/c10d.h"

#include "core/torch_compat.h"

#include <algorithm>

#include "dist/collectives/work.h"
#include "dist/world_access.h"

#if PUSH_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace push::dist {

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

#if PUSH_WITH_NCCL
/// What make_nccl_group (core/torch_compat.h) reads of a world: its rank, and the store the
/// group's ranks meet at, as c10d needs it.
struct NcclRendezvous {
  const World& world;
  int rank() const { return world.rank(); }
  c10::intrusive_ptr<c10d::Store> store() const { return detail::WorldAccess::state(world).store; }
};
#endif

/// Checks the tensor and runs `call(backend)` on the backend for its device.
template <class Call>
c10::intrusive_ptr<c10d::Work> on_backend(detail::GroupState& s, const torch::Tensor& tensor, const std::string& origin,
                                          Call&& call) {
  PUSH_CHECK(tensor.defined(), origin, "the tensor is undefined");
  PUSH_CHECK(tensor.is_contiguous(), origin, "the tensor must be contiguous (call .contiguous())");
  if (tensor.is_cuda()) {
#if PUSH_WITH_NCCL
    {
      std::lock_guard<std::mutex> lock(s.nccl_mutex);
      if (!s.nccl) s.nccl = push::compat::make_nccl_group(NcclRendezvous{s.world}, s.nccl_prefix, s.ranks, s.timeout);
    }
    try {
      return call(s.nccl);
    } catch (const std::exception&) {
      throw Error(c10::str("[", origin, "] ", detail::current_message()));
    }
#else
    throw Error(c10::str("[", origin,
                         "] got a CUDA tensor, but push was built without NCCL "
                         "(configure with -DPUSH_WITH_NCCL=ON against a CUDA LibTorch)"));
#endif
  }
  PUSH_CHECK(tensor.device().is_cpu(), origin, "tensors must be on the CPU (Gloo), got ", tensor.device());
  try {
    return call(s.gloo);
  } catch (const std::exception&) {
    throw Error(c10::str("[", origin, "] ", detail::current_message()));
  }
}

std::string op_name(const char* fn) { return c10::str("push::dist::CollectiveGroup::", fn); }

}  // namespace

detail::GroupState& CollectiveGroup::check(const char* origin) const {
  PUSH_CHECK(state_, "push::dist::CollectiveGroup::", origin, "this group is empty (default-constructed)");
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

/// c10d's options of a call with the group's timeout.
template <class Options>
Options timed(const detail::GroupState& s) {
  Options o;
  o.timeout = s.timeout;
  return o;
}

/// c10d's options of a call with a root (its source or destination, a global rank): the
/// root's group rank and the group's timeout.
template <class Options>
Options rooted(const detail::GroupState& s, int root, const std::string& origin) {
  auto o = timed<Options>(s);
  o.rootRank = to_group_rank(s, root, origin);
  return o;
}

/// ReduceOp::average is the sum divided by the group's size once the data has arrived:
/// that division of `tensor` (checked to be able to hold it), or nothing for other ops.
std::function<void()> average_step(ReduceOp op, const torch::Tensor& tensor, const detail::GroupState& s,
                                   const std::string& origin) {
  if (op != ReduceOp::average) return nullptr;
  PUSH_CHECK(tensor.is_floating_point() || tensor.is_complex(), origin, "average needs a floating-point tensor, got ",
             tensor.scalar_type());
  return [tensor, n = s.ranks.size()]() mutable { tensor.div_(static_cast<double>(n)); };
}

/// What crosses the wire for `t`: a complex tensor as a view of its real and imaginary parts
/// (a last dimension of 2), as torch.distributed's Python layer sends it; Gloo and NCCL
/// reduce those parts as they do real numbers, and writes into the view land in `t`.
torch::Tensor on_wire(const torch::Tensor& t) { return t.defined() && t.is_complex() ? torch::view_as_real(t) : t; }

std::vector<at::Tensor> on_wire(const std::vector<torch::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(on_wire(t));
  return out;
}

/// A reduction of complex tensors part by part is right for sums only: min, max and product
/// are refused, as torch.distributed refuses them.
void check_reducible(ReduceOp op, const torch::Tensor& tensor, const std::string& origin) {
  if (!tensor.defined() || !tensor.is_complex() || op == ReduceOp::sum || op == ReduceOp::average) return;
  const char* name = op == ReduceOp::product ? "product" : op == ReduceOp::min ? "min" : "max";
  throw Error(c10::str("[", origin, "] ", name, " on complex tensors is not defined (sum and average are)"));
}

/// Fills `output` with one tensor like `input` per member, for a gather to land in.
void one_per_member(std::vector<torch::Tensor>& output, const torch::Tensor& input, const detail::GroupState& s) {
  output.clear();
  for (size_t i = 0; i < s.ranks.size(); ++i) output.push_back(torch::empty_like(input));
}

/// Every call's last step: `call(backend)` on the backend for `tensor`'s device, as a Work
/// that runs `on_success` once its data has arrived.
template <class Call>
Work launch(detail::GroupState& s, const torch::Tensor& tensor, const std::string& origin, Call&& call,
            std::function<void()> on_success = nullptr) {
  auto work = on_backend(s, tensor, origin, std::forward<Call>(call));
  return detail::WorkFactory::make(std::move(work), origin, s.timeout, std::move(on_success));
}

}  // namespace

Work CollectiveGroup::all_reduce_async(torch::Tensor& tensor, ReduceOp op) const {
  const auto origin = op_name("all_reduce");
  auto& s = check("all_reduce");
  check_reducible(op, tensor, origin);
  auto done = average_step(op, tensor, s, origin);
  auto o = timed<c10d::AllreduceOptions>(s);
  o.reduceOp = to_c10d(op);
  std::vector<at::Tensor> tensors{on_wire(tensor)};
  return launch(
      s, tensors[0], origin, [&](auto& pg) { return pg->allreduce(tensors, o); }, std::move(done));
}

void CollectiveGroup::all_reduce(torch::Tensor& tensor, ReduceOp op) const { all_reduce_async(tensor, op).wait(); }

Work CollectiveGroup::all_gather_async(std::vector<torch::Tensor>& output, const torch::Tensor& input) const {
  const auto origin = op_name("all_gather");
  auto& s = check("all_gather");
  PUSH_CHECK(input.defined(), origin, "the input tensor is undefined");
  one_per_member(output, input, s);
  std::vector<std::vector<at::Tensor>> outputs{on_wire(output)};
  std::vector<at::Tensor> inputs{on_wire(input)};
  const auto o = timed<c10d::AllgatherOptions>(s);
  return launch(s, inputs[0], origin, [&](auto& pg) { return pg->allgather(outputs, inputs, o); });
}

void CollectiveGroup::all_gather(std::vector<torch::Tensor>& output, const torch::Tensor& input) const {
  all_gather_async(output, input).wait();
}

Work CollectiveGroup::broadcast_async(torch::Tensor& tensor, int src) const {
  const auto origin = op_name("broadcast");
  auto& s = check("broadcast");
  const auto o = rooted<c10d::BroadcastOptions>(s, src, origin);
  std::vector<at::Tensor> tensors{on_wire(tensor)};
  return launch(s, tensors[0], origin, [&](auto& pg) { return pg->broadcast(tensors, o); });
}

void CollectiveGroup::broadcast(torch::Tensor& tensor, int src) const { broadcast_async(tensor, src).wait(); }

Work CollectiveGroup::gather_async(const torch::Tensor& input, std::vector<torch::Tensor>& output, int dst) const {
  const auto origin = op_name("gather");
  auto& s = check("gather");
  const auto o = rooted<c10d::GatherOptions>(s, dst, origin);
  std::vector<std::vector<at::Tensor>> outputs;
  if (o.rootRank == s.group_rank) {
    one_per_member(output, input, s);
    outputs.push_back(on_wire(output));
  }
  std::vector<at::Tensor> inputs{on_wire(input)};
  return launch(s, inputs[0], origin, [&](auto& pg) { return pg->gather(outputs, inputs, o); });
}

void CollectiveGroup::gather(const torch::Tensor& input, std::vector<torch::Tensor>& output, int dst) const {
  gather_async(input, output, dst).wait();
}

Work CollectiveGroup::scatter_async(torch::Tensor& output, const std::vector<torch::Tensor>& input, int src) const {
  const auto origin = op_name("scatter");
  auto& s = check("scatter");
  const auto o = rooted<c10d::ScatterOptions>(s, src, origin);
  std::vector<std::vector<at::Tensor>> inputs;
  if (o.rootRank == s.group_rank) {
    PUSH_CHECK(input.size() == s.ranks.size(), origin, "the source passes one tensor per member: ", s.ranks.size(),
               " expected, got ", input.size());
    inputs.emplace_back();
    for (const auto& t : input) inputs.back().push_back(on_wire(t.contiguous()));
  }
  std::vector<at::Tensor> outputs{on_wire(output)};
  return launch(s, outputs[0], origin, [&](auto& pg) { return pg->scatter(outputs, inputs, o); });
}

void CollectiveGroup::scatter(torch::Tensor& output, const std::vector<torch::Tensor>& input, int src) const {
  scatter_async(output, input, src).wait();
}

Work CollectiveGroup::reduce_async(torch::Tensor& tensor, int dst, ReduceOp op) const {
  const auto origin = op_name("reduce");
  auto& s = check("reduce");
  check_reducible(op, tensor, origin);
  auto done = average_step(op, tensor, s, origin);
  auto o = rooted<c10d::ReduceOptions>(s, dst, origin);
  o.reduceOp = to_c10d(op);
  if (o.rootRank != s.group_rank) done = nullptr;  // the reduction lands on the root only
  std::vector<at::Tensor> tensors{on_wire(tensor)};
  return launch(
      s, tensors[0], origin, [&](auto& pg) { return pg->reduce(tensors, o); }, std::move(done));
}

void CollectiveGroup::reduce(torch::Tensor& tensor, int dst, ReduceOp op) const {
  reduce_async(tensor, dst, op).wait();
}

Work CollectiveGroup::barrier_async() const {
  const auto origin = op_name("barrier");
  auto& s = check("barrier");
  const auto o = timed<c10d::BarrierOptions>(s);
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = s.gloo->barrier(o);
  } catch (const std::exception&) {
    throw Error(c10::str("[", origin, "] ", detail::current_message()));
  }
  return detail::WorkFactory::make(std::move(work), origin, s.timeout);
}

void CollectiveGroup::barrier() const { barrier_async().wait(); }

Work CollectiveGroup::isend(const torch::Tensor& tensor, int dst, int tag) const {
  const auto origin = op_name("isend");
  auto& s = check("isend");
  PUSH_CHECK(tag >= 0, origin, "tags are >= 0, got ", tag);
  const int to = to_group_rank(s, dst, origin);
  PUSH_CHECK(to != s.group_rank, origin, "rank ", dst, " cannot send to itself");
  std::vector<at::Tensor> tensors{on_wire(tensor)};
  return launch(s, tensors[0], origin, [&](auto& pg) { return pg->send(tensors, to, tag); });
}

void CollectiveGroup::send(const torch::Tensor& tensor, int dst, int tag) const { isend(tensor, dst, tag).wait(); }

Work CollectiveGroup::irecv(torch::Tensor& tensor, std::optional<int> src, int tag) const {
  const auto origin = op_name("irecv");
  auto& s = check("irecv");
  PUSH_CHECK(tag >= 0, origin, "tags are >= 0, got ", tag);
  std::vector<at::Tensor> tensors{on_wire(tensor)};
  if (src) {
    const int from = to_group_rank(s, *src, origin);
    PUSH_CHECK(from != s.group_rank, origin, "rank ", *src, " cannot receive from itself");
    auto work = on_backend(s, tensors[0], origin, [&](auto& pg) { return pg->recv(tensors, from, tag); });
    return detail::WorkFactory::make(std::move(work), origin, s.timeout, nullptr, *src);
  }
  PUSH_CHECK(s.ranks.size() > 1, origin, "a group of one has nobody to receive from");
  auto work = on_backend(s, tensors[0], origin, [&](auto& pg) { return pg->recvAnysource(tensors, tag); });
  return detail::WorkFactory::make(std::move(work), origin, s.timeout, nullptr, -1,
                                   [ranks = s.ranks](int group_rank) { return ranks.at(group_rank); });
}

int CollectiveGroup::recv(torch::Tensor& tensor, std::optional<int> src, int tag) const {
  auto work = irecv(tensor, src, tag);
  work.wait();
  return work.source_rank();
}

// -- World's group factories -------------------------------------------------------------

namespace {

std::shared_ptr<detail::GroupState> make_group(const World& world, std::vector<int> ranks, const std::string& name,
                                               Milliseconds timeout, c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo) {
  auto s = std::make_shared<detail::GroupState>(world);
  s->ranks = std::move(ranks);
  s->group_rank = static_cast<int>(std::find(s->ranks.begin(), s->ranks.end(), world.rank()) - s->ranks.begin());
  s->timeout = timeout;
  s->nccl_prefix = c10::str("push/group/", name, "/nccl/");
  if (gloo) {
    s->gloo = std::move(gloo);
  } else {
    try {
      s->gloo = detail::WorldAccess::state(world).make_gloo(c10::str("push/group/", name, "/gloo/"), s->ranks, timeout);
    } catch (const std::exception&) {
      throw Error(c10::str("[push::dist::World::new_group] rank ", world.rank(), " could not connect group '", name,
                           "' (ranks ", c10::Join(", ", s->ranks), ") within ", world.options().init_timeout().count(),
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
  PUSH_CHECK(ranks.front() >= 0 && ranks.back() < size(), origin, "ranks must be in 0..", size() - 1, ", got ",
             c10::Join(", ", ranks));
  PUSH_CHECK(std::binary_search(ranks.begin(), ranks.end(), rank()), origin, "rank ", rank(), " is not in the group {",
             c10::Join(", ", ranks), "}: only members create a group (unlike machin, where every process enters)");
  std::string name = options.name();
  if (name.empty()) {
    const std::string key = c10::Join(",", ranks);
    std::lock_guard<std::mutex> lock(s.mutex);
    name = c10::str(key, "#", s.group_counts[key]++);
  }
  PUSH_CHECK(options.timeout().value_or(Milliseconds(1)).count() > 0, origin, "timeout must be positive");
  return CollectiveGroup(
      make_group(*this, std::move(ranks), name, options.timeout().value_or(s.options.timeout()), {}));
}

}  // namespace push::dist
