#pragma once
// Lists of tensors as one flat vector, in a buffer the caller keeps. Where a fresh
// allocation is fine, push uses LibTorch's own torch::nn::utils::parameters_to_vector;
// these are for the hot paths that reuse one buffer (a data-parallel average every step,
// a SWAG sample written into a module).
#include <torch/types.h>

#include <vector>

namespace push::detail {

/// Total elements of `tensors`.
int64_t total_numel(const std::vector<torch::Tensor>& tensors);
/// Copies `tensors` one after another into `flat` (cast to its dtype and device).
void pack(const std::vector<torch::Tensor>& tensors, const torch::Tensor& flat);
/// Copies `flat`'s consecutive slices back into `tensors` (cast to their dtype and device).
void unpack(const torch::Tensor& flat, const std::vector<torch::Tensor>& tensors);

}  // namespace push::detail
