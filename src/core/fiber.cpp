#include "core/fiber.h"

#include <push/core/errors.h>

#include <c10/core/impl/VirtualGuardImpl.h>

#include <cxxabi.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#if defined(PUSH_TSAN)
extern "C" {
void* __tsan_get_current_fiber();
void* __tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void* fiber);
void __tsan_switch_to_fiber(void* fiber, unsigned flags);
}
#endif
#if defined(PUSH_ASAN)
extern "C" {
void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom, std::size_t size);
void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old, std::size_t* size_old);
}
#endif

namespace push::detail {
namespace {

thread_local Fiber* t_current = nullptr;

EhGlobals* eh_globals() { return reinterpret_cast<EhGlobals*>(abi::__cxa_get_globals()); }

std::size_t page_size() {
  static const std::size_t size = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

}  // namespace

ThreadState ThreadState::capture(const c10::Device& loop_device) {
  ThreadState state;  // torch_ captures at::ThreadLocalState
  state.autocast_ = compat::AutocastState::capture();
  if (loop_device.type() != c10::DeviceType::CPU) {
    const c10::impl::VirtualGuardImpl guard(loop_device.type());
    state.device_ = guard.getDevice();
    state.stream_ = guard.getStream(*state.device_);
  }
  return state;
}

void ThreadState::restore_over(const ThreadState& current) const {
  at::ThreadLocalState::setThreadLocalState(torch_);
  autocast_.restore_over(current.autocast_);
  if (device_) {
    const c10::impl::VirtualGuardImpl guard(device_->type());
    guard.uncheckedSetDevice(*device_);
    guard.exchangeStream(*stream_);
  }
}

Fiber* Fiber::current() { return t_current; }

Fiber::Fiber(std::size_t stack_size, const c10::Device& device) : device_(device) {
  const std::size_t page = page_size();
  stack_size_ = (stack_size + page - 1) / page * page;
  mapping_size_ = stack_size_ + page;
  // MAP_NORESERVE: a thousand suspended handlers cost only the pages they touched.
  mapping_ = ::mmap(nullptr, mapping_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapping_ == MAP_FAILED) {
    const int error = errno;
    throw Error(c10::str("[push::detail::Fiber] cannot map a fiber stack of ", mapping_size_,
                         " bytes (the event loop's stack_size, PushOptions::stack_size on a device "
                         "lane, plus a guard page): ",
                         std::strerror(error),
                         error == ENOMEM ? " (out of address space, or the process is at "
                                           "vm.max_map_count mappings)"
                                         : ""));
  }
  // Guard page: a handler that overflows its stack faults instead of corrupting memory.
  // Without it an overflow would corrupt memory silently, so a failure is an error too.
  if (::mprotect(mapping_, page, PROT_NONE) != 0) {
    const int error = errno;
    ::munmap(mapping_, mapping_size_);
    throw Error(
        c10::str("[push::detail::Fiber] cannot protect the guard page of a fiber stack: ", std::strerror(error)));
  }
  stack_ = static_cast<char*>(mapping_) + page;
#if defined(PUSH_TSAN)
  tsan_fiber_ = __tsan_create_fiber(0);
#endif
}

Fiber::~Fiber() {
#if defined(PUSH_TSAN)
  __tsan_destroy_fiber(tsan_fiber_);
#endif
  ::munmap(mapping_, mapping_size_);
}

void Fiber::release_stack() { ::madvise(stack_, stack_size_, MADV_DONTNEED); }

void Fiber::start(std::function<void()> body) {
  body_ = std::move(body);
  finished_ = false;
  state_.reset();
  eh_fiber_ = EhGlobals{};
#if defined(PUSH_TSAN)
  // The last run's final switch never returned, so TSan never popped its entry frames
  // (trampoline, run_body); reusing that TSan fiber would grow its shadow stack by two
  // frames per handler and its trace without bound (GiBs in the SVGD tests). A fresh
  // TSan fiber per run starts with an empty stack.
  __tsan_destroy_fiber(tsan_fiber_);
  tsan_fiber_ = __tsan_create_fiber(0);
#endif
  ::getcontext(&context_);
  context_.uc_stack.ss_sp = stack_;
  context_.uc_stack.ss_size = stack_size_;
  context_.uc_link = nullptr;
  const auto self = reinterpret_cast<std::uintptr_t>(this);
  ::makecontext(&context_, reinterpret_cast<void (*)()>(&Fiber::trampoline), 2,
                static_cast<unsigned int>(self & 0xffffffffu), static_cast<unsigned int>(self >> 32));
}

void Fiber::trampoline(unsigned int lo, unsigned int hi) {
  auto* self = reinterpret_cast<Fiber*>(static_cast<std::uintptr_t>(lo) | (static_cast<std::uintptr_t>(hi) << 32));
  self->run_body();
}

void Fiber::run_body() {
#if defined(PUSH_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &asan_caller_bottom_, &asan_caller_size_);
#endif
  body_();
  body_ = nullptr;
  finished_ = true;
  // The final switch never returns here; the stack is reused by the next start().
  switch_out();
#if defined(PUSH_ASAN)
  __sanitizer_start_switch_fiber(nullptr, asan_caller_bottom_, asan_caller_size_);
#endif
  ::swapcontext(&context_, &caller_);
  __builtin_unreachable();
}

void Fiber::switch_in(const ThreadState& caller) {
  // Scheduler side, just before the jump: install the fiber's view of the thread.
  previous_ = t_current;
  t_current = this;
  EhGlobals* eh = eh_globals();
  eh_caller_ = *eh;
  *eh = eh_fiber_;
  // A fiber's first run inherits the loop's state (the caller's).
  if (state_) state_->restore_over(caller);
  caller_state_ = &caller;
#if defined(PUSH_TSAN)
  tsan_caller_ = __tsan_get_current_fiber();
  __tsan_switch_to_fiber(tsan_fiber_, 0);
#endif
}

void Fiber::switch_out() {
  // Fiber side, just before the jump back: save the fiber's view, give the caller its own.
  // The fiber's state: saved to resume with, and what the caller's is restored over.
  state_.emplace(ThreadState::capture(device_));
  // The autocast cache maps a parameter to its low-precision copy; the parameter may
  // change (another handler steps it) before this fiber resumes: drop the copies. Also
  // when the handler returned inside an autocast region.
  if (state_->autocast_enabled()) at::autocast::clear_cache();
  caller_state_->restore_over(*state_);
  if (finished_) state_.reset();
  EhGlobals* eh = eh_globals();
  eh_fiber_ = *eh;
  *eh = eh_caller_;
  t_current = previous_;
#if defined(PUSH_TSAN)
  __tsan_switch_to_fiber(tsan_caller_, 0);
#endif
}

void Fiber::resume() {
  // The scheduler's thread state: switch_out() restores it before control comes back.
  const ThreadState caller = ThreadState::capture(device_);
  if (caller.autocast_enabled()) at::autocast::clear_cache();
  switch_in(caller);
#if defined(PUSH_ASAN)
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, stack_, stack_size_);
#endif
  ::swapcontext(&caller_, &context_);
#if defined(PUSH_ASAN)
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
  // switch_out() restored `caller` before the jump back.
  caller_state_ = nullptr;
}

void Fiber::suspend() {
  switch_out();
#if defined(PUSH_ASAN)
  __sanitizer_start_switch_fiber(&asan_fake_stack_, asan_caller_bottom_, asan_caller_size_);
#endif
  ::swapcontext(&context_, &caller_);
#if defined(PUSH_ASAN)
  __sanitizer_finish_switch_fiber(asan_fake_stack_, &asan_caller_bottom_, &asan_caller_size_);
#endif
  // Back on the fiber: the scheduler ran switch_in() before jumping here.
}

}  // namespace push::detail
