// SG-MCMC chains as particles (push/bayes/sgmcmc.h): the posterior they sample, fused and
// unfused alike, their samples kept and saved, the schedule, and bad options.
#include <push/bayes.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>
#include <filesystem>

#include "sgmcmc_posterior.h"
#include "test_util.h"

namespace push::bayes {
namespace {

using exact::chain_model;
using exact::expect_posterior;
using exact::linear_posterior;
using exact::pooled_samples;

InferOptions chain_options_for(int particles) {
  return InferOptions().particles(particles).batch_size(100).noise_std(0.5).prior_std(1.0).distribution(
      PushOptions().seed(3));
}

// A short version of sgmcmc_long_test.cpp's check, with wider bounds: a wrong noise scale
// (a variance off by 2x) or a drift in the mean still fails it.
TEST(SGMCMC, EveryMethodSamplesNearTheExactPosterior) {
  for (const auto& c : exact::chain_cases()) exact::check_chains(c, ::push::testing::scaled(1000, 500, 2), 0.3, 0.4);
}

TEST(SGMCMC, FusedChainsTakeTheStepsOfChainsAlone) {
  auto d = data::synthetic_gap(96, 4);
  for (auto options : {SGMCMCOptions(), SGMCMCOptions().preconditioned(true),
                       SGMCMCOptions().method(SGMCMCMethod::sghmc).cycle_epochs(2)}) {
    // Cycles of 2 epochs sample in epoch 1 only: 3 steps, each kept.
    options.step_size(1e-2).thin(options.cycle_epochs() > 0 ? 1 : 2).samples(3);
    auto make = [&](bool fuse) {
      return SGMCMC(make_model("mlp:8", {1}, 1), InferOptions().particles(3).batch_size(32).fuse(fuse), options);
    };
    auto alone = make(false), fused = make(true);
    alone.fit(d, 3);
    fused.fit(d, 3);
    ASSERT_TRUE(fused.fused());
    for (int pid = 0; pid < 3; ++pid) {
      const auto a = alone.samples(pid), f = fused.samples(pid);
      ASSERT_EQ(a.sizes(), f.sizes());
      EXPECT_EQ(a.size(0), 3);  // 9 steps, one kept in 2 (4), the last 3 of them
      EXPECT_TRUE(torch::allclose(a, f, 1e-4, 1e-5)) << alone.name() << " particle " << pid;
    }
    auto x = torch::linspace(-3, 3, 7).unsqueeze(1);
    EXPECT_EQ(alone.predict(x).members.size(0), 3 * 3);
  }
}

/// SGMCMC that also answers "second": a particle's pSGLD V.
class SecondMomentProbe : public SGMCMC {
 public:
  using SGMCMC::SGMCMC;
  torch::Tensor second(Pid pid) { return distribution().p_launch(pid, "second").wait().toTensor(); }

