// The scale model of docs/several-hosts.md ("What 64 and 1,024 ranks would cost") checked on
// the test bed at 2, 4 and 8 hosts of one rank each: how many link round trips an epoch of
// SVGD and of a deep ensemble pays, measured as the extra training time a slower link adds
// (10 ms against 0.1 ms one way) divided by the extra round trip. The model says SVGD pays
// one round trip a batch (its leader sends every other rank's group one message at once)
// plus one an epoch, whatever the number of ranks, and an ensemble a few an epoch (its
// losses), none a batch. Long: a few minutes.
#include <chrono>
#include <cstdio>

#include "netbed/netbed_util.h"
#include "netbed/train_on_hosts.h"

namespace {
using namespace push::testing;

using ScaleModel = TrainOnHosts;

constexpr int kEpochs = 10;
constexpr int kBatches = 7;  // sine-gap's 410 training points in batches of 64

TEST_F(ScaleModel, RoundTripsAnEpochOfSvgdAndAnEnsembleAtTwoFourAndEightRanks) {
  std::printf("ranks  algo      link RTT 0.1 / 10 ms    train_s 0.1 / 10 ms   round trips an epoch (model)\n");
  int port = 40400;
  for (const int ranks : {2, 4, 8}) {
    for (const std::string algo : {"svgd", "ensemble"}) {
      double rtt[2] = {0, 0}, train_s[2] = {0, 0};
      int i = 0;
      for (const double one_way : {0.1, 10.0}) {
        NetBed bed(ranks);
        for (int h = 0; h < ranks; ++h) bed.link(h, LinkSpec{.delay_ms = one_way / 2});
        const auto echo = echo_round_trips(bed, 1, 0, port++, one_way >= 10 ? 10 : 50);
        ASSERT_FALSE(echo.empty());
        rtt[i] = echo[echo.size() / 2];
        const std::string out = algo + std::to_string(ranks) + "-" + std::to_string(i);
        ASSERT_TRUE(run_nodes(bed, "--algo " + algo + " --particles 16 --epochs " + std::to_string(kEpochs) +
                                       " --devices 1 --quiet --nproc 1 --out " + out));
        train_s[i] = metrics(out)["timings"]["train_s"].get<double>();
        ++i;
      }
      const double per_epoch = (train_s[1] - train_s[0]) / kEpochs / ((rtt[1] - rtt[0]) / 1000);
      const double model = algo == "svgd" ? kBatches + 1 : 0;
      std::printf("%5d  %-8s  %6.2f / %6.2f ms       %6.2f / %6.2f s      %5.1f (%s)\n", ranks, algo.c_str(), rtt[0],
                  rtt[1], train_s[0], train_s[1], per_epoch, algo == "svgd" ? "8" : "0 a batch");
      std::fflush(stdout);
      if (algo == "svgd") {
        EXPECT_NEAR(per_epoch, model, 3) << ranks << " ranks";  // not one a pair of particles (16 x 15)
      } else {
        EXPECT_LT(per_epoch, 4) << ranks << " ranks";
      }
    }
  }
}

}  // namespace
