#pragma once
// Metrics of a predictive distribution.
//
//   auto r = push::metrics::regression(mean, variance, y);   // RMSE, Gaussian NLL
//   auto c = push::metrics::classification(probs, labels);    // acc, NLL, Brier, ECE
//   for (auto& b : c.bins) ...                                // reliability diagram
//
// Regression metrics are per point and in the units of the values passed in: pass
// de-standardised means, variances and targets to report in original units.
#include <torch/types.h>

#include <vector>

namespace push::metrics {

/// sqrt(mean((mean - y)^2)) over every point and output.
double rmse(const torch::Tensor& mean, const torch::Tensor& y);
/// Mean over points of -log N(y; mean, variance), summed over outputs.
double gaussian_nll(const torch::Tensor& mean, const torch::Tensor& variance, const torch::Tensor& y);

struct RegressionMetrics {
  double rmse = 0, nll = 0;
};
RegressionMetrics regression(const torch::Tensor& mean, const torch::Tensor& variance, const torch::Tensor& y);

/// One bin of a reliability diagram: predictions whose confidence (top probability)
/// lies in (lower, upper] (the first bin also takes 0).
struct ReliabilityBin {
  double lower = 0, upper = 0;
  int64_t count = 0;
  double accuracy = 0, confidence = 0;  // means over the bin; 0 when empty
};

double accuracy(const torch::Tensor& probs, const torch::Tensor& labels);
/// Mean of -log p(label), with p clamped at 1e-12.
double nll(const torch::Tensor& probs, const torch::Tensor& labels);
/// Mean over points of sum_c (p_c - [c == label])^2.
double brier(const torch::Tensor& probs, const torch::Tensor& labels);
std::vector<ReliabilityBin> reliability_bins(const torch::Tensor& probs, const torch::Tensor& labels, int bins = 15);
/// Expected calibration error: sum_b (n_b / N) |accuracy_b - confidence_b|, equal-width bins.
double ece(const torch::Tensor& probs, const torch::Tensor& labels, int bins = 15);

struct ClassificationMetrics {
  double accuracy = 0, nll = 0, brier = 0, ece = 0;
  std::vector<ReliabilityBin> bins;
};
ClassificationMetrics classification(const torch::Tensor& probs, const torch::Tensor& labels, int bins = 15);

}  // namespace push::metrics
