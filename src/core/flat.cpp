#include "core/flat.h"

#include <torch/torch.h>

namespace push::detail {

int64_t total_numel(const std::vector<torch::Tensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.numel();
  return n;
}

void pack(const std::vector<torch::Tensor>& tensors, const torch::Tensor& flat) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const auto& t : tensors) {
    flat.narrow(0, offset, t.numel()).copy_(t.detach().reshape(-1));
    offset += t.numel();
  }
}

void unpack(const torch::Tensor& flat, const std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const auto& t : tensors) {
    t.detach().copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

}  // namespace push::detail
