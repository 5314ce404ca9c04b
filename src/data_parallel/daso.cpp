// DASO's communication: node-local gradient averaging, and global parameter syncs over one
// group per local index, sent in the downcast type, summed in float32, received at once or
// some batches later and blended, then broadcast to the node.
#include <push/data_parallel/daso.h>

#include <push/core/errors.h>
#include <push/data_parallel/data_parallel.h>
#include <push/data_parallel/replicas.h>
#include <push/dist/world.h>

#include <torch/torch.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "core/flat.h"
#include "data_parallel/quiet_wait.h"

namespace push::data_parallel {
namespace {
constexpr const char* kDaso = "push::data_parallel::Daso";

}  // namespace

struct Daso::State {
  torch::nn::Module* module = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;
  DasoSchedule schedule;
  DasoGroups groups;                        // this object's own: its collectives never interleave with others'
  std::unique_ptr<DataParallel> local;      // node-local averaging through hooks
  std::vector<torch::Tensor> params;        // the trainable ones, in module order
  torch::Tensor flat;                       // float32 scratch of their values
  std::optional<GradientAverager> in_step;  // average_in_step, with several ranks per node
  // One sync is in flight at a time (a late one is received before the next is sent), so
  // these serve every sync: what this rank sends, in the downcast type and as Gloo moves
  // it (the same bytes), and the float32 sum of what it gathers.
  torch::Tensor payload, wire, sum;

  struct Sync {
    int sender = 0;  // the local rank whose global group sent it
    std::vector<torch::Tensor> gathered;
    dist::Work work;
    bool mine = false;  // this rank took part
  };
  std::optional<Sync> outstanding;
  int next_sender = 0;
  int64_t sent = 0, received = 0;

  explicit State(DasoOptions options) : schedule(std::move(options)) {}

  const DasoOptions& options() const { return schedule.options(); }

  void average_gradients_in_step() {
    if (in_step) in_step->average(params);
  }

  // Starts a global sync from the group of local rank `sender`: its members send their
  // parameters in the downcast type; the rest of the node only counts it.
  Sync start(int sender) {
    Sync s;
    s.sender = sender;
    s.mine = groups.local_rank == sender;
    if (s.mine) {
      push::detail::pack(params, flat);
      payload.copy_(flat);
      s.work = groups.global.all_gather_async(s.gathered, wire);
    }
    ++sent;
    return s;
  }

