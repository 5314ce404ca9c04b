// The particle cache: real copies, LRU eviction with pinning, and bitwise-identical
// training whatever the cache size.
#include <push/push.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "test_util.h"

namespace push {
namespace {

using testing::mse;
using testing::sgd_momentum;
using testing::tiny_mlp;

// Trains `n` particles for a few epochs, interleaving them message by message and
// reading each other's views, and returns every particle's parameters.
std::vector<std::vector<torch::Tensor>> train(int lanes, int cache_size, int n, const OptimizerFactory& optimizer) {
  Push dist(tiny_mlp, PushOptions().devices(lanes).cache_size(cache_size).seed(7));
  auto x = torch::linspace(-2, 2, 32).unsqueeze(1);
  auto y = torch::sin(x);
  auto opts = ParticleOptions().optimizer(optimizer).on("epoch", [x, y](Particle& p, const Args&) {
    for (int b = 0; b < 4; ++b) {
      auto xb = x.narrow(0, b * 8, 8), yb = y.narrow(0, b * 8, 8);
      p.step(mse, xb, yb).wait();
      // A wait point that suspends this handler mid-epoch (and lets others evict it).
      auto others = p.other_particles();
      ParticleView peer = p.get(others[b % others.size()]).wait();
      EXPECT_EQ(peer.parameters().size(), 4u);
    }
    return c10::IValue();
  });
  for (int i = 0; i < n; ++i) dist.p_create(opts);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<PFuture> fs;
    for (Pid pid = 0; pid < n; ++pid) fs.push_back(dist.p_launch(pid, "epoch"));
    dist.p_wait(fs);
  }
  const int per_lane = (n + lanes - 1) / lanes;
  if (cache_size < per_lane) {
    int64_t evictions = 0;
    for (int l = 0; l < lanes; ++l) evictions += dist.cache_stats(l).evictions;
    EXPECT_GT(evictions, 0);
  }
  std::vector<std::vector<torch::Tensor>> out;
  for (Pid pid = 0; pid < n; ++pid) out.push_back(dist.p_parameters(pid));
  return out;
}

void expect_bitwise_equal(const std::vector<std::vector<torch::Tensor>>& a,
                          const std::vector<std::vector<torch::Tensor>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t p = 0; p < a.size(); ++p) {
    for (size_t i = 0; i < a[p].size(); ++i) {
      EXPECT_TRUE(torch::equal(a[p][i], b[p][i])) << "particle " << p << " tensor " << i;
    }
  }
}

class CacheLanes : public ::testing::TestWithParam<int> {};

TEST_P(CacheLanes, TrainingIsBitwiseIdenticalAtAnyCacheSize) {
  const int lanes = GetParam(), n = 6;
  for (const auto& optimizer : {testing::adam(), sgd_momentum()}) {
    auto reference = train(lanes, /*cache_size=*/n, n, optimizer);
    expect_bitwise_equal(train(lanes, 1, n, optimizer), reference);
    expect_bitwise_equal(train(lanes, 2, n, optimizer), reference);
  }
}

INSTANTIATE_TEST_SUITE_P(Runtime, CacheLanes, ::testing::ValuesIn(testing::lane_counts()),
                         [](const auto& info) { return std::to_string(info.param) + "lanes"; });

TEST(Cache, EvictionCopiesInsteadOfAliasing) {
  // PusH on CPU aliased every particle sharing a cache slot; here each stays itself.
  Push dist(tiny_mlp, PushOptions().cache_size(1));
  auto opts = ParticleOptions().optimizer(testing::adam()).on("nudge", [](Particle& p, const Args& a) {
    torch::NoGradGuard no_grad;
    for (auto& t : p.module().parameters()) t.fill_(a[0].toDouble());
    return c10::IValue();
  });
  for (int i = 0; i < 3; ++i) dist.p_create(opts);
  for (Pid pid = 0; pid < 3; ++pid) dist.p_launch(pid, "nudge", double(pid + 1)).wait();
  for (Pid pid = 0; pid < 3; ++pid) {
    for (auto& t : dist.p_parameters(pid)) {
      EXPECT_TRUE(torch::all(t == double(pid + 1)).item<bool>()) << "particle " << pid;
    }
  }
  auto stats = dist.cache_stats(0);
  EXPECT_EQ(stats.resident, 1);
  EXPECT_GE(stats.evictions, 2);
  EXPECT_GE(stats.restores, 2);
}

