#pragma once
// Whether SG-MCMC chains have mixed: the split-R̂ of Gelman et al. (Bayesian Data
// Analysis, 3rd ed., §11.4) over the chains' predictions. Each chain's samples are split in
// halves; R̂ = sqrt(((n - 1)/n W + B/n) / W), W the mean variance within the half-chains and
// B/n the variance of their means, n samples per half. R̂ near 1: every half-chain has seen
// the same spread of predictions; well above 1: the chains (or a chain's two halves) sit in
// different places, so their pooled samples are not yet draws from one distribution.
//
// The two causes call for different things. A chain whose halves differ is still moving
// (a burn-in too short): `drift` is the same R̂ with B/n taken between each chain's own two
// halves only (the mean over chains of (m₁ - m₂)² / 2), which stays near 1 for chains that
// are each stationary wherever they sit. Chains that are each stationary but apart sit in
// different modes, as a network's chains usually do (like an ensemble's members): the
// split-R̂ is above 1 and drift is not.
//
//   auto pred = chains.predict(test.x);            // members: chains x samples, in order
//   if (auto m = push::bayes::chain_mixing(pred, 8)) std::printf("%.2f\n", m->drift_median);
#include <push/bayes/predictive.h>

#include <cstdint>
#include <optional>

namespace push::bayes {

/// R̂ at or below this: mixed (Gelman et al.'s customary 1.1).
constexpr double kMixedRhat = 1.1;

struct ChainMixing {
  /// Split-R̂ of every predicted value (each point and output: regression means, class
  /// probabilities): their median and maximum, and the fraction above kMixedRhat.
  double rhat_median = 1, rhat_max = 1, above = 0;
  /// The same for the chains' drift (above): their median and maximum.
  double drift_median = 1, drift_max = 1;
  int64_t values = 0;             // predicted values judged
  int64_t samples_per_chain = 0;  // the even number of samples used, the oldest dropped if odd
};

/// The chains' mixing on `pred`, whose members are `chains` equal blocks of samples, each
/// oldest first (SGMCMC::predict). A value some sample predicts as NaN or ±inf counts as
/// not mixed (R̂ infinite). None with fewer than 2 chains or 4 samples per chain.
std::optional<ChainMixing> chain_mixing(const Predictive& pred, int64_t chains);

}  // namespace push::bayes
