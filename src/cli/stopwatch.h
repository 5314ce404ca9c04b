#pragma once
// Elapsed time on push's clock (core/clock.h): the timings of metrics.json and the
// progress bar's ETA.
//   const Stopwatch watch;  ...;  double s = watch.seconds();
#include <chrono>

#include "core/clock.h"

namespace push::cli {

class Stopwatch {
 public:
  /// Seconds since the stopwatch was made.
  double seconds() const { return std::chrono::duration<double>(push::detail::Clock::now() - start_).count(); }

 private:
  push::detail::Clock::time_point start_ = push::detail::Clock::now();
};

}  // namespace push::cli
