// Fused particles: a FusedStack computes what its members compute one by one, and every
// algorithm gives the same results fused and unfused (cache smaller than the group,
// several lanes, a checkpoint in the middle).
#include <push/bayes.h>
#include <push/bayes/fused.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <filesystem>

#include "core/torch_compat.h"

#include "test_util.h"

namespace push::bayes {
namespace {

using push::testing::adam;
using push::testing::max_rel;

std::vector<torch::nn::AnyModule> members_of(const ModuleFactory& factory, int n) {
  std::vector<torch::nn::AnyModule> out;
  for (int i = 0; i < n; ++i) {
    torch::manual_seed(100 + i);
    out.push_back(factory());
  }
  return out;
}

// Forward, backward and two Adam steps of a stack against the same on each member alone.
void expect_stack_matches_members(const ModuleFactory& factory, const std::vector<int64_t>& input, int n) {
  auto fused_nets = members_of(factory, n), alone = members_of(factory, n);
  std::vector<torch::nn::Module*> modules;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> owned;
  std::vector<torch::optim::Optimizer*> opts;
  for (auto& m : fused_nets) {
    modules.push_back(m.ptr().get());
    owned.push_back(adam(1e-2)(m.ptr()->parameters()));
    opts.push_back(owned.back().get());
  }
  std::vector<std::unique_ptr<torch::optim::Optimizer>> alone_opts;
  for (auto& m : alone) alone_opts.push_back(adam(1e-2)(m.ptr()->parameters()));
  torch::manual_seed(7);
  std::vector<int64_t> shape{n, 5};
  shape.insert(shape.end(), input.begin(), input.end());
  for (int round = 0; round < 2; ++round) {
    auto x = torch::randn(shape);
    FusedStack stack(modules, opts, adam(1e-2));
    ASSERT_EQ(stack.size(), n);
    auto out = stack.forward(x);
    stack.zero_grad();
    out.pow(2).sum().backward();
    for (int i = 0; i < n; ++i) {
      alone_opts[i]->zero_grad();
      auto mine = alone[i].forward(x[i]);
      EXPECT_LT(max_rel(out[i].detach(), mine.detach()), 1e-5) << "member " << i;
      mine.pow(2).sum().backward();
      alone_opts[i]->step();
    }
    stack.step();
    stack.write_back();
  }
  for (int i = 0; i < n; ++i) {
    auto a = fused_nets[i].ptr()->parameters(), b = alone[i].ptr()->parameters();
    for (size_t k = 0; k < a.size(); ++k) {
      EXPECT_LT(max_rel(a[k], b[k]), 1e-5) << "member " << i << " parameter " << k;
      EXPECT_LT(max_rel(a[k].grad(), b[k].grad()), 1e-5) << "gradient of member " << i << " parameter " << k;
    }
    // The optimizer state went back too: the next unfused step continues the same run.
    auto& state = owned[i]->state();
    EXPECT_EQ(state.size(), a.size());
  }
}

// The tensors and step count of a state of LibTorch's element-wise optimizers.
std::vector<torch::Tensor> state_tensors(torch::optim::OptimizerParamState& s, int64_t& step) {
  using namespace torch::optim;
  if (auto* a = dynamic_cast<AdamParamState*>(&s))
    return step = a->step(), std::vector{a->exp_avg(), a->exp_avg_sq(), a->max_exp_avg_sq()};
  if (auto* a = dynamic_cast<AdamWParamState*>(&s))
    return step = a->step(), std::vector{a->exp_avg(), a->exp_avg_sq(), a->max_exp_avg_sq()};
  if (auto* a = dynamic_cast<SGDParamState*>(&s)) return step = 0, std::vector{a->momentum_buffer()};
  if (auto* a = dynamic_cast<RMSpropParamState*>(&s))
    return step = a->step(), std::vector{a->square_avg(), a->momentum_buffer(), a->grad_avg()};
  if (auto* a = dynamic_cast<AdagradParamState*>(&s)) return step = a->step(), std::vector{a->sum()};
  ADD_FAILURE() << "unknown optimizer state";
  return {};
}

// Every optimizer kind: stacked steps and the state handed back equal the members' own.
TEST(FusedStack, EveryOptimizerKindStepsAsItsMembersAndHandsItsStateBack) {
  namespace optim = torch::optim;
  using Factory = OptimizerFactory;
  auto make = [](auto options) -> Factory {
    return [options](std::vector<torch::Tensor> ps) -> std::unique_ptr<optim::Optimizer> {
      using O = std::conditional_t<
          std::is_same_v<decltype(options), optim::AdamOptions>, optim::Adam,
          std::conditional_t<
              std::is_same_v<decltype(options), optim::AdamWOptions>, optim::AdamW,
              std::conditional_t<std::is_same_v<decltype(options), optim::SGDOptions>, optim::SGD,
                                 std::conditional_t<std::is_same_v<decltype(options), optim::RMSpropOptions>,
                                                    optim::RMSprop, optim::Adagrad>>>>;
      return std::make_unique<O>(std::move(ps), options);
    };
  };
  const std::pair<const char*, Factory> kinds[] = {
      {"adam amsgrad", make(optim::AdamOptions(1e-2).amsgrad(true).weight_decay(1e-3))},
      {"adamw", make(optim::AdamWOptions(1e-2))},
      {"sgd", make(optim::SGDOptions(1e-2))},
      {"sgd momentum nesterov", make(optim::SGDOptions(1e-2).momentum(0.9).nesterov(true))},
      {"rmsprop centered momentum", make(optim::RMSpropOptions(1e-3).centered(true).momentum(0.5))},
      {"adagrad", make(optim::AdagradOptions(1e-2))},
  };
  auto factory = make_model("mlp:8", {2}, 1);
  for (const auto& [what, kind] : kinds) {
    auto fused_nets = members_of(factory, 3), alone = members_of(factory, 3);
    std::vector<torch::nn::Module*> modules;
    std::vector<std::unique_ptr<torch::optim::Optimizer>> owned, alone_opts;
    std::vector<torch::optim::Optimizer*> opts;
    for (int i = 0; i < 3; ++i) {
      modules.push_back(fused_nets[i].ptr().get());
      owned.push_back(kind(fused_nets[i].ptr()->parameters()));
      opts.push_back(owned.back().get());
      alone_opts.push_back(kind(alone[i].ptr()->parameters()));
    }
    torch::manual_seed(3);
    for (int round = 0; round < 3; ++round) {  // stacks rebuilt each round from the handed-back state
      auto x = torch::randn({3, 4, 2});
      FusedStack stack(modules, opts, kind);
      stack.zero_grad();
      stack.forward(x).pow(2).sum().backward();
      stack.step();
      stack.write_back();
      for (int i = 0; i < 3; ++i) {
        alone_opts[i]->zero_grad();
        alone[i].forward(x[i]).pow(2).sum().backward();
        alone_opts[i]->step();
      }
    }
    for (int i = 0; i < 3; ++i) {
      auto a = fused_nets[i].ptr()->parameters(), b = alone[i].ptr()->parameters();
      for (size_t k = 0; k < a.size(); ++k) {
        EXPECT_LT(max_rel(a[k], b[k]), 1e-5) << what << ": member " << i << " parameter " << k;
        auto &mine = owned[i]->state(), &theirs = alone_opts[i]->state();
        auto key_a = compat::optimizer_state_key(a[k]), key_b = compat::optimizer_state_key(b[k]);
        ASSERT_EQ(mine.count(key_a), theirs.count(key_b)) << what;
        if (mine.count(key_a) == 0) continue;
        int64_t step_a = -1, step_b = -1;
        auto ta = state_tensors(*mine.at(key_a), step_a), tb = state_tensors(*theirs.at(key_b), step_b);
        EXPECT_EQ(step_a, step_b) << what;
        ASSERT_EQ(ta.size(), tb.size()) << what;
        for (size_t j = 0; j < ta.size(); ++j) {
          ASSERT_EQ(ta[j].defined(), tb[j].defined()) << what << " state " << j;
          if (tb[j].defined() && tb[j].numel() > 0) {
            EXPECT_LT(max_rel(ta[j], tb[j]), 1e-5) << what << " state " << j;
          }
        }
      }
    }
  }
}

TEST(FusedStack, MlpMatchesItsMembers) { expect_stack_matches_members(make_model("mlp:16,8", {3}, 2), {3}, 4); }

TEST(FusedStack, CnnMatchesItsMembers) {
  expect_stack_matches_members(make_model("cnn:4,6", {1, 8, 8}, 3), {1, 8, 8}, 3);
}

TEST(FusedStack, DropoutMasksAreEachMembersOwn) {
  auto factory = make_model("mlp:32", {4}, 1, /*dropout=*/0.5);
  auto fused_nets = members_of(factory, 3), alone = members_of(factory, 3);
  std::vector<torch::nn::Module*> modules;
  for (auto& m : fused_nets) modules.push_back(m.ptr().get());
  FusedStack stack(modules, {}, nullptr);
  auto x = torch::randn({3, 6, 4});
  auto out = stack.forward(x);
  for (int i = 0; i < 3; ++i) {
    // A mask drawn differently would zero other units: far beyond rounding.
    EXPECT_LT(max_rel(out[i].detach(), alone[i].forward(x[i]).detach()), 1e-6) << "member " << i;
  }
  EXPECT_PUSH_ERROR(stack.step(), "no optimizer");
}

TEST(FusedStack, SaysWhatItCannotFuse) {
  namespace nn = torch::nn;
  auto with = [](nn::Sequential seq) { return fusion_blocker(*to_any_module(std::move(seq)).ptr()); };
  EXPECT_EQ(with(nn::Sequential(nn::Linear(2, 3), nn::ReLU(), nn::Linear(3, 1))), "");
  EXPECT_NE(with(nn::Sequential(nn::Linear(2, 3), nn::Dropout(0.5))).find("global generator"), std::string::npos);
  EXPECT_NE(with(nn::Sequential(nn::Linear(2, 3), nn::BatchNorm1d(3))).find("layer 1"), std::string::npos);
  EXPECT_NE(fusion_blocker(*nn::AnyModule(nn::Linear(2, 3)).ptr()).find("Sequential"), std::string::npos);
  auto net = make_model("mlp:4", {2}, 1)();
  torch::optim::LBFGS lbfgs(net.ptr()->parameters());
  EXPECT_NE(fusion_blocker(*net.ptr(), &lbfgs).find("element-wise"), std::string::npos);
  auto adam_of_net = adam()(net.ptr()->parameters());
  EXPECT_EQ(fusion_blocker(*net.ptr(), adam_of_net.get()), "");
  // A frozen parameter would be trained by a stack.
  auto frozen = make_model("mlp:4", {2}, 1)();
  frozen.ptr()->parameters()[0].requires_grad_(false);
  EXPECT_NE(fusion_blocker(*frozen.ptr()).find("frozen"), std::string::npos);
  // Members whose optimizers have taken different numbers of steps.
  {
    auto a1 = make_model("mlp:4", {2}, 1)(), b1 = make_model("mlp:4", {2}, 1)();
    auto oa = adam()(a1.ptr()->parameters()), ob = adam()(b1.ptr()->parameters());
    a1.forward(torch::ones({1, 2})).sum().backward();
    oa->step();
    EXPECT_PUSH_ERROR(FusedStack({a1.ptr().get(), b1.ptr().get()}, {oa.get(), ob.get()}, adam()), "optimizer state");
  }
  // Members must share one architecture.
  auto a = make_model("mlp:4", {2}, 1)(), b = make_model("mlp:5", {2}, 1)();
  EXPECT_PUSH_ERROR(FusedStack({a.ptr().get(), b.ptr().get()}, {}, nullptr), "differs from member 0");
}

// ---- every algorithm, fused against unfused -----------------------------------------------

data::Dataset regression(int64_t n) { return data::synthetic_gap(n, 3); }

struct Outcome {
  Predictive pred;
  std::vector<double> losses;
  bool fused = false;
};

template <class Algo, class... Extra>
Outcome run(bool fuse, int epochs, const ModuleFactory& model, InferOptions options, const data::Dataset& train,
            const torch::Tensor& test_x, Extra... extra) {
  Algo algo(model, options.fuse(fuse), extra...);
  algo.fit(train, epochs);
  return {algo.predict(test_x), algo.losses(), algo.fused()};
}

void expect_same(const Outcome& a, const Outcome& b, const char* what) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t e = 0; e < a.losses.size(); ++e) {
    EXPECT_NEAR(a.losses[e], b.losses[e], 1e-5 * std::abs(b.losses[e]) + 1e-9) << what << " epoch " << e;
  }
  if (a.pred.task == Task::classification) {
    EXPECT_LT(max_rel(a.pred.probs, b.pred.probs), 1e-5) << what;
  } else {
    EXPECT_LT(max_rel(a.pred.mean, b.pred.mean), 1e-5) << what;
    EXPECT_LT(max_rel(a.pred.variance, b.pred.variance), 1e-5) << what;
  }
}

