// Work: waiting for a collective or a transfer, blocking a thread or, in a fiber,
// suspending it (c10d's future of the work, or a blocking wait on a thread of its own).
#include "dist/collectives/work.h"

#include "core/clock.h"
#include "core/fiber.h"
#include "dist/collectives/blocking_waits.h"

#include <algorithm>
#include <chrono>

namespace push::dist {
namespace {

/// In a fiber (a particle's or an RPC handler), waits for `work` without blocking the
/// thread, which runs the other fibers of its loop: the fiber suspends until c10d's future
/// of the work completes. False when `timeout` passed first, or when the work has no
/// future (Gloo's send/recv; see BlockingWaits).
bool wait_for_future(const c10::intrusive_ptr<c10d::Work>& work, Milliseconds timeout, bool& has_future) {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  try {
    future = work->getFuture();
  } catch (const std::exception&) {
    // Not implemented for this kind of work.
  }
  has_future = static_cast<bool>(future);
  if (!future) return false;
  auto done = std::make_shared<Promise<bool>>();
  auto f = done->future();
  future->addCallback([done](c10::ivalue::Future&) { done->set_value(true); });
  return f.wait_for(timeout);
}

/// Waits for the work, blocking this thread (at most `timeout`), then records its source
/// and runs its completion step. Once per work: later calls return at once.
void finish(Work::State& s, Milliseconds timeout) {
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.finished) return;
  try {
    // c10d reads 0 ms as "no timeout": never hand it a 0.
    s.work->wait(std::max(timeout, Milliseconds(1)));
#if defined(PUSH_TSAN)
    // Gloo's worker drops its reference to the work (and the work's tensors) after waking
    // us, in code ThreadSanitizer cannot see. Were that the last reference, the tensors
    // would be freed there, unordered (for TSan) with our reads: wait until ours is the
    // only one left (briefly; bounded).
    using push::detail::Clock;
    Clock::poll_until(Clock::deadline_after(std::chrono::seconds(2)), std::chrono::microseconds(50),
                      [&] { return s.work.use_count() <= 1; });
#endif
    if (s.source)
      s.source_rank = s.source(s.work->sourceRank());
    else
      s.source_rank = s.fixed_source;
    if (s.on_success) s.on_success();
  } catch (const std::exception&) {
    s.error = std::make_exception_ptr(Error(c10::str("[", s.origin, "] failed or timed out (waited up to ",
                                                     timeout.count(), " ms): ", detail::current_message())));
  }
  s.finished = true;
}

}  // namespace

void Work::wait() const {
  PUSH_CHECK(state_, "push::dist::Work::wait", "this work handle is empty");
  wait(state_->timeout);
}

void Work::wait(Milliseconds timeout) const {
  PUSH_CHECK(state_, "push::dist::Work::wait", "this work handle is empty");
  auto& s = *state_;
  if (push::detail::Fiber::current() != nullptr) {
    // Never block the lane, and never hold the mutex across a suspension: another fiber
    // of this thread may want it.
    bool finished;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      finished = s.finished;
    }
    if (!finished) {
      bool has_future = false;
      const bool done = wait_for_future(s.work, timeout, has_future);
      if (!has_future) {
        detail::BlockingWaits::instance().run([state = state_, timeout] { finish(*state, timeout); }).wait();
      } else if (!done) {
        std::lock_guard<std::mutex> lock(s.mutex);
        if (!s.finished) {
          s.error = std::make_exception_ptr(
              Error(c10::str("[", s.origin, "] failed or timed out (waited up to ", timeout.count(), " ms)")));
          s.finished = true;
        }
      }
    }
  }
  finish(s, timeout);
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.error) std::rethrow_exception(s.error);
}

bool Work::is_completed() const {
  if (!state_) return false;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->finished || state_->work->isCompleted();
}

int Work::source_rank() const {
  PUSH_CHECK(state_, "push::dist::Work::source_rank", "this work handle is empty");
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->source_rank;
}

}  // namespace push::dist
