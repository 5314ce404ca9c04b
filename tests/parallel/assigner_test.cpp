// Model placement on small problems whose best placement is known; every result within
// every device's budget; problems that cannot fit named with the bytes missing.
#include <push/parallel/assigner.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "test_util.h"

using push::parallel::assign_models;
using push::parallel::DeviceSpec;
using push::parallel::ModelAssigner;
using push::parallel::ModelAssignerOptions;

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
DeviceSpec gpu(int i, int64_t mib, double compute = 1.0) {
  return DeviceSpec{c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)), mib * kMiB, compute};
}

TEST(ModelSizeEstimator, CountsParametersAndBuffersTimesTheMultiplier) {
  torch::nn::Linear lin(10, 5);  // 55 floats
  EXPECT_EQ(push::parallel::estimate_model_bytes(*lin, 1.0), 55 * 4);
  EXPECT_EQ(push::parallel::estimate_model_bytes(*lin), 2 * 55 * 4);
  torch::nn::BatchNorm1d bn(8);  // weight, bias (8 each); running mean, var (8 each), count (int64)
  EXPECT_EQ(push::parallel::estimate_model_bytes(*bn, 1.0), 4 * 8 * 4 + 8);
  EXPECT_PUSH_ERROR(push::parallel::estimate_model_bytes(*lin, 0), "size_multiplier must be positive");
}

TEST(ModelAssigner, ConnectedModelsShareADeviceAndTheWorkIsSpread) {
  // Pairs (0, 1) and (2, 3) exchange much data; two equal GPUs: each pair on one of them.
  const std::vector<int64_t> sizes(4, 10 * kMiB);
  auto a = assign_models(sizes, {{{0, 1}, 10.0}, {{2, 3}, 10.0}}, {gpu(0, 1000), gpu(1, 1000)});
  EXPECT_EQ(a[0], a[1]);
  EXPECT_EQ(a[2], a[3]);
  EXPECT_NE(a[0], a[2]);
  // No connections, compute 3 : 1: three models on the first, one on the second.
  auto b = assign_models(sizes, {}, {gpu(0, 1000, 3.0), gpu(1, 1000, 1.0)});
  EXPECT_EQ(std::count(b.begin(), b.end(), 0), 3);
  // A CPU of compute 0 gets nothing while the GPUs have room.
  auto c =
      assign_models(sizes, {}, {push::parallel::DeviceSpec{c10::kCPU, 1000 * kMiB, 0.0}, gpu(0, 1000), gpu(1, 1000)});
  EXPECT_EQ(std::count(c.begin(), c.end(), 0), 0);
  // Seeded: the same problem, the same placement.
  EXPECT_EQ(assign_models(sizes, {{{0, 1}, 1.0}}, {gpu(0, 1000), gpu(1, 1000)}, ModelAssignerOptions().seed(5)),
            assign_models(sizes, {{{0, 1}, 1.0}}, {gpu(0, 1000), gpu(1, 1000)}, ModelAssignerOptions().seed(5)));
}

TEST(ModelAssigner, ThePlacementAlwaysFitsTheBudgets) {
  // Without the size term the relaxation ignores memory; compute 1 : 2 pulls two of the
  // three models to the second GPU, which holds only one. The repair moves them back.
  const std::vector<int64_t> sizes(3, 60 * kMiB);
  const std::vector<DeviceSpec> devices = {gpu(0, 130), gpu(1, 70, 2.0)};
  for (uint64_t seed = 0; seed < 5; ++seed) {
    auto a = assign_models(sizes, {}, devices, ModelAssignerOptions().size_match_weight(0).seed(seed));
    std::vector<int64_t> used(2, 0);
    for (size_t i = 0; i < a.size(); ++i) used[a[i]] += sizes[i];
    EXPECT_LE(used[0], devices[0].memory_bytes) << "seed " << seed;
    EXPECT_LE(used[1], devices[1].memory_bytes) << "seed " << seed;
    EXPECT_EQ(std::count(a.begin(), a.end(), 1), 1);
  }
}

