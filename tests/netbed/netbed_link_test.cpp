// The test bed's user-space links (NetBed::link, link_switch.cpp): a delay shows in the
// round trip, lost frames are sent again, a stalled link holds its frames until the stall
// ends, a partition drops them. How close the round trip comes to the setting is printed
// (the figures in docs/distributed.md, "Several hosts"); only lower bounds are checked (a
// loaded machine adds time, never removes it).
#include "netbed/netbed_util.h"

#include <chrono>
#include <cstdio>
#include <thread>

namespace {
using namespace push::testing;

TEST_F(Hosts, AnEmulatedLinkDelaysByItsSetting) {
  NetBed bed(2);
  const auto bridge = echo_round_trips(bed, 1, 0, 40100, 50);
  ASSERT_EQ(bridge.size(), 50u);
  std::printf("kernel bridge: round trip median %.3f ms\n", bridge[25]);
  int port = 40101;
  for (double delay : {0.0, 0.1, 1.0, 10.0}) {
    bed.link(1, LinkSpec{.delay_ms = delay});  // host 1's link, each way: a round trip crosses it twice
    const auto ms = echo_round_trips(bed, 1, 0, port++, delay >= 10 ? 20 : 50);
    ASSERT_FALSE(ms.empty()) << delay;
    const double median = ms[ms.size() / 2], p90 = ms[ms.size() * 9 / 10];
    std::printf("link delay %.1f ms each way: round trip median %.3f ms, p90 %.3f ms (setting %.1f ms)\n", delay,
                median, p90, 2 * delay);
    EXPECT_GE(median, 2 * delay * 0.98) << delay;
  }
}

TEST_F(Hosts, AnEmulatedLinkLosesAndStallsAsAsked) {
  NetBed bed(2);
  // A lossy link: TCP sends again, and the bytes all arrive.
  bed.link(1, LinkSpec{.delay_ms = 0.5, .loss = 0.05});
  const int64_t bytes = 1 << 20;
  pid_t server = serve_once(bed, 0, 40110, bytes);
  EXPECT_EQ(in_host(bed, 1, [&] { return receive(bed.address(0), 40110, bytes, 10000) == bytes ? 0 : 1; }), 0);
  reap(server);
  // A stall holds everything until it ends: a connection made during a 1 s stall completes
  // after it.
  bed.link(1, LinkSpec{.stalled = true});
  server = serve_once(bed, 0, 40111, 16);
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::seconds(1));  // real time is the point: the stall's length
    bed.link(1, LinkSpec{});
  });
  const auto start = std::chrono::steady_clock::now();
  const int code = in_host(bed, 1, [&] { return receive(bed.address(0), 40111, 16, 5000) == 16 ? 0 : 1; });
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  release.join();
  reap(server);
  EXPECT_EQ(code, 0);
  EXPECT_GE(waited, 0.9) << "the stall let the connection through";
  // A partition drops every frame, until healed.
  bed.partition(1);
  server = serve_once(bed, 0, 40112, 16);
  EXPECT_EQ(in_host(bed, 1, [&] { return connect_within(bed.address(0), 40112, 300) == ETIMEDOUT ? 0 : 1; }), 0);
  bed.heal(1);
  EXPECT_EQ(in_host(bed, 1, [&] { return receive(bed.address(0), 40112, 16, 2000) == 16 ? 0 : 1; }), 0);
  reap(server);
}

}  // namespace
