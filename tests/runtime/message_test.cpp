// Tensors in messages and results are values: evicting the particle whose parameters
// (or gradients, or optimizer state) a tensor shares storage with never changes or
// empties what the receiver sees, whatever the cache size.
#include <push/push.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "test_util.h"

namespace push {
namespace {

using testing::tiny_mlp;

// Particle 0 sends its live first parameter (and a slice of it, in a list) to particle
// 1 on the same lane, then changes it in place before particle 1 runs. With cache_size 1
// particle 1's switch-in evicts particle 0.
std::vector<torch::Tensor> send_live_parameter(int cache_size) {
  Push dist(tiny_mlp, PushOptions().cache_size(cache_size));
  auto opts =
      ParticleOptions()
          .on("share",
              [](Particle& p, const Args&) {
                torch::Tensor w = p.module().parameters()[0];
                c10::List<torch::Tensor> list;
                list.push_back(w.narrow(0, 0, 2));
                auto sent = w.clone();
                PFuture reply = p.send(1, "read", w, list);
                {
                  torch::NoGradGuard no_grad;
                  w.fill_(7.0);  // after the send: the receiver must not see it
                }
                auto seen = reply.wait().toTensorVector();
                seen.push_back(sent);
                return c10::IValue(seen);
              })
          .on("read", [](Particle&, const Args& a) {
            auto list = a[1].toTensorList();
            return c10::IValue(std::vector<torch::Tensor>{a[0].toTensor().clone(), torch::Tensor(list.get(0)).clone()});
          });
  dist.p_create(opts);
  dist.p_create(opts);
  return dist.p_launch(0, "share").wait().toTensorVector();
}

TEST(Messages, TensorsArriveAsSentWhateverTheCacheSize) {
  for (int cache_size : {1, 2}) {
    auto seen = send_live_parameter(cache_size);
    ASSERT_EQ(seen.size(), 3u);
    const torch::Tensor& sent = seen[2];
    EXPECT_EQ(seen[0].numel(), sent.numel()) << "cache_size " << cache_size;
    EXPECT_TRUE(torch::equal(seen[0], sent)) << "cache_size " << cache_size;
    EXPECT_TRUE(torch::equal(seen[1], sent.narrow(0, 0, 2))) << "cache_size " << cache_size;
  }
}

TEST(Messages, ResultsSurviveTheEvictionOfTheirParticle) {
  Push dist(tiny_mlp, PushOptions().cache_size(1));
  auto opts = ParticleOptions().optimizer(testing::adam()).on("leak", [](Particle& p, const Args&) {
    auto x = torch::ones({2, 1});
    p.step(testing::mse, x, x).wait();
    return c10::IValue(std::vector<torch::Tensor>{p.module().parameters()[0], p.module().parameters()[0].grad()});
  });
  dist.p_create(opts);
  dist.p_create(opts);
  auto leaked = dist.p_launch(0, "leak").wait().toTensorVector();
  auto expected = dist.p_parameters(0)[0];
  dist.p_launch(1, "leak").wait();  // evicts particle 0
  EXPECT_EQ(dist.cache_stats(0).resident, 1);
  ASSERT_EQ(leaked[0].numel(), expected.numel());
  EXPECT_TRUE(torch::equal(leaked[0], expected));
  EXPECT_EQ(leaked[1].numel(), expected.numel());
}

// A result that is one tensor, not a list: the runtime skips its check of the lane's
// particles only for a tensor nobody else holds, so a particle's own tensor (itself,
// detached, or a view of it, or its gradient, or nested in a repeated tuple) is still
// copied, and a fresh one is not.
TEST(Messages, ASingleTensorResultIsCopiedOnlyWhenAParticleHoldsIt) {
  for (const std::string kind : {"itself", "detached", "view", "grad", "nested twice"}) {
    Push dist(tiny_mlp, PushOptions().cache_size(1));
    auto opts = ParticleOptions().optimizer(testing::adam()).on("leak", [kind](Particle& p, const Args&) {
      auto x = torch::ones({2, 1});
      p.step(testing::mse, x, x).wait();
      torch::Tensor w = p.module().parameters()[0];
      if (kind == "itself") return c10::IValue(w);
      if (kind == "detached") return c10::IValue(w.detach());
      if (kind == "view") return c10::IValue(w.narrow(0, 0, 2));
      if (kind == "grad") return c10::IValue(w.grad());
      // A tuple that appears twice holds its tensor once: counting visits would match
      // the holders (module, optimizer, tuple) and take it for a fresh tensor.
      auto inner = c10::ivalue::Tuple::create({w});
      return c10::IValue(c10::ivalue::Tuple::create({inner, inner, inner}));
    });
    dist.p_create(opts);
    dist.p_create(opts);
    const auto result = dist.p_launch(0, "leak").wait();
    const auto leaked =
        result.isTuple() ? result.toTupleRef().elements()[0].toTupleRef().elements()[0].toTensor() : result.toTensor();
    const auto expected = kind == "grad" ? leaked.clone() : dist.p_parameters(0)[0];
    dist.p_launch(1, "leak").wait();  // evicts particle 0: its tensors are emptied
    EXPECT_EQ(dist.cache_stats(0).resident, 1);
    ASSERT_GT(leaked.numel(), 0) << kind;
    EXPECT_TRUE(torch::equal(leaked, kind == "view" ? expected.narrow(0, 0, 2) : expected)) << kind;
  }
  // A fresh tensor arrives as it was made: not copied.
  Push dist(tiny_mlp);
  static const void* made = nullptr;
  dist.p_create(ParticleOptions().on("fresh", [](Particle&, const Args&) {
    auto t = torch::ones({3, 2});
    made = t.data_ptr();
    return c10::IValue(std::move(t));
  }));
  EXPECT_EQ(dist.p_launch(0, "fresh").wait().toTensor().data_ptr(), made);
}

}  // namespace
}  // namespace push
