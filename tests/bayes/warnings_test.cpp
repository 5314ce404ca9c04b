// Members that trained badly with finite numbers (push/bayes/warnings.h): the rules, and
// the record of each particle's losses that fit() keeps and a checkpoint carries.
#include <push/bayes.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>
#include <filesystem>

#include "test_util.h"

namespace push::bayes {
namespace {

data::Dataset regression(torch::Tensor x, torch::Tensor y) {
  data::Dataset d;
  d.x = std::move(x);
  d.y = std::move(y);
  return d;
}

TEST(Warnings, ALossThatEndsFarAboveItsBestIsNamed) {
  std::map<Pid, ParticleLosses> losses;
  losses[0] = {0.5, 10, 0.9, 40};    // rose by 0.4: a noisy end, not a divergence
  losses[1] = {-1.0, 3, 5.0, 40};    // rose by 6 nats per point
  losses[2] = {0.2, 40, 0.2, 40};    // ended at its best
  losses[3] = {-2.0, 12, -0.5, 40};  // rose by 1.5, below zero
  const auto found = loss_warnings(losses);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].particle, 1);
  EXPECT_EQ(found[0].kind, MemberWarning::Kind::loss_rose);
  EXPECT_EQ(found[0].value, 5.0);
  EXPECT_EQ(found[0].reference, -1.0);
  EXPECT_EQ(found[0].epoch, 40);
  EXPECT_EQ(found[0].best_epoch, 3);
  EXPECT_EQ(found[0].describe(),
            "particle 1: its training loss ended at 5 in epoch 40, far above its best, -1 in epoch 3");
  EXPECT_EQ(found[1].particle, 3);
  EXPECT_EQ(loss_warnings(losses, 0.3).size(), 3u);
  EXPECT_PUSH_ERROR(loss_warnings(losses, 0), "rise must be positive");
}

TEST(Warnings, ARegressionMemberWorseThanTheTrainingMeanIsNamed) {
  // Two particles of three samples each on 4 test points: particle 0 predicts the targets
  // up to 0.1, particle 1 is 3 away from them (the training mean is 1 away).
  auto train = regression(torch::zeros({8, 1}), torch::ones({8, 1}));
  auto y = torch::tensor({2.0, 0.0, 2.0, 0.0}).unsqueeze(1);
  auto test = regression(torch::zeros({4, 1}), y);
  Predictive p;
  auto good = (y + 0.1).unsqueeze(0).expand({3, 4, 1});
  auto bad = (y + 3.0).unsqueeze(0).expand({3, 4, 1});
  p.members = torch::cat({good, bad}).to(torch::kFloat32);
  const auto found = prediction_warnings(p, test, train, 2);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].particle, 1);
  EXPECT_EQ(found[0].kind, MemberWarning::Kind::worse_than_mean);
  EXPECT_NEAR(found[0].value, 9.0, 1e-5);
  EXPECT_NEAR(found[0].reference, 1.0, 1e-12);
  EXPECT_EQ(found[0].describe(),
            "particle 1: its test predictions are worse than predicting the training data's mean: mean squared error "
            "(standardised units) 9 against 1");
  // A NaN prediction is named as well.
  p.members[0][0][0] = std::nan("");
  EXPECT_EQ(prediction_warnings(p, test, train, 2).size(), 2u);
  EXPECT_PUSH_ERROR(prediction_warnings(p, test, train, 4), "are not an equal number of samples of 4 particles");
}

TEST(Warnings, AClassifierWorseThanTheClassFrequenciesIsNamed) {
  data::Dataset train, test;
  train.task = test.task = data::Task::classification;
  train.x = torch::zeros({4, 1});
  train.y = torch::tensor({0, 0, 0, 1});
  test.x = torch::zeros({2, 1});
  test.y = torch::tensor({0, 1});
  Predictive p;
  // Particle 0 is right with 0.9; particle 1 is wrong with 0.99 on both points.
  p.members = torch::tensor({0.9, 0.1, 0.1, 0.9, 0.01, 0.99, 0.99, 0.01}).reshape({2, 2, 2});
  const auto found = prediction_warnings(p, test, train, 2);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].particle, 1);
  // Against the frequencies (3.5/5, 1.5/5): -(log 0.7 + log 0.3) / 2.
  EXPECT_NEAR(found[0].reference, -(std::log(0.7) + std::log(0.3)) / 2, 1e-12);
  EXPECT_NEAR(found[0].value, -std::log(0.01), 1e-5);
}

