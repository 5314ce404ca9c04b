// save/load: exact resume, atomic replacement, and clear errors for bad checkpoints.
#include <push/push.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "scratch_dir.h"
#include "test_util.h"

namespace push {
namespace {

namespace fs = std::filesystem;
using testing::mse;
using testing::tiny_mlp;

fs::path checkpoint_dir(const std::string& name) { return testing::fresh_dir("test", name); }

ParticleOptions trainable() {
  return ParticleOptions()
      .optimizer(testing::adam(0.02))
      .scheduler([](torch::optim::Optimizer& o) {
        return std::make_unique<torch::optim::StepLR>(o, /*step_size=*/3, /*gamma=*/0.5);
      })
      .on("epoch", [](Particle& p, const Args&) {
        auto x = torch::linspace(-1, 1, 16).unsqueeze(1);
        for (int i = 0; i < 4; ++i) p.step(mse, x, torch::cos(x)).wait();
        p.scheduler_step().wait();
        auto& epochs = p.state()["epochs"];
        epochs = (epochs.isNone() ? 0 : epochs.toInt()) + 1;
        return c10::IValue();
      });
}

void run_epochs(Push& dist, int epochs) {
  for (int e = 0; e < epochs; ++e) {
    std::vector<PFuture> fs;
    for (Pid pid : dist.particle_ids()) fs.push_back(dist.p_launch(pid, "epoch"));
    dist.p_wait(fs);
  }
}

TEST(Checkpoint, LoadResumesBitwiseExactly) {
  const fs::path dir = checkpoint_dir("resume");
  std::vector<std::vector<torch::Tensor>> expected;
  {
    Push dist(tiny_mlp, PushOptions().devices(2).cache_size(1));
    for (int i = 0; i < 3; ++i) dist.p_create(trainable());
    run_epochs(dist, 4);
    dist.save(dir);
    run_epochs(dist, 4);
    for (Pid pid : dist.particle_ids()) expected.push_back(dist.p_parameters(pid));
  }
  // Into existing particles (fresh weights, overwritten by the load) ...
  {
    Push dist(tiny_mlp, PushOptions().devices(2).cache_size(1).seed(99));
    for (int i = 0; i < 3; ++i) dist.p_create(trainable());
    dist.load(dir);
    run_epochs(dist, 4);
    for (Pid pid : dist.particle_ids()) {
      auto params = dist.p_parameters(pid);
      for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], expected[pid][i]));
    }
  }
  // ... and into an empty distribution that creates them.
  {
    Push dist(tiny_mlp, PushOptions().devices(1));
    dist.load(dir, [](Pid) { return trainable(); });
    EXPECT_EQ(dist.particle_ids(), (std::vector<Pid>{0, 1, 2}));
    run_epochs(dist, 4);
    for (Pid pid : dist.particle_ids()) {
      auto params = dist.p_parameters(pid);
      for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], expected[pid][i]));
    }
  }
}

TEST(Checkpoint, UserStateAndIdsRoundTrip) {
  const fs::path dir = checkpoint_dir("state");
  auto opts = ParticleOptions().on("get", [](Particle& p, const Args&) { return p.state()["tag"]; });
  {
    Push dist(tiny_mlp);
    dist.p_create(ParticleOptions(opts).state({{"tag", std::string("alpha")}}));
    dist.p_create(ParticleOptions(opts).state({{"tag", torch::arange(3)}}));
    dist.save(dir);
  }
  Push dist(tiny_mlp);
  dist.load(dir, [&](Pid) { return opts; });
  EXPECT_EQ(dist.p_launch(0, "get").wait().toStringRef(), "alpha");
  EXPECT_TRUE(torch::equal(dist.p_launch(1, "get").wait().toTensor(), torch::arange(3)));
  EXPECT_EQ(dist.p_create(), 2);  // new ids continue after the loaded ones
}

