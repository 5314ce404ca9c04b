// A device lane is an event loop with particles: Lane::current() must tell a lane's thread
// from another loop's (an RPC loop), whose fiber jobs carry no particle.
#include <push/push.h>

#include <gtest/gtest.h>

#include <memory>

#include "core/event_loop.h"
#include "runtime/lane.h"
#include "test_util.h"

namespace push {
namespace {

using detail::EventLoop;
using detail::Lane;

TEST(Lane, CurrentIsNullOnAnEventLoopThatIsNotALane) {
  auto loop = std::make_shared<EventLoop>(EventLoop::Options{});
  loop->start();
  Promise<bool> seen;
  loop->post_fiber([seen] { seen.set_value(EventLoop::current() != nullptr && Lane::current() == nullptr); },
                   [seen](std::exception_ptr e) { seen.set_error(std::move(e)); });
  EXPECT_TRUE(seen.future().wait()) << "an event loop's thread taken for a lane";
  EXPECT_EQ(Lane::current(), nullptr);  // nor on a plain thread
}

TEST(Lane, CurrentIsTheLaneOfTheRunningHandler) {
  Push dist(testing::tiny_mlp, PushOptions().devices(2));
  Pid pid = dist.p_create(ParticleOptions().device(1).on("where", [](Particle&, const Args&) {
    Lane* lane = Lane::current();
    return c10::IValue(int64_t{lane != nullptr && EventLoop::current() == lane ? lane->index() : -1});
  }));
  EXPECT_EQ(dist.p_launch(pid, "where").wait().toInt(), 1);
}

}  // namespace
}  // namespace push
