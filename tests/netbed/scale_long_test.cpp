// The scale model of docs/several-hosts.md ("What 64 and 1,024 ranks would cost") checked on
// the test bed at 2, 4 and 8 hosts of one rank each: how many link round trips an epoch of
// SVGD and of a deep ensemble pays, and how many a run pays once, measured as the extra
// time a slower link adds (10 ms against 0.1 ms one way) divided by the extra round trip.
// The model: SVGD's leader sends every other rank's group one message a batch, all at once
// (one round trip a batch, whatever the ranks), an ensemble gathers its losses once an
// epoch (one round trip), and a run's start (after joining: RPC connections, building the
// distribution) costs a few round trips a rank, one rank after another. Long: about 2.5
// minutes.
#include <chrono>
#include <cstdio>
#include <map>

#include "netbed/netbed_util.h"
#include "netbed/train_on_hosts.h"

namespace {
using namespace push::testing;

constexpr int kBatches = 7;  // sine-gap's 410 training points in batches of 64

struct LinkCost {
  double per_epoch = 0, once = 0;  // link round trips an epoch, and once a run (after joining)
  double rtt_ms[2] = {0, 0};       // the link's, at 0.1 and 10 ms one way
  double epoch_s[2] = {0, 0};      // an epoch's time at each
};

class ScaleModel : public TrainOnHosts {
 protected:
  /// `algo` on `ranks` hosts of one rank each. An epoch's time is the slope between a run
  /// of 4 epochs and one of 12: what a run pays once drops out of it. `sysctls` are set in
  /// every host first.
  LinkCost measure(int ranks, const std::string& algo, const std::vector<std::string>& sysctls = {}) {
    LinkCost m;
    double once_s[2] = {0, 0};
    for (int i = 0; i < 2; ++i) {
      const double one_way = i == 0 ? 0.1 : 10.0;
      NetBed bed(ranks);
      for (const auto& setting : sysctls) bed.sysctl(setting);
      for (int h = 0; h < ranks; ++h) bed.link(h, LinkSpec{.delay_ms = one_way / 2});
      const auto echo = echo_round_trips(bed, 1, 0, port_++, one_way >= 10 ? 10 : 50);
      EXPECT_FALSE(echo.empty());
      if (echo.empty()) return m;
      m.rtt_ms[i] = echo[echo.size() / 2];
      double train_s[2] = {0, 0};
      for (const int epochs : {4, 12}) {
        const std::string out =
            algo + std::to_string(ranks) + "-" + std::to_string(port_) + "-" + std::to_string(epochs);
        if (!run_nodes(bed, "--algo " + algo + " --particles 16 --epochs " + std::to_string(epochs) +
                                " --devices 1 --quiet --nproc 1 --out " + out)) {
          return m;
        }
        train_s[epochs == 4 ? 0 : 1] = metrics(out)["timings"]["train_s"].get<double>();
      }
      m.epoch_s[i] = (train_s[1] - train_s[0]) / 8;
      once_s[i] = train_s[0] - 4 * m.epoch_s[i];
    }
    const double extra_rtt_s = (m.rtt_ms[1] - m.rtt_ms[0]) / 1000;
    m.per_epoch = (m.epoch_s[1] - m.epoch_s[0]) / extra_rtt_s;
    m.once = (once_s[1] - once_s[0]) / extra_rtt_s;
    std::printf("%5d  %-8s  %6.2f / %6.2f ms     %5.3f / %5.3f s    %5.1f  %5.1f\n", ranks, algo.c_str(), m.rtt_ms[0],
                m.rtt_ms[1], m.epoch_s[0], m.epoch_s[1], m.per_epoch, m.once);
    std::fflush(stdout);
    return m;
  }
  static void header() {
    std::printf("ranks  algo      link RTT 0.1 / 10 ms   epoch 0.1 / 10 ms   round trips: an epoch, once\n");
  }
  int port_ = 40400;
};

TEST_F(ScaleModel, RoundTripsOfSvgdAndAnEnsembleAtTwoFourAndEightRanks) {
  header();
  std::map<int, LinkCost> svgd, ensemble;
  for (const int ranks : {2, 4, 8}) {
    svgd[ranks] = measure(ranks, "svgd");
    ensemble[ranks] = measure(ranks, "ensemble");
  }
  for (const int ranks : {2, 4, 8}) {
    // SVGD: about two a batch with this machine's TCP (bbr: see the next test), never one a
    // pair of particles (16 x 15 a batch).
    EXPECT_GT(svgd[ranks].per_epoch, 0.5 * kBatches) << ranks << " ranks";
    EXPECT_LT(svgd[ranks].per_epoch, 3.0 * kBatches) << ranks << " ranks";
    // An ensemble: its losses once an epoch, none a batch. The measure's resolution is about
    // a round trip an epoch (the ranks' own compute varies by more on 2 cores).
    EXPECT_LT(ensemble[ranks].per_epoch, 3.0) << ranks << " ranks";
    // What a run pays once (its RPC groups' connections, building the distribution, the
    // first epoch's start) grows with the ranks, within the model's 20 a rank.
    EXPECT_LT(svgd[ranks].once, 20.0 * ranks) << ranks << " ranks";
  }
  // Not more round trips a batch with more ranks: the leader's messages go out at once.
  EXPECT_LT(svgd[8].per_epoch, 1.3 * svgd[2].per_epoch);
  EXPECT_GT(svgd[8].once, svgd[2].once);
}

TEST_F(ScaleModel, WithRenoSvgdPaysOneRoundTripABatch) {
  // This machine's TCP is bbr, whose pacing of a burst after a quiet spell costs SVGD's
  // message about a second round trip; with reno (and no slow start after idle) what is
  // left is push's own: one a batch and one an epoch.
  const std::string reno = "net.ipv4.tcp_congestion_control=reno";
  try {
    NetBed probe(1);
    probe.sysctl(reno);
  } catch (const std::runtime_error& e) {
    GTEST_SKIP() << "reno cannot be set here: " << e.what();
  }
  header();
  const auto m = measure(2, "svgd", {reno, "net.ipv4.tcp_slow_start_after_idle=0"});
  EXPECT_LT(m.per_epoch, kBatches + 3.0);
}

}  // namespace
