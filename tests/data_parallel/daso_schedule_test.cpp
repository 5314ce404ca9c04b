// DASO's schedule against one computed by hand from heat's rules: warm-up and cool-down
// epochs sync after every batch and wait; after the warm-up, syncs start every 4 batches and
// are received 1 batch later; a stable loss halves the skips; from 1 they restart at
// max_global_skips; every epoch's last batch waits for its sync.
#include <push/data_parallel/daso.h>

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "test_util.h"

using push::data_parallel::DasoOptions;
using push::data_parallel::DasoSchedule;
using push::data_parallel::DasoStep;

namespace {

// One letter per batch: B sends and waits; S sends (received later); R receives a late one;
// X receives a late one, then sends and waits; Y receives a late one, then sends again
// (received later); . does nothing across nodes.
std::string code(const DasoStep& s) {
  if (s.receive && s.send) return s.blocking ? "X" : "Y";
  if (s.receive) return "R";
  if (s.send && s.blocking) return "B";
  if (s.send) return {'S', static_cast<char>('0' + s.wait)};
  return ".";
}

TEST(DasoSchedule, MatchesTheScheduleComputedByHand) {
  // 13 epochs of 6 batches: warm-up 2, cool-down 2 (epochs 11 and 12), max_global_skips 4,
  // patience 1 (stable after 2 epochs without a 5% improvement), restart wait 4 / 2 = 2.
  // The loss after epoch e sets epoch e + 1's schedule.
  DasoSchedule schedule(
      DasoOptions(13).warmup_epochs(2).cooldown_epochs(2).max_global_skips(4).stability_patience(1).local_skip_factor(
          2));
  schedule.set_batches_per_epoch(6);
  const std::vector<double> losses = {3.0, 2.0, 1.0, 0.99, 0.98, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6};
  const std::vector<std::string> expected = {
      "BBBBBB",       // 0: warm-up
      "BBBBBB",       // 1: warm-up
      "S1R..S1X",     // 2: after the warm-up: global_skip 4, wait 1; the last batch waits
      "S1R..S1X",     // 3: (2.0 -> 1.0 improved)
      "S1R..S1X",     // 4: (0.99: one epoch without a 5% improvement)
      "S1RS1RS1X",    // 5: (0.98: two: stable) skips 4 -> 2, wait stays 1
      "S1RS1RS1X",    // 6: (0.5 improved)
      "S1RS1RS1X",    // 7: (0.6: one bad epoch)
      "S1Y1Y1Y1Y1X",  // 8: (two: stable) skips 2 -> 1: each batch receives the last sync and sends
      "S1Y1Y1Y1Y1X",  // 9: (one bad epoch)
      "S2.R.S1X",     // 10: (stable at 1) restart at 4, wait 4/2 = 2, clipped to 1 at batch 4
      "BBBBBB",       // 11: cool-down
      "BBBBBB",       // 12: cool-down
  };
  for (size_t e = 0; e < expected.size(); ++e) {
    std::string got;
    for (int b = 0; b < 6; ++b) {
      const auto s = schedule.next();
      got += code(s);
      if (s.receive && s.send && !s.blocking) got += static_cast<char>('0' + s.wait);
    }
    EXPECT_EQ(got, expected[e]) << "epoch " << e << " (global_skip " << schedule.global_skip() << ")";
    schedule.end_epoch(losses[e]);
  }
}

// Runs one epoch of `batches` and returns its letters (as above).
std::string epoch_of(DasoSchedule& schedule, int64_t batches) {
  schedule.set_batches_per_epoch(batches);
  std::string got;
  for (int64_t b = 0; b < batches; ++b) {
    const auto s = schedule.next();
    got += code(s);
    if (s.receive && s.send && !s.blocking) got += static_cast<char>('0' + s.wait);
  }
  return got;
}

// Where this schedule leaves heat's on purpose: a late sync is received exactly when due
// (heat's, at skip 8 and wait 2 in a 12-batch epoch, skips the receive due at batch 10 and
// takes it at 11, blended as if it had waited 2); warm-up 0 cycles from the start (heat's
// stays blocking for good); skips and waits never shrink to 0 while cycling.
TEST(DasoSchedule, ReceivesWhenDueAndNeverStallsAtZero) {
  // patience 0: every epoch that does not improve is stable. Equal losses: the first one
  // improves (on infinity), each later one is stable.
  DasoSchedule schedule(DasoOptions(20).warmup_epochs(0).cooldown_epochs(0).max_global_skips(8).stability_patience(0));
  EXPECT_EQ(schedule.global_skip(), 4);  // cycling before any end_epoch
  EXPECT_EQ(epoch_of(schedule, 6), "S1R..S1X");
  schedule.end_epoch(1.0);  // improves: 4
  EXPECT_EQ(epoch_of(schedule, 6), "S1R..S1X");
  schedule.end_epoch(1.0);  // stable: 2
  EXPECT_EQ(schedule.global_skip(), 2);
  EXPECT_EQ(epoch_of(schedule, 6), "S1RS1RS1X");
  schedule.end_epoch(1.0);  // stable: 1
  EXPECT_EQ(epoch_of(schedule, 4), "S1Y1Y1X");
  schedule.end_epoch(1.0);  // stable at 1: restart at 8, wait 8 / 4 = 2
  EXPECT_EQ(schedule.global_skip(), 8);
  EXPECT_EQ(schedule.batches_to_wait(), 2);
  EXPECT_EQ(epoch_of(schedule, 12), "S2.R.....S2.RB");
  // A reduction factor larger than the skip: down to 1, not 0 (0 would block for good).
  DasoSchedule steep(DasoOptions(20)
                         .warmup_epochs(0)
                         .cooldown_epochs(0)
                         .stability_patience(0)
                         .skip_reduction_factor(16)
                         .local_skip_factor(16));
  epoch_of(steep, 3);
  steep.end_epoch(1.0);
  epoch_of(steep, 3);
  steep.end_epoch(1.0);
  EXPECT_EQ(steep.global_skip(), 1);
  EXPECT_EQ(steep.batches_to_wait(), 1);
  epoch_of(steep, 3);
  steep.end_epoch(1.0);  // restart: 8, and a wait of 8 / 16 rounded up to 1
  EXPECT_EQ(steep.global_skip(), 8);
  EXPECT_EQ(steep.batches_to_wait(), 1);
  // A wait as long as the skip: each sync is received when the next one is sent, and the
  // receive says how long it waited.
  DasoSchedule even(
      DasoOptions(20).warmup_epochs(0).cooldown_epochs(0).max_global_skips(2).stability_patience(0).local_skip_factor(
          1));
  EXPECT_EQ(even.global_skip(), 2);  // 4 after the warm-up, but never above max_global_skips
  for (int e = 0; e < 3; ++e) {      // 2 (improving), then 2 -> 1, then the restart at 2 with wait 2
    epoch_of(even, 3);
    even.end_epoch(1.0);
  }
  ASSERT_EQ(even.global_skip(), 2);
  ASSERT_EQ(even.batches_to_wait(), 2);
  even.set_batches_per_epoch(7);
  std::vector<int64_t> waited;
  for (int b = 0; b < 7; ++b) {
    const auto s = even.next();
    if (s.receive) waited.push_back(s.waited);
  }
  EXPECT_EQ(waited, (std::vector<int64_t>{2, 2, 2}));  // at batches 2, 4 and 6 (the last)
}

TEST(DasoSchedule, RefusesMisuse) {
  EXPECT_PUSH_ERROR(DasoSchedule(DasoOptions(0)), "total_epochs");
  EXPECT_PUSH_ERROR(DasoSchedule(DasoOptions(5).max_global_skips(0)), "max_global_skips");
  EXPECT_PUSH_ERROR(DasoSchedule(DasoOptions(5).downcast(torch::kInt)), "downcast");
  EXPECT_PUSH_ERROR(DasoSchedule(DasoOptions(5).ranks_per_node(-1)), "ranks_per_node");
  DasoSchedule schedule(DasoOptions(5));
  EXPECT_PUSH_ERROR(schedule.next(), "set_batches_per_epoch");
  schedule.set_batches_per_epoch(2);
  schedule.next();
  EXPECT_PUSH_ERROR(schedule.end_epoch(1.0), "after an epoch's last step");
  schedule.next();
  EXPECT_PUSH_ERROR(schedule.next(), "end_epoch was not called");
  EXPECT_PUSH_ERROR(schedule.end_epoch(std::numeric_limits<double>::quiet_NaN()), "diverged");
  schedule.end_epoch(1.0);
  EXPECT_PUSH_ERROR(schedule.end_epoch(1.0), "once");
}

}  // namespace
