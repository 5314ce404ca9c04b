#pragma once
// A stackful coroutine on its own guarded stack, switched with ucontext.
//
// Why stackful: a handler (a particle's; soon an RPC's) is ordinary C++ that calls wait()
// anywhere in its call tree. Suspending it without blocking its event loop's only OS thread
// needs its own stack; C++20 stackless coroutines would force co_await into every user
// handler.
//
// A Fiber never migrates between threads: it is resumed only by the event loop thread
// that started it. On every switch the per-thread state a handler can change is saved and
// restored (ThreadState below, and the C++ exception-handling globals), so a handler that
// waits inside a NoGradGuard, an autocast region, a device or stream guard or a catch
// block resumes exactly as it left, and leaks none of it into other handlers. Not saved:
// the autograd engine's state during a backward pass (wait() refuses to suspend there)
// and the autocast cache of casts (cleared instead when an autocast handler switches).
#include "core/torch_compat.h"

#include <ATen/ThreadLocalState.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>

#include <ucontext.h>

namespace push::detail {

// Mirror of the Itanium C++ ABI's per-thread exception globals (cxxabi.h keeps the
// struct opaque; its layout is fixed by the ABI).
struct EhGlobals {
  void* caught_exceptions = nullptr;
  unsigned int uncaught_exceptions = 0;
};

// LibTorch's per-thread state beyond the C++ runtime's: at::ThreadLocalState (grad mode,
// dispatch keys, saved-tensor hooks, ...), autocast, and for a device with a current
// device and stream (CUDA), both, through the device type's guard implementation (so the
// CPU build needs no CUDA headers).
class ThreadState {
 public:
  static ThreadState capture(const c10::Device& loop_device);
  /// Makes this the thread's state, given that `current` (captured just now) is.
  void restore_over(const ThreadState& current) const;
  bool autocast_enabled() const { return autocast_.any_enabled(); }

 private:
  at::ThreadLocalState torch_;
  compat::AutocastState autocast_;
  std::optional<c10::Device> device_;  // current device of the loop device's type
  std::optional<c10::Stream> stream_;  // current stream on device_
};

class Fiber {
 public:
  /// A stack of `stack_size` bytes; `device` is the loop's (whose current device and
  /// stream are saved on switches). Throws push::Error when the stack cannot be mapped.
  Fiber(std::size_t stack_size, const c10::Device& device);
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // Prepares the fiber to run `body` from the start at the next resume(). The body
  // must not let an exception escape (the caller wraps it).
  void start(std::function<void()> body);

  // Scheduler side: runs the fiber until it suspends or its body returns.
  void resume();

  // Fiber side: returns control to the resume() that is running it.
  void suspend();

  bool finished() const { return finished_; }
  /// Gives the stack's pages back to the system (only while not running).
  void release_stack();
  std::size_t stack_size() const { return stack_size_; }

  // The fiber running on this thread, or nullptr on a plain thread stack.
  static Fiber* current();

 private:
  static void trampoline(unsigned int lo, unsigned int hi);
  void run_body();
  void switch_in(const ThreadState& caller);
  void switch_out();

  ucontext_t context_{};
  ucontext_t caller_{};
  void* mapping_ = nullptr;  // stack with a guard page below it
  std::size_t mapping_size_ = 0;
  void* stack_ = nullptr;
  std::size_t stack_size_ = 0;
  std::function<void()> body_;
  bool finished_ = true;

  EhGlobals eh_fiber_{};
  EhGlobals eh_caller_{};
  c10::Device device_;
  std::optional<ThreadState> state_;           // the fiber's, while suspended
  const ThreadState* caller_state_ = nullptr;  // the resume() running it: restored on switch-out
  Fiber* previous_ = nullptr;

  // Sanitizer bookkeeping (used only in instrumented builds).
  void* tsan_fiber_ = nullptr;
  void* tsan_caller_ = nullptr;
  void* asan_fake_stack_ = nullptr;
  const void* asan_caller_bottom_ = nullptr;
  std::size_t asan_caller_size_ = 0;
};

}  // namespace push::detail
