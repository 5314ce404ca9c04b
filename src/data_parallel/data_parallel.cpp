// Blocking data parallelism: gradient hooks fill buckets; a full bucket's all_reduce starts
// at once, in bucket order; the end of backward waits for all and adds the averages.
#include <push/data_parallel/data_parallel.h>

#include <push/core/errors.h>
#include <push/data_parallel/replicas.h>

#include <torch/csrc/autograd/engine.h>
#include <torch/torch.h>

#include <mutex>

#include "core/seed.h"
#include "data_parallel/quiet_wait.h"

namespace push::data_parallel {
namespace {
constexpr const char* kDataParallel = "push::data_parallel::DataParallel";
}  // namespace

struct DataParallel::State : std::enable_shared_from_this<DataParallel::State> {
  torch::nn::Module* module = nullptr;
  dist::CollectiveGroup group;
  DataParallelOptions options;

  struct Slot {
    torch::Tensor param;
    std::string name;
    size_t bucket = 0;
    size_t position = 0;  // in its bucket's slots
    int64_t offset = 0;
    torch::Tensor zero;  // what its hook hands backward: one zero, expanded (no memory)
    unsigned hook = 0;
  };
  struct Bucket {
    torch::Tensor buffer;  // the bucket's gradients, flat, then their average
    std::vector<size_t> slots;
    std::vector<bool> filled;  // per slot of the bucket, this backward
    size_t pending = 0;        // slots not yet filled this backward
    bool launched = false;
    dist::Work work;
  };
  std::vector<Slot> slots;
  std::vector<Bucket> buckets;
  std::vector<std::vector<std::string>> bucket_names;

  std::mutex mutex;
  bool in_backward = false;
  size_t next_launch = 0;
  int64_t reductions = 0;

  // Whether this backward's final callback ran: when a backward fails, the engine drops
  // its callbacks unrun, and this token's destructor then resets the state.
  struct Token {
    std::weak_ptr<State> state;
    bool finished = false;
    ~Token() {
      if (finished) return;
      if (auto s = state.lock()) s->abandon();
    }
  };

  // Under the mutex: a new backward begins (the first hook of one).
  void begin_locked() {
    in_backward = true;
    next_launch = 0;
    for (auto& b : buckets) {
      b.pending = b.slots.size();
      b.filled.assign(b.slots.size(), false);
      b.launched = false;
    }
    auto token = std::make_shared<Token>();
    token->state = weak_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([token] {
      if (auto self = token->state.lock()) {
        token->finished = true;  // finish() resets the state itself, also when it throws
        self->finish();
      }
    });
  }

  // A backward that never finished: waits for what it launched (the collectives must end
  // before their buffers are reused) and starts clean.
  void abandon() {
    std::vector<dist::Work> works;
    {
      std::lock_guard lock(mutex);
      if (!in_backward) return;
      for (auto& b : buckets) {
        if (b.launched) works.push_back(b.work);
      }
    }
    for (auto& w : works) detail::wait_quietly(w);
    std::lock_guard lock(mutex);
    in_backward = false;
  }

  // Under the mutex: starts the buckets that are full, in order.
  void launch_ready_locked() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      auto& b = buckets[next_launch++];
      b.launched = true;
      b.work = group.all_reduce_async(b.buffer, dist::ReduceOp::average);
    }
  }

  torch::Tensor on_grad(size_t index, const torch::Tensor& grad) {
    // create_graph: the averaged gradients would have no graph (and the buckets would grow one).
    PUSH_CHECK(!torch::GradMode::is_enabled(), kDataParallel,
               "a backward with create_graph (double backward) is not averaged: not supported");
    std::lock_guard lock(mutex);
    if (!in_backward) begin_locked();
    const Slot& s = slots[index];
    auto& b = buckets[s.bucket];
    const size_t pos = s.position;
    // A leaf's hook runs once per backward, on its summed gradient; twice means two
    // backward passes at once (from two threads), which one set of buckets cannot serve.
    PUSH_CHECK(!b.filled[pos], kDataParallel, "parameter '", s.name,
               "' got a second gradient in one backward: run one backward at a time");
    b.buffer.narrow(0, s.offset, s.param.numel()).copy_(grad.reshape(-1));
    b.filled[pos] = true;
    --b.pending;
    launch_ready_locked();
    // What backward accumulates is zero: the average is added when all buckets are in.
    return s.zero;
  }

  // The end of backward (the engine's final callback): every bucket reduced, averages added.
  void finish() {
    std::vector<dist::Work> works;
    {
      std::lock_guard lock(mutex);
      // Parameters this backward did not reach: zero gradients, still reduced everywhere.
      for (auto& b : buckets) {
        for (size_t k = 0; k < b.slots.size(); ++k) {
          if (b.filled[k]) continue;
          const Slot& s = slots[b.slots[k]];
          b.buffer.narrow(0, s.offset, s.param.numel()).zero_();
          b.filled[k] = true;
          --b.pending;
        }
      }
      launch_ready_locked();
      for (auto& b : buckets) works.push_back(b.work);
    }
    try {
      for (auto& w : works) w.wait();
    } catch (...) {
      abandon();  // the others still end before the buffers are reused
      throw;
    }
    torch::NoGradGuard no_grad;
    std::lock_guard lock(mutex);
    for (auto& s : slots) {
      auto avg = buckets[s.bucket].buffer.narrow(0, s.offset, s.param.numel()).view(s.param.sizes());
      auto& grad = s.param.mutable_grad();
      if (grad.defined()) {
        grad.add_(avg);
      } else {
        grad = avg.clone();
      }
    }
    in_backward = false;
    ++reductions;
  }
};