TEST(Checkpoint, FailedSaveLeavesThePreviousCheckpointInPlace) {
  const fs::path dir = checkpoint_dir("atomic");
  Push dist(tiny_mlp);
  Pid pid = dist.p_create(ParticleOptions().on("poison", [](Particle& p, const Args&) {
    // A value LibTorch's archive cannot serialize: the save fails midway.
    p.state()["bad"] = c10::IValue(c10::make_intrusive<c10::ivalue::Future>(c10::IntType::get()));
    return c10::IValue();
  }));
  dist.p_create();
  dist.save(dir);
  auto before = dist.p_parameters(pid);
  dist.p_launch(pid, "poison").wait();
  EXPECT_THROW(dist.save(dir), Error);
  // The old checkpoint is intact and loadable; no temporary directory is left behind.
  Push other(tiny_mlp);
  other.load(dir, [](Pid) { return ParticleOptions(); });
  EXPECT_TRUE(torch::equal(other.p_parameters(pid)[0], before[0]));
  for (const auto& entry : fs::directory_iterator(dir.parent_path())) {
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(name.find("atomic.tmp"), std::string::npos) << name;
    EXPECT_EQ(name.find(".partial-"), std::string::npos) << name << ": a staging folder is left";
  }
}

TEST(Checkpoint, SaveReplacesOnlyAFolderItMayAndFollowsALink) {
  Push dist(tiny_mlp);
  Pid pid = dist.p_create(trainable());
  const fs::path dir = checkpoint_dir("targets");
  fs::create_directories(dir);
  EXPECT_PUSH_ERROR(dist.save("/"), "is not a folder one can write");
  EXPECT_PUSH_ERROR(dist.save("."), "is the current folder or contains it");
  std::ofstream(dir / "file") << "not a folder";
  EXPECT_PUSH_ERROR(dist.save(dir / "file"), "exists and is not a folder");
  fs::create_directories(dir / "other");
  std::ofstream(dir / "other" / "notes.txt") << "mine";
  EXPECT_PUSH_ERROR(dist.save(dir / "other"), "holds something other than a push checkpoint");
  EXPECT_TRUE(fs::exists(dir / "other" / "notes.txt"));
  // A link to a checkpoint folder: the folder behind it is replaced, the link still leads there.
  dist.save(dir / "real");
  fs::create_directory_symlink(dir / "real", dir / "link");
  dist.p_launch(pid, "epoch").wait();
  dist.save(dir / "link");
  EXPECT_TRUE(fs::is_symlink(dir / "link"));
  Push other(tiny_mlp);
  other.load(dir / "link", [](Pid) { return trainable(); });
  EXPECT_TRUE(torch::equal(other.p_parameters(pid)[0], dist.p_parameters(pid)[0]));
  // Nothing staged is left anywhere.
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().filename().string().find(".partial-"), std::string::npos) << entry.path();
  }
}

TEST(Checkpoint, MissingOrCorruptCheckpointsAreNamed) {
  Push dist(tiny_mlp);
  EXPECT_PUSH_ERROR(dist.load(checkpoint_dir("nothing-here")), "does not exist");

  const fs::path dir = checkpoint_dir("corrupt");
  {
    Push saved(tiny_mlp);
    saved.p_create();
    saved.p_create();
    saved.save(dir);
  }
  // Truncated particle file.
  fs::resize_file(dir / "particle-1.pt", 100);
  EXPECT_PUSH_ERROR(dist.load(dir, [](Pid) { return ParticleOptions(); }), "particle-1.pt");
  EXPECT_EQ(dist.num_particles(), 0);  // nothing was half-loaded

  // Garbage manifest.
  std::ofstream(dir / "push.manifest") << "hello";
  EXPECT_PUSH_ERROR(dist.load(dir), "corrupt");
}

TEST(Checkpoint, MismatchedParticlesAreNamed) {
  const fs::path dir = checkpoint_dir("mismatch");
  {
    Push saved(tiny_mlp);
    saved.p_create();
    saved.save(dir);
  }
  Push bigger(tiny_mlp);
  bigger.p_create();
  bigger.p_create();
  EXPECT_PUSH_ERROR(bigger.load(dir), "particles 1 exist here but not in checkpoint");
  Push empty(tiny_mlp);
  EXPECT_PUSH_ERROR(empty.load(dir), "pass make_options");
  Push with_optimizer(tiny_mlp);
  with_optimizer.p_create(ParticleOptions().optimizer(testing::adam()));
  EXPECT_PUSH_ERROR(with_optimizer.load(dir), "saved without one");
}

