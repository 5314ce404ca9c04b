#pragma once
// push train's word on members that trained badly with finite numbers (push/bayes/warnings.h):
// one line each on stderr naming the particle and the likely cause, the list in
// metrics.json, and with --strict an error instead.
#include <push/bayes.h>

#include <nlohmann/json.hpp>

#include <optional>
#include <vector>

#include "train_config.h"
#include "train_data.h"

namespace push::cli {

/// The particles whose training loss ended far above its best, then those whose test
/// predictions are worse than the training mean's (among those that trained an epoch),
/// then a regression predictive whose intervals are far too wide or narrow for its test
/// errors (bayes::calibration_warnings; once any particle has trained).
std::vector<bayes::MemberWarning> member_warnings(const TrainConfig& c, const bayes::Infer& infer,
                                                  const bayes::Predictive& pred, const TrainData& d);

/// Prints each warning (at most a few, then how many more) with its likely cause: the
/// learning rate, or too few epochs for a particle whose loss was still falling. With
/// --strict throws push::Error instead, naming the first and the count.
void report_warnings(const TrainConfig& c, const bayes::Infer& infer,
                     const std::vector<bayes::MemberWarning>& warnings);

/// metrics.json's "warnings": each warning's particle, kind, figures and line.
nlohmann::ordered_json warnings_json(const TrainConfig& c, const bayes::Infer& infer,
                                     const std::vector<bayes::MemberWarning>& warnings);

/// sgld, sghmc: the chains' split-R̂ and drift on the test predictions (bayes::chain_mixing),
/// with a hint on stderr when the drift's median exceeds bayes::kMixedRhat: the chains were
/// still moving while they kept samples. Chains that are each stationary but apart (a
/// network's modes) get no hint; nor do runs with --cycles (a chain's halves come from
/// cycles that are meant to land apart) or with fewer than kHintSamples samples per chain
/// (too few to tell). A hint, not a warning: --strict does not fail on it. None for other
/// algorithms or too few samples.
std::optional<bayes::ChainMixing> report_mixing(const TrainConfig& c, const bayes::Predictive& pred);
/// report_mixing's hint needs this many samples per chain (8 in each half).
constexpr int64_t kHintSamples = 16;

/// metrics.json's "mixing": report_mixing's figures.
nlohmann::ordered_json mixing_json(const bayes::ChainMixing& m);

/// metrics.json's "particle_losses": each particle's best and last epoch loss.
nlohmann::ordered_json particle_losses_json(const bayes::Infer& infer);

}  // namespace push::cli
