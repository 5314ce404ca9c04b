// poll_timeout_ms (transport.h): the transport's and the handshake's waits on push's Clock.
#include "dist/transport/transport.h"

#include <algorithm>

namespace push::dist::detail {

int poll_timeout_ms(Clock::time_point deadline, int longest_ms) {
  const auto now = Clock::now();
  if (deadline <= now) return 0;
  int64_t longest = longest_ms;
  if (Clock::manual()) longest = std::min<int64_t>(longest, Clock::kManualTick.count());
  const int64_t left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
  return static_cast<int>(std::min(left, longest));
}

}  // namespace push::dist::detail
