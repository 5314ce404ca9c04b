// heat's non-blocking DataParallel: a ParameterAverager per layer (replicas.h), applied as
// the layer is reached in forward.
#include <push/data_parallel/non_blocking_data_parallel.h>

#include <push/core/errors.h>

#include <torch/torch.h>

namespace push::data_parallel {

NonBlockingDataParallel::NonBlockingDataParallel(torch::nn::Sequential net, dist::CollectiveGroup group)
    : net_(std::move(net)) {
  broadcast_from_first(net_->parameters(), group);
  broadcast_from_first(net_->buffers(), group);
  for (size_t k = 0; k < net_->size(); ++k) {
    std::vector<torch::Tensor> params;
    for (auto& p : net_->ptr(k)->parameters()) {
      PUSH_CHECK(params.empty() || (p.scalar_type() == params[0].scalar_type() && p.device() == params[0].device()),
                 "push::data_parallel::NonBlockingDataParallel", "layer ", k, " mixes dtypes or devices");
      params.push_back(p);
    }
    params_.push_back(std::move(params));
    averagers_.push_back(std::make_unique<ParameterAverager>(group));
  }
}

void NonBlockingDataParallel::start_averaging() {
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!params_[k].empty()) averagers_[k]->start(params_[k]);
  }
}

torch::Tensor NonBlockingDataParallel::forward(const torch::Tensor& x) {
  torch::Tensor h = x;
  for (size_t k = 0; k < params_.size(); ++k) {
    averagers_[k]->apply();
    h = (net_->begin() + static_cast<std::ptrdiff_t>(k))->forward(h);
  }
  return h;
}

void NonBlockingDataParallel::synchronize() {
  for (auto& averager : averagers_) averager->apply();
}

}  // namespace push::data_parallel
