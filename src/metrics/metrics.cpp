// Regression and classification metrics of predictive distributions.
#include <push/core/errors.h>
#include <push/metrics/metrics.h>

#include <torch/torch.h>

#include <cmath>
#include <numbers>

namespace push::metrics {
namespace {

void check_probs(const torch::Tensor& probs, const torch::Tensor& labels, const char* origin) {
  PUSH_CHECK(probs.dim() == 2 && labels.dim() == 1 && probs.size(0) == labels.size(0) && probs.size(0) > 0, origin,
             "expected probs [N, C] and labels [N] with N > 0, got ", probs.sizes(), " and ", labels.sizes());
}

// Every metric works on host float64 copies: predictions may come from any device
// (reliability_bins reads raw pointers) and the targets usually live on the host.
torch::Tensor host(const torch::Tensor& t) { return t.to(torch::kCPU, torch::kFloat64); }
torch::Tensor host_labels(const torch::Tensor& t) { return t.to(torch::kCPU, torch::kLong); }

double ece_of(const std::vector<ReliabilityBin>& bins, int64_t points) {
  double total = 0;
  for (const auto& b : bins) {
    total += static_cast<double>(b.count) / static_cast<double>(points) * std::abs(b.accuracy - b.confidence);
  }
  return total;
}

}  // namespace

double rmse(const torch::Tensor& mean, const torch::Tensor& y) {
  PUSH_CHECK(mean.sizes() == y.sizes(), "push::metrics::rmse", "mean ", mean.sizes(), " vs y ", y.sizes());
  return torch::sqrt((host(mean) - host(y)).pow(2).mean()).item<double>();
}

double gaussian_nll(const torch::Tensor& mean, const torch::Tensor& variance, const torch::Tensor& y) {
  PUSH_CHECK(mean.sizes() == y.sizes() && variance.sizes() == y.sizes(), "push::metrics::gaussian_nll", "mean ",
             mean.sizes(), ", variance ", variance.sizes(), " and y ", y.sizes(), " differ");
  auto m = host(mean), v = host(variance), t = host(y);
  auto per = 0.5 * (torch::log(2 * std::numbers::pi * v) + (t - m).pow(2) / v);
  if (per.dim() > 1) per = per.flatten(1).sum(1);
  return per.mean().item<double>();
}

RegressionMetrics regression(const torch::Tensor& mean, const torch::Tensor& variance, const torch::Tensor& y) {
  return {rmse(mean, y), gaussian_nll(mean, variance, y)};
}

double accuracy(const torch::Tensor& probs, const torch::Tensor& labels) {
  check_probs(probs, labels, "push::metrics::accuracy");
  return host(probs).argmax(1).eq(host_labels(labels)).to(torch::kFloat64).mean().item<double>();
}

double nll(const torch::Tensor& probs, const torch::Tensor& labels) {
  check_probs(probs, labels, "push::metrics::nll");
  auto p = host(probs).gather(1, host_labels(labels).unsqueeze(1)).squeeze(1);
  return -torch::log(torch::clamp_min(p, 1e-12)).mean().item<double>();
}

double brier(const torch::Tensor& probs, const torch::Tensor& labels) {
  check_probs(probs, labels, "push::metrics::brier");
  auto onehot = torch::one_hot(host_labels(labels), probs.size(1)).to(torch::kFloat64);
  return (host(probs) - onehot).pow(2).sum(1).mean().item<double>();
}

std::vector<ReliabilityBin> reliability_bins(const torch::Tensor& probs, const torch::Tensor& labels, int bins) {
  check_probs(probs, labels, "push::metrics::reliability_bins");
  PUSH_CHECK(bins >= 1, "push::metrics::reliability_bins", "bins must be >= 1, got ", bins);
  auto [conf_t, pred_t] = host(probs).max(1);
  auto correct_t = pred_t.eq(host_labels(labels)).to(torch::kFloat64).contiguous();
  conf_t = conf_t.contiguous();
  const double* conf = conf_t.data_ptr<double>();
  const double* correct = correct_t.data_ptr<double>();
  std::vector<ReliabilityBin> out(bins);
  for (int b = 0; b < bins; ++b) {
    out[b].lower = static_cast<double>(b) / bins;
    out[b].upper = static_cast<double>(b + 1) / bins;
  }
  for (int64_t i = 0; i < conf_t.numel(); ++i) {
    // Bin b holds (b/B, (b+1)/B]; confidence 0 goes to the first bin.
    int b = static_cast<int>(std::ceil(conf[i] * bins)) - 1;
    b = std::clamp(b, 0, bins - 1);
    out[b].count += 1;
    out[b].accuracy += correct[i];
    out[b].confidence += conf[i];
  }
  for (auto& bin : out) {
    if (bin.count > 0) {
      bin.accuracy /= static_cast<double>(bin.count);
      bin.confidence /= static_cast<double>(bin.count);
    }
  }
  return out;
}

double ece(const torch::Tensor& probs, const torch::Tensor& labels, int bins) {
  return ece_of(reliability_bins(probs, labels, bins), probs.size(0));
}

ClassificationMetrics classification(const torch::Tensor& probs, const torch::Tensor& labels, int bins) {
  ClassificationMetrics m;
  m.accuracy = accuracy(probs, labels);
  m.nll = nll(probs, labels);
  m.brier = brier(probs, labels);
  m.bins = reliability_bins(probs, labels, bins);
  m.ece = ece_of(m.bins, probs.size(0));
  return m;
}

}  // namespace push::metrics
