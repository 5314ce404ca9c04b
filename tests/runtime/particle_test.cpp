// The user-facing API of one distribution: create, launch, handlers, views, state.
#include <push/push.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "test_util.h"

namespace push {
namespace {

using testing::adam;
using testing::mse;
using testing::tiny_mlp;

TEST(Particle, LaunchReturnsHandlerValue) {
  Push dist(tiny_mlp);
  Pid pid = dist.p_create(ParticleOptions().on(
      "add", [](Particle& p, const Args& a) { return c10::IValue(a[0].toInt() + a[1].toInt() + p.pid()); }));
  EXPECT_EQ(dist.p_launch(pid, "add", int64_t{40}, int64_t{2}).wait().toInt(), 42);
  EXPECT_EQ(dist.num_particles(), 1);
  EXPECT_EQ(dist.particle_ids(), std::vector<Pid>{0});
}

TEST(Particle, StepTrainsInsideHandler) {
  Push dist(tiny_mlp);
  auto x = torch::linspace(-1, 1, 64).unsqueeze(1);
  auto y = 2 * x;
  Pid pid = dist.p_create(ParticleOptions().optimizer(adam(0.05)).on("train", [](Particle& p, const Args& a) {
    auto x = a[0].toTensor(), y = a[1].toTensor();
    double first = p.step(mse, x, y).wait().toTensor().item<double>();
    double last = first;
    for (int i = 0; i < 200; ++i) last = p.step(mse, x, y).wait().toTensor().item<double>();
    auto out = p.forward(x).wait().toTensor();
    EXPECT_EQ(out.sizes(), x.sizes());
    return c10::IValue(std::vector<double>{first, last});
  }));
  auto losses = dist.p_launch(pid, "train", x, y).wait().toDoubleVector();
  EXPECT_LT(losses[1], losses[0] * 0.1);
}

TEST(Particle, ParametersAreCopiesNotAliases) {
  Push dist(tiny_mlp);
  Pid pid = dist.p_create();
  auto before = dist.p_parameters(pid);
  before[0].add_(100.0);
  auto again = dist.p_parameters(pid);
  EXPECT_FALSE(torch::equal(before[0], again[0]));
  auto named = dist.p_named_parameters(pid);
  EXPECT_EQ(named[0].first, "layers.0.weight");
}

TEST(Particle, SeedMakesInitialisationIndependentOfCreationOrder) {
  Push a(tiny_mlp, PushOptions().devices(2));
  Push b(tiny_mlp, PushOptions().devices(1));
  Pid a1 = a.p_create(ParticleOptions().seed(11));
  Pid a2 = a.p_create(ParticleOptions().seed(22));
  Pid b2 = b.p_create(ParticleOptions().seed(22));
  Pid b1 = b.p_create(ParticleOptions().seed(11));
  auto pa1 = a.p_parameters(a1), pb1 = b.p_parameters(b1);
  auto pa2 = a.p_parameters(a2), pb2 = b.p_parameters(b2);
  for (size_t i = 0; i < pa1.size(); ++i) {
    EXPECT_TRUE(torch::equal(pa1[i], pb1[i]));
    EXPECT_TRUE(torch::equal(pa2[i], pb2[i]));
  }
  EXPECT_FALSE(torch::equal(pa1[0], pa2[0]));

  // Default seeds: a function of the distribution's seed and the particle id.
  Push c(tiny_mlp, PushOptions().seed(5)), d(tiny_mlp, PushOptions().seed(5));
  c.p_create();
  d.p_create();
  EXPECT_TRUE(torch::equal(c.p_parameters(0)[0], d.p_parameters(0)[0]));
}

TEST(Particle, CreationLeavesTheGlobalGeneratorAlone) {
  torch::manual_seed(3);
  auto expected = torch::rand({4});
  torch::manual_seed(3);
  Push dist(tiny_mlp);
  dist.p_create();
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected));
}

