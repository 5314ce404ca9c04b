// SVGD's numbers where rounding or scale could move them: the kernel of close particles far
// from the origin, the likelihood's weight in ∇log p, and a fused fit that leaves the
// caller's random stream alone.
#include <push/bayes.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "test_util.h"

namespace push::bayes {
namespace {

double rel_error(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat64) - b).norm() / b.norm()).item<double>();
}

// Particles of many parameters close together far from the origin (a network's weights
// after training, a small bandwidth): |θ_i|² + |θ_j|² - 2 θ_i·θ_j loses their distances
// to float32 rounding; φ in float32 must still be float64's to float32 precision.
TEST(SVGD, DirectionIsExactForCloseParticlesFarFromTheOrigin) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  auto theta = 100 + 1e-2 * torch::randn({4, 2000}, gen, torch::kFloat64);
  auto grads = torch::randn({4, 2000}, gen, torch::kFloat64);
  theta = theta.to(torch::kFloat32).to(torch::kFloat64);  // the same particles in both precisions
  for (double h : {0.4, 0.05}) {
    auto exact = svgd_direction(theta, grads, h);
    auto single = svgd_direction(theta.to(torch::kFloat32), grads.to(torch::kFloat32), h);
    EXPECT_LT(rel_error(single, exact), 1e-4) << "bandwidth " << h;
  }
  // Two particles at the same place: the kernel between them is exactly 1.
  auto twins = torch::full({2, 3}, 1e3, torch::kFloat32);
  auto g = torch::tensor({1.0F, 2.0F, 3.0F, 5.0F, 6.0F, 7.0F}).view({2, 3});
  EXPECT_TRUE(torch::equal(svgd_direction(twins, g, 1e-3), g.mean(0, true).expand({2, 3})));
}

// likelihood_weight w makes ∇log p the gradient of w times the batch's mean log-likelihood
// (unset: the training set's size): with plain SGD one particle's step scales with w.
TEST(SVGD, TheLikelihoodWeightScalesTheGradientOfTheMeanLogLikelihood) {
  auto train = data::synthetic_gap(64, 3);
  auto step = [&](std::optional<double> weight, int epochs) {
    auto options = InferOptions()
                       .particles(1)
                       .distribution(PushOptions().devices(1).intra_op_threads(1).seed(5))
                       .batch_size(64)
                       .prior_std(INFINITY)
                       .optimizer([](std::vector<torch::Tensor> ps) -> std::unique_ptr<torch::optim::Optimizer> {
                         return std::make_unique<torch::optim::SGD>(std::move(ps), torch::optim::SGDOptions(1e-4));
                       });
    SVGD svgd(make_model("mlp:8", {1}, 1), options, SVGDOptions().bandwidth(1.0).likelihood_weight(weight));
    svgd.fit(train, epochs);
    return torch::nn::utils::parameters_to_vector(svgd.distribution().p_parameters(0)).to(torch::kFloat64);
  };
  auto start = step(std::nullopt, 0);
  auto by_size = step(std::nullopt, 1) - start, by_one = step(1.0, 1) - start, by_ten = step(10.0, 1) - start;
  EXPECT_GT(by_one.norm().item<double>(), 0);
  EXPECT_LT(rel_error(by_one * 64, by_size), 1e-3);
  EXPECT_LT(rel_error(by_one * 10, by_ten), 1e-3);
  EXPECT_THROW(SVGD(make_model("mlp:8", {1}, 1), InferOptions(), SVGDOptions().likelihood_weight(0.0)), Error);
}

// The fused path builds a scratch model to ask whether it fuses: under its own seed, not
// from the caller's random stream.
TEST(SVGD, AFusedFitLeavesTheCallersRandomStreamAlone) {
  auto train = data::synthetic_gap(32, 3);
  torch::manual_seed(7);
  const auto expected = torch::rand({4});
  torch::manual_seed(7);
  SVGD svgd(make_model("mlp:8", {1}, 1),
            InferOptions().particles(2).fuse(true).distribution(PushOptions().devices(1).intra_op_threads(1)));
  svgd.fit(train, 1);
  EXPECT_TRUE(svgd.fused());
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected));
}

}  // namespace
}  // namespace push::bayes