InferOptions with_cache(InferOptions options, int cache_size) {
  options.distribution().cache_size(cache_size);
  return options;
}

InferOptions small_options() {
  // 5 particles on 2 lanes with room for 2 each: groups {0, 2}, {4}, {1, 3}.
  return InferOptions()
      .particles(5)
      .distribution(PushOptions().devices(2).cache_size(2).intra_op_threads(1).seed(11))
      .batch_size(32)
      .lr(1e-2)
      .likelihood(Likelihood::heteroscedastic);
}

TEST(Fused, EveryAlgorithmGivesTheUnfusedResults) {
  auto train = regression(96);
  auto x = torch::linspace(-1.5, 1.5, 17).unsqueeze(1);
  auto model = make_model("mlp:16,16", {1}, 2);
  auto options = small_options();
  {
    auto f = run<Ensemble>(true, 3, model, options, train, x, EnsembleOptions().bootstrap(true));
    auto u = run<Ensemble>(false, 3, model, options, train, x, EnsembleOptions().bootstrap(true));
    EXPECT_TRUE(f.fused);
    EXPECT_FALSE(u.fused);
    expect_same(f, u, "ensemble");
  }
  {
    auto swag = SWAGOptions().pretrain_epochs(1).rank(2).samples(4);
    expect_same(run<MultiSWAG>(true, 3, model, options, train, x, swag),
                run<MultiSWAG>(false, 3, model, options, train, x, swag), "mswag");
    auto every =
        SWAGOptions().pretrain_epochs(1).rank(2).samples(4).collect_every_steps(2).collect_momentum(std::nullopt);
    expect_same(run<MultiSWAG>(true, 3, model, options, train, x, every),
                run<MultiSWAG>(false, 3, model, options, train, x, every), "mswag, collect every 2 steps");
  }
  expect_same(run<SVGD>(true, 3, model, options, train, x), run<SVGD>(false, 3, model, options, train, x), "svgd");
  auto dropout = make_model("mlp:16,16", {1}, 2, 0.2);
  expect_same(run<MCDropout>(true, 3, dropout, options, train, x, McDropoutOptions().samples(3)),
              run<MCDropout>(false, 3, dropout, options, train, x, McDropoutOptions().samples(3)), "mcdropout");
  auto noise = small_options().likelihood(Likelihood::learned_noise);
  auto plain = make_model("mlp:16", {1}, 1);
  expect_same(run<SVGD>(true, 3, plain, noise, train, x), run<SVGD>(false, 3, plain, noise, train, x),
              "svgd, learned noise");
}

