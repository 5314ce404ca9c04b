#include "runtime/particle_cache.h"

#include <push/core/errors.h>
#include "core/torch_compat.h"

#include <torch/optim.h>

#include <unordered_map>
#include <unordered_set>

#include "runtime/particle_record.h"

namespace push::detail {
namespace {

// The tensors of an optimizer's per-parameter state, for the optimizers LibTorch ships.
// Another optimizer's state stays on the device (a warning says so once).
template <class F>
void for_each_optimizer_tensor(torch::optim::Optimizer& optimizer, F&& visit) {
  using namespace torch::optim;
  for (auto& entry : optimizer.state()) {
    OptimizerParamState* state = entry.second.get();
    if (auto* s = dynamic_cast<AdamParamState*>(state)) {
      visit(s->exp_avg());
      visit(s->exp_avg_sq());
      visit(s->max_exp_avg_sq());
    } else if (auto* s = dynamic_cast<AdamWParamState*>(state)) {
      visit(s->exp_avg());
      visit(s->exp_avg_sq());
      visit(s->max_exp_avg_sq());
    } else if (auto* s = dynamic_cast<SGDParamState*>(state)) {
      visit(s->momentum_buffer());
    } else if (auto* s = dynamic_cast<RMSpropParamState*>(state)) {
      visit(s->square_avg());
      visit(s->momentum_buffer());
      visit(s->grad_avg());
    } else if (auto* s = dynamic_cast<AdagradParamState*>(state)) {
      visit(s->sum());
    } else {
      TORCH_WARN_ONCE(
          "[push::ParticleCache] optimizer state of an unknown type stays on the device "
          "when its particle is evicted");
    }
  }
}

// Every distinct tensor of the particle (by TensorImpl, so a tied weight is copied and
// restored once and stays shared), parameters first, in a fixed order; and where each
// parameter and gradient, duplicates included, lives among them.
void collect_slots(ParticleRecord& r) {
  r.slots.clear();
  r.param_slot.clear();
  r.grad_slot.clear();
  std::unordered_map<const void*, int64_t> index;
  auto add = [&](const torch::Tensor& t) -> int64_t {
    if (!t.defined()) return -1;
    auto [it, fresh] = index.emplace(t.unsafeGetTensorImpl(), static_cast<int64_t>(r.slots.size()));
    if (fresh) r.slots.push_back(t);
    return it->second;
  };
  auto params = r.module.ptr()->parameters();
  for (const auto& p : params) r.param_slot.push_back(add(p));
  r.buffer_slot.clear();
  for (const auto& b : r.module.ptr()->buffers()) r.buffer_slot.push_back(add(b));
  for (const auto& p : params) r.grad_slot.push_back(add(p.grad()));
  if (r.optimizer) for_each_optimizer_tensor(*r.optimizer, add);
}

bool same_layout(const torch::Tensor& a, const torch::Tensor& b) {
  return a.defined() && a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type();
}

int64_t bytes_of(const torch::Tensor& t) {
  return static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
}

}  // namespace

void ParticleCache::insert(ParticleRecord& record) {
  make_room();
  record.resident = true;
  record.lru_position = lru_.insert(lru_.end(), &record);
  resident_.fetch_add(1, std::memory_order_relaxed);
}

void ParticleCache::pin(ParticleRecord& record) {
  if (!record.resident) {
    make_room();
    restore(record);
  } else {
    lru_.splice(lru_.end(), lru_, record.lru_position);  // most recently used
  }
  ++record.pins;
}

void ParticleCache::unpin(ParticleRecord& record) {
  TORCH_INTERNAL_ASSERT(record.pins > 0, "unpin of particle ", record.pid, " without a pin");
  --record.pins;
}

void ParticleCache::make_room() {
  if (static_cast<int>(lru_.size()) < capacity_) return;
  for (ParticleRecord* victim : lru_) {
    if (victim->pins == 0) {
      evict(*victim);
      return;
    }
  }
  // Every resident particle is pinned: the runtime pins at most one particle per lane
  // at a time, so this only happens with operations nested by hand; go over capacity.
}

void ParticleCache::evict(ParticleRecord& r) {
  TORCH_INTERNAL_ASSERT(r.resident && r.pins == 0, "evicting particle ", r.pid, " that is not resident or is pinned");
  torch::NoGradGuard no_grad;
  collect_slots(r);
  r.host.resize(r.slots.size());
  const bool pinned = compat::wants_pinned_host(device_);
  // A host tensor may still be read by a restore queued on the copy stream: the copies
  // below queue behind it there.
  for (size_t i = 0; i < r.slots.size(); ++i) {
    const torch::Tensor& t = r.slots[i];
    if (!same_layout(r.host[i], t)) {
      r.host[i] = torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(pinned));
    }
  }
  r.host_ready = streams_.copy(r.slots, r.host);
  // Spares the last restore did not use are dropped: the pool never holds more than
  // one evicted particle's storage.
  spare_.clear();
  for (const torch::Tensor& t : r.slots) {
    if (device_.is_cpu()) keep_buffer(t.detach());
    t.set_data(torch::empty({0}, t.options()));
  }
  lru_.erase(r.lru_position);
  r.resident = false;
  resident_.fetch_sub(1, std::memory_order_relaxed);
  evictions_.fetch_add(1, std::memory_order_relaxed);
}

