// An RPC call's deadline is a timer on push's one Clock (core/clock.h): with a ManualClock
// installed, it passes when the test moves the clock past it, at that moment and not
// before, however much real time goes by.
#include "dist_test_util.h"

#include "core/clock.h"

#include <test_util.h>

#include <atomic>
#include <thread>

using namespace std::chrono_literals;
using push::dist::RpcArgs;

namespace {

// Opened by the test; the handler below waits for it (its fiber suspends, the loop goes on).
std::atomic<push::Promise<bool>*> g_gate{nullptr};

c10::IValue deadline_held(const RpcArgs& a) {
  g_gate.load()->future().wait();
  return a.at(0);
}
PUSH_RPC_FUNCTION(deadline_held);

/// A one-member group in this process: its calls go to itself, through the same pending
/// calls, deadlines and handler fibers as calls to others.
struct Alone {
  Alone()
      : world(push::dist::WorldOptions().master_port(push::dist::free_port()).init_timeout(30s)),
        rpc(world.rpc_group("deadline", {world.name()})) {}
  push::dist::World world;
  push::dist::RpcGroup rpc;
};

}  // namespace

TEST(DistRpcDeadline, ACallTimesOutExactlyWhenAManualClockPassesItsDeadline) {
  Alone alone;
  push::Promise<bool> gate;
  g_gate = &gate;
  {
    push::detail::ManualClock clock;
    auto soon = alone.rpc.rpc_async(0, "deadline_held", {c10::IValue(int64_t{7})}, 100ms);
    auto later = alone.rpc.rpc_async(0, "deadline_held", {c10::IValue(int64_t{8})}, 300ms);
    // Due 1 ms before `later`: its timing out shows the I/O thread has looked at that time.
    auto probe = alone.rpc.rpc_async(0, "deadline_held", {c10::IValue(int64_t{10})}, 299ms);
    clock.advance(99ms);
    // Real time, more than either timeout, while the manual one stands 1 ms short of the
    // first: the I/O thread looks every Clock::kManualTick and must find nothing due (real
    // time is the point: a deadline kept on the wall clock would pass here).
    std::this_thread::sleep_for(350ms);
    EXPECT_FALSE(soon.is_ready());
    clock.advance(1ms);
    EXPECT_PUSH_ERROR(soon.wait(),
                      "call of 'deadline_held' on worker0: no reply from worker0 (rank 0) within the timeout");
    // Each call has its own deadline: the second's is 200 ms further on.
    clock.advance(199ms);
    EXPECT_PUSH_ERROR(probe.wait(), "no reply from worker0 (rank 0) within the timeout");
    EXPECT_FALSE(later.is_ready());
    clock.advance(1ms);
    EXPECT_PUSH_ERROR(later.wait(), "no reply from worker0 (rank 0) within the timeout");
  }
  gate.set_value(true);  // the held handlers reply now: their replies are late, and dropped
  EXPECT_EQ(alone.rpc.rpc_sync(0, "deadline_held", {c10::IValue(int64_t{9})}).toInt(), 9);
  alone.rpc.shutdown();
  g_gate = nullptr;
}
