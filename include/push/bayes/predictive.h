#pragma once
// A predictive distribution from the members' raw outputs: the uniform mixture of the
// particles (and of their samples, for SWAG and MC dropout).
//
//   push::bayes::Predictive p = push::bayes::make_predictive(outputs, Likelihood::heteroscedastic, 1.0);
//   p.mean; p.variance;   // regression: [M, targets]; p.probs for classification
#include <push/bayes/options.h>
#include <push/data/dataset.h>

#include <torch/types.h>

namespace push::bayes {

using data::Task;

/// A predictive distribution on M points.
struct Predictive {
  Task task = Task::regression;
  /// Regression: [M, targets]. variance = aleatoric + epistemic (law of total variance
  /// over the members); aleatoric = the members' mean noise variance.
  torch::Tensor mean, variance, aleatoric;
  /// Classification: [M, classes], the members' mean softmax.
  torch::Tensor probs;
  /// Each member's prediction (regression means or class probabilities): [S, M, ·].
  torch::Tensor members;
};

/// A regression / classification predictive distribution from raw member outputs
/// [S, M, out] under `likelihood` (noise_std for the gaussian one; learned_noise outputs
/// are [means, log γ] as the particles' forward returns them).
Predictive make_predictive(const torch::Tensor& outputs, Likelihood likelihood, double noise_std);

}  // namespace push::bayes
