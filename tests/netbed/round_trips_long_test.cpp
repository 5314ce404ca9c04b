// Particle messages and views between two hosts of the test bed, against the link's own
// round trip (a one-byte TCP echo between the same namespaces, in the same run), at 0.1, 1
// and 10 ms one way: the table of docs/several-hosts.md ("Round trips"). Long: about 10 s.
//
// Rank 0's particle a (host 0) and rank 1's particle b (host 1), a Linear(64, 64) each:
// - a message from a plain user thread: dist.p_launch(b, "ping").wait();
// - a message from a particle: a's handler p.send(b, "ping").wait();
// - a view of b after b changed (a fresh copy: one round trip and its 16 KiB);
// - a view of b that has not changed since a's last one (the cache: no bytes, one round
//   trip to learn that it is still current).
#include <push/push.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "netbed/netbed_util.h"
#include "netbed/ranks_on_hosts.h"

using namespace std::chrono_literals;

namespace {
using namespace push::testing;
using push::Args;
using push::Particle;
using push::ParticleOptions;
using push::Pid;

using RoundTrips = Hosts;

double median(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  return ms.empty() ? 0 : ms[ms.size() / 2];
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// Handlers of particle a (the one that measures) and b (the one measured).
ParticleOptions measured_particle() {
  return ParticleOptions()
      .on("ping", [](Particle&, const Args&) { return c10::IValue(int64_t{1}); })
      .on("bump",
          [](Particle& p, const Args&) {
            torch::NoGradGuard no_grad;
            for (auto& t : p.module().parameters()) t.add_(1);
            return c10::IValue();
          })
      .on("messages",
          [](Particle& p, const Args& a) {
            std::vector<double> ms;
            for (int64_t i = 0; i < a.at(1).toInt(); ++i) {
              const auto start = std::chrono::steady_clock::now();
              p.send(a.at(0).toInt(), "ping").wait();
              ms.push_back(ms_since(start));
            }
            return c10::IValue(median(ms));
          })
      .on("views", [](Particle& p, const Args& a) {
        const Pid b = a.at(0).toInt();
        std::vector<double> fresh, cached;
        for (int64_t i = 0; i < a.at(1).toInt(); ++i) {
          p.send(b, "bump").wait();
          auto start = std::chrono::steady_clock::now();
          p.get(b).wait();
          fresh.push_back(ms_since(start));
          start = std::chrono::steady_clock::now();
          p.get(b).wait();
          cached.push_back(ms_since(start));
        }
        return c10::IValue(std::vector<double>{median(fresh), median(cached)});
      });
}

// Writes "user-thread particle fresh-view cached-view" medians (ms) to PUSH_TEST_OUT.
PUSH_DIST_WORKER(netbed_messages_and_views) {
  auto world = test_world(120s);
  push::Push dist([] { return torch::nn::Linear(64, 64); }, push::PushOptions().world(world));
  const Pid a = dist.p_create(measured_particle());
  const Pid b = dist.p_create(measured_particle());
  ASSERT_EQ(dist.rank_of(b), 1);
  if (world.rank() == 0) {
    const int rounds = std::atoi(std::getenv("PUSH_TEST_ROUNDS"));
    dist.p_launch(b, "ping").wait();  // connected and warm
    std::vector<double> user;
    for (int i = 0; i < rounds; ++i) {
      const auto start = std::chrono::steady_clock::now();
      dist.p_launch(b, "ping").wait();
      user.push_back(ms_since(start));
    }
    const double particle = dist.p_launch(a, "messages", b, int64_t{rounds}).wait().toDouble();
    const auto before = dist.cache_stats(0);
    const auto views = dist.p_launch(a, "views", b, int64_t{rounds}).wait().toDoubleVector();
    const auto after = dist.cache_stats(0);
    EXPECT_EQ(after.view_hits - before.view_hits, rounds);  // every second view was the cached one
    EXPECT_EQ(after.view_misses - before.view_misses, rounds);
    std::ofstream(std::getenv("PUSH_TEST_OUT"))
        << median(user) << ' ' << particle << ' ' << views[0] << ' ' << views[1] << '\n';
  }
  dist.barrier();
}

TEST_F(RoundTrips, MessagesAndViewsAgainstTheLinksOwnRoundTrip) {
  const std::string out = ::testing::TempDir() + "/netbed_round_trips_" + std::to_string(::getpid());
  std::printf("one way   link RTT   message (thread)   message (particle)   view (changed)   view (cached)\n");
  int port = 40300;
  for (const double one_way : {0.1, 1.0, 10.0}) {
    NetBed bed(2);
    bed.link(0, LinkSpec{});  // host 0 through the switch too: the same path both ways
    bed.link(1, LinkSpec{.delay_ms = one_way});
    const int rounds = one_way >= 10 ? 20 : 100;
    const auto echo = echo_round_trips(bed, 0, 1, port++, rounds);
    ASSERT_FALSE(echo.empty());
    const double rtt = echo[echo.size() / 2];
    expect_all_ok(run_workers(2, "netbed_messages_and_views", 120s,
                              {"PUSH_TEST_OUT=" + out, "PUSH_TEST_ROUNDS=" + std::to_string(rounds)},
                              on_hosts(bed, {0, 1})));
    double user = 0, particle = 0, fresh = 0, cached = 0;
    std::ifstream(out) >> user >> particle >> fresh >> cached;
    std::printf("%5.1f ms  %7.3f ms  %7.3f ms (%4.2fx)  %7.3f ms (%4.2fx)  %7.3f ms (%4.2fx)  %7.3f ms (%4.2fx)\n",
                one_way, rtt, user, user / rtt, particle, particle / rtt, fresh, fresh / rtt, cached, cached / rtt);
    std::fflush(stdout);
    // One round trip each, not two; what push adds is a fixed cost, small beside 10 ms.
    for (const double ms : {user, particle, fresh, cached}) {
      EXPECT_GE(ms, rtt * 0.9) << one_way;
      EXPECT_LT(ms, 1.5 * rtt + 0.5) << one_way;
    }
    if (one_way >= 10) EXPECT_LT(user, rtt * 1.2);
  }
}

}  // namespace