// PusH's save_to_disk(pid): a checkpoint of some particles, loaded back into them alone.
TEST(Checkpoint, SomeParticlesSaveAndLoadAloneLeavingTheOthers) {
  const fs::path dir = checkpoint_dir("some");
  Push dist(tiny_mlp, PushOptions().devices(2).cache_size(1));
  for (int i = 0; i < 4; ++i) dist.p_create(trainable());
  run_epochs(dist, 2);
  dist.save(dir, {3, 1});
  run_epochs(dist, 2);
  std::vector<std::vector<torch::Tensor>> after;
  for (Pid pid : dist.particle_ids()) after.push_back(dist.p_parameters(pid));
  EXPECT_PUSH_ERROR(dist.load(dir), "particles 0, 2 exist here but not in checkpoint");
  EXPECT_EQ(dist.load_particles(dir), (std::vector<Pid>{1, 3}));  // they go back two epochs, 0 and 2 stay
  auto same = [](const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
    for (size_t i = 0; i < a.size(); ++i) {
      if (!torch::equal(a[i], b[i])) return false;
    }
    return true;
  };
  for (Pid pid : {0, 2}) EXPECT_TRUE(same(dist.p_parameters(pid), after[pid])) << pid;
  for (Pid pid : {1, 3}) EXPECT_FALSE(same(dist.p_parameters(pid), after[pid])) << pid;
  // Optimizer and scheduler came back too: two more epochs retrace the first run exactly.
  run_epochs(dist, 2);
  for (Pid pid : {1, 3}) EXPECT_TRUE(same(dist.p_parameters(pid), after[pid])) << pid;
  // Into a distribution without them, only the saved ones are made.
  Push fresh(tiny_mlp);
  fresh.load_particles(dir, [](Pid) { return trainable(); });
  EXPECT_EQ(fresh.particle_ids(), (std::vector<Pid>{1, 3}));
  EXPECT_PUSH_ERROR(dist.save(checkpoint_dir("none"), std::vector<Pid>{}), "no particles given to save");
  EXPECT_PUSH_ERROR(dist.save(checkpoint_dir("unknown"), {2, 7}), "particle 7 does not exist");
}

// A load into particles that trained on past the checkpoint: their optimizer's moments
// and learning rates (decayed further by their scheduler) must not survive it. LibTorch's
// Optimizer::load restores the per-parameter state it finds and leaves the rest, and none
// of the groups' options.
TEST(Checkpoint, LoadIntoParticlesThatTrainedOnResumesBitwiseExactly) {
  const fs::path start = checkpoint_dir("trained-start"), middle = checkpoint_dir("trained-middle");
  Push dist(tiny_mlp, PushOptions().devices(2).cache_size(1));
  for (int i = 0; i < 3; ++i) dist.p_create(trainable());
  auto params = [&] {
    std::vector<std::vector<torch::Tensor>> out;
    for (Pid pid : dist.particle_ids()) out.push_back(dist.p_parameters(pid));
    return out;
  };
  auto expect_params = [&](const std::vector<std::vector<torch::Tensor>>& want, const char* what) {
    const auto got = params();
    for (size_t pid = 0; pid < want.size(); ++pid) {
      for (size_t i = 0; i < want[pid].size(); ++i) EXPECT_TRUE(torch::equal(got[pid][i], want[pid][i])) << what << pid;
    }
  };
  dist.save(start);  // no optimizer step yet: Adam has no moments
  run_epochs(dist, 2);
  const auto two = params();
  dist.save(middle);
  run_epochs(dist, 2);  // the scheduler decays the learning rate at its third step
  const auto four = params();
  run_epochs(dist, 1);
  dist.load(middle);
  run_epochs(dist, 2);
  expect_params(four, "from the middle, particle ");
  dist.load(start);
  run_epochs(dist, 2);
  expect_params(two, "from the start, particle ");
}

}  // namespace
}  // namespace push