TEST(Fused, CnnClassifierGivesTheUnfusedResults) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  data::Dataset train;
  train.task = Task::classification;
  train.x = torch::randn({64, 1, 8, 8}, gen);
  train.y = (train.x.mean({1, 2, 3}) > 0).to(torch::kLong);
  train.num_classes = 2;
  auto options = small_options().particles(3).likelihood(Likelihood::categorical);
  auto model = make_model("cnn:4,4", {1, 8, 8}, 2);
  auto test_x = torch::randn({9, 1, 8, 8}, gen);
  auto f = run<Ensemble>(true, 2, model, options, train, test_x);
  EXPECT_TRUE(f.fused);
  expect_same(f, run<Ensemble>(false, 2, model, options, train, test_x), "cnn ensemble");
}

TEST(Fused, ACheckpointOfAFusedRunResumesUnfusedAndTheOtherWayRound) {
  auto train = regression(96);
  auto x = torch::linspace(-1.5, 1.5, 17).unsqueeze(1);
  auto model = make_model("mlp:16,16", {1}, 2);
  const auto dir = std::filesystem::temp_directory_path() / ("push_fused_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  for (bool first_fused : {true, false}) {
    {
      Ensemble first(model, small_options().fuse(first_fused));
      first.fit(train, 2);
      first.save(dir);
    }
    Ensemble second(model, small_options().fuse(!first_fused));
    second.load(dir);
    second.fit(train, 1);
    Outcome resumed{second.predict(x), second.losses(), second.fused()};
    expect_same(resumed, run<Ensemble>(false, 3, model, small_options(), train, x), "resumed");
    std::filesystem::remove_all(dir);
  }
}

