// InferOptions::data_parallel: each particle's replicas on every rank, kept equal by the
// chosen mode; the waits suspend the particle's fiber, so its lane trains other particles
// while one particle's collective is in flight.
#include "replica.h"

#include <push/core/errors.h>

#include <torch/torch.h>

#include <cmath>

#include "../parallel/flat.h"

namespace push::bayes {

const char* to_string(DataParallelMode mode) {
  switch (mode) {
    case DataParallelMode::blocking: return "blocking";
    case DataParallelMode::nonblocking: return "nonblocking";
    case DataParallelMode::daso: return "daso";
  }
  return "?";
}

DataParallelMode parse_data_parallel_mode(const std::string& text) {
  if (text == "blocking") return DataParallelMode::blocking;
  if (text == "nonblocking") return DataParallelMode::nonblocking;
  if (text == "daso") return DataParallelMode::daso;
  throw Error(c10::str("[push::bayes] unknown data-parallel mode '", text, "' (blocking, nonblocking or daso)"));
}

detail::Replica* Infer::replica(Pid pid) const {
  if (replicas_.empty()) return nullptr;
  auto it = replicas_.find(pid);
  return it == replicas_.end() ? nullptr : it->second.get();
}

std::map<Pid, double> Infer::average_over_replicas(const std::map<Pid, double>& mine) {
  std::vector<double> values;
  for (const auto& [pid, loss] : mine) values.push_back(loss);
  auto t = torch::tensor(values, torch::kDouble);
  replica_group_->all_reduce(t, dist::ReduceOp::average);
  std::map<Pid, double> out;
  int64_t i = 0;
  for (const auto& [pid, loss] : mine) out[pid] = t[i++].item<double>();
  return out;
}

namespace detail {
namespace {
constexpr const char* kOrigin = "push::bayes::Infer (data parallel)";

}  // namespace

Replica::Replica(const DataParallelSpec& spec) : spec_(spec) {
  if (spec.mode() == DataParallelMode::daso) {
    daso_groups_ = parallel::DasoGroups::make(spec.world(), spec.ranks_per_node());
  } else {
    group_ = parallel::detail::group_of_everyone(spec.world());
  }
}

Replica::~Replica() { drop_outstanding(); }

void Replica::drop_outstanding() {
  if (!outstanding_) return;
  outstanding_ = false;
  parallel::detail::wait_quietly(work_);
}

const dist::CollectiveGroup& Replica::everyone() const {
  return daso_groups_ ? daso_groups_->everyone : group_;
}

int Replica::ranks() const { return spec_.world().size(); }

torch::Tensor Replica::shard(const torch::Tensor& rows) const {
  return parallel::detail::share_of(rows, spec_.world().rank(), spec_.world().size());
}

void Replica::begin_epoch(Particle& p, int64_t epochs_left, int64_t batches, int64_t fit_call) {
  params_.clear();  // the particle's trainable parameters, as they are this epoch
  for (const auto& t : p.module().parameters()) {
    if (t.requires_grad()) params_.push_back(t);
  }
  if (fit_call != fit_call_) {
    drop_outstanding();
    diverged_ = false;
    daso_.reset();
    if (spec_.mode() == DataParallelMode::daso) {  // it starts from rank 0's parameters itself
      daso_ = std::make_unique<parallel::Daso>(
          p.module(), p.optimizer(), *daso_groups_,
          parallel::DasoOptions(std::max<int64_t>(1, epochs_left))
              .warmup_epochs(spec_.daso_warmup_epochs())
              .cooldown_epochs(spec_.daso_cooldown_epochs())
              .max_global_skips(spec_.daso_max_global_skips())
              .average_in_step(true));
    } else {
      parallel::detail::broadcast_from_first(p.module().parameters(), group_);
    }
    fit_call_ = fit_call;
  }
  if (daso_) daso_->set_batches_per_epoch(batches);
}

void Replica::note_loss(double loss) {
  if (!std::isfinite(loss)) diverged_ = true;
}

void Replica::before_forward() {
  if (!outstanding_) return;
  work_.wait();
  outstanding_ = false;
  parallel::detail::unpack(flat_, params_);
}

void Replica::step(Particle& p, const std::function<void()>& apply) {
  PUSH_CHECK(!params_.empty(), kOrigin, "particle ", p.pid(), ": a step outside an epoch (no begin_epoch)");
  switch (spec_.mode()) {
    case DataParallelMode::daso:
      daso_->step(apply);
      return;
    case DataParallelMode::blocking:
      parallel::detail::average_gradients(params_, flat_, group_);
      apply();
      return;
    case DataParallelMode::nonblocking: {
      PUSH_CHECK(!outstanding_, kOrigin, "particle ", p.pid(), ": a step with an average still in flight");
      apply();
      const int64_t n = parallel::detail::total_numel(params_);
      if (!flat_.defined() || flat_.numel() != n) flat_ = torch::empty({n}, params_.front().options().requires_grad(false));
      parallel::detail::pack(params_, flat_);
      work_ = group_.all_reduce_async(flat_, dist::ReduceOp::average);
      outstanding_ = true;
      return;
    }
  }
}

int Replica::end_epoch(double loss) {
  if (spec_.mode() == DataParallelMode::nonblocking) before_forward();  // the last step's average
  auto flag = torch::tensor({diverged_ ? 1.0 : 0.0}, torch::kDouble);
  everyone().all_reduce(flag, dist::ReduceOp::sum);
  diverged_ = false;
  const int diverged = static_cast<int>(flag.item<double>());
  if (diverged == 0 && daso_) daso_->end_epoch(loss);
  return diverged;
}

}  // namespace detail
}  // namespace push::bayes
