// Workload W of the runtime benchmarks: 16 MLPs 1->64->64->1 trained with Adam(0.01) on
// y = sin x + 0.1 eps (1,024 points, batch 128, 20 epochs). bench/runtime_bench.cpp runs it
// through push and as plain loops; bench/ranks_bench.cpp on 2 ranks against 2 lanes.
#pragma once

#include <torch/torch.h>

namespace push_bench {

struct Workload {
  static constexpr int kParticles = 16, kEpochs = 20, kBatch = 128, kPoints = 1024;
  torch::Tensor x, y;
  Workload() {
    torch::manual_seed(0);
    x = torch::rand({kPoints, 1}) * 8 - 4;
    y = torch::sin(x) + 0.1 * torch::randn({kPoints, 1});
  }
};

inline torch::nn::Sequential mlp() {
  return torch::nn::Sequential(torch::nn::Linear(1, 64), torch::nn::ReLU(), torch::nn::Linear(64, 64),
                               torch::nn::ReLU(), torch::nn::Linear(64, 1));
}

inline torch::Tensor mse(const torch::Tensor& o, const torch::Tensor& y) { return torch::mse_loss(o, y); }

}  // namespace push_bench