TEST(Particle, MessagesCarryIValues) {
  Push dist(tiny_mlp);
  Pid pid = dist.p_create(ParticleOptions().on("describe", [](Particle&, const Args& a) {
    auto list = a[0].toIntVector();
    auto dict = a[1].toGenericDict();
    std::string s = a[2].toStringRef();
    auto t = a[3].toTensor();
    return c10::IValue(c10::str(list.size(), ":", dict.at("k").toInt(), ":", s, ":", t.sum().item<int64_t>()));
  }));
  c10::impl::GenericDict dict(c10::StringType::get(), c10::IntType::get());
  dict.insert("k", int64_t{7});
  auto out = dist.p_launch(pid, "describe",
                           Args{std::vector<int64_t>{1, 2, 3}, dict, std::string("hi"), torch::ones({5}, torch::kLong)})
                 .wait();
  EXPECT_EQ(out.toStringRef(), "3:7:hi:5");
}

TEST(Particle, SendAndRegisterReceive) {
  Push dist(tiny_mlp, PushOptions().devices(2));
  auto opts = ParticleOptions()
                  .on("install",
                      [](Particle& p, const Args&) {
                        p.register_receive("hello", [](Particle& q, const Args& a) {
                          return c10::IValue("hello " + a[0].toStringRef() + " from " + std::to_string(q.pid()));
                        });
                        return c10::IValue();
                      })
                  .on("greet", [](Particle& p, const Args& a) {
                    return p.send(a[0].toInt(), "hello", std::string("you")).wait();
                  });
  Pid p0 = dist.p_create(opts), p1 = dist.p_create(opts);
  dist.p_launch(p1, "install").wait();
  EXPECT_EQ(dist.p_launch(p0, "greet", p1).wait().toStringRef(), "hello you from 1");
}

TEST(Particle, IdsAndOtherParticles) {
  Push dist(tiny_mlp, PushOptions().devices(2));
  auto opts = ParticleOptions().on("others", [](Particle& p, const Args&) {
    EXPECT_EQ(p.particle_ids().size(), 3u);
    return c10::IValue(p.other_particles());
  });
  for (int i = 0; i < 3; ++i) dist.p_create(opts);
  EXPECT_EQ(dist.p_launch(1, "others").wait().toIntVector(), (std::vector<int64_t>{0, 2}));
}

TEST(Particle, GetReturnsACopyOfAnotherParticleAndCachesIt) {
  for (int lanes : {1, 2}) {
    Push dist(tiny_mlp, PushOptions().devices(lanes));
    auto opts = ParticleOptions()
                    .optimizer(adam())
                    .on("peek",
                        [](Particle& p, const Args& a) {
                          ParticleView v = p.get(a[0].toInt()).wait();
                          EXPECT_EQ(v.pid(), a[0].toInt());
                          EXPECT_EQ(v.parameters()[0].device(), p.device());
                          return c10::IValue(v.flat_parameters());
                        })
                    .on("train", [](Particle& p, const Args&) {
                      auto x = torch::ones({4, 1});
                      return p.step(mse, x, x).wait();
                    });
    dist.p_create(opts);
    dist.p_create(opts);
    auto flat = [&](Pid pid) {
      std::vector<torch::Tensor> parts;
      for (auto& t : dist.p_parameters(pid)) parts.push_back(t.reshape(-1));
      return torch::cat(parts);
    };
    auto first = dist.p_launch(0, "peek", int64_t{1}).wait().toTensor();
    EXPECT_TRUE(torch::equal(first, flat(1)));
    dist.p_launch(0, "peek", int64_t{1}).wait();  // particle 1 has not run: a cache hit
    int64_t hits = 0;
    for (int l = 0; l < lanes; ++l) hits += dist.cache_stats(l).view_hits;
    EXPECT_GE(hits, 1) << "lanes=" << lanes;
    dist.p_launch(1, "train").wait();
    auto after = dist.p_launch(0, "peek", int64_t{1}).wait().toTensor();
    EXPECT_FALSE(torch::equal(after, first));
    EXPECT_TRUE(torch::equal(after, flat(1)));
  }
}

