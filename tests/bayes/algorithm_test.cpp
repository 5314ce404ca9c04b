// An algorithm written outside the library against the narrow interface (push/bayes/
// algorithm.h), public headers only: the example of docs/bayes.md, "Adding an algorithm".
#include <gtest/gtest.h>
#include <push/push.h>

#include <torch/torch.h>

namespace push::bayes {
namespace {

// docs/bayes.md's example. Anchored ensembles (Pearce et al. 2020): each member's Gaussian
// prior is centred on an anchor θ₀ ~ N(0, σ² I) of its own instead of on zero. The
// objective's prior adds θ / (σ² N) to the gradient; the step hook adds −θ₀ / (σ² N) before
// the optimizer steps. The anchor is drawn once from the member's seeded generator and
// kept in its state, so it is saved and loaded with the particle.
class Anchored : public Infer {
 public:
  Anchored(ModuleFactory model, InferOptions options) : Infer(std::move(model), std::move(options)) {}
  std::string name() const override { return "anchored"; }

  /// Particle `pid`'s anchor (flat, as parameters_to_vector orders them).
  torch::Tensor anchor_of(Pid pid) { return distribution().p_launch(pid, "anchor").wait().toTensor(); }

 protected:
  ParticleOptions particle_options() override {
    return ParticleOptions().on("anchor", [this](Particle& p, const Args&) { return c10::IValue(anchor(p)); });
  }

  StepHooks epoch_hooks(Particle& p, int64_t epoch) override {
    StepHooks hooks;
    hooks.step = [this, &p] {  // the prior's gradient θ/(σ²N) becomes (θ − θ₀)/(σ²N)
      const double sigma = options().prior_std();
      const double scale = 1.0 / (sigma * sigma * training().dataset_size());
      const auto theta0 = anchor(p);
      torch::NoGradGuard no_grad;
      int64_t offset = 0;
      for (auto& t : p.module().parameters()) {
        t.mutable_grad().add_(theta0.narrow(0, offset, t.numel()).view_as(t), -scale);
        offset += t.numel();
      }
      p.optimizer().step();
    };
    return hooks;
  }

 private:
  torch::Tensor anchor(Particle& p) const {  // drawn once, kept (and saved) in p's state
    auto& held = p.state()["anchor"];
    if (!held.isTensor()) {
      const int64_t size = torch::nn::utils::parameters_to_vector(p.module().parameters()).numel();
      held = torch::randn({size}, training().generator(p.pid(), /*purpose=*/7)) * options().prior_std();
    }
    return held.toTensor();
  }
};

InferOptions anchored_options(bool fuse) {
  // Few points and a narrow prior: the prior, wherever it is centred, outweighs the data.
  return InferOptions()
      .particles(3)
      .distribution(PushOptions().devices(1).cache_size(4).intra_op_threads(1).seed(5))
      .batch_size(8)
      .prior_std(0.3)
      .likelihood(Likelihood::heteroscedastic)
      .fuse(fuse)
      .optimizer([](std::vector<torch::Tensor> ps) {
        return std::make_unique<torch::optim::SGD>(std::move(ps), torch::optim::SGDOptions(0.05));
      });
}

torch::Tensor particle_vector(Infer& algo, Pid pid) {
  std::vector<torch::Tensor> flat;
  for (const auto& t : algo.distribution().p_parameters(pid)) flat.push_back(t.reshape({-1}));
  return torch::cat(flat);
}

TEST(Algorithm, OneWrittenOutsideTheLibraryTrainsTowardsItsOwnPrior) {
  auto train = data::synthetic_gap(8, 3);
  auto model = make_model("mlp:8", {1}, 2);
  Anchored anchored(model, anchored_options(false));
  Ensemble plain(model, anchored_options(false));
  anchored.fit(train, 150);
  plain.fit(train, 150);
  EXPECT_EQ(anchored.name(), "anchored");
  for (Pid pid = 0; pid < 3; ++pid) {
    const auto theta0 = anchored.anchor_of(pid);
    const double to_own = (particle_vector(anchored, pid) - theta0).norm().item<double>();
    const double plain_to_it = (particle_vector(plain, pid) - theta0).norm().item<double>();
    // Each member sits near its own anchor; the same member trained with the prior at zero does not.
    EXPECT_LT(to_own, 0.5 * plain_to_it) << "particle " << pid << ": " << to_own << " vs " << plain_to_it;
  }
  EXPECT_FALSE(torch::equal(anchored.anchor_of(0), anchored.anchor_of(1)));
}

TEST(Algorithm, OneWithHooksForAParticleOnlyTrainsTheSameWhenAskedToFuse) {
  // The example defines epoch_hooks and no fused_epoch_hooks: asked to fuse, its members
  // train one by one with its hooks, not fused without them.
  auto train = data::synthetic_gap(8, 3);
  auto model = make_model("mlp:8", {1}, 2);
  Anchored fused(model, anchored_options(true)), alone(model, anchored_options(false));
  fused.fit(train, 5);
  alone.fit(train, 5);
  for (Pid pid = 0; pid < 3; ++pid) {
    EXPECT_TRUE(torch::equal(particle_vector(fused, pid), particle_vector(alone, pid))) << "particle " << pid;
  }
}

TEST(Algorithm, ItsStateIsSavedAndLoadedWithTheParticle) {
  auto train = data::synthetic_gap(8, 3);
  auto model = make_model("mlp:8", {1}, 2);
  const auto dir = std::filesystem::temp_directory_path() / ("push_anchored_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  torch::Tensor saved;
  {
    Anchored a(model, anchored_options(false));
    a.fit(train, 2);
    saved = a.anchor_of(1);
    a.save(dir);
  }
  // Another seed would draw another anchor: the loaded one is the saved one.
  auto other = anchored_options(false);
  other.distribution().seed(6);
  Anchored b(model, other);
  b.load(dir);
  EXPECT_TRUE(torch::equal(b.anchor_of(1), saved));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace push::bayes
