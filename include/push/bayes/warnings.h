#pragma once
// Members that trained badly although every number stayed finite: a training loss that
// ended far above its best (the run diverged and did not come back), test predictions
// worse than predicting the training data's mean, or, for the whole regression predictive,
// intervals far too wide or too narrow for its test errors. Non-finite losses stop fit()
// instead (Infer::check_finite); these are the runs that would otherwise be reported as
// successes.
//
//   auto warnings = push::bayes::loss_warnings(infer.particle_losses());
//   auto pred = infer.predict(test.x);
//   auto more = push::bayes::prediction_warnings(pred, test, train, particles);
//   auto wide = push::bayes::calibration_warnings(pred, test);
//   for (const auto& w : warnings) std::cerr << w.describe() << "\n";
#include <push/bayes/infer.h>
#include <push/bayes/predictive.h>
#include <push/data/dataset.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace push::bayes {

struct MemberWarning {
  enum class Kind {
    loss_rose,        // the last epoch's training loss is far above the particle's best
    worse_than_mean,  // on the test set the particle does worse than the training mean
    miscalibrated,    // the predictive's sd is far from its test errors (regression)
  };
  Kind kind = Kind::loss_rose;
  /// The particle; miscalibrated: kWholePredictive, the warning is about them all.
  Pid particle = 0;
  /// loss_rose: the last epoch's loss and the best (mean nll per point). worse_than_mean:
  /// the particle's test error and the training mean's (regression: mean squared error in
  /// standardised units; classification: nll per point against the training set's class
  /// frequencies). miscalibrated: the median over the test values of |y - mean| / sd, and
  /// a calibrated Gaussian predictive's, kCalibratedMedianZ.
  double value = 0, reference = 0;
  /// loss_rose: the epochs of the last and of the best loss, counted from 1.
  int64_t epoch = 0, best_epoch = 0;
  /// worse_than_mean: what value and reference measure, and what the reference predicts.
  /// miscalibrated: measure is "too wide" or "too narrow".
  std::string measure, baseline;
  /// One line naming the particle and what was seen, without a cause.
  std::string describe() const;
};
/// "loss_rose", "worse_than_mean", "miscalibrated".
const char* to_string(MemberWarning::Kind kind);

/// MemberWarning::particle of a warning about the whole predictive.
constexpr Pid kWholePredictive = -1;
/// The median of |z| for z ~ N(0, 1): Φ⁻¹(0.75).
constexpr double kCalibratedMedianZ = 0.6744897501960817;
/// calibration_warnings' defaults: how far below (too wide) and above (too narrow)
/// kCalibratedMedianZ the median |z| may sit, as factors (docs/bayes.md, *Runs that warn*:
/// set from Boston at the paper's rate, 3.6-14x too wide, against clean runs on Boston and
/// the built-in sets, at most 2.2x too wide and 2.8x too narrow).
constexpr double kTooWide = 3.0, kTooNarrow = 4.0;
/// calibration_warnings judges test sets of at least this many values (a median of fewer
/// is too noisy to tell such factors).
constexpr int64_t kCalibrationMinValues = 20;

/// The particles whose last training loss exceeds their best by more than `rise` nats per
/// point (a factor e^rise in every training point's likelihood, on average). By particle id.
std::vector<MemberWarning> loss_warnings(const std::map<Pid, ParticleLosses>& losses, double rise = 1.0);

/// The particles whose own predictions (the mean of their samples; the members of `pred`
/// are the particles' samples in id order, equally many each) do worse on `test` than
/// predicting `train`'s mean (regression) or `train`'s class frequencies (classification).
/// Both sets standardised alike (data::Standardizer). By particle id.
std::vector<MemberWarning> prediction_warnings(const Predictive& pred, const data::Dataset& test,
                                               const data::Dataset& train, int64_t particles);

/// A regression predictive (mean, variance) whose intervals do not match its errors on
/// `test` (standardised like the predictive): the median over the test values of |z| =
/// |y - mean| / sd below kCalibratedMedianZ / wide (too wide: the sd overstates the errors
/// `wide`-fold, as when members that trained badly predict a huge noise, or diverged ones
/// spread the mixture) or above kCalibratedMedianZ · narrow (too narrow: overconfident).
/// One warning or none; none for classification or fewer than kCalibrationMinValues finite
/// values (those whose mean or variance is not finite are left out: prediction_warnings
/// names the particles that predict them).
std::vector<MemberWarning> calibration_warnings(const Predictive& pred, const data::Dataset& test,
                                                double wide = kTooWide, double narrow = kTooNarrow);

}  // namespace push::bayes