// A view reflects every change made before it was asked for, also of the asking
// particle itself (whose version does not change while its handler runs).
TEST(Particle, ViewOfItselfReflectsItsOwnSteps) {
  Push dist(tiny_mlp);
  auto flat = [&](Pid pid) {
    std::vector<torch::Tensor> parts;
    for (auto& t : dist.p_parameters(pid)) parts.push_back(t.reshape(-1));
    return torch::cat(parts);
  };
  auto opts = ParticleOptions()
                  .optimizer(adam(0.1))
                  .on("step_between_gets",
                      [](Particle& p, const Args&) {
                        auto before = p.get(p.pid()).wait().flat_parameters();
                        auto x = torch::ones({4, 1});
                        p.step(mse, x, 2 * x).wait();
                        auto after = p.get(p.pid()).wait().flat_parameters();
                        return c10::IValue(std::vector<torch::Tensor>{before, after});
                      })
                  .on("peek", [](Particle& p, const Args& a) {
                    return c10::IValue(p.get(a[0].toInt()).wait().flat_parameters());
                  });
  dist.p_create(opts);
  dist.p_create(opts);
  auto initial = flat(0);
  auto seen = dist.p_launch(0, "step_between_gets").wait().toTensorVector();
  EXPECT_TRUE(torch::equal(seen[0], initial));
  EXPECT_FALSE(torch::equal(seen[1], seen[0]));
  EXPECT_TRUE(torch::equal(seen[1], flat(0)));
  // A sibling on the same lane sees the stepped particle too.
  EXPECT_TRUE(torch::equal(dist.p_launch(1, "peek", int64_t{0}).wait().toTensor(), flat(0)));
}

TEST(Particle, StatePersistsAcrossMessages) {
  Push dist(tiny_mlp);
  Pid pid = dist.p_create(ParticleOptions().state({{"count", int64_t{10}}}).on("bump", [](Particle& p, const Args&) {
    auto& count = p.state()["count"];
    count = count.toInt() + 1;
    return count;
  }));
  dist.p_launch(pid, "bump").wait();
  EXPECT_EQ(dist.p_launch(pid, "bump").wait().toInt(), 12);
}

TEST(Particle, SchedulerStepChangesLearningRate) {
  Push dist(tiny_mlp);
  Pid pid = dist.p_create(ParticleOptions()
                              .optimizer(adam(0.1))
                              .scheduler([](torch::optim::Optimizer& o) {
                                return std::make_unique<torch::optim::StepLR>(o, /*step_size=*/1, /*gamma=*/0.5);
                              })
                              .on("lr", [](Particle& p, const Args&) {
                                p.scheduler_step().wait();
                                return c10::IValue(p.optimizer().param_groups()[0].options().get_lr());
                              }));
  // LibTorch's StepLR decays on the step after each step_size-th one.
  EXPECT_DOUBLE_EQ(dist.p_launch(pid, "lr").wait().toDouble(), 0.1);
  EXPECT_DOUBLE_EQ(dist.p_launch(pid, "lr").wait().toDouble(), 0.05);
  EXPECT_DOUBLE_EQ(dist.p_launch(pid, "lr").wait().toDouble(), 0.025);
}

struct TwoInputs : torch::nn::Module {
  TwoInputs() : fc(register_module("fc", torch::nn::Linear(2, 1))) {}
  torch::Tensor forward(torch::Tensor x, double scale) { return fc(x) * scale; }
  torch::nn::Linear fc;
};

