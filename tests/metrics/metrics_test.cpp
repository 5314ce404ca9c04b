// Metrics against values computed by hand.
#include <push/core/errors.h>
#include <push/metrics/metrics.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <numbers>

namespace push::metrics {
namespace {

torch::Tensor t(std::vector<double> v) { return torch::tensor(v, torch::kFloat64); }

TEST(Metrics, RegressionByHand) {
  auto mean = t({1, 2}), var = t({1, 4}), y = t({2, 0});
  EXPECT_NEAR(rmse(mean, y), std::sqrt(2.5), 1e-12);
  // 0.5 (log 2π·1 + 1/1) and 0.5 (log 2π·4 + 4/4)
  const double nll1 = 0.5 * (std::log(2 * std::numbers::pi) + 1);
  const double nll2 = 0.5 * (std::log(8 * std::numbers::pi) + 1);
  EXPECT_NEAR(gaussian_nll(mean, var, y), (nll1 + nll2) / 2, 1e-12);
  // Two outputs per point: the per-point NLL sums over outputs.
  EXPECT_NEAR(gaussian_nll(mean.view({1, 2}), var.view({1, 2}), y.view({1, 2})), nll1 + nll2, 1e-12);
  auto r = regression(mean, var, y);
  EXPECT_DOUBLE_EQ(r.rmse, rmse(mean, y));
}

TEST(Metrics, ClassificationByHand) {
  auto probs = torch::tensor({0.9, 0.1, 0.6, 0.4, 0.3, 0.7, 0.2, 0.8}, torch::kFloat64).view({4, 2});
  auto labels = torch::tensor({0, 1, 1, 1}, torch::kLong);
  EXPECT_DOUBLE_EQ(accuracy(probs, labels), 0.75);
  EXPECT_NEAR(nll(probs, labels), -(std::log(0.9) + std::log(0.4) + std::log(0.7) + std::log(0.8)) / 4, 1e-12);
  // (0.1² + 0.1²) + (0.6² + 0.6²) + (0.3² + 0.3²) + (0.2² + 0.2²) = 1.0 over 4 points.
  EXPECT_NEAR(brier(probs, labels), 0.25, 1e-12);
  // Each point alone in its bin: mean of |correct - confidence|.
  EXPECT_NEAR(ece(probs, labels), (0.1 + 0.6 + 0.3 + 0.2) / 4, 1e-12);
}

TEST(Metrics, EceAndReliabilityBinsShareBins) {
  auto probs = torch::tensor({0.95, 0.05, 0.03, 0.97, 0.55, 0.45}, torch::kFloat64).view({3, 2});
  auto labels = torch::tensor({0, 0, 0}, torch::kLong);
  // Bin (14/15, 1]: 0.95 right and 0.97 wrong -> acc 0.5, conf 0.96. Bin (8/15, 9/15]: 0.55 right.
  EXPECT_NEAR(ece(probs, labels), 2.0 / 3 * 0.46 + 1.0 / 3 * 0.45, 1e-12);
  auto bins = reliability_bins(probs, labels);
  ASSERT_EQ(bins.size(), 15u);
  EXPECT_EQ(bins[14].count, 2);
  EXPECT_NEAR(bins[14].accuracy, 0.5, 1e-12);
  EXPECT_NEAR(bins[14].confidence, 0.96, 1e-12);
  EXPECT_EQ(bins[8].count, 1);
  EXPECT_NEAR(bins[8].lower, 8.0 / 15, 1e-12);
  int64_t total = 0;
  for (const auto& b : bins) total += b.count;
  EXPECT_EQ(total, 3);
  auto all = classification(probs, labels);
  EXPECT_NEAR(all.ece, ece(probs, labels), 1e-12);
  EXPECT_NEAR(all.accuracy, 2.0 / 3, 1e-12);
}

TEST(Metrics, PerfectConfidentPredictionsScoreZero) {
  auto probs = torch::eye(3, torch::kFloat64);
  auto labels = torch::tensor({0, 1, 2}, torch::kLong);
  EXPECT_DOUBLE_EQ(brier(probs, labels), 0.0);
  EXPECT_DOUBLE_EQ(ece(probs, labels), 0.0);
  EXPECT_NEAR(nll(probs, labels), 0.0, 1e-12);
}

// Predictions from a GPU lane, targets on the host: every metric (reliability_bins reads
// raw pointers) gives the host's numbers.
TEST(Metrics, PredictionsOnTheGpu_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto probs = torch::tensor({0.95, 0.05, 0.03, 0.97, 0.55, 0.45}, torch::kFloat64).view({3, 2});
  auto labels = torch::tensor({0, 0, 0}, torch::kLong);
  auto gpu = probs.to(torch::kCUDA).to(torch::kFloat32);
  auto host = classification(probs, labels), device = classification(gpu, labels);
  EXPECT_NEAR(device.ece, host.ece, 1e-6);
  EXPECT_NEAR(device.nll, host.nll, 1e-6);
  EXPECT_NEAR(device.brier, host.brier, 1e-6);
  EXPECT_DOUBLE_EQ(device.accuracy, host.accuracy);
  ASSERT_EQ(device.bins.size(), host.bins.size());
  for (size_t b = 0; b < host.bins.size(); ++b) EXPECT_EQ(device.bins[b].count, host.bins[b].count) << "bin " << b;
  EXPECT_EQ(reliability_bins(gpu, labels.to(torch::kCUDA))[14].count, 2);
  auto mean = t({1, 2}), var = t({1, 4}), y = t({2, 0});
  auto r = regression(mean.to(torch::kCUDA), var.to(torch::kCUDA), y);
  EXPECT_NEAR(r.rmse, rmse(mean, y), 1e-12);
  EXPECT_NEAR(r.nll, gaussian_nll(mean, var, y), 1e-12);
}

TEST(Metrics, ShapeMismatchNamesTheShapes) {
  try {
    accuracy(torch::rand({3, 2}), torch::zeros({4}, torch::kLong));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[3, 2]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace push::metrics