void ParticleCache::restore(ParticleRecord& r) {
  TORCH_INTERNAL_ASSERT(!r.resident, "restoring particle ", r.pid, " that is resident");
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> on_device;
  on_device.reserve(r.slots.size());
  for (const torch::Tensor& host : r.host) on_device.push_back(take_buffer(host));
  // The compute stream waits for the copies on the device; the lane's thread goes on.
  streams_.order_after(streams_.copy(r.host, on_device));
  for (size_t i = 0; i < r.slots.size(); ++i) r.slots[i].set_data(on_device[i]);
  // The slot handles are the particle's own tensors: drop ours so that a gradient the
  // optimizer later replaces is not kept alive here.
  r.slots.clear();
  r.lru_position = lru_.insert(lru_.end(), &r);
  r.resident = true;
  resident_.fetch_add(1, std::memory_order_relaxed);
  restores_.fetch_add(1, std::memory_order_relaxed);
}

void ParticleCache::keep_buffer(torch::Tensor buffer) {
  const int64_t bytes = bytes_of(buffer);
  if (bytes == 0 || !buffer.is_contiguous()) return;
  spare_.push_back(std::move(buffer));
}

torch::Tensor ParticleCache::take_buffer(const torch::Tensor& like) {
  for (size_t i = 0; i < spare_.size(); ++i) {
    torch::Tensor& candidate = spare_[i];
    // Reuse only storage nobody else holds: a view the user kept of an evicted
    // tensor must never start aliasing another particle.
    if (same_layout(candidate, like) && candidate.storage().use_count() == 1) {
      torch::Tensor buffer = std::move(candidate);
      spare_[i] = std::move(spare_.back());
      spare_.pop_back();
      return buffer;
    }
  }
  return torch::empty(like.sizes(), like.options().device(device_).pinned_memory(false));
}

std::vector<torch::Tensor> ParticleCache::parameters(ParticleRecord& r) const {
  if (r.resident) return r.module.ptr()->parameters();
  r.host_ready.wait();
  std::vector<torch::Tensor> out;
  for (int64_t slot : r.param_slot) out.push_back(r.host[slot]);
  return out;
}

std::unordered_set<const void*> ParticleCache::resident_storages() const {
  std::unordered_set<const void*> out;
  auto add = [&](const torch::Tensor& t) {
    if (t.defined() && t.has_storage()) out.insert(t.storage().unsafeGetStorageImpl());
  };
  for (ParticleRecord* r : lru_) {
    for (const auto& p : r->module.ptr()->parameters()) {
      add(p);
      add(p.grad());
    }
    for (const auto& b : r->module.ptr()->buffers()) add(b);
    if (r->optimizer) for_each_optimizer_tensor(*r->optimizer, add);
  }
  return out;
}

std::vector<torch::Tensor> ParticleCache::buffers(ParticleRecord& r) const {
  if (r.resident) return r.module.ptr()->buffers();
  r.host_ready.wait();
  std::vector<torch::Tensor> out;
  for (int64_t slot : r.buffer_slot) out.push_back(r.host[slot]);
  return out;
}

std::vector<torch::Tensor> ParticleCache::gradients(ParticleRecord& r) const {
  std::vector<torch::Tensor> out;
  if (r.resident) {
    for (const auto& p : r.module.ptr()->parameters()) out.push_back(p.grad());
    return out;
  }
  r.host_ready.wait();
  for (int64_t slot : r.grad_slot) out.push_back(slot >= 0 ? r.host[slot] : torch::Tensor());
  return out;
}

}  // namespace push::detail
