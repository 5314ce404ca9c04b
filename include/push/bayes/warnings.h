#pragma once
// Members that trained badly although every number stayed finite: a training loss that
// ended far above its best (the run diverged and did not come back), or test predictions
// worse than predicting the training data's mean. Non-finite losses stop fit() instead
// (Infer::check_finite); these are the runs that would otherwise be reported as successes.
//
//   auto warnings = push::bayes::loss_warnings(infer.particle_losses());
//   auto more = push::bayes::prediction_warnings(infer.predict(test.x), test, train);
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
  };
  Kind kind = Kind::loss_rose;
  Pid particle = 0;
  /// loss_rose: the last epoch's loss and the best (mean nll per point). worse_than_mean:
  /// the particle's test error and the training mean's (regression: mean squared error in
  /// standardised units; classification: nll per point against the training set's class
  /// frequencies).
  double value = 0, reference = 0;
  /// loss_rose: the epochs of the last and of the best loss, counted from 1.
  int64_t epoch = 0, best_epoch = 0;
  /// worse_than_mean: what value and reference measure, and what the reference predicts.
  std::string measure, baseline;
  /// One line naming the particle and what was seen, without a cause.
  std::string describe() const;
};
/// "loss_rose", "worse_than_mean".
const char* to_string(MemberWarning::Kind kind);

/// The particles whose last training loss exceeds their best by more than `rise` nats per
/// point (a factor e^rise in every training point's likelihood, on average). By particle id.
std::vector<MemberWarning> loss_warnings(const std::map<Pid, ParticleLosses>& losses, double rise = 1.0);

/// The particles whose own predictions (the mean of their samples; the members of `pred`
/// are the particles' samples in id order, equally many each) do worse on `test` than
/// predicting `train`'s mean (regression) or `train`'s class frequencies (classification).
/// Both sets standardised alike (data::Standardizer). By particle id.
std::vector<MemberWarning> prediction_warnings(const Predictive& pred, const data::Dataset& test,
                                               const data::Dataset& train, int64_t particles);

}  // namespace push::bayes
