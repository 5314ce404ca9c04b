#include "dist/rpc/handler_loops.h"

#include <c10/util/StringUtil.h>

namespace push::dist::detail {

using push::detail::EventLoop;

void HandlerLoops::start(int count, const std::string& group, std::function<void(std::exception_ptr)> report) {
  report_ = std::move(report);
  for (int i = 0; i < count; ++i) {
    EventLoop::Options o;
    o.name = "push-rpc";
    o.stopped = c10::str("RPC group '", group, "' was shut down");
    loops_.push_back(std::make_shared<EventLoop>(std::move(o)));
    loops_.back()->start();
  }
}

void HandlerLoops::enqueue(std::function<void()> job, int peer) {
  const uint64_t slot = peer >= 0 ? static_cast<uint64_t>(peer) : next_.fetch_add(1, std::memory_order_relaxed);
  loops_[slot % loops_.size()]->post_fiber(std::move(job), report_);
}

void HandlerLoops::stop() {
  for (auto& loop : loops_) loop->stop();
}

bool HandlerLoops::is_own_thread() const {
  for (const auto& loop : loops_) {
    if (EventLoop::current() == loop.get()) return true;
  }
  return false;
}

}  // namespace push::dist::detail