  // Receives a sync: its senders replace (blocking) or blend (late) their parameters, then
  // broadcast them to their node.
  void finish(Sync& s, bool blocking, int64_t waited = 0) {
    if (s.mine) {
      s.work.wait();
      torch::NoGradGuard no_grad;
      sum.zero_();
      for (const auto& g : s.gathered) {
        sum.add_(g.scalar_type() == torch::kFloat ? g : g.view(options().downcast()).to(torch::kFloat));
      }
      const double n = static_cast<double>(s.gathered.size());
      if (blocking) {
        flat.copy_(sum.div_(n));
      } else {
        push::detail::pack(params, flat);
        const double k = waited > 0 ? 2.0 * static_cast<double>(waited) : 1.0;
        flat.mul_(k).add_(sum).div_(k + n);
      }
      push::detail::unpack(flat, params);
    }
    if (groups.node_group) {  // the senders' result, to the rest of their node
      groups.node_group->broadcast(flat, groups.node * groups.ranks_per_node + s.sender);
      if (!s.mine) push::detail::unpack(flat, params);
    }
    ++received;
  }
};

int DasoGroups::resolve_ranks_per_node(int asked, int world_size) {
  PUSH_CHECK(asked >= 0, kDaso, "ranks_per_node must not be negative, got ", asked);
  if (asked > 0) return asked;
  if (auto launched = dist::WorldOptions::launched_local_world_size()) {
    PUSH_CHECK(*launched > 0, kDaso, "the launcher's ranks per node (LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE or ",
               "SLURM_NTASKS_PER_NODE) must be positive, got ", *launched);
    return *launched;
  }
  return world_size;
}

DasoGroups DasoGroups::make(const dist::World& world, int ranks_per_node) {
  DasoGroups g;
  const int size = world.size(), rank = world.rank();
  g.ranks_per_node = resolve_ranks_per_node(ranks_per_node, size);
  PUSH_CHECK(size % g.ranks_per_node == 0, kDaso, "a world of ", size, " ranks is not a whole number of nodes of ",
             g.ranks_per_node, " ranks");
  g.nodes = size / g.ranks_per_node;
  PUSH_CHECK(g.nodes >= 2, kDaso, "DASO needs at least 2 nodes; ", size, " ranks with ", g.ranks_per_node,
             " ranks per node make one (set ranks_per_node to a divisor of ", size,
             " to simulate nodes, or use DataParallel)");
  g.node = rank / g.ranks_per_node;
  g.local_rank = rank % g.ranks_per_node;
  // Created in one order everywhere (only members create a group).
  std::vector<int> node_ranks, global_ranks;
  for (int r = 0; r < g.ranks_per_node; ++r) node_ranks.push_back(g.node * g.ranks_per_node + r);
  for (int n = 0; n < g.nodes; ++n) global_ranks.push_back(n * g.ranks_per_node + g.local_rank);
  g.everyone = group_of_everyone(world);
  if (g.ranks_per_node > 1) g.node_group = world.new_group(node_ranks);
  g.global = world.new_group(global_ranks);
  return g;
}

Daso::Daso(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const dist::World& world, DasoOptions options)
    : Daso(module, optimizer, DasoGroups::make(world, options.ranks_per_node()), options) {}

Daso::Daso(torch::nn::Module& module, torch::optim::Optimizer& optimizer, DasoGroups groups, DasoOptions options)
    : state_(std::make_unique<State>(std::move(options))) {
  auto& s = *state_;
  s.module = &module;
  s.optimizer = &optimizer;
  s.groups = std::move(groups);
  for (const auto& p : module.parameters()) {
    if (!p.requires_grad()) continue;
    PUSH_CHECK(p.is_floating_point(), kDaso, "parameter of type ", c10::toString(p.scalar_type()),
               " is not floating point");
    PUSH_CHECK(s.params.empty() || p.device() == s.params[0].device(), kDaso, "the parameters are on several devices (",
               s.params[0].device(), " and ", p.device(), ")");
    s.params.push_back(p);
  }
  PUSH_CHECK(!s.params.empty(), kDaso, "the module has no trainable parameters");
  const auto flat_options = s.params[0].options().dtype(torch::kFloat).requires_grad(false);
  s.flat = torch::empty({push::detail::total_numel(s.params)}, flat_options);
  s.sum = torch::empty_like(s.flat);
  // Gloo (in LibTorch 1.13) moves no bfloat16: 16-bit payloads travel as half, bit for
  // bit, and are summed in float32, in one order on every rank.
  const auto downcast = s.options().downcast();
  s.payload = torch::empty_like(s.flat, flat_options.dtype(downcast));
  s.wire = downcast == torch::kFloat ? s.payload : s.payload.view(torch::kHalf);

  broadcast_from_first(module.parameters(), s.groups.everyone);
  broadcast_from_first(module.buffers(), s.groups.everyone);
  if (s.groups.node_group && !s.options().average_in_step()) {
    s.local = std::make_unique<DataParallel>(module, *s.groups.node_group,
                                             DataParallelOptions().bucket_bytes(s.options().bucket_bytes()));
  } else if (s.groups.node_group) {
    s.in_step.emplace(*s.groups.node_group);
  }
}

Daso::~Daso() {
  // An outstanding sync ends before its buffers go.
  auto& s = *state_;
  if (s.outstanding && s.outstanding->mine) detail::wait_quietly(s.outstanding->work);
}

void Daso::set_batches_per_epoch(int64_t batches) { state_->schedule.set_batches_per_epoch(batches); }

void Daso::step() {
  step([this] { state_->optimizer->step(); });
}

void Daso::step(const std::function<void()>& apply) {
  auto& s = *state_;
  s.average_gradients_in_step();
  apply();
  const DasoStep step = s.schedule.next();
  if (step.receive) {
    PUSH_CHECK(s.outstanding.has_value(), kDaso, "internal: a receive with no sync outstanding");
    s.finish(*s.outstanding, /*blocking=*/false, step.waited);
    s.outstanding.reset();
  }
  if (step.send) {
    const int sender = s.next_sender;
    s.next_sender = (s.next_sender + 1) % s.groups.ranks_per_node;
    auto sync = s.start(sender);
    if (step.blocking) {
      s.finish(sync, /*blocking=*/true);
    } else {
      s.outstanding = std::move(sync);
    }
  }
  if (s.schedule.batch() == 0) s.next_sender = 0;  // every epoch starts with local rank 0's group
}

void Daso::end_epoch(double loss) {
  auto& s = *state_;
  auto t = torch::tensor({loss}, torch::kDouble);
  s.groups.everyone.all_reduce(t, dist::ReduceOp::average);
  s.schedule.end_epoch(t.item<double>());
}

const DasoSchedule& Daso::schedule() const { return state_->schedule; }
int Daso::nodes() const { return state_->groups.nodes; }
int Daso::node() const { return state_->groups.node; }
int Daso::local_rank() const { return state_->groups.local_rank; }
int64_t Daso::syncs_sent() const { return state_->sent; }
int64_t Daso::syncs_received() const { return state_->received; }

}  // namespace push::data_parallel
