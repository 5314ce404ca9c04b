// The training loop, one particle at a time: an "epoch" message per particle, each running
// its minibatch steps in its own handler.
#include <push/core/errors.h>

#include <torch/torch.h>

#include "core/seed.h"
#include "data_parallel_training.h"
#include "epoch_engine.h"
#include "training_state.h"

namespace push::bayes::detail {

EpochEngine::EpochEngine(TrainingState& state) : state_(state), algorithm_(state.algorithm), training_(state) {}

std::map<Pid, double> EpochEngine::launch(Push& dist, const std::vector<std::vector<Pid>>& groups, const char* message,
                                          const torch::Tensor& x, const torch::Tensor& y, int64_t epoch,
                                          bool with_group) {
  std::vector<PFuture> fs;
  for (const auto& g : groups) {
    fs.push_back(with_group ? dist.p_launch(g.front(), message, x, y, epoch, g)
                            : dist.p_launch(g.front(), message, x, y, epoch));
  }
  std::map<Pid, double> losses;
  double running = 0;
  std::exception_ptr error;  // rethrown once every particle is done: nothing left running
  for (size_t i = 0; i < fs.size(); ++i) {
    try {
      auto value = fs[i].wait();
      const auto each = value.isDouble() ? std::vector<double>{value.toDouble()} : value.toDoubleVector();
      for (size_t m = 0; m < each.size(); ++m) {
        losses[groups[i][m]] = each[m];
        running += each[m];
      }
      training_.report(epoch + 1, state_.fit_last_epoch, static_cast<int64_t>(losses.size()),
                       running / static_cast<double>(losses.size()));
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  return losses;
}

void UnfusedEpochs::add_handlers(ParticleOptions& options) {
  options.on("epoch", [this](Particle& p, const Args& a) {
    return c10::IValue(particle_epoch(p, a[0].toTensor(), a[1].toTensor(), a[2].toInt()));
  });
}

std::map<Pid, double> UnfusedEpochs::run(Push& dist, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch) {
  std::vector<std::vector<Pid>> groups;
  for (Pid pid : dist.local_particle_ids()) groups.push_back({pid});
  return launch(dist, groups, "epoch", x, y, epoch, /*with_group=*/false);
}

double UnfusedEpochs::particle_epoch(Particle& p, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch) {
  training_.schedule_lr(p, epoch);
  algorithm_.prepare_epoch(p, epoch);
  return prepared_epoch(p, x, y, epoch);
}

double UnfusedEpochs::prepared_epoch(Particle& p, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch) {
  auto rows = algorithm_.epoch_rows(p, x.size(0));  // a subclass's hook: its rows are combined on the host
  if (rows.defined()) rows = rows.to(torch::kCPU);
  Replica* r = state_.data_parallel ? state_.data_parallel->replica(p.pid()) : nullptr;
  if (r) {  // this rank's share of the rows, drawn anew each epoch (the same draw on every rank)
    auto all = rows.defined() ? rows : torch::arange(x.size(0), torch::kLong);
    auto order = torch::randperm(all.size(0),
                                 training_.generator(static_cast<uint64_t>(p.pid()), static_cast<uint64_t>(epoch),
                                                     push::detail::seed_purpose::kShard),
                                 torch::kLong);
    rows = r->shard(all.index_select(0, order));
    const int64_t batches = (rows.size(0) + state_.options.batch_size() - 1) / state_.options.batch_size();
    r->begin_epoch(p, state_.fit_last_epoch - epoch, batches, state_.fit_calls);
  }
  const StepHooks hooks = algorithm_.epoch_hooks(p, epoch);
  if (rows.defined()) rows = rows.to(x.device());  // drawn on the host, the data is on the lane's device
  const double loss = rows.defined() ? train(p, x.index_select(0, rows), y.index_select(0, rows), epoch, hooks)
                                     : train(p, x, y, epoch, hooks);
  if (r) {
    const int diverged = r->end_epoch(loss);
    PUSH_CHECK(diverged == 0, "push::bayes::Infer::fit", algorithm_.name(), ": the training loss of particle ", p.pid(),
               " is non-finite in epoch ", epoch + 1, " on ", diverged, " of ", r->ranks(),
               " ranks: training diverged; lower the learning rate or check the data for huge values");
    training_.check_finite(p, epoch);
  }
  algorithm_.finish_epoch(p, epoch);
  return loss;
}

double UnfusedEpochs::train(Particle& p, const torch::Tensor& x, const torch::Tensor& y, int64_t epoch,
                            const StepHooks& hooks) {
  Replica* r = state_.data_parallel ? state_.data_parallel->replica(p.pid()) : nullptr;
  const int64_t n = x.size(0), bs = state_.options.batch_size();
  auto order = training_.epoch_order(p.pid(), epoch, n).to(x.device());
  double total = 0;
  int64_t batches = 0;
  for (int64_t b = 0; b < n; b += bs, ++batches) {
    auto idx = order.narrow(0, b, std::min(bs, n - b));
    // The epoch message brought the data to the lane's device; the .to() is for a caller that did not.
    const double loss = step(p, x.index_select(0, idx).to(p.device()), y.index_select(0, idx).to(p.device()), hooks);
    if (r) {
      r->note_loss(loss);  // every rank learns of it at the epoch's end (a rank alone would leave the others waiting)
    } else {
      training_.check_finite(p, epoch, loss);
    }
    total += loss;
    if (hooks.after_step) hooks.after_step();
  }
  // Data-parallel: checked after the epoch's end has made every rank's parameters equal.
  if (!r) training_.check_finite(p, epoch);
  return total / static_cast<double>(batches);
}

double UnfusedEpochs::step(Particle& p, const torch::Tensor& x, const torch::Tensor& y, const StepHooks& hooks) {
  auto& opt = p.optimizer();
  Replica* r = state_.data_parallel ? state_.data_parallel->replica(p.pid()) : nullptr;
  if (r) r->before_forward();
  opt.zero_grad();
  auto nll = state_.objective.mean_nll(p.any_module().forward(x), y);
  auto loss = nll + state_.objective.neg_log_prior(p.module()) / static_cast<double>(state_.dataset_size);
  loss.backward();
  std::function<void()> plain;  // the optimizer's own step, when the hooks do not replace it
  if (!hooks.step) plain = [&opt] { opt.step(); };
  const std::function<void()>& apply = hooks.step ? hooks.step : plain;
  if (r) {
    r->step(p, apply);
  } else {
    apply();
  }
  return nll.item<double>();
}

}  // namespace push::bayes::detail