TEST(Fused, ModelsItCannotFuseTrainUnfused) {
  auto model = ModuleFactory([] {
    return to_any_module(
        torch::nn::Sequential(torch::nn::Linear(1, 4), torch::nn::BatchNorm1d(4), torch::nn::Linear(4, 2)));
  });
  Ensemble ens(model, small_options().fuse(true));
  EXPECT_FALSE(ens.fused());
  ens.fit(regression(64), 1);
  EXPECT_EQ(ens.losses().size(), 1u);
}

// An ensemble whose particle 3 blows up in its second epoch.
class Poisoned : public Ensemble {
 public:
  using Ensemble::Ensemble;

 protected:
  void prepare_epoch(Particle& p, int64_t epoch) override {
    if (p.pid() != 3 || epoch != 1) return;
    torch::NoGradGuard no_grad;
    for (auto& t : p.module().parameters()) t.fill_(1e30);
  }
};

TEST(Fused, ADivergingMemberIsNamedAndTheGroupStaysUsable) {
  auto train = regression(64);
  for (bool fuse : {true, false}) {
    Poisoned ens(make_model("mlp:8", {1}, 2), with_cache(small_options(), 4).particles(4).fuse(fuse));
    EXPECT_EQ(ens.fused(), fuse);
    EXPECT_PUSH_ERROR(ens.fit(train, 2), "of particle 3 is non-finite");
    // Pins and borrowed handles were given back: the particles still answer.
    auto p = ens.predict(torch::zeros({2, 1}));
    EXPECT_EQ(p.members.size(0), 4);
  }
}

