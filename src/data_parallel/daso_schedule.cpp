// DASO's schedule (heat's DASO.step and epoch_loss_logic, without the node-local skips):
// which batches start a global sync, which wait for it, and which receive a late one.
#include <push/data_parallel/daso_schedule.h>

#include <push/core/errors.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace push::data_parallel {
namespace {
constexpr const char* kDasoSchedule = "push::data_parallel::DasoSchedule";
}

DasoSchedule::DasoSchedule(DasoOptions options)
    : options_(std::move(options)), best_(std::numeric_limits<double>::infinity()) {
  const auto& o = options_;
  PUSH_CHECK(o.total_epochs() > 0, kDasoSchedule, "total_epochs must be positive, got ", o.total_epochs());
  PUSH_CHECK(o.warmup_epochs() >= 0 && o.cooldown_epochs() >= 0, kDasoSchedule,
             "warmup_epochs and cooldown_epochs must not be negative, got ", o.warmup_epochs(), " and ",
             o.cooldown_epochs());
  PUSH_CHECK(o.max_global_skips() >= 1, kDasoSchedule, "max_global_skips must be at least 1, got ",
             o.max_global_skips());
  PUSH_CHECK(o.skip_reduction_factor() >= 1 && o.local_skip_factor() >= 1, kDasoSchedule,
             "skip_reduction_factor and local_skip_factor must be at least 1, got ", o.skip_reduction_factor(), " and ",
             o.local_skip_factor());
  PUSH_CHECK(o.stability_level() >= 0 && o.stability_level() < 1, kDasoSchedule,
             "stability_level must be in [0, 1), got ", o.stability_level());
  PUSH_CHECK(o.stability_patience() >= 0, kDasoSchedule, "stability_patience must not be negative, got ",
             o.stability_patience());
  PUSH_CHECK(o.ranks_per_node() >= 0, kDasoSchedule, "ranks_per_node must not be negative, got ", o.ranks_per_node());
  PUSH_CHECK(o.downcast() == torch::kBFloat16 || o.downcast() == torch::kHalf || o.downcast() == torch::kFloat,
             kDasoSchedule, "downcast must be bfloat16, half or float, got ", c10::toString(o.downcast()));
  if (o.warmup_epochs() == 0) start_cycling();
}

void DasoSchedule::start_cycling() {
  cycling_ = true;
  global_skip_ = std::min<int64_t>(4, options_.max_global_skips());
  batches_to_wait_ = 1;
}

void DasoSchedule::set_batches_per_epoch(int64_t batches) {
  PUSH_CHECK(batches >= 1, kDasoSchedule, "an epoch needs at least one batch, got ", batches);
  PUSH_CHECK(batch_ == 0, kDasoSchedule, "the batches per epoch change between epochs, not at batch ", batch_);
  batches_ = batches;
}

DasoStep DasoSchedule::next() {
  PUSH_CHECK(batches_ > 0, kDasoSchedule, "set_batches_per_epoch before the first step");
  PUSH_CHECK(batch_ > 0 || epoch_ == 0 || epoch_ended_, kDasoSchedule, "end_epoch was not called after epoch ", epoch_,
             "'s last batch");
  const int64_t last = batches_ - 1, b = batch_;
  const int64_t gs = global_skip_;
  const bool sending = b == last || gs == 0 || b % gs == 0;
  DasoStep s;
  // A late sync is received when due, and at the latest before the next one is sent.
  if (outstanding_ && (b == receive_at_ || sending)) {
    s.receive = true;
    s.waited = b - sent_at_;
    outstanding_ = false;
  }
  if (sending) {
    s.send = true;
    // It must be received within the epoch.
    const int64_t wait = std::min(batches_to_wait_, last - b);
    if (wait <= 0) {
      s.blocking = true;
    } else {
      s.wait = wait;
      outstanding_ = true;
      sent_at_ = b;
      receive_at_ = b + wait;
    }
  }
  if (++batch_ == batches_) {
    batch_ = 0;
    ++epoch_;
    epoch_ended_ = false;
  }
  return s;
}

void DasoSchedule::end_epoch(double mean_loss) {
  PUSH_CHECK(batch_ == 0 && epoch_ > 0 && !epoch_ended_, kDasoSchedule,
             "end_epoch belongs after an epoch's last step, once (at batch ", batch_, " of epoch ", epoch_, ")");
  PUSH_CHECK(std::isfinite(mean_loss), kDasoSchedule, "the epoch loss is ", mean_loss,
             ": training diverged, and its stability cannot be judged");
  epoch_ended_ = true;
  const auto& o = options_;
  if (epoch_ < o.warmup_epochs()) {
    global_skip_ = batches_to_wait_ = 0;
    return;
  }
  if (!cycling_) start_cycling();
  if (epoch_ >= o.total_epochs() - o.cooldown_epochs()) {
    global_skip_ = batches_to_wait_ = 0;
    return;
  }
  // The plateau test: the loss counts as stable after more than `patience` epochs without
  // a relative improvement of stability_level over the best so far.
  const double threshold = best_ >= 0 ? best_ * (1 - o.stability_level()) : best_ * (1 + o.stability_level());
  if (mean_loss < threshold) {
    best_ = mean_loss;
    bad_epochs_ = 0;
  } else {
    ++bad_epochs_;
  }
  const bool stable = bad_epochs_ > o.stability_patience();
  if (stable) bad_epochs_ = 0;
  // Neither ever reaches 0 here (heat's can, with some options, and then stays blocking).
  if (stable && global_skip_ > 1) {
    global_skip_ = std::max<int64_t>(1, global_skip_ / o.skip_reduction_factor());
    batches_to_wait_ = std::max<int64_t>(1, batches_to_wait_ - 1);
  } else if (stable && global_skip_ == 1) {
    global_skip_ = o.max_global_skips();
    batches_to_wait_ = std::max<int64_t>(1, o.max_global_skips() / o.local_skip_factor());
  }
}

}  // namespace push::data_parallel
