#pragma once
#include <torch/types.h>

#include <push/runtime/types.h>

#include <memory>
#include <string>
#include <vector>

namespace push {

/// A read-only copy of another particle's parameters, gradients and buffers, on the
/// device of the particle that asked for it (Particle::get). A view never aliases live
/// weights: it is the state of that particle at the moment it was taken. A view runs:
/// Particle::forward_view(view, x) is the viewed particle's forward on the caller's device.
class ParticleView {
 public:
  struct Data {
    Pid pid = -1;
    uint64_t version = 0;
    std::vector<std::string> names;
    std::vector<torch::Tensor> parameters;
    std::vector<torch::Tensor> gradients;  // undefined where the parameter has no grad
    std::vector<torch::Tensor> buffers;    // in module order (running statistics, a frozen prior)
  };

  ParticleView() = default;
  explicit ParticleView(std::shared_ptr<const Data> data) : data_(std::move(data)) {}

  Pid pid() const { return data().pid; }
  /// The particle's version when the view was taken (it changes whenever the particle may
  /// have: a handler of it ran, or a load).
  uint64_t version() const { return data().version; }
  const std::vector<std::string>& names() const { return data().names; }
  const std::vector<torch::Tensor>& parameters() const { return data().parameters; }
  const std::vector<torch::Tensor>& gradients() const { return data().gradients; }
  const std::vector<torch::Tensor>& buffers() const { return data().buffers; }
  /// All parameters flattened and concatenated, in module order.
  torch::Tensor flat_parameters() const;
  /// All gradients flattened and concatenated (zeros where a parameter has none).
  torch::Tensor flat_gradients() const;

 private:
  const Data& data() const;
  std::shared_ptr<const Data> data_;
};

}  // namespace push
