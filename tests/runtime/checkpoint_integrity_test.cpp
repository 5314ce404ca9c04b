// load() is all or nothing (every particle is checked against scratch copies before any
// live one changes), and a checkpoint whose bytes changed after save is refused with a
// one-line error naming the file.
#include <push/push.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "core/crc32c.h"
#include "scratch_dir.h"
#include "test_util.h"

namespace push {
namespace {

namespace fs = std::filesystem;
using testing::mse;
using testing::sgd_momentum;
using testing::tiny_mlp;

fs::path integrity_dir(const std::string& name) { return testing::fresh_dir("integrity", name); }

ParticleOptions trainable_with(OptimizerFactory optimizer) {
  return ParticleOptions().optimizer(std::move(optimizer)).on("train", [](Particle& p, const Args&) {
    auto x = torch::linspace(-1, 1, 8).unsqueeze(1);
    return p.step(mse, x, torch::sin(x)).wait();
  });
}

std::vector<std::vector<torch::Tensor>> all_parameters(Push& dist) {
  std::vector<std::vector<torch::Tensor>> out;
  for (Pid pid : dist.particle_ids()) out.push_back(dist.p_parameters(pid));
  return out;
}

void expect_unchanged(Push& dist, const std::vector<std::vector<torch::Tensor>>& before) {
  auto now = all_parameters(dist);
  ASSERT_EQ(now.size(), before.size());
  for (size_t p = 0; p < now.size(); ++p) {
    ASSERT_EQ(now[p].size(), before[p].size());
    for (size_t i = 0; i < now[p].size(); ++i) {
      EXPECT_TRUE(torch::equal(now[p][i], before[p][i])) << "particle " << p << " tensor " << i;
    }
  }
}

TEST(CheckpointIntegrity, AFailedLoadChangesNothing) {
  const fs::path dir = integrity_dir("atomic-load");
  {
    // Particle 0 trained with Adam, particle 1 with SGD + momentum.
    Push saved(tiny_mlp, PushOptions().seed(1));
    saved.p_create(trainable_with(testing::adam()));
    saved.p_create(trainable_with(sgd_momentum()));
    saved.p_create(trainable_with(testing::adam()));
    for (Pid pid = 0; pid < 3; ++pid) saved.p_launch(pid, "train").wait();
    saved.save(dir);
  }
  // Particles 0 and 1 use Adam here: 0 would load, 1's optimizer state does not fit.
  // Particle 2 is missing and would be created.
  Push dist(tiny_mlp, PushOptions().seed(2));
  dist.p_create(trainable_with(testing::adam()));
  dist.p_create(trainable_with(testing::adam()));
  auto before = all_parameters(dist);
  EXPECT_PUSH_ERROR(dist.load(dir, [](Pid) { return trainable_with(testing::adam()); }), "particle 1");
  EXPECT_EQ(dist.num_particles(), 2);  // particle 2 was not created
  expect_unchanged(dist, before);
  // The distribution still trains, and a checkpoint that fits loads.
  for (Pid pid = 0; pid < 2; ++pid) dist.p_launch(pid, "train").wait();
}

TEST(CheckpointIntegrity, ParametersOfAnotherShapeAreRefused) {
  const fs::path dir = integrity_dir("shape");
  {
    Push saved(
        [] { return torch::nn::Sequential(torch::nn::Linear(1, 4), torch::nn::Tanh(), torch::nn::Linear(4, 1)); });
    saved.p_create();
    saved.save(dir);
  }
  Push dist(tiny_mlp);  // 1 -> 8 -> 1
  dist.p_create();
  auto before = all_parameters(dist);
  EXPECT_PUSH_ERROR(dist.load(dir), "layers.0.weight");
  expect_unchanged(dist, before);
}

TEST(CheckpointIntegrity, FlippedTensorBytesAreDetected) {
  const fs::path dir = integrity_dir("flipped");
  torch::Tensor weight;
  {
    Push saved(tiny_mlp);
    saved.p_create();
    saved.p_create();
    saved.save(dir);
    weight = saved.p_parameters(1)[0].contiguous();
  }
  // Find the first parameter's bytes in the archive and overwrite one float with a NaN.
  const fs::path file = dir / "particle-1.pt";
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string payload(static_cast<const char*>(weight.data_ptr()),
                            static_cast<size_t>(weight.numel()) * sizeof(float));
  const size_t at = bytes.find(payload);
  ASSERT_NE(at, std::string::npos) << "the tensor payload was not found in the archive";
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(&bytes[at + sizeof(float)], &nan, sizeof(float));
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;

  Push dist(tiny_mlp, PushOptions().seed(5));
  dist.p_create();
  dist.p_create();
  auto before = all_parameters(dist);
  EXPECT_PUSH_ERROR(dist.load(dir), "particle-1.pt");
  EXPECT_PUSH_ERROR(dist.load(dir), "checksum");
  expect_unchanged(dist, before);
  Push empty(tiny_mlp);
  EXPECT_PUSH_ERROR(empty.load(dir, [](Pid) { return ParticleOptions(); }), "checksum");
  EXPECT_EQ(empty.num_particles(), 0);
}

TEST(CheckpointIntegrity, Crc32cMatchesTheStandardCheckValue) {
  const std::string digits = "123456789";
  EXPECT_EQ(detail::crc32c(digits.data(), digits.size()), 0xE3069283u);
  // Extending a checksum piece by piece (slices of 8 and leftover bytes) is the same.
  std::string text(1000, '\0');
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>(i * 31 + 7);
  const uint32_t whole = detail::crc32c(text.data(), text.size());
  EXPECT_EQ(detail::crc32c(text.data() + 13, text.size() - 13, detail::crc32c(text.data(), 13)), whole);
  text[500] ^= 1;
  EXPECT_NE(detail::crc32c(text.data(), text.size()), whole);
}

TEST(CheckpointIntegrity, AnEditedManifestIsRefused) {
  const fs::path dir = integrity_dir("manifest");
  {
    Push saved(tiny_mlp);
    saved.p_create();
    saved.save(dir);
  }
  std::string text;
  {
    std::ifstream in(dir / "push.manifest");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t line = text.find("\n0 0 0 ");  // particle 0, lane 0, 0 scheduler steps
  ASSERT_NE(line, std::string::npos) << text;
  text[line + 5] = '3';  // claims 3 scheduler steps
  std::ofstream(dir / "push.manifest", std::ios::trunc) << text;
  Push dist(tiny_mlp);
  dist.p_create();
  EXPECT_PUSH_ERROR(dist.load(dir), "push.manifest fails its checksum");
}

TEST(CheckpointIntegrity, TruncatedFilesAreNamed) {
  const fs::path dir = integrity_dir("truncated");
  {
    Push saved(tiny_mlp);
    saved.p_create();
    saved.save(dir);
  }
  fs::resize_file(dir / "particle-0.pt", fs::file_size(dir / "particle-0.pt") - 1);
  Push dist(tiny_mlp);
  dist.p_create();
  try {
    dist.load(dir);
    ADD_FAILURE() << "a truncated file loaded";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("particle-0.pt"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "not one line: " << what;
  }
}

}  // namespace
}  // namespace push

namespace push {
namespace {

// save() replaces its folder as a whole, so it refuses one that holds anything else, and
// "ck/" is the folder ck.
TEST(CheckpointIntegrity, SaveRefusesAFolderThatIsNotACheckpoint) {
  const fs::path dir = integrity_dir("foreign");
  fs::create_directories(dir);
  { std::ofstream(dir / "notes.txt") << "mine"; }
  Push dist(tiny_mlp, PushOptions().seed(1));
  dist.p_create(trainable_with(testing::adam()));
  EXPECT_PUSH_ERROR(dist.save(dir), "holds something other than a push checkpoint");
  EXPECT_TRUE(fs::exists(dir / "notes.txt"));

  const fs::path ck = integrity_dir("trailing-slash");
  dist.save(ck.string() + "/");
  dist.save(ck.string() + "/");  // a checkpoint folder is replaced
  EXPECT_TRUE(fs::exists(ck / "push.manifest"));
  Push loaded(tiny_mlp, PushOptions().seed(2));
  loaded.load(ck.string() + "/", [](Pid) { return trainable_with(testing::adam()); });
  EXPECT_TRUE(torch::equal(loaded.p_parameters(0)[0], dist.p_parameters(0)[0]));
}

// A checkpoint is replaced only when it holds what save() wrote, as written: the manifest
// decides, not the names. A file of the user's named like a particle's, and a particle
// file overwritten, are named and kept.
TEST(CheckpointIntegrity, SaveRefusesACheckpointWithFilesItDidNotWrite) {
  const fs::path ck = integrity_dir("user-files");
  Push dist(tiny_mlp, PushOptions().seed(1));
  dist.p_create(trainable_with(testing::adam()));
  dist.save(ck);
  { std::ofstream(ck / "particle-5.pt") << "mine"; }
  EXPECT_PUSH_ERROR(dist.save(ck), "is a push checkpoint that also holds 'particle-5.pt'");
  EXPECT_TRUE(fs::exists(ck / "particle-5.pt"));
  fs::remove(ck / "particle-5.pt");
  { std::ofstream(ck / "particle-0.pt", std::ios::app) << "mine"; }
  EXPECT_PUSH_ERROR(dist.save(ck), "particle-0.pt has ");
  fs::remove(ck / "particle-0.pt");
  dist.save(ck);  // a particle file missing loses nothing: replaced
  EXPECT_TRUE(fs::exists(ck / "particle-0.pt"));
}

// load() creating particles while another thread calls p_create: every id belongs to
// exactly one particle (an id taken by both used to leave a freed record in the cache).
TEST(CheckpointIntegrity, ParticlesCreatedDuringALoadNeverShareAnId) {
  const fs::path dir = integrity_dir("concurrent-create");
  {
    Push saved(tiny_mlp, PushOptions().devices(2).seed(1));
    for (int i = 0; i < 6; ++i) saved.p_create(trainable_with(testing::adam()));
    saved.save(dir);
  }
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    Push dist(tiny_mlp, PushOptions().devices(2).cache_size(1).seed(2));
    for (int i = 0; i < 2; ++i) dist.p_create(trainable_with(testing::adam()));
    std::atomic<bool> go{false};
    std::vector<Pid> created;
    std::thread creator([&] {
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < 8; ++i) created.push_back(dist.p_create(trainable_with(testing::adam())));
    });
    go = true;
    bool loaded = true;
    try {
      dist.load(dir, [](Pid) { return trainable_with(testing::adam()); });
    } catch (const Error&) {
      loaded = false;  // a created particle is not in the checkpoint: refused, nothing changed
    }
    creator.join();
    const auto ids = dist.particle_ids();
    EXPECT_EQ(ids.size(), 2 + created.size() + (loaded ? 4 : 0));
    for (Pid pid : created) EXPECT_NE(std::find(ids.begin(), ids.end(), pid), ids.end()) << pid;
    // Every particle trains through evictions (cache_size 1): no record was lost or freed.
    std::vector<PFuture> fs;
    for (Pid pid : ids) fs.push_back(dist.p_launch(pid, "train"));
    for (const auto& v : dist.p_wait(fs)) EXPECT_TRUE(std::isfinite(v.toTensor().item<double>()));
  }
}

}  // namespace
}  // namespace push
