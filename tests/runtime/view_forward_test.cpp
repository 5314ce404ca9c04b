// Views that run (Particle::forward_view): the viewed particle's forward, with its
// parameters and buffers, on the caller's device, leaving the caller's own untouched.
#include <push/push.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "test_util.h"

namespace push {
namespace {

// y = w x + b + shift, the shift a buffer drawn under the particle's seed: a forward
// that used the caller's buffers instead of the viewed particle's would differ.
struct ShiftedImpl : torch::nn::Module {
  ShiftedImpl() : linear(register_module("linear", torch::nn::Linear(1, 1))) {
    shift = register_buffer("shift", torch::randn({1}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return linear->forward(x) + shift; }
  torch::nn::Linear linear;
  torch::Tensor shift;
};
TORCH_MODULE(Shifted);

ParticleOptions viewing() {
  return ParticleOptions()
      .on("own", [](Particle& p, const Args& a) { return p.forward(a.at(0).toTensor()).wait(); })
      .on("run_view",
          [](Particle& p, const Args& a) {
            auto view = p.get(a.at(0).toInt()).wait();
            return p.forward_view(view, a.at(1).toTensor()).wait();
          })
      .on("bad_view", [](Particle& p, const Args& a) {
        auto data = std::make_shared<ParticleView::Data>();
        data->pid = 99;
        data->parameters = {torch::zeros({2, 2}), torch::zeros({1})};
        data->buffers = {torch::zeros({1})};
        return p.forward_view(ParticleView(data), a.at(0).toTensor()).wait();
      });
}

TEST(Views, RunTheViewedParticlesForwardWithItsParametersAndBuffers) {
  const auto x = torch::linspace(-2, 2, 5).unsqueeze(1);
  for (int lanes : {1, 2}) {
    // Cache size 1: the viewed particle is often swapped out, its tensors in the host store.
    Push dist([] { return Shifted(); }, PushOptions().devices(lanes).cache_size(1).seed(3));
    for (int i = 0; i < 3; ++i) dist.p_create(viewing());
    const auto own0 = dist.p_launch(0, "own", x).wait().toTensor();
    for (Pid target : {1, 2, 0}) {
      const auto theirs = dist.p_launch(target, "own", x).wait().toTensor();
      const auto through_view = dist.p_launch(0, "run_view", target, x).wait().toTensor();
      EXPECT_TRUE(torch::equal(through_view, theirs)) << "lanes " << lanes << ", particle " << target;
      EXPECT_FALSE(through_view.requires_grad());
    }
    EXPECT_FALSE(torch::equal(dist.p_launch(1, "own", x).wait().toTensor(), own0));
    // The caller's own parameters and buffers are back.
    EXPECT_TRUE(torch::equal(dist.p_launch(0, "own", x).wait().toTensor(), own0));
  }
}

TEST(Views, ABatchNormViewRunsOnItsRunningStatisticsAndLeavesThemAlone) {
  auto bn = [] {
    return torch::nn::Sequential(torch::nn::Linear(1, 2), torch::nn::BatchNorm1d(2), torch::nn::Linear(2, 1));
  };
  // One intra-op thread: batch norm's OpenMP team syncs where ThreadSanitizer cannot see.
  Push dist(bn, PushOptions().seed(6).intra_op_threads(1));
  auto opts = viewing()
                  .on("train_mode", [](Particle& p, const Args& a) { return p.forward(a.at(0).toTensor()).wait(); })
                  .on("eval_mode", [](Particle& p, const Args& a) {
                    p.module().eval();
                    auto out = p.forward(a.at(0).toTensor()).wait();
                    p.module().train();
                    return out;
                  });
  dist.p_create(opts);
  dist.p_create(opts);
  const auto x = torch::linspace(-1, 1, 6).unsqueeze(1);
  dist.p_launch(1, "train_mode", x * 3 + 1).wait();  // moves particle 1's running statistics
  const auto first = dist.p_launch(0, "run_view", int64_t{1}, x).wait().toTensor();
  const auto again = dist.p_launch(0, "run_view", int64_t{1}, x).wait().toTensor();
  EXPECT_TRUE(torch::equal(first, again));  // the view's statistics did not move
  EXPECT_TRUE(torch::allclose(first, dist.p_launch(1, "eval_mode", x).wait().toTensor()));
}

TEST(Views, AViewOfAnotherShapeIsNamedAndChangesNothing) {
  Push dist([] { return Shifted(); }, PushOptions().seed(4));
  dist.p_create(viewing());
  const auto x = torch::ones({2, 1});
  const auto own = dist.p_launch(0, "own", x).wait().toTensor();
  EXPECT_PUSH_ERROR(dist.p_launch(0, "bad_view", x).wait(), "parameter 0 of the view of particle 99 is");
  EXPECT_TRUE(torch::equal(dist.p_launch(0, "own", x).wait().toTensor(), own));
}

}  // namespace
}  // namespace push