// The whole predictive's intervals against its test errors: z = (y - mean) / sd drawn
// N(0, s²) for a predictive whose sd is 1/s of the errors' spread.
TEST(Warnings, APredictiveWhoseIntervalsAreFarTooWideOrNarrowIsNamed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const int64_t n = 400;
  auto y = torch::randn({n, 1}, gen, torch::kFloat64);
  auto test = regression(torch::zeros({n, 1}), y.to(torch::kFloat32));
  auto predictive = [&](double error_sd, double sd) {
    Predictive p;
    p.mean = (y + error_sd * torch::randn({n, 1}, gen, torch::kFloat64)).to(torch::kFloat32);
    p.variance = torch::full({n, 1}, sd * sd);
    return p;
  };
  EXPECT_TRUE(calibration_warnings(predictive(0.5, 0.5), test).empty());
  EXPECT_TRUE(calibration_warnings(predictive(0.5, 1.0), test).empty());  // 2x wide: within kTooWide
  EXPECT_TRUE(calibration_warnings(predictive(1.0, 0.3), test).empty());  // 3.3x narrow: within kTooNarrow
  const auto wide = calibration_warnings(predictive(0.1, 1.0), test);
  ASSERT_EQ(wide.size(), 1u);
  EXPECT_EQ(wide[0].kind, MemberWarning::Kind::miscalibrated);
  EXPECT_EQ(wide[0].particle, kWholePredictive);
  EXPECT_EQ(wide[0].measure, "too wide");
  EXPECT_NEAR(wide[0].value, 0.1 * kCalibratedMedianZ, 0.02);
  EXPECT_EQ(wide[0].reference, kCalibratedMedianZ);
  EXPECT_EQ(wide[0].describe().rfind("the predictive's intervals are too wide for its test errors: the median "
                                     "|y - mean| / sd is 0.0",
                                     0),
            0u)
      << wide[0].describe();
  const auto narrow = calibration_warnings(predictive(1.0, 0.1), test);
  ASSERT_EQ(narrow.size(), 1u);
  EXPECT_EQ(narrow[0].measure, "too narrow");
  EXPECT_NEAR(narrow[0].value, 10 * kCalibratedMedianZ, 1.5);
  EXPECT_EQ(to_string(narrow[0].kind), std::string("miscalibrated"));
  // A zero sd is too narrow however close the mean.
  EXPECT_EQ(calibration_warnings(predictive(0.0, 0.0), test).at(0).measure, "too narrow");
  // Values not finite are not judged (prediction_warnings names them): NaN means at every
  // other point leave a calibrated predictive unnamed and a wide one named; all NaN, none.
  auto holes = predictive(0.5, 0.5), wide_holes = predictive(0.1, 1.0);
  for (int64_t i = 0; i < n; i += 2) holes.mean[i][0] = wide_holes.mean[i][0] = std::nan("");
  EXPECT_TRUE(calibration_warnings(holes, test).empty());
  EXPECT_EQ(calibration_warnings(wide_holes, test).at(0).measure, "too wide");
  holes.mean.fill_(std::nan(""));
  EXPECT_TRUE(calibration_warnings(holes, test).empty());
  // The factor; too few values to judge; classification; shapes.
  EXPECT_EQ(calibration_warnings(predictive(0.5, 1.0), test, 1.5).size(), 1u);
  EXPECT_EQ(calibration_warnings(predictive(1.0, 0.3), test, kTooWide, 2).size(), 1u);
  EXPECT_PUSH_ERROR(calibration_warnings(predictive(0.5, 1.0), test, 1.0), "wide and narrow must be above 1");
  auto few = regression(torch::zeros({kCalibrationMinValues - 1, 1}), torch::zeros({kCalibrationMinValues - 1, 1}));
  Predictive tiny;
  tiny.mean = torch::full({kCalibrationMinValues - 1, 1}, 5.0);
  tiny.variance = torch::full({kCalibrationMinValues - 1, 1}, 1e-6);
  EXPECT_TRUE(calibration_warnings(tiny, few).empty());
  auto classes = test;
  classes.task = data::Task::classification;
  EXPECT_TRUE(calibration_warnings(predictive(0.1, 1.0), classes).empty());
  auto two_targets = regression(torch::zeros({n / 2, 1}), torch::zeros({n / 2, 2}));
  EXPECT_PUSH_ERROR(calibration_warnings(predictive(0.1, 1.0), two_targets), "the test set has");
}

TEST(Warnings, FitKeepsEachParticlesBestAndLastLossAcrossSaveAndLoad) {
  auto d = data::synthetic_gap(64, 3);
  auto make = [] { return Ensemble(make_model("mlp:8", {1}, 1), InferOptions().particles(3).lr(1e-2)); };
  auto a = make();
  a.fit(d, 4);
  const auto seen = a.particle_losses();
  ASSERT_EQ(seen.size(), 3u);
  double mean_last = 0;
  for (const auto& [pid, l] : seen) {
    EXPECT_EQ(l.last_epoch, 4);
    EXPECT_GE(l.best_epoch, 1);
    EXPECT_LE(l.best_epoch, 4);
    EXPECT_LE(l.best, l.last);
    mean_last += l.last / 3;
  }
  EXPECT_NEAR(mean_last, a.losses().back(), 1e-12);  // the epoch's mean is the particles' mean
  auto dir = std::filesystem::temp_directory_path() / ("push_warnings_ckpt_" + std::to_string(::getpid()));
  a.save(dir);
  auto b = make();
  b.load(dir);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(b.particle_losses().size(), 3u);
  for (const auto& [pid, l] : seen) {
    const auto& r = b.particle_losses().at(pid);
    EXPECT_EQ(r.best, l.best);
    EXPECT_EQ(r.best_epoch, l.best_epoch);
    EXPECT_EQ(r.last, l.last);
    EXPECT_EQ(r.last_epoch, l.last_epoch);
  }
  // Training on after the load continues the record: epoch 5, the best kept unless beaten.
  b.fit(d, 1);
  for (const auto& [pid, l] : b.particle_losses()) {
    EXPECT_EQ(l.last_epoch, 5);
    EXPECT_LE(l.best, seen.at(pid).best);
  }
}

}  // namespace
}  // namespace push::bayes
