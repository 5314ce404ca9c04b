// SyncMaster and SyncBatchNorm: replicas on threads (2 and 4), and 2 ranks x 2 replicas,
// normalise as one batch norm on the whole batch: outputs, running statistics, input
// gradients and the sum of the replicas' weight and bias gradients to 1e-5. A participant
// that never arrives, or a callback that throws, fails every participant with the reason.
#include <push/data_parallel/sync_batch_norm.h>
#include <push/parallel/thread_pool.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

#include "dist_test_util.h"
#include "test_util.h"

using namespace std::chrono_literals;
using push::data_parallel::BatchNormSync;
using push::data_parallel::SyncBatchNorm;
using push::data_parallel::SyncBatchNormOptions;
using push::parallel::SyncMaster;

namespace {

void expect_close(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  EXPECT_TRUE(torch::allclose(a, b, 1e-5, 1e-5))
      << what << ": largest difference " << (a - b).abs().max().item<double>();
}

// Replicas `first .. first + local - 1` of `total` (all ranks together) on threads, each
// on its chunk of the whole batch; compared with one batch norm on the whole batch.
void check(int local, int first, int total, const std::vector<int64_t>& shape, std::shared_ptr<BatchNormSync> sync) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  auto x = torch::randn(shape, gen) * 3 + 1, g = torch::randn(shape, gen);
  const int64_t c = shape[1];
  auto w = torch::randn({c}, gen), b = torch::randn({c}, gen);
  // The reference.
  auto rw = w.clone().requires_grad_(true), rb = b.clone().requires_grad_(true);
  auto rm = torch::zeros({c}), rv = torch::ones({c});
  auto rx = x.clone().requires_grad_(true);
  auto ry = torch::batch_norm(rx, rw, rb, rm, rv, /*training=*/true, 0.1, 1e-5, /*cudnn_enabled=*/false);
  (ry * g).sum().backward();
  // The replicas.
  const int64_t per = shape[0] / total;
  std::vector<torch::Tensor> ys(local), xgrads(local), wgrads(local), bgrads(local), means(local), vars(local);
  std::vector<std::string> errors(local);
  std::vector<std::thread> threads;
  for (int r = 0; r < local; ++r) {
    threads.emplace_back([&, r] {
      try {
        SyncBatchNorm bn(SyncBatchNormOptions(c), sync, r);
        {
          torch::NoGradGuard no_grad;
          bn->weight.copy_(w);
          bn->bias.copy_(b);
        }
        const int64_t at = (first + r) * per;
        auto xr = x.narrow(0, at, per).clone().requires_grad_(true);
        auto y = bn(xr);
        (y * g.narrow(0, at, per)).sum().backward();
        ys[r] = y.detach();
        xgrads[r] = xr.grad();
        wgrads[r] = bn->weight.grad();
        bgrads[r] = bn->bias.grad();
        means[r] = bn->running_mean.clone();
        vars[r] = bn->running_var.clone();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) ASSERT_EQ(e, "");
  const std::string what = std::to_string(total) + " replicas, input " + c10::str(shape);
  expect_close(torch::cat(ys), ry.detach().narrow(0, first * per, local * per), what + ", output");
  expect_close(torch::cat(xgrads), rx.grad().narrow(0, first * per, local * per), what + ", input gradient");
  for (int r = 0; r < local; ++r) {
    expect_close(means[r], rm, what + ", running mean");
    expect_close(vars[r], rv, what + ", running variance");
  }
  if (local == total) {
    expect_close(torch::stack(wgrads).sum(0), rw.grad(), what + ", weight gradient");
    expect_close(torch::stack(bgrads).sum(0), rb.grad(), what + ", bias gradient");
  }
}

TEST(SyncBatchNorm, TwoAndFourReplicasNormaliseAsOneBatchNormOnTheWholeBatch) {
  for (int replicas : {2, 4}) {
    for (const auto& shape : std::vector<std::vector<int64_t>>{{8, 3}, {8, 3, 6}, {8, 3, 5, 5}}) {
      check(replicas, 0, replicas, shape, std::make_shared<BatchNormSync>(replicas));
    }
  }
}

TEST(SyncBatchNorm, AReplicaThatNeverComesOrAFailingCallbackIsNamed) {
  auto sync = std::make_shared<BatchNormSync>(2, std::nullopt, 200ms);
  SyncBatchNorm bn(SyncBatchNormOptions(3), sync, 0);
  EXPECT_PUSH_ERROR(bn(torch::randn({4, 3})), "participant 1 of 2 did not arrive within 200 ms");
  EXPECT_PUSH_ERROR(SyncBatchNorm(SyncBatchNormOptions(3), sync, 2), "replica 2 of 2");
  EXPECT_PUSH_ERROR(bn(torch::randn({4, 5})), "expected input [B, 3");
  SyncMaster<int, int> failing(2, [](std::vector<int>) -> std::vector<int> { throw std::runtime_error("no sum"); });
  std::string other;
  std::thread t([&] {
    try {
      failing.exchange(1, 1);
    } catch (const std::exception& e) {
      other = e.what();
    }
  });
  // Both participants get the one exception object: this thread keeps its reference until
  // the other has joined, so that its last release (in uninstrumented libstdc++, invisible
  // to ThreadSanitizer) comes after the other thread's read of the message.
  std::exception_ptr mine;
  try {
    failing.exchange(0, 1);
  } catch (...) {
    mine = std::current_exception();
  }
  t.join();
  ASSERT_TRUE(mine);
  EXPECT_THROW(std::rethrow_exception(mine), std::runtime_error);
  EXPECT_EQ(other, "no sum");
  // A wait inside a fiber suspends the fiber: two participants as tasks of a one-thread pool.
  {
    SyncMaster<int, int> both(2, [](std::vector<int> v) { return std::vector<int>(2, v[0] * v[1]); });
    push::parallel::ThreadPool one(1);
    auto a = one.apply_async([&] { return both.exchange(0, 6); });
    auto b = one.apply_async([&] { return both.exchange(1, 7); });
    EXPECT_EQ(a.wait(), 42);
    EXPECT_EQ(b.wait(), 42);
    // SyncBatchNorm itself refuses an event loop (a pool task here; a particle handler alike).
    auto sync1 = std::make_shared<BatchNormSync>(1);
    EXPECT_PUSH_ERROR(one.apply([&] {
      return SyncBatchNorm(SyncBatchNormOptions(3), sync1, 0)(torch::randn({4, 3}));
    }),
                      "runs on an event loop");
  }
  // Rounds repeat.
  SyncMaster<int, int> sum(2, [](std::vector<int> v) { return std::vector<int>(2, v[0] + v[1]); });
  for (int round = 0; round < 3; ++round) {
    int got = 0;
    std::thread u([&] { got = sum.exchange(1, round); });
    EXPECT_EQ(sum.exchange(0, 10), 10 + round);
    u.join();
    EXPECT_EQ(got, 10 + round);
  }
}

// 2 ranks x 2 replicas: the whole batch is 4 chunks, rank r holds chunks 2r and 2r + 1.
PUSH_DIST_WORKER(sync_batch_norm) {
  auto world = push::testing::test_world(60s);
  for (const auto& shape : std::vector<std::vector<int64_t>>{{8, 3}, {8, 3, 5, 5}}) {
    check(2, 2 * world.rank(), 4, shape, std::make_shared<BatchNormSync>(2, world.collective()));
  }
}

TEST(SyncBatchNorm, TwoRanksOfTwoReplicasNormaliseAsOneBatchNorm) {
  push::testing::expect_all_ok(push::testing::run_workers(2, "sync_batch_norm", 120s));
}

}  // namespace