TEST(Cache, LeastRecentlyUsedIsEvictedFirst) {
  Push dist(tiny_mlp, PushOptions().cache_size(2));
  auto opts = ParticleOptions().on("touch", [](Particle&, const Args&) { return c10::IValue(); });
  for (int i = 0; i < 3; ++i) dist.p_create(opts);  // creating 2 evicts 0
  EXPECT_EQ(dist.cache_stats(0).evictions, 1);
  dist.p_launch(1, "touch").wait();  // resident: 1 (MRU), 2
  dist.p_launch(0, "touch").wait();  // restores 0, evicts 2 (LRU), not 1
  EXPECT_EQ(dist.cache_stats(0).restores, 1);
  dist.p_launch(1, "touch").wait();  // still resident: no restore
  EXPECT_EQ(dist.cache_stats(0).restores, 1);
  dist.p_launch(2, "touch").wait();  // was evicted: restore
  EXPECT_EQ(dist.cache_stats(0).restores, 2);
}

TEST(Cache, ViewsOfEvictedParticlesComeFromTheHostStore) {
  Push dist(tiny_mlp, PushOptions().cache_size(1));
  auto opts = ParticleOptions().on(
      "peek", [](Particle& p, const Args& a) { return c10::IValue(p.get(a[0].toInt()).wait().flat_parameters()); });
  dist.p_create(opts);
  dist.p_create(opts);
  dist.p_launch(0, "peek", int64_t{0}).wait();  // 0 resident, 1 evicted
  auto seen = dist.p_launch(0, "peek", int64_t{1}).wait().toTensor();
  std::vector<torch::Tensor> parts;
  for (auto& t : dist.p_parameters(1)) parts.push_back(t.reshape(-1));
  EXPECT_TRUE(torch::equal(seen, torch::cat(parts)));
}

// One weight registered under two names (weight tying): 3 names, 10 numbers.
struct Tied : torch::nn::Module {
  Tied() : fc(register_module("fc", torch::nn::Linear(2, 2))) { register_parameter("tied", fc->weight); }
  torch::Tensor forward(torch::Tensor x) { return fc(x).matmul(named_parameters()["tied"]); }
  torch::nn::Linear fc;
};

// Views, flat parameters and gradients are the same whether the particle is resident or
// evicted, also when a parameter appears under several names.
TEST(Cache, TiedParametersLookTheSameResidentOrEvicted) {
  Push dist([] { return std::make_shared<Tied>(); }, PushOptions().cache_size(1));
  auto opts = ParticleOptions()
                  .optimizer([](std::vector<torch::Tensor> ps) -> std::unique_ptr<torch::optim::Optimizer> {
                    return std::make_unique<torch::optim::SGD>(std::move(ps), torch::optim::SGDOptions(0.1));
                  })
                  .on("train",
                      [](Particle& p, const Args&) {
                        auto x = torch::ones({3, 2});
                        return p.step(mse, x, x).wait();
                      })
                  .on("peek", [](Particle& p, const Args& a) {
                    ParticleView v = p.get(a[0].toInt()).wait();
                    return c10::IValue(std::vector<torch::Tensor>{v.flat_parameters(), v.flat_gradients()});
                  });
  dist.p_create(opts);
  dist.p_create(opts);
  dist.p_launch(0, "train").wait();
  auto resident = dist.p_launch(0, "peek", int64_t{0}).wait().toTensorVector();
  auto evicted = dist.p_launch(1, "peek", int64_t{0}).wait().toTensorVector();  // evicts 0
  EXPECT_GE(dist.cache_stats(0).evictions, 2);
  ASSERT_EQ(resident[0].numel(), 10);
  EXPECT_TRUE(torch::equal(evicted[0], resident[0]));
  EXPECT_TRUE(torch::equal(evicted[1], resident[1]));
  EXPECT_TRUE(torch::any(resident[1] != 0).item<bool>());  // the gradients are real
  auto named = dist.p_named_parameters(0);                 // 0 is evicted now
  ASSERT_EQ(named.size(), 3u);
  EXPECT_TRUE(torch::equal(named[0].second, named[1].second));  // "tied" and "fc.weight"
  // Training continues with the weight still shared after a restore.
  dist.p_launch(0, "train").wait();
  named = dist.p_named_parameters(0);
  EXPECT_TRUE(torch::equal(named[0].second, named[1].second));
}

}  // namespace
}  // namespace push
