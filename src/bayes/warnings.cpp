// Members that trained badly with finite numbers: the rules of push/bayes/warnings.h.
#include <push/bayes/warnings.h>
#include <push/core/errors.h>

#include <c10/util/StringUtil.h>

#include <cmath>
#include <cstdio>
#include <limits>

namespace push::bayes {
namespace {

constexpr const char* kWarningsOrigin = "push::bayes::prediction_warnings";

/// Each particle's own prediction: the mean of its samples, [P, M, ·] in float64.
torch::Tensor per_particle(const torch::Tensor& members, int64_t particles) {
  PUSH_CHECK(members.defined() && members.dim() == 3, kWarningsOrigin, "the predictive has no members [S, M, ·]");
  PUSH_CHECK(particles > 0 && members.size(0) % particles == 0, kWarningsOrigin, "the predictive's ", members.size(0),
             " members are not an equal number of samples of ", particles, " particles");
  const auto m = members.detach().to(torch::kCPU, torch::kFloat64);
  return m.reshape({particles, members.size(0) / particles, members.size(1), members.size(2)}).mean(1);
}

/// Per particle and for the training mean: the mean squared error on test, standardised units.
std::pair<torch::Tensor, double> regression_errors(const torch::Tensor& means, const data::Dataset& test,
                                                   const data::Dataset& train) {
  auto y = test.y.to(torch::kCPU, torch::kFloat64);
  if (y.dim() == 1) y = y.unsqueeze(1);
  auto train_y = train.y.to(torch::kCPU, torch::kFloat64);
  if (train_y.dim() == 1) train_y = train_y.unsqueeze(1);
  PUSH_CHECK(means.size(1) == y.size(0) && means.size(2) == y.size(1), kWarningsOrigin, "the predictive is for ",
             means.size(1), " points of ", means.size(2), " targets, the test set has ", y.size(0), " of ", y.size(1));
  const auto errors = (means - y.unsqueeze(0)).pow(2).mean({1, 2});
  const double baseline = (y - train_y.mean(0, true)).pow(2).mean().item<double>();
  return {errors, baseline};
}

/// Per particle and for the training set's class frequencies: the nll per test point.
std::pair<torch::Tensor, double> classification_errors(const torch::Tensor& probs, const data::Dataset& test,
                                                       const data::Dataset& train) {
  const auto y = test.y.to(torch::kCPU, torch::kLong);
  const int64_t classes = probs.size(2);
  PUSH_CHECK(probs.size(1) == y.size(0), kWarningsOrigin, "the predictive is for ", probs.size(1),
             " points, the test set has ", y.size(0));
  PUSH_CHECK(y.numel() == 0 || (y.min().item<int64_t>() >= 0 && y.max().item<int64_t>() < classes), kWarningsOrigin,
             "a test label is outside the predictive's ", classes, " classes");
  // Frequencies with half a count added, so that a class the training set lacks is not log 0.
  auto counts = torch::bincount(train.y.to(torch::kCPU, torch::kLong).reshape(-1), {}, classes)
                    .to(torch::kFloat64)
                    .slice(0, 0, classes);
  const auto freq = (counts + 0.5) / (counts.sum() + 0.5 * static_cast<double>(classes));
  const auto index = y.reshape({1, -1, 1}).expand({probs.size(0), -1, 1});
  const auto errors = -probs.clamp_min(1e-12).log().gather(2, index).squeeze(2).mean(1);
  const double baseline = -freq.index_select(0, y).log().mean().item<double>();
  return {errors, baseline};
}

}  // namespace

const char* to_string(MemberWarning::Kind kind) {
  switch (kind) {
    case MemberWarning::Kind::loss_rose:
      return "loss_rose";
    case MemberWarning::Kind::worse_than_mean:
      return "worse_than_mean";
    case MemberWarning::Kind::miscalibrated:
      return "miscalibrated";
  }
  return "unknown";
}

std::string MemberWarning::describe() const {
  auto g = [](double v) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.4g", v);
    return std::string(text);
  };
  if (kind == Kind::loss_rose) {
    return c10::str("particle ", particle, ": its training loss ended at ", g(value), " in epoch ", epoch,
                    ", far above its best, ", g(reference), " in epoch ", best_epoch);
  }
  if (kind == Kind::miscalibrated) {
    return c10::str("the predictive's intervals are ", measure, " for its test errors: the median |y - mean| / sd is ",
                    g(value), " against ", g(reference), " for a calibrated one");
  }
  return c10::str("particle ", particle, ": its test predictions are worse than ", baseline, ": ", measure, " ",
                  g(value), " against ", g(reference));
}