DataParallel::DataParallel(torch::nn::Module& module, dist::CollectiveGroup group, DataParallelOptions options)
    : state_(std::make_shared<State>()) {
  PUSH_CHECK(options.bucket_bytes() > 0, kDataParallel, "bucket_bytes must be positive, got ", options.bucket_bytes());
  auto& s = *state_;
  s.module = &module;
  s.group = std::move(group);
  s.options = options;
  broadcast_from_first(module.parameters(), s.group);
  broadcast_buffers();
  // Buckets in reverse parameter order, each of one dtype and device.
  auto named = module.named_parameters();
  std::vector<size_t> order;
  for (size_t i = named.size(); i-- > 0;) {
    if (named[i]->requires_grad()) order.push_back(i);
  }
  int64_t bytes = 0;
  for (size_t i : order) {
    const auto& p = named[i].value();
    const int64_t size = p.numel() * static_cast<int64_t>(p.element_size());
    const bool fresh = s.buckets.empty() || bytes + size > options.bucket_bytes() ||
                       s.buckets.back().buffer.scalar_type() != p.scalar_type() ||
                       s.buckets.back().buffer.device() != p.device();
    if (fresh) {
      State::Bucket b;
      b.buffer = torch::empty({0}, p.options().requires_grad(false));
      s.buckets.push_back(std::move(b));
      s.bucket_names.emplace_back();
      bytes = 0;
    }
    auto& b = s.buckets.back();
    State::Slot slot;
    slot.param = p;
    slot.name = named[i].key();
    slot.bucket = s.buckets.size() - 1;
    slot.offset = b.buffer.numel();
    slot.position = b.slots.size();
    slot.zero = torch::zeros({}, p.options().requires_grad(false)).expand(p.sizes());
    b.buffer = torch::cat({b.buffer, torch::zeros({p.numel()}, b.buffer.options())});
    b.slots.push_back(s.slots.size());
    s.bucket_names.back().push_back(slot.name);
    s.slots.push_back(std::move(slot));
    bytes += size;
  }
  std::weak_ptr<State> weak = state_;
  for (size_t i = 0; i < s.slots.size(); ++i) {
    s.slots[i].hook = s.slots[i].param.register_hook([weak, i](const torch::Tensor& grad) -> torch::Tensor {
      auto self = weak.lock();
      if (!self) return grad;
      return self->on_grad(i, grad);
    });
  }
}

DataParallel::~DataParallel() {
  for (auto& s : state_->slots) {
    try {
      s.param.remove_hook(s.hook);
    } catch (const std::exception&) {
    }
  }
}

void DataParallel::broadcast_buffers() { broadcast_from_first(state_->module->buffers(), state_->group); }

const std::vector<std::vector<std::string>>& DataParallel::buckets() const { return state_->bucket_names; }

int64_t DataParallel::reductions() const {
  std::lock_guard lock(state_->mutex);
  return state_->reductions;
}

torch::Tensor shard(int64_t n, const dist::CollectiveGroup& group, int64_t epoch, uint64_t seed, bool shuffle) {
  PUSH_CHECK(n > 0, "push::data_parallel::shard", "no rows to shard (n = ", n, ")");
  torch::Tensor order;
  if (shuffle) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(
        push::detail::mix_seed(seed, epoch, push::detail::seed_purpose::kShard));
    order = torch::randperm(n, gen, torch::kLong);
  } else {
    order = torch::arange(n, torch::kLong);
  }
  return share_of(order, group.group_rank(), group.size());
}

}  // namespace push::data_parallel