 protected:
  ParticleOptions particle_options() override {
    return SGMCMC::particle_options().on("second", [](Particle& p, const Args&) {
      return c10::IValue(p.state().at("sgmcmc_second").toTensor().clone());
    });
  }
};

// With hold_preconditioner, pSGLD's V adapts through burn-in and is held once samples are
// kept (G constant, so the dropped Γ term is zero); by default it adapts on every step. On
// the linear posterior no coordinate wakes: V is held exactly. In a ReLU network units
// inactive through burn-in wake: there V adapts, and so only grows.
TEST(SGMCMC, PreconditionedChainsHoldTheirPreconditionerWhileSampling) {
  const auto linear = linear_posterior(200, 0.5, 1.0);
  const auto gap = data::synthetic_gap(64, 6);
  for (bool network : {false, true}) {
    for (bool fuse : {false, true}) {
      for (bool hold : {true, false}) {
        SCOPED_TRACE(std::string(network ? "mlp:8" : "linear") + (fuse ? ", fused" : ", alone") +
                     (hold ? ", held" : ", adapting"));
        SecondMomentProbe chains(
            network ? make_model("mlp:8", {1}, 1) : chain_model(),
            InferOptions().particles(2).batch_size(network ? 16 : 50).noise_std(0.5).fuse(fuse),
            SGMCMCOptions().preconditioned(true).hold_preconditioner(hold).step_size(1e-2).burn_in_epochs(2));
        const auto& d = network ? gap : linear.data;
        chains.fit(d, 1);
        const auto burning = chains.second(1);
        chains.fit(d, 1);
        const auto burnt = chains.second(1);
        EXPECT_FALSE(torch::equal(burning, burnt));  // still adapting in epoch 1
        chains.fit(d, 2);                            // epochs 2 and 3 keep samples, 4 steps each
        EXPECT_EQ(chains.samples(1).size(0), 8);
        const auto sampled = chains.second(1);
        if (!hold) {
          EXPECT_FALSE(torch::equal(burnt, sampled));
        } else if (!network) {
          EXPECT_TRUE(torch::equal(burnt, sampled));
        } else {
          EXPECT_TRUE((sampled >= burnt).all().item<bool>());
        }
      }
    }
  }
}

// A held coordinate whose gradient was ~0 through burn-in (here the weight, on inputs all
// 0: only its prior pulls it) and is large once sampling starts (inputs of spread 1, as a
// network unit that wakes): its V adapts there (g² > 100 V) instead of stepping with G ≈
// 1/λ, and the chain stays finite.
TEST(SGMCMC, AHeldPreconditionerAdaptsWhereACoordinateWakes) {
  const auto linear = linear_posterior(200, 0.5, 1.0);
  auto asleep = linear.data;
  asleep.x = torch::zeros_like(asleep.x);
  SecondMomentProbe chains(
      chain_model(), InferOptions().particles(2).batch_size(50).noise_std(0.5).prior_std(1.0),
      SGMCMCOptions().preconditioned(true).hold_preconditioner(true).step_size(1e-3).burn_in_epochs(3));
  chains.fit(asleep, 3);
  const auto burnt = chains.second(0);  // [weight, bias]
  chains.fit(linear.data, 2);
  const auto sampled = chains.second(0);
  EXPECT_GT(sampled[0].item<double>(), 100 * burnt[0].item<double>()) << burnt << sampled;
  EXPECT_TRUE(torch::isfinite(chains.samples(0)).all().item<bool>());
  EXPECT_LT(chains.samples(0).abs().max().item<double>(), 10);
}

TEST(SGMCMC, SamplesAndChainStateSurviveSaveAndLoad) {
  auto d = data::synthetic_gap(64, 5);
  const auto options = SGMCMCOptions().method(SGMCMCMethod::sghmc).step_size(1e-2).samples(4);
  auto make = [&] { return SGMCMC(make_model("mlp:8", {1}, 1), InferOptions().particles(2).batch_size(16), options); };
  auto a = make();
  a.fit(d, 2);
  // One sample a step, the last 4 kept oldest first (the ring has wrapped): the newest is
  // the chain's current parameters.
  const auto held = a.samples(0);
  ASSERT_EQ(held.size(0), 4);
  std::vector<torch::Tensor> flat;
  for (const auto& [name, t] : a.distribution().p_named_parameters(0)) flat.push_back(t.reshape(-1));
  EXPECT_TRUE(torch::equal(held[3], torch::cat(flat)));
  EXPECT_FALSE(torch::equal(held[2], held[3]));
  auto dir = std::filesystem::temp_directory_path() / ("push_sgmcmc_ckpt_" + std::to_string(::getpid()));
  a.save(dir);
  auto b = make();
  b.load(dir);
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(torch::equal(a.samples(1), b.samples(1)));
  a.fit(d, 1);
  b.fit(d, 1);  // the same momentum, noise and samples: the same third epoch
  EXPECT_TRUE(torch::equal(a.samples(0), b.samples(0)));
  auto x = torch::linspace(-3, 3, 5).unsqueeze(1);
  EXPECT_TRUE(torch::equal(a.predict(x).mean, b.predict(x).mean));
  SGMCMC other(make_model("mlp:8", {1}, 1), InferOptions().particles(2), SGMCMCOptions());
  EXPECT_PUSH_ERROR(other.load(dir), "no checkpoint");
}

TEST(SGMCMC, AChainLoadedWithAnotherSampleCountKeepsItsLatestInOrder) {
  auto d = data::synthetic_gap(64, 8);
  auto make = [&](int64_t samples) {
    return SGMCMC(make_model("mlp:8", {1}, 1), InferOptions().particles(1).batch_size(16),
                  SGMCMCOptions().step_size(1e-2).samples(samples));
  };
  auto a = make(3);
  a.fit(d, 2);  // 8 steps: the ring of 3 has wrapped
  const auto before = a.samples(0);
  auto dir = std::filesystem::temp_directory_path() / ("push_sgmcmc_ring_" + std::to_string(::getpid()));
  a.save(dir);
  for (int64_t samples : {2, 5}) {
    auto b = make(samples);
    b.load(dir);
    b.fit(d, 1);  // 4 more steps
    const auto after = b.samples(0);
    ASSERT_EQ(after.size(0), std::min<int64_t>(samples, 3 + 4)) << samples;
    if (samples == 5) EXPECT_TRUE(torch::equal(after[0], before[2]));  // the newest of before, then 4 new
    std::vector<torch::Tensor> flat;
    for (const auto& [name, t] : b.distribution().p_named_parameters(0)) flat.push_back(t.reshape(-1));
    EXPECT_TRUE(torch::equal(after[after.size(0) - 1], torch::cat(flat))) << samples;
  }
  std::filesystem::remove_all(dir);
}

TEST(SGMCMC, TheCyclicalScheduleExploresThenSamples) {
  SGMCMC chains(chain_model(), chain_options_for(1),
                SGMCMCOptions().step_size(0.1).cycle_epochs(4).exploration(0.5).burn_in_epochs(5));
  const double expected[] = {0.1, 0.1 * (std::cos(M_PI / 4) + 1) / 2, 0.05, 0.1 * (std::cos(3 * M_PI / 4) + 1) / 2};
  for (int64_t e = 0; e < 8; ++e) {
    const auto plan = chains.plan(e);
    EXPECT_NEAR(plan.step_size, expected[e % 4], 1e-12) << e;
    EXPECT_EQ(plan.noisy, e % 4 >= 2) << e;
    EXPECT_EQ(plan.keeps, e % 4 >= 2 && e >= 5) << e;
  }
  const auto constant = SGMCMC(chain_model(), chain_options_for(1), SGMCMCOptions().burn_in_epochs(3)).plan(2);
  EXPECT_TRUE(constant.noisy);
  EXPECT_FALSE(constant.keeps);
}

TEST(SGMCMC, BadOptionsAreNamed) {
  auto make = [](SGMCMCOptions o) { SGMCMC(chain_model(), InferOptions().particles(1), o); };
  EXPECT_PUSH_ERROR(make(SGMCMCOptions().step_size(0)), "step_size must be positive and finite, got 0");
  EXPECT_PUSH_ERROR(make(SGMCMCOptions().step_size(std::nan(""))), "step_size must be positive and finite");
  EXPECT_PUSH_ERROR(make(SGMCMCOptions().method(SGMCMCMethod::sghmc).friction(0)), "friction must be in (0, 1]");
  EXPECT_PUSH_ERROR(make(SGMCMCOptions().friction(1.5)), "friction must be in (0, 1], got 1.5");
  EXPECT_PUSH_ERROR(make(SGMCMCOptions().method(SGMCMCMethod::sghmc).preconditioned(true)), "sgld only");
  EXPECT_PUSH_ERROR(make(SGMCMCOptions().preconditioned(true).hold_preconditioner(true)),
                    "hold_preconditioner needs burn_in_epochs, or cycle_epochs with exploration");
  EXPECT_PUSH_ERROR(make(SGMCMCOptions().preconditioned(true).hold_preconditioner(true).cycle_epochs(4).exploration(0)),
                    "hold_preconditioner needs burn_in_epochs, or cycle_epochs with exploration");
  EXPECT_PUSH_ERROR(make(SGMCMCOptions().hold_preconditioner(true).burn_in_epochs(2)), "it needs preconditioned");
  EXPECT_PUSH_ERROR(make(SGMCMCOptions().method(SGMCMCMethod::sghmc).hold_preconditioner(true).burn_in_epochs(2)),
                    "it needs preconditioned");
  EXPECT_PUSH_ERROR(make(SGMCMCOptions().thin(0)), "thin must be >= 1");
  EXPECT_PUSH_ERROR(make(SGMCMCOptions().samples(0)), "samples must be >= 1");
  EXPECT_PUSH_ERROR(make(SGMCMCOptions().exploration(1)), "exploration must be in [0, 1)");
  EXPECT_PUSH_ERROR(make(SGMCMCOptions().temperature(-1)), "temperature must be positive");
  EXPECT_PUSH_ERROR(SGMCMC(chain_model(), InferOptions().cosine_epochs(10), SGMCMCOptions()),
                    "not InferOptions' cosine schedule");
  const OptimizerFactory sgd = [](std::vector<torch::Tensor> ps) {
    return std::make_unique<torch::optim::SGD>(std::move(ps), torch::optim::SGDOptions(0.1));
  };
  EXPECT_PUSH_ERROR(SGMCMC(chain_model(), InferOptions().optimizer(sgd), SGMCMCOptions()),
                    "not InferOptions' optimizer");
}

}  // namespace
}  // namespace push::bayes