std::vector<MemberWarning> loss_warnings(const std::map<Pid, ParticleLosses>& losses, double rise) {
  PUSH_CHECK(rise > 0 && std::isfinite(rise), "push::bayes::loss_warnings", "rise must be positive and finite, got ",
             rise);
  std::vector<MemberWarning> out;
  for (const auto& [pid, l] : losses) {
    if (!(l.last - l.best > rise)) continue;
    MemberWarning w;
    w.kind = MemberWarning::Kind::loss_rose;
    w.particle = pid;
    w.value = l.last;
    w.reference = l.best;
    w.epoch = l.last_epoch;
    w.best_epoch = l.best_epoch;
    out.push_back(w);
  }
  return out;
}

std::vector<MemberWarning> prediction_warnings(const Predictive& pred, const data::Dataset& test,
                                               const data::Dataset& train, int64_t particles) {
  PUSH_CHECK(test.task == train.task, kWarningsOrigin, "the test set is ", data::to_string(test.task),
             ", the training set ", data::to_string(train.task));
  PUSH_CHECK(train.size() > 0, kWarningsOrigin, "the training set is empty");
  const bool classify = test.task == data::Task::classification;
  const auto own = per_particle(pred.members, particles);
  const auto [errors, baseline] =
      classify ? classification_errors(own, test, train) : regression_errors(own, test, train);
  std::vector<MemberWarning> out;
  const auto e = errors.contiguous();
  for (int64_t p = 0; p < particles; ++p) {
    const double error = e[p].item<double>();
    // Not finite, or worse: a particle whose error is NaN is named too.
    if (error <= baseline) continue;
    MemberWarning w;
    w.kind = MemberWarning::Kind::worse_than_mean;
    w.particle = p;
    w.value = error;
    w.reference = baseline;
    w.measure = classify ? "nll per point" : "mean squared error (standardised units)";
    w.baseline = classify ? "predicting the training set's class frequencies" : "predicting the training data's mean";
    out.push_back(w);
  }
  return out;
}

std::vector<MemberWarning> calibration_warnings(const Predictive& pred, const data::Dataset& test, double wide,
                                                double narrow) {
  constexpr const char* kOrigin = "push::bayes::calibration_warnings";
  PUSH_CHECK(wide > 1 && std::isfinite(wide) && narrow > 1 && std::isfinite(narrow), kOrigin,
             "wide and narrow must be above 1 and finite, got ", wide, " and ", narrow);
  if (test.task != data::Task::regression || pred.task != data::Task::regression) return {};
  PUSH_CHECK(pred.mean.defined() && pred.variance.defined(), kOrigin, "the predictive has no mean and variance");
  auto y = test.y.to(torch::kCPU, torch::kFloat64);
  if (y.dim() == 1) y = y.unsqueeze(1);
  const auto mean = pred.mean.detach().to(torch::kCPU, torch::kFloat64);
  PUSH_CHECK(mean.sizes() == y.sizes(), kOrigin, "the predictive is for ", mean.sizes(), " values, the test set has ",
             y.sizes());
  const auto sd = pred.variance.detach().to(torch::kCPU, torch::kFloat64).sqrt();
  // A zero sd makes |z| infinite however close the mean (too narrow, as it should); values
  // whose mean or variance is not finite are not judged here (prediction_warnings names
  // the particles that predict them).
  const auto finite = (torch::isfinite(mean) & torch::isfinite(sd)).reshape(-1);
  const auto error = (y - mean).abs();
  auto z = torch::where(sd > 0, error / sd, torch::full_like(error, std::numeric_limits<double>::infinity()));
  z = z.reshape(-1).masked_select(finite);
  const int64_t n = z.numel();
  if (n < kCalibrationMinValues) return {};
  // The median of an even count: the mean of the middle two.
  const auto sorted = std::get<0>(z.sort());
  const double median = (sorted[(n - 1) / 2].item<double>() + sorted[n / 2].item<double>()) / 2;
  const bool too_wide = median < kCalibratedMedianZ / wide;
  if (!too_wide && !(median > kCalibratedMedianZ * narrow)) return {};
  return {MemberWarning{.kind = MemberWarning::Kind::miscalibrated,
                        .particle = kWholePredictive,
                        .value = median,
                        .reference = kCalibratedMedianZ,
                        .measure = too_wide ? "too wide" : "too narrow"}};
}

}  // namespace push::bayes
