#pragma once
// push train's progress bar: one line on stderr, redrawn at most ten times a second, with
// epochs x particles done, the running loss and the time left (before training, the
// particles made so far, when making them takes a while).
//   ProgressBar bar(particles, quiet);
//   options.on_progress([&bar](const bayes::Progress& p) { bar.update(p); });
//   bar.start(first_epoch, last_epoch);  infer.fit(train, last_epoch - first_epoch);
#include <push/bayes.h>

#include <cstdint>

#include "stopwatch.h"

namespace push::cli {

class ProgressBar {
 public:
  ProgressBar(int particles, bool quiet) : particles_(particles), quiet_(quiet) {}
  /// A run stopped mid-way: end the bar's line, so that an error gets its own.
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  /// Training runs from `first_epoch` (epochs already done) to `last_epoch`; the ETA counts
  /// from now. Progress reported before this (loading a checkpoint) is not shown.
  void start(int64_t first_epoch, int64_t last_epoch);
  /// Training progress once started; before it, the particles being made, shown only
  /// when making them takes more than a second.
  void update(const bayes::Progress& p);

 private:
  void creating(const bayes::Progress& p);

  int64_t first_ = 0, last_ = 0;
  int particles_;
  bool quiet_;
  bool started_ = false;
  Stopwatch since_start_;
  double last_print_ = -1;
  bool open_line_ = false;
};

}  // namespace push::cli
