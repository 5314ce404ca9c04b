// The written-out CPU path of a fused MLP (src/bayes/fused_mlp.cpp): the outputs and the
// gradients of the stacks and of the input are what each member computes alone through
// autograd, for every activation it takes; anything else goes the general way.
#include <push/bayes.h>
#include <push/bayes/fused.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "test_util.h"

namespace push::bayes {
namespace {

namespace nn = torch::nn;
using push::testing::max_rel;

bool written_out(const torch::Tensor& out) {
  return out.grad_fn() != nullptr && out.grad_fn()->name().find("MlpFunction") != std::string::npos;
}

// Forward and backward of a stack of n members made by `make`, against each member alone;
// returns whether the stack took the written-out path.
bool expect_members_computed(const std::function<nn::Sequential()>& make, const std::vector<int64_t>& input, int n,
                             torch::Dtype dtype = torch::kFloat) {
  std::vector<nn::Sequential> stacked, alone;
  for (int i = 0; i < n; ++i) {
    torch::manual_seed(40 + i);
    stacked.push_back(make());
    torch::manual_seed(40 + i);
    alone.push_back(make());
    stacked.back()->to(dtype);
    alone.back()->to(dtype);
  }
  std::vector<nn::Module*> modules;
  for (auto& m : stacked) modules.push_back(m.ptr().get());
  FusedStack stack(modules, {}, nullptr);
  torch::manual_seed(9);
  std::vector<int64_t> shape{n};
  shape.insert(shape.end(), input.begin(), input.end());
  auto x = torch::randn(shape, dtype).requires_grad_(true);
  stack.zero_grad();
  auto out = stack.forward(x);
  // A loss whose gradient differs by element, sign and size.
  auto weights = torch::linspace(-2, 3, out.numel(), dtype).view(out.sizes());
  (out * weights + out.pow(2)).sum().backward();
  for (int i = 0; i < n; ++i) {
    auto xi = x.detach()[i].clone().requires_grad_(true);
    auto mine = alone[i]->forward(xi);
    EXPECT_LT(max_rel(out[i].detach(), mine.detach()), 1e-6) << "output of member " << i;
    (mine * weights[i] + mine.pow(2)).sum().backward();
    EXPECT_LT(max_rel(x.grad()[i], xi.grad()), 1e-5) << "input gradient of member " << i;
    auto params = alone[i]->parameters();
    for (size_t k = 0; k < params.size(); ++k) {
      EXPECT_LT(max_rel(stack.parameters()[k].grad()[i], params[k].grad()), 1e-5)
          << "gradient of parameter " << k << " of member " << i;
    }
  }
  return written_out(out);
}

TEST(FusedMlp, EveryActivationGivesTheMembersGradients) {
  const std::pair<const char*, std::function<nn::AnyModule()>> activations[] = {
      {"relu", [] { return nn::AnyModule(nn::ReLU()); }},
      {"leaky relu", [] { return nn::AnyModule(nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.1))); }},
      {"leaky relu at slope 0", [] { return nn::AnyModule(nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0))); }},
      {"tanh", [] { return nn::AnyModule(nn::Tanh()); }},
      {"sigmoid", [] { return nn::AnyModule(nn::Sigmoid()); }},
  };
  for (const auto& [what, act] : activations) {
    auto make = [&act = act] {
      nn::Sequential seq(nn::Linear(3, 16));
      seq->push_back(act());
      seq->push_back(nn::Linear(16, 8));
      seq->push_back(act());
      seq->push_back(nn::Linear(8, 2));
      seq->push_back(act());  // on the output too
      return seq;
    };
    EXPECT_TRUE(expect_members_computed(make, {5, 3}, 4)) << what;
  }
}

TEST(FusedMlp, LayersWithoutBiasAndNoOpLayers) {
  auto no_bias = [] {
    return nn::Sequential(nn::Linear(nn::LinearOptions(2, 7).bias(false)), nn::Identity(), nn::Tanh(),
                          push::bayes::Dropout(0.0), nn::Flatten(), nn::Linear(7, 1));
  };
  EXPECT_TRUE(expect_members_computed(no_bias, {6, 2}, 3));
  // One member, one point.
  EXPECT_TRUE(expect_members_computed([] { return nn::Sequential(nn::Linear(1, 3), nn::ReLU(), nn::Linear(3, 1)); },
                                      {1, 1}, 1));
}

// One Linear twice: the plan's two layers use one stack (the last of the parameter list's
// two entries for it), which gets both layers' terms.
TEST(FusedMlp, ALayerUsedTwiceGetsBothTermsInOneStack) {
  nn::Linear square(5, 5);
  nn::Sequential net(square, nn::ReLU(), square, nn::Sigmoid(), nn::Linear(5, 1));
  FusedStack stack({net.ptr().get()}, {}, nullptr);
  auto x = torch::randn({1, 4, 5});
  stack.zero_grad();
  auto out = stack.forward(x);
  ASSERT_TRUE(written_out(out));
  out.sum().backward();
  net->forward(x[0]).sum().backward();
  EXPECT_LT(max_rel(stack.parameters()[2].grad()[0], square->weight.grad()), 1e-5);
  EXPECT_LT(max_rel(stack.parameters()[3].grad()[0], square->bias.grad()), 1e-5);
}

