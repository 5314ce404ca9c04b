#include "data_parallel_training.h"

#include <push/core/errors.h>

#include <torch/torch.h>

#include <cmath>

namespace push::bayes::detail {
namespace {
constexpr const char* kDataParallelTraining = "push::bayes::Infer (data parallel)";
}  // namespace

Replica::Replica(const DataParallelSpec& spec) : spec_(spec) {
  if (spec.mode() == DataParallelMode::daso) {
    daso_groups_ = data_parallel::DasoGroups::make(spec.world(), spec.daso().ranks_per_node());
    everyone_ = daso_groups_->everyone;
  } else {
    everyone_ = data_parallel::group_of_everyone(spec.world());
    if (spec.mode() == DataParallelMode::blocking) gradients_.emplace(everyone_);
    if (spec.mode() == DataParallelMode::nonblocking) parameters_.emplace(everyone_);
  }
}

torch::Tensor Replica::shard(const torch::Tensor& rows) const {
  return data_parallel::share_of(rows, spec_.world().rank(), spec_.world().size());
}

void Replica::begin_epoch(Particle& p, int64_t epochs_left, int64_t batches, int64_t fit_call) {
  params_.clear();  // the particle's trainable parameters, as they are this epoch
  for (const auto& t : p.module().parameters()) {
    if (t.requires_grad()) params_.push_back(t);
  }
  if (fit_call != fit_call_) {
    if (parameters_) parameters_->drop();
    diverged_ = false;
    daso_.reset();
    if (daso_groups_) {  // it starts from rank 0's parameters itself
      auto options = spec_.daso();
      options.total_epochs(std::max<int64_t>(1, epochs_left)).average_in_step(true);
      daso_ = std::make_unique<data_parallel::Daso>(p.module(), p.optimizer(), *daso_groups_, options);
    } else {
      data_parallel::broadcast_from_first(p.module().parameters(), everyone_);
    }
    fit_call_ = fit_call;
  }
  if (daso_) daso_->set_batches_per_epoch(batches);
}

void Replica::note_loss(double loss) {
  if (!std::isfinite(loss)) diverged_ = true;
}

void Replica::before_forward() {
  if (parameters_) parameters_->apply();
}

void Replica::step(Particle& p, const std::function<void()>& apply) {
  PUSH_CHECK(!params_.empty(), kDataParallelTraining, "particle ", p.pid(),
             ": a step outside an epoch (no begin_epoch)");
  if (daso_) {
    daso_->step(apply);
  } else if (gradients_) {
    gradients_->average(params_);
    apply();
  } else {
    PUSH_CHECK(!parameters_->outstanding(), kDataParallelTraining, "particle ", p.pid(),
               ": a step with an average still in flight");
    apply();
    parameters_->start(params_);
  }
}

int Replica::end_epoch(double loss) {
  before_forward();  // nonblocking: the last step's average
  auto flag = torch::tensor({diverged_ ? 1.0 : 0.0}, torch::kDouble);
  everyone_.all_reduce(flag, dist::ReduceOp::sum);
  diverged_ = false;
  const int diverged = static_cast<int>(flag.item<double>());
  if (diverged == 0 && daso_) daso_->end_epoch(loss);
  return diverged;
}

DataParallelTraining::DataParallelTraining(const DataParallelSpec& spec, const std::vector<Pid>& pids) {
  for (Pid pid : pids) replicas_[pid] = std::make_unique<Replica>(spec);
  group_ = data_parallel::group_of_everyone(spec.world());
}

Replica* DataParallelTraining::replica(Pid pid) const {
  auto it = replicas_.find(pid);
  return it == replicas_.end() ? nullptr : it->second.get();
}

std::map<Pid, double> DataParallelTraining::average(const std::map<Pid, double>& losses) {
  std::vector<double> values;
  for (const auto& [pid, loss] : losses) values.push_back(loss);
  auto t = torch::tensor(values, torch::kDouble);
  group_.all_reduce(t, dist::ReduceOp::average);
  std::map<Pid, double> out;
  int64_t i = 0;
  for (const auto& [pid, loss] : losses) out[pid] = t[i++].item<double>();
  return out;
}

}  // namespace push::bayes::detail
