// Every algorithm end to end: a diverged run stops each one naming particle and epoch,
// docs/bayes.md's example runs and beats the mean, and push train's model specs build the
// networks they describe (split from bayes_test.cpp, which holds the algorithms' own tests).
#include <push/bayes.h>
#include <push/metrics.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <regex>
#include <tuple>

#include "test_util.h"

namespace push::bayes {
namespace {

// A learning rate of 1e30 blows the loss up within an epoch: every algorithm stops with an
// error naming the particle and the epoch instead of training on to NaN metrics.
TEST(Divergence, NonFiniteLossStopsEveryAlgorithmNamingParticleAndEpoch) {
  auto d = data::synthetic_gap(64, 1);
  auto options = [] {
    return InferOptions().particles(2).distribution(PushOptions().devices(2).seed(1)).batch_size(16).lr(1e30);
  };
  auto model = make_model("mlp:8", {1}, 1), dropout_model = make_model("mlp:8", {1}, 1, 0.1);
  std::vector<std::unique_ptr<Infer>> algorithms;
  algorithms.push_back(std::make_unique<Ensemble>(model, options()));
  algorithms.push_back(std::make_unique<MultiSWAG>(model, options(), SWAGOptions().pretrain_epochs(0)));
  algorithms.push_back(std::make_unique<SVGD>(model, options()));
  algorithms.push_back(std::make_unique<MCDropout>(dropout_model, options()));
  for (auto& infer : algorithms) {
    SCOPED_TRACE(infer->name());
    infer->fit(d, 0);
    try {
      infer->fit(d, 3);
      ADD_FAILURE() << "a diverged run must fail";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(infer->name() + ": "), std::string::npos) << what;
      EXPECT_TRUE(std::regex_search(what, std::regex("(loss|parameter '[^']+') of particle [01] is non-finite .*"
                                                     "epoch 1: training diverged")))
          << what;
    }
    EXPECT_EQ(infer->epochs_done(), 0);
  }
}

// The example at the top of docs/bayes.md, with fewer epochs.
TEST(Docs, ExampleRunsAndBeatsTheMean) {
  namespace pb = push::bayes;
  auto [train_raw, test_raw] = push::data::load_split("sine-gap", {}, /*test_fraction=*/0.2, /*seed=*/0);
  auto scaler = push::data::Standardizer::fit(train_raw);
  auto train = scaler.apply(train_raw), test = scaler.apply(test_raw);
  auto model = pb::make_model("mlp:64,64", train.input_shape(), pb::output_units(pb::Likelihood::heteroscedastic, 1));
  pb::SVGD svgd(model, pb::InferOptions()
                           .particles(16)
                           .distribution(push::PushOptions().devices(2).seed(7))
                           .lr(1e-2)
                           .likelihood(pb::Likelihood::heteroscedastic));
  svgd.fit(train, testing::scaled(30, 15, 2));
  pb::Predictive p = svgd.predict(test.x);
  auto m = push::metrics::regression(scaler.unscale_mean(p.mean), scaler.unscale_variance(p.variance), test_raw.y);
  const double sd = test_raw.y.std().item<double>();  // the RMSE of predicting the mean
  EXPECT_LT(m.rmse, 0.5 * sd);
  EXPECT_TRUE(std::isfinite(m.nll));
  EXPECT_GT((p.variance - p.aleatoric).min().item<double>(), 0.0);  // the particles disagree
}

TEST(Models, ParametersAreCountedWithoutBuildingANetwork) {
  const std::tuple<std::string, std::vector<int64_t>, int64_t> cases[] = {
      {"mlp:64,64", {1}, 2}, {"mlp:7", {3, 2}, 5}, {"cnn", {1, 8, 8}, 10}, {"cnn:4,6", {3, 9, 10}, 3}};
  for (const auto& [spec, shape, outputs] : cases) {
    int64_t built = 0;
    for (const auto& p : make_model(spec, shape, outputs)().ptr()->parameters()) built += p.numel();
    EXPECT_EQ(parameter_count(parse_model_spec(spec), shape, outputs), static_cast<double>(built)) << spec;
  }
}

TEST(Models, SpecsAndErrors) {
  EXPECT_EQ(parse_model_spec("mlp:64,32").widths, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(parse_model_spec("cnn").widths, (std::vector<int64_t>{16, 32}));
  EXPECT_PUSH_ERROR(parse_model_spec("resnet"), "unknown model 'resnet'");
  EXPECT_PUSH_ERROR(parse_model_spec("mlp:64,x"), "bad width 'x'");
  // One rule for an MLP without widths, with or without the colon: it is refused, since it
  // would be a linear model on which --dropout (MC dropout) has nothing to act.
  EXPECT_PUSH_ERROR(parse_model_spec("mlp"), "model 'mlp' lists no widths");
  EXPECT_PUSH_ERROR(parse_model_spec("mlp:"), "model 'mlp:' lists no widths");
  ModelSpec linear;
  linear.kind = "mlp";
  EXPECT_PUSH_ERROR(make_model(linear, {3}, 1, 0.1), "dropout 0.1 needs a hidden layer");
  EXPECT_PUSH_ERROR(make_model("cnn", {4}, 3), "cnn needs image inputs");
  auto cnn = make_model("cnn:4,8", {1, 28, 28}, 10)();
  EXPECT_EQ(cnn.forward(torch::zeros({2, 1, 28, 28})).sizes(), (std::vector<int64_t>{2, 10}));
}

}  // namespace
}  // namespace push::bayes
