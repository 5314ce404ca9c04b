// Collectives and transfers awaited inside particle handlers: a wait suspends the handler's
// fiber, not its lane, so two particles on one lane can take part in transfers and
// collectives at once, in orders that differ between the ranks.
#include "dist_test_util.h"

#include <push/push.h>

#include <test_util.h>

using namespace std::chrono_literals;
using push::testing::expect_all_ok;
using push::testing::run_workers;

namespace {

torch::nn::AnyModule tiny() { return torch::nn::AnyModule(torch::nn::Linear(1, 1)); }

}  // namespace

PUSH_DIST_WORKER(fiber_send_recv) {
  auto world = push::testing::test_world(20s);
  auto group = world.collective();
  const int peer = 1 - world.rank();
  // One lane: the receiving particle's wait must let the sending particle run, or both
  // ranks wait for a message that the other's blocked lane never sends.
  push::Push dist(tiny, push::PushOptions().devices(1));
  auto opts = push::ParticleOptions()
                  .on("receive",
                      [group, peer](push::Particle&, const push::Args&) {
                        auto t = torch::zeros({3});
                        group.irecv(t, peer, 5).wait();
                        return c10::IValue(t);
                      })
                  .on("send", [group, peer, rank = world.rank()](push::Particle&, const push::Args&) {
                    group.isend(torch::full({3}, rank + 1.0), peer, 5).wait();
                    return c10::IValue();
                  });
  auto receiver = dist.p_create(opts), sender = dist.p_create(opts);
  auto got = dist.p_launch(receiver, "receive");
  auto sent = dist.p_launch(sender, "send");
  sent.wait();
  EXPECT_TRUE(torch::equal(got.wait().toTensor(), torch::full({3}, peer + 1.0)));
}

TEST(DistCollective, TransfersAwaitedInHandlersDoNotBlockTheirLane) {
  expect_all_ok(run_workers(2, "fiber_send_recv", 60s));
}

PUSH_DIST_WORKER(fiber_collectives) {
  auto world = push::testing::test_world(20s);
  auto a = world.new_group({0, 1}, push::dist::CollectiveGroupOptions().name("a"));
  auto b = world.new_group({0, 1}, push::dist::CollectiveGroupOptions().name("b"));
  push::Push dist(tiny, push::PushOptions().devices(1));
  auto reduce_on = [](push::dist::CollectiveGroup g) {
    return [g](push::Particle&, const push::Args& args) {
      auto t = args.at(0).toTensor().clone();
      g.all_reduce(t);
      return c10::IValue(t);
    };
  };
  auto pa = dist.p_create(push::ParticleOptions().on("reduce", reduce_on(a)));
  auto pb = dist.p_create(push::ParticleOptions().on("reduce", reduce_on(b)));
  // Rank 0 starts group a's all_reduce first, rank 1 group b's: with waits that blocked the
  // lane, each rank would hold its lane in a collective the other has not reached yet.
  const auto x = torch::full({2}, world.rank() + 1.0);
  std::vector<push::PFuture> fs;
  if (world.rank() == 0) {
    fs.push_back(dist.p_launch(pa, "reduce", x));
    fs.push_back(dist.p_launch(pb, "reduce", x * 10));
  } else {
    fs.push_back(dist.p_launch(pb, "reduce", x * 10));
    fs.push_back(dist.p_launch(pa, "reduce", x));
  }
  auto first = fs[0].wait().toTensor(), second = fs[1].wait().toTensor();
  const auto& ra = world.rank() == 0 ? first : second;
  const auto& rb = world.rank() == 0 ? second : first;
  EXPECT_TRUE(torch::equal(ra, torch::full({2}, 3.0)));
  EXPECT_TRUE(torch::equal(rb, torch::full({2}, 30.0)));
}

TEST(DistCollective, TwoParticlesOnOneLaneInCollectivesAtOnce) {
  expect_all_ok(run_workers(2, "fiber_collectives", 60s));
}
