// InferOptions::cosine_epochs: before each epoch every particle's learning rate is set to
// lr₀ (1 + cos(π e / T)) / 2, whatever the algorithm and fused or not; a resumed run
// continues the same schedule; MultiSWAG collects at its own rate.
#include <push/bayes.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <mutex>
#include <numbers>
#include <set>

#include "test_util.h"

namespace push::bayes {
namespace {

/// The optimizers alive now: the particles' (the scratch ones Infer makes are gone).
struct Live {
  std::mutex mutex;
  std::set<torch::optim::Optimizer*> optimizers;
};

class TrackedSGD : public torch::optim::SGD {
 public:
  TrackedSGD(std::vector<torch::Tensor> ps, double lr, std::shared_ptr<Live> live)
      : torch::optim::SGD(std::move(ps), torch::optim::SGDOptions(lr)), live_(std::move(live)) {
    std::lock_guard lock(live_->mutex);
    live_->optimizers.insert(this);
  }
  ~TrackedSGD() override {
    std::lock_guard lock(live_->mutex);
    live_->optimizers.erase(this);
  }

 private:
  std::shared_ptr<Live> live_;
};

OptimizerFactory tracked_sgd(double lr, const std::shared_ptr<Live>& live) {
  return [lr, live](std::vector<torch::Tensor> ps) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<TrackedSGD>(std::move(ps), lr, live);
  };
}

/// The learning rates of every particle's optimizer.
std::vector<double> rates(Live& live) {
  std::lock_guard lock(live.mutex);
  std::vector<double> out;
  for (auto* o : live.optimizers) out.push_back(o->param_groups()[0].options().get_lr());
  return out;
}

data::Dataset sine(int64_t n) {
  data::Dataset d;
  d.x = torch::linspace(-2, 2, n).unsqueeze(1);
  d.y = torch::sin(d.x);
  return d;
}

ModuleFactory mlp() { return make_model("mlp:8", {1}, 1); }

InferOptions options(int64_t cosine_epochs) {
  return InferOptions().particles(3).distribution(PushOptions().devices(2)).batch_size(16).cosine_epochs(cosine_epochs);
}

double cosine(double lr0, int64_t epoch, int64_t t) {
  return epoch < t ? lr0 * 0.5 * (1 + std::cos(std::numbers::pi * static_cast<double>(epoch) / t)) : 0.0;
}

/// Fits `infer` one epoch at a time and checks every particle's rate against the cosine.
void expect_cosine(Infer& infer, Live& live, double lr0, int64_t t, int64_t epochs, const std::string& what) {
  const auto d = sine(40);
  for (int64_t e = 0; e < epochs; ++e) {
    infer.fit(d, 1);
    const auto rs = rates(live);
    ASSERT_EQ(rs.size(), 3u) << what;
    for (double r : rs) EXPECT_DOUBLE_EQ(r, cosine(lr0, e, t)) << what << ", epoch " << e;
  }
}

TEST(LrSchedule, EveryParticleFollowsTheHalfCosine) {
  for (bool fuse : {false, true}) {
    auto live = std::make_shared<Live>();
    Ensemble e(mlp(), options(4).fuse(fuse).optimizer(tracked_sgd(0.1, live)));
    expect_cosine(e, *live, 0.1, 4, 6, fuse ? "ensemble, fused" : "ensemble");
    EXPECT_EQ(e.fused(), fuse);
  }
  for (bool fuse : {false, true}) {
    auto live = std::make_shared<Live>();
    SVGD s(mlp(), options(3).fuse(fuse).optimizer(tracked_sgd(0.05, live)));
    expect_cosine(s, *live, 0.05, 3, 4, fuse ? "svgd, fused" : "svgd");
    EXPECT_EQ(s.fused(), fuse);
  }
}

// A fused group trains at the rate its members were given for the epoch: the numbers of
// unfused training (to rounding), which sets each particle's rate before its own steps.
TEST(LrSchedule, FusedGroupsTrainAtTheScheduledRate) {
  const auto d = sine(40);
  Ensemble fused(mlp(), options(3).fuse(true).lr(0.05)), plain(mlp(), options(3).fuse(false).lr(0.05));
  Ensemble constant(mlp(), options(0).fuse(true).lr(0.05));
  fused.fit(d, 3);
  plain.fit(d, 3);
  constant.fit(d, 3);
  ASSERT_TRUE(fused.fused());
  const auto f = fused.predict(d.x).mean, u = plain.predict(d.x).mean, c = constant.predict(d.x).mean;
  EXPECT_TRUE(torch::allclose(f, u, 1e-4, 1e-6)) << (f - u).abs().max().item<double>();
  EXPECT_FALSE(torch::allclose(f, c, 1e-4, 1e-6));  // the schedule changed the steps
}

// The epochs past T train at rate 0: the parameters stay where the schedule left them.
TEST(LrSchedule, EpochsPastTheScheduleChangeNothing) {
  Ensemble e(mlp(), options(2).fuse(true).lr(0.05));
  const auto d = sine(40);
  e.fit(d, 2);
  const auto after = e.distribution().p_parameters(0)[0].clone();
  e.fit(d, 2);
  EXPECT_TRUE(torch::equal(after, e.distribution().p_parameters(0)[0]));
}

// The rate is a function of the epoch counted from the first: saved after 2 epochs and
// resumed for 2 more, a run takes the very steps of 4 in one go.
TEST(LrSchedule, AResumedRunContinuesTheSchedule) {
  const auto d = sine(40);
  Ensemble straight(mlp(), options(4).fuse(true).lr(0.05));
  straight.fit(d, 4);
  Ensemble first(mlp(), options(4).fuse(true).lr(0.05));
  first.fit(d, 2);
  auto dir = std::filesystem::temp_directory_path() / ("push_lr_schedule_" + std::to_string(::getpid()));
  first.save(dir);
  Ensemble resumed(mlp(), options(4).fuse(true).lr(0.05));
  resumed.load(dir);
  std::filesystem::remove_all(dir);
  resumed.fit(d, 2);
  for (Pid pid : straight.distribution().particle_ids()) {
    const auto a = straight.distribution().p_parameters(pid), b = resumed.distribution().p_parameters(pid);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "particle " << pid;
  }
  EXPECT_EQ(straight.losses(), resumed.losses());
}

// MultiSWAG: the cosine covers the pretraining; the collection runs at the optimizer's own
// lr₀ (its SGD steps with momentum m at lr₀ (1 - m)), or at swag_lr when set; fused or not.
TEST(LrSchedule, MultiSwagCollectsAtItsOwnRate) {
  for (auto [swag_lr, momentum, fuse] : {std::tuple<std::optional<double>, std::optional<double>, bool>{{}, {}, false},
                                         {0.02, {}, false},
                                         {{}, 0.9, true},
                                         {0.02, 0.9, true}}) {
    auto live = std::make_shared<Live>();
    MultiSWAG m(mlp(), options(2).fuse(fuse).optimizer(tracked_sgd(0.1, live)),
                SWAGOptions().pretrain_epochs(2).rank(2).samples(2).collect_momentum(momentum).swag_lr(swag_lr));
    const auto d = sine(40);
    m.fit(d, 1);
    for (double r : rates(*live)) EXPECT_DOUBLE_EQ(r, 0.1);
    m.fit(d, 1);
    for (double r : rates(*live)) EXPECT_DOUBLE_EQ(r, cosine(0.1, 1, 2));
    m.fit(d, 2);
    for (double r : rates(*live)) EXPECT_DOUBLE_EQ(r, swag_lr.value_or(0.1));
  }
}

TEST(LrSchedule, ANegativeHorizonIsRefused) {
  EXPECT_PUSH_ERROR(Ensemble(mlp(), options(-1)), "cosine_epochs must be >= 0, got -1");
}

}  // namespace
}  // namespace push::bayes
