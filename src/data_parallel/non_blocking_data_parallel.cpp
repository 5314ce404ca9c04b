// heat's non-blocking DataParallel: a ParameterAverager per layer of a Sequential
// (replicas.h), applied as the layer is reached in forward; for any other module, one per
// dtype and device of its parameters, applied before it runs.
#include <push/data_parallel/non_blocking_data_parallel.h>

#include <push/core/errors.h>

#include <torch/torch.h>

#include <map>
#include <string>

namespace push::data_parallel {

NonBlockingDataParallel::NonBlockingDataParallel(torch::nn::Sequential net, dist::CollectiveGroup group)
    : net_(net), module_(net.ptr()) {
  broadcast_from_first(module_->parameters(), group);
  broadcast_from_first(module_->buffers(), group);
  for (size_t k = 0; k < (*net_)->size(); ++k) {
    std::vector<torch::Tensor> params;
    for (auto& p : (*net_)->ptr(k)->parameters()) {
      PUSH_CHECK(params.empty() || (p.scalar_type() == params[0].scalar_type() && p.device() == params[0].device()),
                 "push::data_parallel::NonBlockingDataParallel", "layer ", k, " mixes dtypes or devices");
      params.push_back(p);
    }
    add_group(std::move(params), group);
  }
}

NonBlockingDataParallel::NonBlockingDataParallel(torch::nn::AnyModule module, dist::CollectiveGroup group)
    : any_(std::move(module)) {
  PUSH_CHECK(!any_.is_empty(), "push::data_parallel::NonBlockingDataParallel", "no module given");
  module_ = any_.ptr();
  broadcast_from_first(module_->parameters(), group);
  broadcast_from_first(module_->buffers(), group);
  // One flat average per dtype and device: it all must be there before the module runs.
  std::map<std::string, std::vector<torch::Tensor>> by_kind;
  for (auto& p : module_->parameters()) by_kind[c10::str(p.scalar_type(), "@", p.device())].push_back(p);
  for (auto& [kind, params] : by_kind) add_group(std::move(params), group);
}

void NonBlockingDataParallel::add_group(std::vector<torch::Tensor> params, dist::CollectiveGroup group) {
  params_.push_back(std::move(params));
  averagers_.push_back(std::make_unique<ParameterAverager>(std::move(group)));
}

void NonBlockingDataParallel::start_averaging() {
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!params_[k].empty()) averagers_[k]->start(params_[k]);
  }
}

torch::Tensor NonBlockingDataParallel::forward_layers(const torch::Tensor& x) {
  torch::Tensor h = x;
  for (size_t k = 0; k < params_.size(); ++k) {
    averagers_[k]->apply();
    h = ((*net_)->begin() + static_cast<std::ptrdiff_t>(k))->forward(h);
  }
  return h;
}

void NonBlockingDataParallel::synchronize() {
  for (auto& averager : averagers_) averager->apply();
}

void NonBlockingDataParallel::train(bool on) {
  if (!on) synchronize();
  module_->train(on);
}

}  // namespace push::data_parallel
