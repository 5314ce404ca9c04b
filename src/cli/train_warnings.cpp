// push train's warnings about members that trained badly.
#include "train_warnings.h"

#include <push/core/errors.h>

#include <cstdio>
#include <string>

namespace push::cli {
namespace {

/// Lines printed before "... and N more".
constexpr size_t kShown = 5;

std::string decimal(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.4g", v);
  return text;
}

/// The warning's line with its likely cause. A loss that rose: the learning rate the
/// particle trained at. Poor predictions from a particle whose loss ended at (or within
/// kNearBest of) its best: it had not learned enough (too few epochs, or a rate too small
/// to move it), never "too high".
std::string line(const TrainConfig& c, const bayes::Infer& infer, const bayes::MemberWarning& w) {
  constexpr double kNearBest = 0.1;  // nats per point: epoch-to-epoch noise, not a divergence
  const auto seen = infer.particle_losses().find(w.particle);
  const bool known = seen != infer.particle_losses().end();
  const bool still_falling = known && seen->second.best_epoch == seen->second.last_epoch;
  const bool near_best = known && seen->second.last - seen->second.best <= kNearBest;
  if (w.kind == bayes::MemberWarning::Kind::worse_than_mean && (still_falling || near_best)) {
    const std::string rate =
        c.lr < 1e-3 ? ", or a larger --lr than " + decimal(c.lr) : ", or a smaller --lr if it began far off";
    return w.describe() + "; its training loss " +
           (still_falling ? "was still falling" : "ended within " + decimal(kNearBest) + " of its best") +
           ": it likely needs more --epochs than " + std::to_string(infer.epochs_done()) + rate;
  }
  if (w.kind == bayes::MemberWarning::Kind::miscalibrated) {
    if (w.measure == "too narrow") {
      return w.describe() + ": it is overconfident; " +
             (c.likelihood == bayes::Likelihood::gaussian
                  ? "--noise-std " + decimal(c.noise_std) + " is likely too small"
                  : "the members likely overfit (fewer --epochs)");
    }
    if (is_sgmcmc(c.algo)) {
      // Chains step without Adam's scaling: their noise heads fit slowly (plain SGLD on
      // sine-gap sits near the threshold), not because the step is too large.
      return w.describe() + ": the chains likely fit slowly; more --epochs than " +
             std::to_string(infer.epochs_done()) +
             (c.algo == Algo::sgld && !c.preconditioned.value_or(false) ? ", or pSGLD (without --no-preconditioned)"
                                                                        : std::string());
    }
    return w.describe() + ": the members likely trained badly; the learning rate (--lr " + decimal(c.lr) +
           ") may be too high, or --epochs " + std::to_string(infer.epochs_done()) + " too few";
  }
  std::string rate = "--lr " + decimal(c.lr);
  if (c.algo == Algo::mswag)
    rate += ", --swag-lr " + decimal(c.swag_lr > 0 ? c.swag_lr : c.lr * 0.1) + " while collecting";
  return w.describe() + "; the learning rate (" + rate + ") is likely too high";
}

}  // namespace

std::vector<bayes::MemberWarning> member_warnings(const TrainConfig& c, const bayes::Infer& infer,
                                                  const bayes::Predictive& pred, const TrainData& d) {
  // A chain samples: its loss wanders above its best by design (at T = 1 by about half a
  // nat per parameter over N), so only its predictions are judged.
  auto found = is_sgmcmc(c.algo) ? std::vector<bayes::MemberWarning>{} : bayes::loss_warnings(infer.particle_losses());
  // A particle that has trained no epoch (--epochs 0 on new particles) is not judged: its
  // predictions are its initialisation's.
  for (auto& w : bayes::prediction_warnings(pred, d.test, d.train, c.particles)) {
    if (infer.particle_losses().count(w.particle) != 0) found.push_back(std::move(w));
  }
  if (!infer.particle_losses().empty()) {
    for (auto& w : bayes::calibration_warnings(pred, d.test)) found.push_back(std::move(w));
  }
  return found;
}

void report_warnings(const TrainConfig& c, const bayes::Infer& infer,
                     const std::vector<bayes::MemberWarning>& warnings) {
  if (warnings.empty()) return;
  const std::string more = warnings.size() > 2   ? " (and " + std::to_string(warnings.size() - 1) + " more warnings)"
                           : warnings.size() > 1 ? std::string(" (and 1 more warning)")
                                                 : std::string();
  PUSH_CHECK(!c.strict, "push train", "--strict: ", line(c, infer, warnings.front()), more, "; nothing was written");
  for (size_t i = 0; i < warnings.size() && i < kShown; ++i) {
    std::fprintf(stderr, "push train: warning: %s\n", line(c, infer, warnings[i]).c_str());
  }
  if (warnings.size() > kShown) {
    std::fprintf(stderr, "push train: warning: and %zu more (metrics.json lists every warning)\n",
                 warnings.size() - kShown);
  }
}

nlohmann::ordered_json warnings_json(const TrainConfig& c, const bayes::Infer& infer,
                                     const std::vector<bayes::MemberWarning>& warnings) {
  auto out = nlohmann::ordered_json::array();
  for (const auto& w : warnings) {
    nlohmann::ordered_json one = {
        {"particle",
         w.particle == bayes::kWholePredictive ? nlohmann::ordered_json() : nlohmann::ordered_json(w.particle)},
        {"kind", bayes::to_string(w.kind)},
        {"value", w.value},
        {"reference", w.reference}};
    if (w.kind == bayes::MemberWarning::Kind::loss_rose) {
      one["epoch"] = w.epoch;
      one["best_epoch"] = w.best_epoch;
    }
    one["message"] = line(c, infer, w);
    out.push_back(std::move(one));
  }
  return out;
}

std::optional<bayes::ChainMixing> report_mixing(const TrainConfig& c, const bayes::Predictive& pred) {
  if (!is_sgmcmc(c.algo)) return std::nullopt;
  auto m = bayes::chain_mixing(pred, c.particles);
  if (m && m->drift_median > bayes::kMixedRhat && c.cycles == 0 && m->samples_per_chain >= kHintSamples) {
    std::fprintf(stderr,
                 "push train: hint: the chains were still moving while they kept samples: the two halves of each "
                 "chain's test predictions differ (drift R-hat median %s, max %s; %s or less for a stationary "
                 "chain), so their samples are not yet draws from the posterior: a longer --burn-in, more --epochs "
                 "or a larger --lr (the step size)\n",
                 decimal(m->drift_median).c_str(), decimal(m->drift_max).c_str(), decimal(bayes::kMixedRhat).c_str());
  }
  return m;
}

nlohmann::ordered_json mixing_json(const bayes::ChainMixing& m) {
  return {{"rhat_median", m.rhat_median},
          {"rhat_max", m.rhat_max},
          {"above_1.1", m.above},
          {"drift_median", m.drift_median},
          {"drift_max", m.drift_max},
          {"values", m.values},
          {"samples_per_chain", m.samples_per_chain},
          {"stationary", m.drift_median <= bayes::kMixedRhat},
          {"chains_agree", m.rhat_median <= bayes::kMixedRhat}};
}

nlohmann::ordered_json particle_losses_json(const bayes::Infer& infer) {
  auto out = nlohmann::ordered_json::array();
  for (const auto& [pid, l] : infer.particle_losses()) {
    out.push_back({{"particle", pid},
                   {"best", l.best},
                   {"best_epoch", l.best_epoch},
                   {"last", l.last},
                   {"last_epoch", l.last_epoch}});
  }
  return out;
}

}  // namespace push::cli