// Particle 1 trains on the first half of the data only: its group cannot stack.
class HalfRows : public Ensemble {
 public:
  using Ensemble::Ensemble;

 protected:
  torch::Tensor epoch_rows(Particle& p, int64_t n) const override {
    return p.pid() == 1 ? torch::arange(n / 2) : torch::Tensor();
  }
};

TEST(Fused, AGroupWhoseMembersCannotStackTrainsOneByOne) {
  auto train = regression(64);
  auto x = torch::linspace(-1.5, 1.5, 9).unsqueeze(1);
  auto model = make_model("mlp:8", {1}, 2);
  HalfRows fused(model, with_cache(small_options(), 4).particles(4).fuse(true));
  HalfRows plain(model, with_cache(small_options(), 4).particles(4));
  EXPECT_TRUE(fused.fused());
  fused.fit(train, 2);
  plain.fit(train, 2);
  expect_same({fused.predict(x), fused.losses(), true}, {plain.predict(x), plain.losses(), false}, "half rows");
}

// An algorithm with its own "epoch" handler keeps it, and trains unfused.
class OwnEpoch : public Ensemble {
 public:
  using Ensemble::Ensemble;
  std::atomic<int> ran{0};

 protected:
  ParticleOptions particle_options() override {
    return ParticleOptions().on("epoch", [this](Particle& p, const Args& a) {
      ++ran;
      return c10::IValue(training().train_epoch(p, a[0].toTensor(), a[1].toTensor(), a[2].toInt()));
    });
  }
};

TEST(Fused, AnAlgorithmsOwnEpochHandlerIsKept) {
  OwnEpoch own(make_model("mlp:8", {1}, 2), small_options().particles(3).fuse(true));
  EXPECT_FALSE(own.fused());
  own.fit(regression(64), 2);
  EXPECT_EQ(own.ran.load(), 6);
}

TEST(Fused, BorrowTakesOnlyThisLanesParticlesAndNeverWaits) {
  Push dist([] { return push::testing::tiny_mlp(); }, PushOptions().devices(2));
  auto opts = ParticleOptions()
                  .optimizer(adam())
                  .on("noop", [](Particle&, const Args&) { return c10::IValue(); })
                  .on("borrow", [](Particle& p, const Args& a) {
                    std::string seen;
                    p.borrow(a[0].toIntVector(), [&](const std::vector<Particle*>& ps) {
                      for (Particle* q : ps)
                        seen += std::to_string(q->pid()) + ":" + std::to_string(q->module().parameters().size()) + " ";
                      if (a[1].toBool()) p.wait(std::vector<PFuture>{});
                      // Any wait, not only Particle::wait: a message to itself cannot be answered meanwhile.
                      if (a.size() > 2) p.send(p.pid(), "noop").wait();
                    });
                    return c10::IValue(seen);
                  });
  for (int i = 0; i < 4; ++i) dist.p_create(opts);  // lanes: 0, 2 on lane 0; 1, 3 on lane 1
  EXPECT_EQ(dist.p_launch(0, "borrow", std::vector<int64_t>{0, 2}, false).wait().toStringRef(), "0:4 2:4 ");
  EXPECT_PUSH_ERROR(dist.p_launch(0, "borrow", std::vector<int64_t>{1}, false).wait(), "not on the lane");
  EXPECT_PUSH_ERROR(dist.p_launch(0, "borrow", std::vector<int64_t>{2, 2}, false).wait(), "listed twice");
  EXPECT_PUSH_ERROR(dist.p_launch(2, "borrow", std::vector<int64_t>{0}, true).wait(), "cannot wait");
  EXPECT_PUSH_ERROR(dist.p_launch(2, "borrow", std::vector<int64_t>{0}, false, true).wait(), "cannot wait");
  // The lane lends nothing after a refused wait: the next borrow works.
  EXPECT_EQ(dist.p_launch(2, "borrow", std::vector<int64_t>{0, 2}, false).wait().toStringRef(), "0:4 2:4 ");
}

}  // namespace
}  // namespace push::bayes
