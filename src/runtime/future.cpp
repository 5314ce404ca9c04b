#include <push/runtime/future.h>

#include <c10/util/Exception.h>

#include "runtime/fiber.h"
#include "runtime/lane.h"

namespace push {
namespace detail {

std::string describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

namespace {
// A wait on a lane's own thread outside a fiber would block the loop that must make
// progress for the future to complete.
void check_not_lane_stack(const char* origin) {
  if (Lane::current() != nullptr && Fiber::current() == nullptr) {
    throw Error(c10::str("[", origin,
                         "] cannot block a device's event loop outside a handler; "
                         "wait inside a handler or from another thread"));
  }
}
}  // namespace

void FutureCore::wait_ready() {
  if (ready()) return;
  if (Lane* lane = Lane::current(); lane != nullptr && Fiber::current() != nullptr) {
    lane->suspend_until(*this);
    return;
  }
  check_not_lane_stack("push::Future::wait");
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return ready(); });
}

bool FutureCore::wait_ready_for(std::chrono::nanoseconds timeout) {
  if (ready()) return true;
  if (Lane::current() != nullptr && Fiber::current() != nullptr) {
    // Inside a handler there is no timer to wake the fiber: wait for completion.
    wait_ready();
    return true;
  }
  check_not_lane_stack("push::Future::wait_for");
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, timeout, [&] { return ready(); });
}

void FutureCore::add_callback(std::function<void()> callback) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!ready()) {
      callbacks_.push_back(std::move(callback));
      return;
    }
  }
  callback();
}

void FutureCore::mark_ready(std::exception_ptr error) {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ready()) throw Error("[push::Promise] this future already has a value or an error");
    error_ = std::move(error);
    ready_.store(true, std::memory_order_release);
    callbacks.swap(callbacks_);
  }
  cv_.notify_all();
  for (auto& callback : callbacks) callback();
}

}  // namespace detail
}  // namespace push