TEST(FusedMlp, WhatItDoesNotTakeGoesTheGeneralWay) {
  auto mlp = [] { return nn::Sequential(nn::Linear(3, 8), nn::ReLU(), nn::Linear(8, 2)); };
  EXPECT_FALSE(expect_members_computed(mlp, {4, 3}, 2, torch::kDouble)) << "float64";
  EXPECT_FALSE(expect_members_computed(mlp, {4, 6, 3}, 2)) << "leading dimensions";
  EXPECT_FALSE(expect_members_computed(
      [] { return nn::Sequential(nn::Linear(3, 8), nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(-0.5))); },
      {4, 3}, 2))
      << "negative slope";
  EXPECT_FALSE(
      expect_members_computed([] { return nn::Sequential(nn::Linear(3, 8), nn::ReLU(), nn::Tanh()); }, {4, 3}, 2))
      << "two activations in a row";
  EXPECT_FALSE(expect_members_computed([] { return nn::Sequential(nn::Tanh(), nn::Linear(3, 2)); }, {4, 3}, 2))
      << "an activation first";
  // Dropout with p > 0 draws each member's masks the general way (fused_test.cpp checks them).
  auto dropout = make_model("mlp:8", {3}, 1, 0.5)();
  FusedStack stack({dropout.ptr().get()}, {}, nullptr);
  EXPECT_FALSE(written_out(stack.forward(torch::randn({1, 4, 3}))));
}

TEST(FusedMlp, AStepInPlaceBetweenForwardAndBackwardIsAnError) {
  nn::Sequential net(nn::Linear(2, 4), nn::ReLU(), nn::Linear(4, 1));
  FusedStack stack({net.ptr().get()}, {}, nullptr);
  auto out = stack.forward(torch::randn({1, 3, 2}));
  ASSERT_TRUE(written_out(out));
  {
    torch::NoGradGuard no_grad;
    stack.parameters()[0].add_(1.0);  // what an optimizer step would do
  }
  EXPECT_THROW(out.sum().backward(), c10::Error);
}

// A batch of one point: the bias seeded into the output must be a copy, never the bias
// itself (an expand of a [N, 1, out] view is already contiguous).
TEST(FusedMlp, ABatchOfOneLeavesTheParametersAlone) {
  nn::Sequential net(nn::Linear(3, 4), nn::Tanh(), nn::Linear(4, 2));
  FusedStack stack({net.ptr().get()}, {}, nullptr);
  std::vector<torch::Tensor> before;
  for (const auto& p : stack.parameters()) before.push_back(p.detach().clone());
  auto x = torch::randn({1, 1, 3});
  auto first = stack.forward(x);
  ASSERT_TRUE(written_out(first));
  first.sum().backward();
  for (size_t k = 0; k < before.size(); ++k) {
    EXPECT_TRUE(torch::equal(stack.parameters()[k].detach(), before[k])) << "parameter " << k;
  }
  EXPECT_TRUE(torch::equal(stack.forward(x).detach(), first.detach()));
}

// The same run fused and unfused, its last batch one point (33 points, batch 32).
TEST(FusedMlp, ATrainingWhoseLastBatchHasOnePointMatchesUnfused) {
  auto train = data::synthetic_gap(33, 3);
  auto model = make_model("mlp:16,16", {1}, 1);
  auto options = InferOptions()
                     .particles(3)
                     .distribution(PushOptions().devices(1).cache_size(3).intra_op_threads(1).seed(5))
                     .batch_size(32)
                     .lr(1e-2);
  Ensemble fused(model, InferOptions(options).fuse(true)), alone(model, InferOptions(options).fuse(false));
  fused.fit(train, 3);
  alone.fit(train, 3);
  ASSERT_TRUE(fused.fused());
  auto x = torch::linspace(-1.5, 1.5, 9).unsqueeze(1);
  EXPECT_LT(max_rel(fused.predict(x).mean, alone.predict(x).mean), 1e-5);
}

TEST(FusedMlp, LayersWhoseShapesDoNotChainFailAsTheGeneralPathDoes) {
  nn::Sequential net(nn::Linear(3, 8), nn::ReLU(), nn::Linear(9, 2));
  FusedStack stack({net.ptr().get()}, {}, nullptr);
  EXPECT_THROW(stack.forward(torch::randn({1, 5, 3})), c10::Error);
}

TEST(FusedMlp, BackwardTwiceAndAnExpandedGradient) {
  nn::Sequential net(nn::Linear(3, 6), nn::ReLU(), nn::Linear(6, 2));
  FusedStack stack({net.ptr().get()}, {}, nullptr);
  auto x = torch::randn({1, 4, 3});
  auto out = stack.forward(x);
  ASSERT_TRUE(written_out(out));
  stack.zero_grad();
  out.sum().backward({}, /*retain_graph=*/true);  // the incoming gradient is an expanded 1
  auto once = stack.parameters()[0].grad().clone();
  net->forward(x[0]).sum().backward();  // the member itself (the stack is a copy)
  EXPECT_LT(max_rel(once[0], net->parameters()[0].grad()), 1e-5);
  out.sum().backward();
  EXPECT_LT(max_rel(stack.parameters()[0].grad(), once * 2), 1e-6);
}

TEST(FusedMlp, ASecondDerivativeIsAClearError) {
  nn::Sequential net(nn::Linear(2, 4), nn::Tanh(), nn::Linear(4, 1));
  FusedStack stack({net.ptr().get()}, {}, nullptr);
  auto out = stack.forward(torch::randn({1, 3, 2}));
  ASSERT_TRUE(written_out(out));
  EXPECT_PUSH_ERROR(torch::autograd::grad({out.sum()}, {stack.parameters()[0]}, {}, true, true), "second derivative");
}

}  // namespace
}  // namespace push::bayes
