// GPU lanes (lane_streams.h): a lane's handlers run on a CUDA stream of the lane's own, and
// particles swapped through the pinned host store on the copy stream train bitwise as
// particles that stay resident. Without a GPU these skip; against a LibTorch without CUDA
// they say so.
#include <push/push.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "test_util.h"
#if PUSH_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace push {
namespace {

#define PUSH_SKIP_WITHOUT_GPU()                                         \
  do {                                                                  \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (false)

TEST(GpuLane, HandlersRunOnTheLanesOwnStream_CUDA) {
  PUSH_SKIP_WITHOUT_GPU();
#if PUSH_WITH_CUDA
  Push dist(testing::tiny_mlp, PushOptions().devices(1));
  Pid pid = dist.p_create(ParticleOptions().on("stream", [](Particle& p, const Args&) {
    const auto index = p.device().index();
    const auto current = c10::cuda::getCurrentCUDAStream(index);
    return c10::IValue(current != c10::cuda::getDefaultCUDAStream(index));
  }));
  EXPECT_TRUE(dist.p_launch(pid, "stream").wait().toBool()) << "a GPU lane ran a handler on the default stream";
#else
  GTEST_SKIP() << "push was built against a LibTorch without CUDA";
#endif
}

// Particles trained through a one-particle cache (every switch evicts and restores through
// the copy stream) against the same particles all resident: the same bits.
std::vector<std::vector<torch::Tensor>> train_on_gpu(int cache_size) {
  Push dist(testing::tiny_mlp, PushOptions().devices(1).cache_size(cache_size).seed(11));
  auto x = torch::linspace(-2, 2, 64).unsqueeze(1);
  auto y = torch::sin(x);
  auto opts = ParticleOptions().optimizer(testing::adam(0.01)).on("epoch", [x, y](Particle& p, const Args&) {
    for (int b = 0; b < 4; ++b) {
      p.step(testing::mse, x.narrow(0, b * 16, 16), y.narrow(0, b * 16, 16)).wait();
      // Reads a sibling, evicted or not, between steps: its host copy must be complete.
      auto others = p.other_particles();
      EXPECT_EQ(p.get(others[b % others.size()]).wait().parameters().size(), 4u);
    }
    return c10::IValue();
  });
  constexpr int kParticles = 4;
  for (int i = 0; i < kParticles; ++i) dist.p_create(opts);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<PFuture> fs;
    for (Pid pid = 0; pid < kParticles; ++pid) fs.push_back(dist.p_launch(pid, "epoch"));
    dist.p_wait(fs);
  }
  if (cache_size < kParticles) EXPECT_GT(dist.cache_stats(0).evictions, 0);
  std::vector<std::vector<torch::Tensor>> out;
  for (Pid pid = 0; pid < kParticles; ++pid) out.push_back(dist.p_parameters(pid));
  return out;
}

TEST(GpuLane, SwappedParticlesTrainBitwiseAsResidentOnes_CUDA) {
  PUSH_SKIP_WITHOUT_GPU();
  const auto resident = train_on_gpu(4), swapped = train_on_gpu(1);
  ASSERT_EQ(resident.size(), swapped.size());
  for (size_t p = 0; p < resident.size(); ++p) {
    for (size_t i = 0; i < resident[p].size(); ++i) {
      EXPECT_TRUE(torch::equal(resident[p][i].cpu(), swapped[p][i].cpu())) << "particle " << p << " tensor " << i;
    }
  }
}

}  // namespace
}  // namespace push
