// The transport's pool of large receive buffers: a freed buffer is reused, a received
// tensor behaves like any CPU tensor (resizable, usable after its group is gone), and the
// pool never holds more than it was allowed.
#include "dist/transport/receive_pool.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

using push::dist::detail::ReceivePool;

namespace {
constexpr int64_t kFloats = (int64_t{4} << 20) / 4;  // 4 MiB of floats
}

TEST(ReceivePool, AFreedBufferIsReusedForTheNextLargeTensor) {
  auto pool = std::make_shared<ReceivePool>(std::size_t{64} << 20);
  const void* first = nullptr;
  {
    auto t = pool->empty({kFloats}, at::kFloat);
    first = t.data_ptr();
    EXPECT_EQ(pool->cached_bytes(), 0u);
  }
  EXPECT_EQ(pool->cached_bytes(), std::size_t{4} << 20);
  // Same bytes in another shape and dtype: the same buffer.
  auto u = pool->empty({2, kFloats / 2}, at::kInt);
  EXPECT_EQ(u.data_ptr(), first);
  EXPECT_EQ(pool->cached_bytes(), 0u);
  EXPECT_EQ(u.sizes(), (std::vector<int64_t>{2, kFloats / 2}));
  EXPECT_EQ(u.scalar_type(), at::kInt);
  EXPECT_TRUE(u.is_contiguous());
}

TEST(ReceivePool, SmallTensorsAndAFarLargerBufferAreNotUsed) {
  auto pool = std::make_shared<ReceivePool>(std::size_t{64} << 20);
  { auto small = pool->empty({16}, at::kFloat); }
  EXPECT_EQ(pool->cached_bytes(), 0u) << "tensors under 1 MiB come from the CPU allocator";
  const void* big = nullptr;
  {
    auto t = pool->empty({kFloats * 4}, at::kFloat);  // 16 MiB
    big = t.data_ptr();
  }
  auto quarter = pool->empty({kFloats}, at::kFloat);  // 4 MiB: would waste 12 MiB
  EXPECT_NE(quarter.data_ptr(), big);
  EXPECT_EQ(pool->cached_bytes(), std::size_t{16} << 20);
}

TEST(ReceivePool, HoldsNoMoreThanItsLimit) {
  auto pool = std::make_shared<ReceivePool>(std::size_t{6} << 20);
  {
    auto a = pool->empty({kFloats}, at::kFloat);
    auto b = pool->empty({kFloats}, at::kFloat);
  }
  EXPECT_EQ(pool->cached_bytes(), std::size_t{4} << 20) << "the second 4 MiB would pass 6 MiB";
  auto off = std::make_shared<ReceivePool>(0);
  { auto c = off->empty({kFloats}, at::kFloat); }
  EXPECT_EQ(off->cached_bytes(), 0u);
}

TEST(ReceivePool, TensorsAreOrdinaryAndOutliveThePool) {
  auto pool = std::make_shared<ReceivePool>(std::size_t{64} << 20);
  auto t = pool->empty({kFloats}, at::kFloat);
  t.fill_(2.0f);
  std::weak_ptr<ReceivePool> weak = pool;
  pool.reset();
  EXPECT_FALSE(weak.expired()) << "a tensor holds its pool";
  t.resize_({kFloats * 2});  // moves to the CPU allocator, gives the pooled buffer back
  t.narrow(0, kFloats, kFloats).fill_(3.0f);
  EXPECT_EQ(t.sum().item<double>(), 5.0 * static_cast<double>(kFloats));
  EXPECT_TRUE(weak.expired()) << "after the resize nothing holds the pool";
  auto g = t.clone().requires_grad_();
  (g * g).sum().backward();
  EXPECT_TRUE(torch::equal(g.grad(), 2 * t));
}
