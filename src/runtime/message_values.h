#pragma once
// What a message's values go through on their way: tensors found at any depth of lists,
// tuples and dicts, copied away from live particles, moved to the receiver's device.
#include <ATen/core/ivalue.h>
#include <torch/types.h>

#include <push/runtime/types.h>

#include <functional>
#include <vector>

#include "runtime/particle_cache.h"

namespace push::detail {

/// `value` with `fn` applied to every tensor in it (lists, tuples and dicts rebuilt).
c10::IValue map_tensors(const c10::IValue& value, const std::function<torch::Tensor(const torch::Tensor&)>& fn);
/// Whether `pred` holds for some defined tensor in `value`.
bool any_tensor(const c10::IValue& value, const std::function<bool(const torch::Tensor&)>& pred);
/// `t` moved to `device` (itself when it is there already, or undefined).
torch::Tensor to_device(const torch::Tensor& t, const torch::Device& device);
/// Tensors in `value` moved to `device` (a no-op for those already there).
c10::IValue to_device(const c10::IValue& value, const torch::Device& device);
/// Whether some tensor in `args` is not on `device`.
bool has_tensor_off(const Args& args, const torch::Device& device);
/// Tensors that share storage with a particle resident in `cache` are replaced by copies.
void detach_from_particles(std::vector<c10::IValue>& values, const ParticleCache& cache);

}  // namespace push::detail