TEST(ModelAssigner, APlacementNoSingleMoveRepairsIsPackedAgain) {
  // 6, 6, 4, 4 MiB in two devices of 10 MiB: only {6, 4} / {6, 4} fits. Without the size
  // term, compute 10 : 1 puts everything on the first, and no single move off it fits.
  const std::vector<int64_t> sizes = {6 * kMiB, 6 * kMiB, 4 * kMiB, 4 * kMiB};
  auto a = assign_models(sizes, {}, {gpu(0, 10, 10.0), gpu(1, 10, 1.0)}, ModelAssignerOptions().size_match_weight(0));
  EXPECT_NE(a[0], a[1]);
  EXPECT_NE(a[2], a[3]);
}

TEST(ModelAssigner, ProblemsThatCannotFitSayByHowMuch) {
  EXPECT_PUSH_ERROR(assign_models({300 * kMiB}, {}, {gpu(0, 100), gpu(1, 200)}),
                    "model 0 needs 314572800 bytes, the largest device budget is 209715200: 104857600 bytes too many");
  EXPECT_PUSH_ERROR(assign_models({150 * kMiB, 150 * kMiB}, {}, {gpu(0, 100), gpu(1, 160)}),
                    "the models need 314572800 bytes, the devices hold 272629760: 41943040 bytes too many");
  // The totals fit, the pieces do not: three of 60 MiB in two of 100 MiB.
  EXPECT_PUSH_ERROR(assign_models({60 * kMiB, 60 * kMiB, 60 * kMiB}, {}, {gpu(0, 100), gpu(1, 100)}), "bytes short");
  EXPECT_PUSH_ERROR(assign_models({kMiB}, {{{0, 3}, 1.0}}, {gpu(0, 100)}), "connection (0, 3) names no pair");
  EXPECT_PUSH_ERROR(assign_models({kMiB}, {}, {gpu(0, 0)}), "memory budget of 0 bytes");
  EXPECT_PUSH_ERROR(assign_models({kMiB}, {}, {gpu(0, 100, 0.0)}), "every device has compute 0");
  EXPECT_PUSH_ERROR(assign_models({kMiB}, {}, {}), "no devices");
}

TEST(ModelAssigner, PlacesAndMovesModules) {
  torch::nn::Linear a(4, 4), b(4, 4);
  std::vector<torch::nn::Module*> models = {a.get(), b.get()};
  // Two budgets on the CPU (two NUMA halves, say): both are CPU devices, and the models move.
  ModelAssigner assigner(models, {{{0, 1}, 1.0}},
                         {DeviceSpec{c10::kCPU, 1 << 20, 1.0}, push::parallel::cpu_device(0.5, 1.0)});
  ASSERT_EQ(assigner.assignment().size(), 2u);
  for (const auto& d : assigner.assignment()) EXPECT_TRUE(d.is_cpu());
  EXPECT_GT(push::parallel::cpu_device().memory_bytes, 0);
}

// machin's ModelAssigner with devices=None: the devices this process has, each GPU with a
// share of its free memory; the CPU last, with machin's compute of 0 beside GPUs (alone, 1).
TEST(ModelAssigner, DetectsTheDevicesOfThisProcessWhenNoneAreGiven) {
  const auto devices = push::parallel::detect_devices(0.5, 0.0);
  const int gpus = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  ASSERT_EQ(devices.size(), static_cast<size_t>(gpus) + 1);
  for (int i = 0; i < gpus; ++i) {
    EXPECT_EQ(devices[i].device, c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)));
    EXPECT_GT(devices[i].memory_bytes, 0);
    EXPECT_EQ(devices[i].compute, 1.0);
  }
  EXPECT_TRUE(devices.back().device.is_cpu());
  EXPECT_EQ(devices.back().compute, gpus > 0 ? 0.0 : 1.0);
  EXPECT_GT(devices.back().memory_bytes, 0);
  // A smaller share of the same memory is a smaller budget (free memory moves a little).
  EXPECT_LT(push::parallel::detect_devices(0.01).back().memory_bytes, devices.back().memory_bytes);
  EXPECT_PUSH_ERROR(push::parallel::detect_devices(1.5), "max_mem_ratio must be in (0, 1]");
  // Placed on them: with a GPU, the work goes there (the CPU computes nothing by default).
  torch::nn::Linear a(4, 4), b(4, 4);
  std::vector<torch::nn::Module*> models = {a.get(), b.get()};
  ModelAssigner assigner(models, {{{0, 1}, 1.0}}, push::parallel::ModelAssignerOptions().move_models(false));
  for (const auto& d : assigner.assignment()) EXPECT_EQ(d.is_cuda(), gpus > 0) << d;
}

}  // namespace
