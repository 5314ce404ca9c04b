#include <push/core/errors.h>
#include <push/runtime/view.h>

#include <torch/torch.h>

#include "runtime/view_cache.h"

namespace push {

const ParticleView::Data& ParticleView::data() const {
  if (!data_) throw Error("[push::ParticleView] this view is empty (default-constructed)");
  return *data_;
}

namespace {
// LibTorch's parameters_to_vector views each tensor flat: a copy with another layout
// (channels-last, say) is made contiguous first.
torch::Tensor flat(std::vector<torch::Tensor> tensors) {
  if (tensors.empty()) return torch::empty({0});
  for (auto& t : tensors) t = t.contiguous();
  return torch::nn::utils::parameters_to_vector(tensors);
}
}  // namespace

torch::Tensor ParticleView::flat_parameters() const { return flat(parameters()); }

torch::Tensor ParticleView::flat_gradients() const {
  const auto& ps = parameters();
  std::vector<torch::Tensor> gs = gradients();
  for (size_t i = 0; i < ps.size(); ++i) {
    if (!gs[i].defined()) gs[i] = torch::zeros_like(ps[i]);
  }
  return flat(std::move(gs));
}

namespace detail {

std::optional<Future<ParticleView>> ViewCache::lookup(Pid pid, uint64_t version) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->pid != pid) continue;
    if (it->version != version || it->view.has_error()) {
      entries_.erase(it);
      break;
    }
    entries_.splice(entries_.begin(), entries_, it);
    hits_.fetch_add(1, std::memory_order_relaxed);
    return entries_.front().view;
  }
  misses_.fetch_add(1, std::memory_order_relaxed);
  return std::nullopt;
}

std::optional<Future<ParticleView>> ViewCache::peek(Pid pid) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->pid != pid) continue;
    if (it->view.has_error()) {
      entries_.erase(it);
      return std::nullopt;
    }
    entries_.splice(entries_.begin(), entries_, it);
    return entries_.front().view;
  }
  return std::nullopt;
}

void ViewCache::insert(Pid pid, uint64_t version, Future<ParticleView> view) {
  entries_.remove_if([pid](const Entry& e) { return e.pid == pid; });
  entries_.push_front(Entry{pid, version, std::move(view)});
  while (static_cast<int>(entries_.size()) > capacity_) entries_.pop_back();
}

}  // namespace detail
}  // namespace push