// As in PusH, zero_grad clears the module's gradients, every parameter's, with or without an
// optimizer (SVGD's particles have none).
TEST(Particle, ZeroGradClearsTheModulesGradientsWithoutAnOptimizer) {
  Push dist(tiny_mlp);
  auto x = torch::linspace(-1, 1, 8).unsqueeze(1);
  Pid pid = dist.p_create(ParticleOptions().on("clear", [x](Particle& p, const Args&) {
    mse(p.forward(x).wait().toTensor(), 2 * x).backward();
    int64_t with_gradients = 0;
    for (const auto& t : p.module().parameters()) with_gradients += t.grad().defined() ? 1 : 0;
    EXPECT_EQ(with_gradients, static_cast<int64_t>(p.module().parameters().size()));
    p.zero_grad().wait();
    int64_t left = 0;
    for (const auto& t : p.module().parameters()) left += t.grad().defined() ? 1 : 0;
    return c10::IValue(left);
  }));
  EXPECT_EQ(dist.p_launch(pid, "clear").wait().toInt(), 0);
}

TEST(Particle, CustomModuleWithExtraForwardArguments) {
  Push dist([] { return std::make_shared<TwoInputs>(); });
  Pid pid = dist.p_create(ParticleOptions().on("f", [](Particle& p, const Args&) {
    auto x = torch::ones({3, 2});
    auto a = p.forward(x, 1.0).wait().toTensor();
    auto b = p.forward(x, 2.0).wait().toTensor();
    return c10::IValue(torch::allclose(a * 2, b));
  }));
  EXPECT_TRUE(dist.p_launch(pid, "f").wait().toBool());
}

TEST(Particle, PromiseCompletedFromOutside) {
  Push dist(tiny_mlp);
  Promise<c10::IValue> promise;
  auto future = promise.future();
  Pid pid = dist.p_create(ParticleOptions().on(
      "await", [future](Particle&, const Args&) { return c10::IValue(future.wait().toInt() * 2); }));
  auto result = dist.p_launch(pid, "await");
  EXPECT_FALSE(result.wait_for(std::chrono::milliseconds(20)));
  promise.set_value(int64_t{21});
  EXPECT_EQ(result.wait().toInt(), 42);
}

}  // namespace
}  // namespace push

// PushOptions::placement(by_size): each particle goes to the lane whose particles hold the
// fewest bytes so far. One network of 1,010 parameters, then ten of 101: the big one alone
// on lane 0 until the small ones on lane 1 add up to as much, where round robin would put
// six on lane 0 (1,010 + 5 x 101 bytes against 5 x 101).
TEST(Particle, PlacementBySizeBalancesTheBytesOfTheLanes) {
  std::atomic<int> made{0};
  auto factory = [&made] {
    const bool big = made++ == 0;
    return torch::nn::AnyModule(torch::nn::Linear(100, big ? 10 : 1));
  };
  push::Push dist(factory, push::PushOptions().devices(2).placement(push::Placement::by_size));
  std::vector<int64_t> lane_bytes(2, 0);
  for (int i = 0; i < 12; ++i) {
    const auto pid = dist.p_create(push::ParticleOptions());
    int64_t bytes = 0;
    for (const auto& t : dist.p_parameters(pid)) bytes += t.numel() * 4;
    const int lane = dist.lane_of(pid);
    // The lightest lane before it (the lowest on a tie).
    const int lightest = lane_bytes[1] < lane_bytes[0] ? 1 : 0;
    EXPECT_EQ(lane, lightest) << "particle " << pid << " (" << bytes << " bytes)";
    lane_bytes[lane] += bytes;
  }
  EXPECT_EQ(dist.lane_of(0), 0);
  for (push::Pid pid = 1; pid <= 10; ++pid) EXPECT_EQ(dist.lane_of(pid), 1) << pid;
  EXPECT_EQ(dist.lane_of(11), 0);  // 4,040 bytes each: a tie
  // An explicit device still wins, and counts: lane 0 holds 4,040 + 404 bytes now, lane 1
  // 10 x 404; pinned to lane 1, the next small one makes both 4,444, so the one after goes
  // to lane 0 (uncounted, lane 1 would still be the lighter).
  const auto pinned = dist.p_create(push::ParticleOptions().device(1));
  EXPECT_EQ(dist.lane_of(pinned), 1);
  EXPECT_EQ(dist.lane_of(dist.p_create(push::ParticleOptions())), 0);
}
